#!/usr/bin/env python3
"""What writing checkpoints costs the tree (output.checkpoint_dir, issue 12 part 4).

    bench/tree/checkpoint_dir_bench.py [--params 50M] [--receivers 2] [--steps 5] [--rounds 3]

Interleaved rounds of the same `deltacast run` (synth trainer, real processes on 127.0.0.1,
tests/integration/recovery/dcfleet.py): receivers that only hold the weights, then receivers that
also write every version to their own checkpoint_dir. Reports, per mode, the producer's refit
seconds of steps 2.. (the bootstrap excluded) as a range over rounds, and for the writers the
versions written and skipped and the last write's seconds. Prints one JSON line per run and a
summary table; writes nothing into the source tree. Standard library only.
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "integration" / "recovery"))
sys.dont_write_bytecode = True
import dcfleet  # noqa: E402


def one(dc, work, params, receivers, steps, write):
    job = dcfleet.JobConfig(receivers=receivers, topology="chain", params=params, steps=steps, seed=11,
                            chunk_bytes="4MiB", peer="10s", join="60s")
    extra = ["--set", f"output.checkpoint_dir={work}/ckpt-{{rank}}"] if write else []
    with dcfleet.Fleet(dc, work, job) as fleet:
        for r in range(1, receivers + 1):
            fleet.start_receiver(r, extra=extra)
        fleet.start_producer()
        code = fleet.wait_producer(600)
        statuses = fleet.wait_receivers(300)
        report = fleet.report()
        if code != 0 or any(s != 0 for s in statuses.values()) or not report or not report["ok"]:
            raise SystemExit(f"run failed: producer {code}, receivers {statuses}\n" + fleet.tail(0, 20))
        refits = [s["refit_seconds"] for s in report["steps"][1:]]
        out = {"write": write, "refit_median": statistics.median(refits), "refits": refits,
               "full_seconds": report["full"]["seconds"]}
        if write:
            out["writers"] = [fleet.summary(r)["checkpoint_dir"] for r in range(1, receivers + 1)]
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deltacast", default=None)
    ap.add_argument("--params", default="50M")
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    dc = dcfleet.find_deltacast(a.deltacast)
    root = Path(tempfile.mkdtemp(prefix="dc-ckptdir-bench."))
    results = {False: [], True: []}
    try:
        for r in range(a.rounds):
            for write in (False, True):
                res = one(dc, root / f"r{r}-{'write' if write else 'hold'}", a.params, a.receivers, a.steps, write)
                print(json.dumps(res), flush=True)
                results[write].append(res)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    hold = [x["refit_median"] for x in results[False]]
    write = [x["refit_median"] for x in results[True]]
    ratios = [w / h for w, h in zip(write, hold)]
    print(f"refit median per round, hold only: {min(hold):.3f}-{max(hold):.3f} s; writing: "
          f"{min(write):.3f}-{max(write):.3f} s; writing/hold per round {min(ratios):.2f}-{max(ratios):.2f}")
    for x in results[True]:
        print("writers:", x["writers"])


if __name__ == "__main__":
    main()
