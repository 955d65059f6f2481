#!/usr/bin/env bash
# Chaos harness for failure repair: random kills, freezes, restarts of receivers and kills + resumes
# of the producer (or a producer group's rank) in real `deltacast run` jobs on 127.0.0.1 (a
# benchmark; its --small form is the ctest test recovery_chaos_small). Usage and what each trial
# varies:
#   bench/recovery/chaos.sh --help
#   bench/recovery/chaos.sh --trials 50 --seed 1 [--deltacast build/tools/deltacast]
# One JSON line per trial in bench/recovery/results/chaos-seed<S>.jsonl, the summary table in
# chaos-seed<S>.md, the plot of faulted-version ratios in chaos-seed<S>.svg; logs of trials that were not clean under results/failed-seed<S>/trial-<N>/.
# results/ is git-ignored: a failure a log shows becomes a regression test, not a file. Current
# figures and the commands behind them: docs/reliability.md.
# Each trial runs 7-9 processes; run nothing else heavy beside it on a 2-core machine.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$HERE/chaos.py" "$@"
