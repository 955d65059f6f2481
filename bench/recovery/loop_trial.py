#!/usr/bin/env python3
"""Loop one failure trial and keep the logs of every failing run (issue 35, "a rare whole-job loss").

    loop_trial.py [--runs 60] [--seed 1] [--receivers 8] [--topology binary] [--params 200M]
                  [--steps 4] [--commit auto] [--victim 1] [--version V] [--refit 60s] [--peer 5s]
                  [--heartbeat 1250ms] [--demo-timeouts] [--log-level info] [--no-baseline]
                  [--first N] [--hang 150] [--keep-prefix /tmp/rootkill-] [--deltacast PATH]

The trial: tcp, one producer and --receivers receivers (`deltacast run` processes on 127.0.0.1,
tests/integration/recovery/dcfleet.py), a synthetic trainer of --params parameters and --steps
steps, chaos.py's timeouts (refit 60 s, peer 5 s; --demo-timeouts: `deltacast demo`'s). First one
run without a fault (the baseline, unless --no-baseline), then --runs runs in which rank --victim
(1: the root of the binary tree) is SIGKILLed. Each run draws its moment from
random.Random(f"{seed}:{run}"):

  fault      `--fault kill@V:N` (the victim kills itself after its N-th data message of version V):
             V = 2, N 1-3 (35% of the runs); V 3..steps+1, N 1-4 (25%)
  external   SIGKILL from here 0-100 ms after the producer's "full checkpoint" line (20%: the first
             delta is being made), or 0-40 ms after its "step K:" line, K 1..steps-1 (20%)
  --version V  every run kills in version V only; V = 1 is the bootstrap (N 1-200 of its 225 RAW
             pieces of 4 MiB at 200M parameters). `run --fault` counts versions, not steps: a user
             who means "step 1" and types kill@1 kills the bootstrap.

A run passes when the producer exits 0 and every survivor's summary holds the report's last
version with the producer's SHA-256. A failing run's directory (every process's log, the config,
the report) is kept as <keep-prefix><seed>-<run>; the others are removed. One JSON line per run on
stdout, then a count; exit 1 when a run failed. A run that takes longer than --hang seconds is a
hang (every process killed, kept).

What it found (docs/reliability.md, "A root's death that ended the job"): on the code before
f8d46ab, `--version 1` reproduces the issue's whole-job loss; on the current code 68 runs passed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "recovery"))
sys.dont_write_bytecode = True
import dcfleet  # noqa: E402


def plan_run(seed: int, run: int, steps: int, version: int = 0) -> dict:
    """The moment of the victim's death. Half the runs hit the first delta (version 2), where a
    whole-job loss was seen (0 of 4 versions committed)."""
    rng = random.Random(f"{seed}:{run}")
    if version == 1:  # the bootstrap: 225 RAW pieces of 4 MiB for 200M parameters
        return {"kind": "fault", "version": 1, "after": rng.randint(1, 200)}
    if version:
        return {"kind": "fault", "version": version, "after": rng.randint(1, 4)}
    x = rng.random()
    if x < 0.35:
        return {"kind": "fault", "version": 2, "after": rng.randint(1, 3)}
    if x < 0.55:  # after the bootstrap's line: while the producer encodes the first delta
        return {"kind": "external", "after_step": 0, "delay_s": round(rng.uniform(0, 0.1), 3)}
    if x < 0.8:
        return {"kind": "fault", "version": rng.randint(3, steps + 1), "after": rng.randint(1, 4)}
    return {"kind": "external", "after_step": rng.randint(1, steps - 1), "delay_s": round(rng.uniform(0, 0.04), 3)}


def job_config(a) -> dcfleet.JobConfig:
    job = dcfleet.JobConfig(receivers=a.receivers, topology=a.topology, transport="tcp", params=a.params,
                            steps=a.steps, lr="1e-5", seed=a.seed, log_level=a.log_level, commit=a.commit)
    job.refit, job.peer, job.heartbeat = a.refit, a.peer, a.heartbeat
    if a.demo_timeouts:  # what `deltacast demo --kill` writes (tools/demo/tree_demo.cpp)
        job.connect, job.heartbeat, job.peer, job.refit, job.join, job.producer_loss = \
            "30s", "1s", "60s", "30m", "10m", "30s"
    return job


def one_run(dc: str, a, run: int, moment: dict, hang_s: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"rootkill-run-{a.seed}-{run}-"))
    job = job_config(a)
    faults = {}
    if moment and moment["kind"] == "fault":
        faults[a.victim] = f"kill@{moment['version']}:{moment['after']}"
    t0 = time.monotonic()
    out = {"run": run, "moment": moment}
    with dcfleet.Fleet(dc, work, job) as fleet:
        fleet.start(faults)
        deadline = t0 + hang_s
        if moment and moment["kind"] == "external":
            line = r"^full checkpoint \(version 1\)" if moment["after_step"] == 0 else rf"^step {moment['after_step']}: "
            seen = fleet.wait_line(line, hang_s)
            if seen:
                time.sleep(moment["delay_s"])
                fleet.signal(a.victim, signal.SIGKILL)
                out["fired"] = True
        rc0 = fleet.wait_producer(max(0.0, deadline - time.monotonic()))
        out["seconds"] = round(time.monotonic() - t0, 2)
        if rc0 is None:
            out["hang"] = True
            fleet.kill_all()
        codes = fleet.wait_receivers(35 if rc0 is not None else 1)
        fleet.kill_all()
        report = fleet.report()
        out["producer_rc"] = rc0
        out["receiver_rc"] = codes
        want = report.get("sha256") if report else None
        last = None
        committed = 0
        if report:
            ents = dcfleet.entries(report)
            committed = sum(1 for e in ents if e.get("committed", True) and not e.get("aborted"))
            last = ents[-1].get("version")
        out["versions_in_report"] = committed
        exact = 0
        for r in range(1, a.receivers + 1):
            if r == a.victim and moment:
                continue
            s = fleet.summary(r)
            if s and want and s.get("sha256") == want and s.get("version") == last:
                exact += 1
        out["survivors_exact"] = exact
        out["survivors"] = a.receivers - (1 if moment else 0)
    ok = rc0 == 0 and exact == out["survivors"] and report is not None
    out["ok"] = ok
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    else:
        keep = Path(f"{a.keep_prefix}{a.seed}-{run}")
        shutil.rmtree(keep, ignore_errors=True)
        shutil.move(str(work), keep)
        out["kept"] = str(keep)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--first", type=int, default=0, help="first run index (a resumed loop)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--receivers", type=int, default=8)
    p.add_argument("--topology", default="binary")
    p.add_argument("--params", default="200M")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--commit", default="auto")
    p.add_argument("--victim", type=int, default=1)
    p.add_argument("--log-level", default="info")
    p.add_argument("--demo-timeouts", action="store_true")
    p.add_argument("--version", type=int, default=0, help="kill in this version only (1: the bootstrap)")
    p.add_argument("--refit", default="60s", help="timeouts.refit (chaos.py's 60 s)")
    p.add_argument("--peer", default="5s", help="timeouts.peer (chaos.py's 5 s)")
    p.add_argument("--heartbeat", default="1250ms")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--hang", type=float, default=150)
    p.add_argument("--keep-prefix", default="/tmp/rootkill-")
    p.add_argument("--deltacast")
    a = p.parse_args()
    dc = dcfleet.find_deltacast(a.deltacast)
    failed = 0
    done = 0
    if not a.no_baseline:
        r = one_run(dc, a, -1, None, a.hang)
        print(json.dumps(r), flush=True)
    for run in range(a.first, a.first + a.runs):
        r = one_run(dc, a, run, plan_run(a.seed, run, a.steps, a.version), a.hang)
        done += 1
        failed += 0 if r["ok"] else 1
        print(json.dumps(r), flush=True)
    print(f"# {failed} of {done} runs failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
