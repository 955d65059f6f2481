"""trainer.kind watch at a realistic size: what following a checkpoint directory costs the producer.

    python3 bench/tree/watch_bench.py [--deltacast build/tools/deltacast] [--params 200M] [--shards 4]
                                      [--versions 4] [--receivers 2] [--reads pread,map] [--rounds 3]
                                      [--keep]

`deltacast synth --shards` writes the checkpoints first (not timed). Then one `deltacast run`
job on 127.0.0.1 (tests/integration/recovery/dcfleet.py) follows a directory into which this
script drops each checkpoint (written as NAME.tmp, renamed) once the previous version committed.
Reports, per version: the time from the checkpoint's rename to its commit, and the refit time
the producer reports for it (the baseline: appearance-to-commit minus refit is what watching
adds: noticing the name, opening and validating the shards); and the producer's anonymous memory
(RssAnon) once version 1 committed and at its largest afterwards, against the checkpoint size.
With several --reads (trainer.read: pread, map), each round runs one job per mode, in turn, and a
summary per mode gives the range of every round's figures. The checkpoints are copied in, so the
page cache holds them as a trainer's fresh writes leave them.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "integration" / "recovery"))
import dcfleet  # noqa: E402


def run_job(dc: str, work: Path, steps: list, versions: int, receivers: int, read: str) -> dict:
    """One `deltacast run` following a fresh directory with trainer.read `read`; its per-version
    rows and memory figures."""
    watched = work / f"watched-{read}"
    watched.mkdir()
    shutil.copytree(steps[0], watched / "ckpt-0000")
    job = dcfleet.JobConfig(receivers=receivers, chunk_bytes="16MiB", peer="10s", join="120s",
                            trainer_yaml=f"  kind: watch\n  dir: {watched}\n  steps: {versions}\n  read: {read}\n")
    rows = []
    with dcfleet.Fleet(dc, work / f"job-{read}", job) as fleet:
        fleet.start()
        if not fleet.wait_line(r"full checkpoint \(version 1\)", 600):
            sys.exit("no bootstrap:\n" + fleet.tail(0, 20))
        for k in range(1, versions + 1):
            name = f"ckpt-{k:04d}"
            shutil.copytree(steps[k], watched / (name + ".tmp"))
            dropped = time.monotonic()
            (watched / (name + ".tmp")).rename(watched / name)
            m = fleet.wait_line(rf"^step {k}: version {k + 1} ", 600)
            seen = time.monotonic()
            if not m:
                sys.exit(f"version {k + 1} did not commit:\n" + fleet.tail(0, 20))
            rows.append(seen - dropped)
        if fleet.wait_producer(120) != 0:
            sys.exit("producer failed:\n" + fleet.tail(0, 20))
        fleet.wait_receivers(120)
        report = fleet.report()
    reads = {st.get("read") for st in report["steps"]}
    if reads != {read}:
        sys.exit(f"the job read with {reads}, not {read}")
    out = []
    for k, st in enumerate(report["steps"]):
        out.append({"read": read, "checkpoint": st["checkpoint"], "rename_to_commit_line_s": round(rows[k], 3),
                    "appeared_to_commit_s": round(st["appeared_to_commit_seconds"], 3),
                    "refit_s": round(st["refit_seconds"], 3),
                    "watch_overhead_s": round(st["appeared_to_commit_seconds"] - st["refit_seconds"], 3)})
        print(json.dumps(out[-1]), flush=True)
    ckpt = report["checkpoint_bytes"]
    after, peak = report["rss_anon_after_bootstrap_bytes"], report["max_rss_anon_bytes"]
    memory = {"read": read, "checkpoint_bytes": ckpt, "rss_anon_after_bootstrap_bytes": after,
              "max_rss_anon_bytes": peak, "growth_over_checkpoint": round((peak - after) / ckpt, 4)}
    print(json.dumps(memory), flush=True)
    shutil.rmtree(watched, ignore_errors=True)
    return {"rows": out, "memory": memory}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deltacast", default=None)
    ap.add_argument("--params", default="200M")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--versions", type=int, default=4, help="checkpoints after the bootstrap")
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--reads", default="pread", help="trainer.read modes, comma-separated, interleaved per round")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (the jobs' logs)")
    args = ap.parse_args()
    dc = dcfleet.find_deltacast(args.deltacast)
    reads = args.reads.split(",")
    work = Path(tempfile.mkdtemp(prefix="dc-watch-bench-"))
    made = work / "made"
    subprocess.run([dc, "synth", "--out", str(made), "--params", args.params, "--steps", str(args.versions),
                    "--shards", str(args.shards)], check=True, stdout=subprocess.DEVNULL)
    steps = sorted(p for p in made.iterdir() if p.is_dir())
    results = {r: [] for r in reads}
    for _ in range(args.rounds):
        for read in reads:
            results[read].append(run_job(dc, work, steps, args.versions, args.receivers, read))
    for read, jobs in results.items():
        def span(key):
            values = [row[key] for job in jobs for row in job["rows"]]
            return [min(values), sorted(values)[len(values) // 2], max(values)]
        print(json.dumps({"summary": read, "jobs": len(jobs),
                          "rename_to_commit_line_s_min_median_max": span("rename_to_commit_line_s"),
                          "refit_s_min_median_max": span("refit_s"),
                          "growth_over_checkpoint_max": max(j["memory"]["growth_over_checkpoint"] for j in jobs)}))
    if args.keep:
        shutil.rmtree(made, ignore_errors=True)
        print(f"logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
