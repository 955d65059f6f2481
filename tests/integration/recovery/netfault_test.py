#!/usr/bin/env python3
"""A partition and a straggler in network namespaces (issue 35; bench/recovery/netfault.py is the
campaign, this is its short form for ctest, `ctest -L netns`).

    netfault_test.py DELTACAST partition|straggler

Real `deltacast run` processes, tcp, one producer and 6 receivers (binary tree: rank 2 is an
interior member with children 4 and 5), each rank in its own namespace behind a veth to a bridge,
every egress shaped to 200 Mbit/s (tests/integration/recovery/dcnetns.py), a 4M-parameter model,
the producer fed from a watch directory one step at a time.

  partition  rank 2's link (bridge side) goes down 0.2 s into version 3 for 3.5 s
             (timeouts.peer 2 s), then up. Expected (docs/protocol.md, "Failures"): the producer
             fails rank 2 as silent within timeouts.peer + a heartbeat + slack of the link going
             down, its children move, every version commits, the 5 others end bit-exact; rank 2
             finds the producer lost, keeps its committed version, rejoins once the link is back
             (the last steps wait for it) and ends bit-exact too: never divergent.
  straggler  rank 2's egress capped to 1/20 of the others' (10 Mbit/s) from the first delta on.
             Expected: every version commits and all 6 end bit-exact, with no hang (the process
             exits within 2 x timeouts.refit); the delta version times with the straggler are
             printed (docs/reliability.md, "Partitions and stragglers", has the measured policy).

Exit 0 passed, 1 failed (the reason and the logs' last lines on stderr), 77 skipped (`ip netns
add` is not permitted here: not root).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import dcfleet  # noqa: E402
import dcnetns  # noqa: E402

SCALE = float(os.environ.get("DELTACAST_TEST_TIME_SCALE", "1"))
RECEIVERS = 6
RELAY = 2  # binary tree over 6: rank 2's children are ranks 4 and 5
PEER_S = 2.0
HEARTBEAT_S = PEER_S / 4
RATE = "200mbit"


class Failed(Exception):
    pass


def check(cond, msg: str) -> None:
    if not cond:
        raise Failed(msg)


def settings(deltacast: str, steps: int) -> argparse.Namespace:
    return argparse.Namespace(deltacast=deltacast, params="4M", steps=steps, model_seed=3, lr="1e-5", pace=0.6,
                              tail=2, peer=PEER_S, refit=30.0, producer_loss=20.0)


def logs(job: dcnetns.Job) -> str:
    out = []
    for rank in range(RECEIVERS + 1):
        if rank in job.fleet.current:
            out.append(f"--- rank {rank} (exit {job.fleet.current[rank].rc}):\n{job.fleet.tail(rank, 12)}")
    return "\n".join(out)


def partition(deltacast: str, work: Path, tag: str) -> str:
    args = settings(deltacast, steps=6)
    plan = {"receivers": RECEIVERS, "topology": "binary", "commit": "producer"}
    job = dcnetns.Job(args, plan, work, {k: RATE for k in range(RECEIVERS + 1)}, set(), tag)
    try:
        job.start()
        at = job.wait_dropped(2, 120 * SCALE)  # step 2 = version 3
        check(at is not None, "step 2 was never dropped (the job did not get that far):\n" + logs(job))
        time.sleep(max(0.0, at + 0.2 - time.monotonic()))
        down_at = dcfleet.seconds_of_day()
        job.net.link(RELAY, up=False)
        time.sleep(3.5)
        job.net.link(RELAY, up=True)
        job.tail_release.set()
        result = job.finish({}, {RELAY})
        check(not result["hang"], f"a hang: {result['hang_what']} (exit codes {result['exit_codes']})\n" + logs(job))
        check(result["producer_ok"], f"the producer did not end ok: exit codes {result['exit_codes']}\n" + logs(job))
        check(result["versions_committed"] == args.steps + 1,
              f"{result['versions_committed']} of {args.steps + 1} versions committed\n" + logs(job))
        check(result["survivors_exact"] == RECEIVERS - 1,
              f"survivors exact {result['survivors_exact']}/{RECEIVERS - 1}: divergent {result['divergent_survivors']}, "
              f"stale {result['stale_survivors']}, failed {result['failed_survivors']}\n" + logs(job))
        mine = [f for f in result["failures"] if f["rank"] == RELAY]
        check(mine and mine[0]["cause"] == "silent", f"rank {RELAY} was not failed as silent: {result['failures']}")
        others = [f for f in result["failures"] if f["rank"] != RELAY]
        check(not others, f"members other than the cut one were failed: {others}")
        failed = [t for t in dcfleet.log_times(job.fleet.current[0].log, rf"producer: rank {RELAY} failed \(")
                  if t >= down_at - 0.5]
        check(failed, "the producer's log does not say when it failed the cut member")
        detection = failed[0] - down_at
        bound = PEER_S + HEARTBEAT_S + 1.0 * SCALE
        check(detection <= bound, f"detected {detection:.2f} s after the link went down (bound {bound:.2f} s)")
        fate = result["cut_fate"][str(RELAY)]
        check(fate["class"] == "exact",
              f"the cut member did not rejoin bit-exact: {fate}\n" + logs(job))
        return (f"rank {RELAY} cut 3.5 s in version 3: failed (silent) {detection:.2f} s after the link went down, "
                f"{args.steps + 1}/{args.steps + 1} versions committed, {RECEIVERS - 1} survivors bit-exact; "
                f"after the link came back it rejoined and ended bit-exact")
    finally:
        job.close()


def straggler(deltacast: str, work: Path, tag: str) -> str:
    args = settings(deltacast, steps=4)
    plan = {"receivers": RECEIVERS, "topology": "binary", "commit": "producer"}
    job = dcnetns.Job(args, plan, work, {k: RATE for k in range(RECEIVERS + 1)}, set(), tag)
    try:
        job.tail_release.set()
        job.start()
        check(job.fleet.wait_line(r"^full checkpoint \(version 1\)", 120 * SCALE), "no bootstrap:\n" + logs(job))
        job.net.shape(RELAY, "10mbit")
        result = job.finish({}, set())
        check(not result["hang"], f"a hang: {result['hang_what']} (exit codes {result['exit_codes']})\n" + logs(job))
        check(result["producer_ok"], f"the producer did not end ok: exit codes {result['exit_codes']}\n" + logs(job))
        check(result["versions_committed"] == args.steps + 1,
              f"{result['versions_committed']} of {args.steps + 1} versions committed\n" + logs(job))
        check(result["survivors_exact"] == RECEIVERS,
              f"exact {result['survivors_exact']}/{RECEIVERS}: divergent {result['divergent_survivors']}, "
              f"stale {result['stale_survivors']}, failed {result['failed_survivors']}\n" + logs(job))
        deltas = [v for k, v in result["refit_seconds"].items() if int(k) >= 3]
        return (f"rank {RELAY} at 1/20 of the others' egress from the first delta on: {args.steps + 1} versions "
                f"committed, {RECEIVERS} receivers bit-exact; delta refits {min(deltas):.3f}-{max(deltas):.3f} s "
                f"(median {statistics.median(deltas):.3f}); failures {result['failures'] or 'none'}")
    finally:
        job.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("deltacast")
    p.add_argument("case", choices=["partition", "straggler"])
    p.add_argument("--keep", action="store_true")
    a = p.parse_args()
    if not dcnetns.netns_permitted():
        print("netfault_test: 'ip netns add' is not permitted here; skipped")
        return 77
    dcnetns.cleanup_dead_sets()
    work = Path(tempfile.mkdtemp(prefix=f"dc-netfault-{a.case}."))
    started = time.monotonic()
    passed = False
    try:
        text = (partition if a.case == "partition" else straggler)(a.deltacast, work, f"{os.getpid()}t")
        print("ok: " + text)
        passed = True
    except Failed as e:
        print(f"FAIL: {e}", file=sys.stderr)
        print(f"--- work directory: {work}", file=sys.stderr)
    print(f"{a.case}: {'passed' if passed else 'FAILED'} in {time.monotonic() - started:.1f} s")
    if passed and not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
