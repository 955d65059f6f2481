#!/usr/bin/env python3
"""Process-level recovery tests: real `deltacast run` processes on 127.0.0.1 (tcp), failed from
outside with signals, as an operator or the kernel would (not `--fault`).

    recovery_test.py DELTACAST CASE [--keep]

CASE:
  kill_relay      kill -9 of an interior relay while a step is in flight: the job exits 0, the
                  step that lost it is committed and names it (link_closed), every survivor's
                  SHA-256 equals the producer's.
  stop_relay      SIGSTOP of an interior relay (timeouts.peer 2 s): detected as silent within
                  about timeouts.peer, the step commits without it; then SIGCONT: the woken
                  process finds itself out (its control link closed: the producer's transport had
                  failed the silent link, so no FENCED reaches it), rolls back, says HELLO again
                  with its committed version, catches up (replay, or snapshot + replay when its
                  versions left the peers' retention) while steps still flow, is admitted back,
                  and ends bit-exact with everyone else.
  stall_relay     an interior relay stops draining its parent's link (`--fault stall@3:2`: its
                  relay thread blocks) while the process and its heartbeats go on: its parent
                  reports it stalled after timeouts.peer (2 s), the producer fails it after its
                  grace (1 s), its children move, the version commits without it, every other
                  member ends bit-exact.
  stall_relay_delegated  the same with `commit: delegated` (tree 0's root decides the commit):
                  the producer's laggard rule must go on while the delegate waits (before 2026-12-07
                  it stopped at DELEGATE, and the stalled relay held the version to timeouts.refit).
  restart_member  kill -9 of an interior relay after the bootstrap, then a new `deltacast run`
                  process for the same rank: snapshot from a peer + replay while steps keep
                  flowing, admitted back, ends bit-exact (its --summary SHA-256 = the report's).
  no_producer     a receiver started with no producer says at once that it cannot reach it (with
                  the address) and exits non-zero after timeouts.join (3 s) with a clear message.

How "a step in flight" is made certain with an external signal: the victim is first frozen
(SIGSTOP) right after a producer progress line, which holds the next version open (it cannot
commit without the victim's ACK and ACTIVE) for as long as it stays frozen; with timeouts.peer
far longer than the wait, the SIGKILL that follows is seen as a closed link (detection ~0), just
as a crash in the middle of the version would be. No assertion depends on tight timing; every
wait has a generous deadline, and every process is SIGKILLed on exit (dcfleet.py).

Exit 0: passed; 1: failed (the reason and the logs' last lines on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # nothing written into the source tree
import dcfleet  # noqa: E402

# Binary tree over 6 receivers (heap order, job ranks): 1 is the root, 2 relays for 4 and 5,
# 3 relays for 6.
RECEIVERS = 6
RELAY = 2
RELAY_CHILDREN = (4, 5)


# Under a sanitizer every process runs several times slower (scripts/test.sh --sanitize exports 3):
# the bounds this harness gives a healthy process stretch by it. What the product itself measures
# and reports (a detection time against timeouts.peer) is judged the same way.
SCALE = float(os.environ.get("DELTACAST_TEST_TIME_SCALE", "1"))


class Failed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failed(message)


def dump(fleet: dcfleet.Fleet, why: str) -> None:
    print(f"FAIL: {why}", file=sys.stderr)
    print(f"--- work directory: {fleet.dir}", file=sys.stderr)
    try:
        print("--- producer stdout:\n" + (fleet.dir / "rank-0.out").read_text(errors="replace"), file=sys.stderr)
    except OSError:
        pass
    for (rank, instance), p in sorted(fleet.procs.items()):
        print(f"--- rank {rank} instance {instance} (exit {p.rc}), last log lines:\n{fleet.tail(rank, 10, instance)}",
              file=sys.stderr)


def finish_job(fleet: dcfleet.Fleet, timeout: float = 90) -> dict:
    timeout *= SCALE
    """Waits for the producer, then for every receiver; returns the report."""
    rc = fleet.wait_producer(timeout)
    check(rc is not None, f"the producer did not finish within {timeout} s (a hang)")
    check(rc == 0, f"the producer exited with {rc}")
    report = fleet.report()
    check(report is not None, "the producer wrote no report")
    check(report.get("ok") is True, f"report ok = {report.get('ok')}")
    return report


def check_survivors(fleet: dcfleet.Fleet, report: dict, survivors, timeout: float = 30) -> None:
    timeout *= SCALE
    codes = fleet.wait_receivers(timeout, survivors)
    for rank, code in codes.items():
        check(code is not None, f"rank {rank} still runs {timeout} s after the producer ended")
        check(code == 0, f"rank {rank} exited with {code}")
        s = fleet.summary(rank)
        check(s is not None, f"rank {rank} wrote no summary")
        check(s["version"] == report["version"],
              f"rank {rank} ended at version {s['version']}, the producer at {report['version']}")
        check(s["sha256"] == report["sha256"],
              f"rank {rank}'s SHA-256 {s['sha256'][:16]}... differs from the producer's {report['sha256'][:16]}...")


def every_step_committed(report: dict) -> None:
    for e in dcfleet.entries(report):
        check(e["committed"] is True, f"version {e['version']} was not committed: {e}")


def the_failure(report: dict, rank: int):
    """(entry, member) of the one version that names `rank` failed."""
    hits = [(e, m) for e in dcfleet.entries(report) for m in e["failed_members"] if m["rank"] == rank]
    check(len(hits) == 1, f"rank {rank} is named failed {len(hits)} times: {hits}")
    return hits[0]


def job(**overrides) -> dcfleet.JobConfig:
    base = dict(receivers=RECEIVERS, topology="binary", transport="tcp", params="20M", lr="1e-5", seed=7,
                connect="5s", heartbeat="500ms", peer="20s", refit="2m", join="60s", producer_loss="20s",
                log_level="info")
    base.update(overrides)
    return dcfleet.JobConfig(**base)


# --- cases ---------------------------------------------------------------------------------------
def kill_relay(fleet: dcfleet.Fleet) -> None:
    fleet.start()
    check(fleet.wait_line(r"^step 2: ", 120), "no 'step 2:' line from the producer")
    # Freeze, so that the version after step 2 cannot commit, then kill while it is held open.
    fleet.signal(RELAY, signal.SIGSTOP)
    time.sleep(1.0)
    check(fleet.producer.poll() is None, "the producer ended while the relay was frozen")
    fleet.signal(RELAY, signal.SIGKILL)
    fleet.kill(RELAY)
    report = finish_job(fleet)
    every_step_committed(report)
    entry, member = the_failure(report, RELAY)
    check(entry["version"] >= 4, f"rank {RELAY} was reported at version {entry['version']}, before it was killed")
    check(member["cause"] == "link_closed", f"cause {member['cause']}, expected link_closed")
    check(entry["verified_receivers"] == RECEIVERS - 1,
          f"version {entry['version']} verified by {entry['verified_receivers']}, expected {RECEIVERS - 1}")
    check(all(not e["failed_members"] for e in dcfleet.entries(report) if e is not entry),
          "another version names a failure")
    check_survivors(fleet, report, [r for r in range(1, RECEIVERS + 1) if r != RELAY])
    check(fleet.summary(RELAY) is None, "the killed relay wrote a summary")
    print(f"ok: rank {RELAY} killed during version {entry['version']}: committed by {entry['verified_receivers']}"
          f"/{entry['receivers']}, repaired in {entry['repair_seconds']:.3f} s, {entry['resent_chunks']} chunks re-sent;"
          f" {RECEIVERS - 1} survivors bit-exact")


def stop_relay(fleet: dcfleet.Fleet) -> None:
    peer = 2.0
    fleet.start()
    check(fleet.wait_line(r"^step 2: ", 120 * SCALE), "no 'step 2:' line from the producer")
    fleet.signal(RELAY, signal.SIGSTOP)
    stopped = time.monotonic()
    stopped_unix = time.time()
    m = fleet.wait_line(rf"^step (\d+): .*repaired: .*rank {RELAY} \((\w+)\)", 60 * SCALE)
    check(m, f"no step line reports rank {RELAY} repaired within 60 s of its SIGSTOP")
    seen_after = time.monotonic() - stopped
    # Wake it: it must find out that it was fenced and rejoin while steps still flow.
    fleet.signal(RELAY, signal.SIGCONT)
    report = finish_job(fleet)
    every_step_committed(report)
    entry, member = the_failure(report, RELAY)
    check(member["cause"] in ("silent", "stalled"), f"cause {member['cause']}, expected silent (or stalled)")
    # Detection, from the SIGSTOP to the producer's verdict (wall clock, one machine): about
    # timeouts.peer; allow a heartbeat (500 ms) and a loaded machine, not a second timeout. (The
    # report's detection_seconds is the bound that made the verdict, not a measure.)
    detection = member["detected_at_unix"] - stopped_unix
    check(peer - 0.1 <= detection <= peer + 1.5 * SCALE,
          f"detection took {detection:.2f} s with timeouts.peer {peer} s")
    check(seen_after <= 30 * SCALE, f"the repaired step line came {seen_after:.1f} s after the SIGSTOP")
    check(entry["verified_receivers"] == RECEIVERS - 1,
          f"version {entry['version']} verified by {entry['verified_receivers']}, expected {RECEIVERS - 1}")
    # After SIGCONT the woken relay is fenced, rejoins and catches up: it must end like everyone.
    check_survivors(fleet, report, range(1, RECEIVERS + 1))
    # How it learns: FENCED on its control link, or (what this machine shows for a silent member:
    # the producer's transport already failed that link) the link closed under it. Either way it
    # rolls back what it had in flight and says HELLO again with its committed version.
    log = fleet.current[RELAY].log.read_text(errors="replace")
    learned = re.search(r"fenced by the producer|lost the producer", log)
    check(learned, "the woken relay's log says neither that it was fenced nor that it lost the producer")
    rejoined = re.search(rf"producer: rank {RELAY} is back in the tree at epoch (\d+)",
                         fleet.current[0].log.read_text(errors="replace"))
    check(rejoined, f"the producer's log does not say rank {RELAY} is back in the tree")
    print(f"ok: rank {RELAY} frozen, detected ({member['cause']}) after {detection:.2f} s "
          f"(step line {seen_after:.1f} s after SIGSTOP); version {entry['version']} committed by "
          f"{entry['verified_receivers']}/{entry['receivers']}; after SIGCONT it found itself out ('{learned.group(0)}'),"
          f" rejoined (epoch {rejoined.group(1)}) and ended bit-exact with the other {RECEIVERS - 1}")


def stall_relay(fleet: dcfleet.Fleet) -> None:
    peer = 2.0
    fleet.start(faults={RELAY: "stall@3:2"})
    report = finish_job(fleet)
    every_step_committed(report)
    entry, member = the_failure(report, RELAY)
    check(member["cause"] == "stalled", f"cause {member['cause']}, expected stalled (its heartbeats went on)")
    stalled = dcfleet.log_times(fleet.current[RELAY].log, r"--fault stall@3:2: this relay thread stops draining")
    check(stalled, "the relay's log does not say it stopped draining")
    # timeouts.peer without draining, its parent's REPORT, then the producer's grace of
    # min(1 s, timeouts.peer / 2): about 3 s; a loaded machine adds, a second timeout does not fit.
    detection = dcfleet.fault_to_detection(fleet, RELAY, stalled[0])
    check(detection is not None, "the producer's log does not say when it failed the relay")
    check(peer <= detection <= peer + 1.0 + 2.0 * SCALE,
          f"the stall was acted on {detection:.2f} s after it began (timeouts.peer {peer} s + 1 s grace)")
    check(entry["verified_receivers"] == RECEIVERS - 1,
          f"version {entry['version']} verified by {entry['verified_receivers']}, expected {RECEIVERS - 1}")
    check_survivors(fleet, report, [r for r in range(1, RECEIVERS + 1) if r != RELAY])
    print(f"ok: rank {RELAY} stopped draining in version 3; the producer failed it "
          f"(stalled: not verified timeouts.peer + grace after its parent) {detection:.2f} s later; version {entry['version']} committed by "
          f"{entry['verified_receivers']}/{entry['receivers']}; {RECEIVERS - 1} survivors bit-exact")


def restart_member(fleet: dcfleet.Fleet) -> None:
    fleet.start()
    check(fleet.wait_line(r"^full checkpoint \(version 1\)", 120), "no bootstrap line from the producer")
    check(fleet.wait_line(r"^step 1: ", 60), "no 'step 1:' line from the producer")
    fleet.kill(RELAY)
    # Its death is repaired before the new instance says HELLO (a HELLO for a rank still counted
    # live would fence the old one as 'replaced' instead: a different path).
    check(fleet.wait_line(rf"repaired: .*rank {RELAY} \(link_closed\)", 60), f"rank {RELAY}'s death was not repaired")
    old = fleet.current[RELAY]
    fleet.start_receiver(RELAY)
    report = finish_job(fleet, 150)
    every_step_committed(report)
    entry, member = the_failure(report, RELAY)
    check(member["cause"] == "link_closed", f"cause {member['cause']}, expected link_closed")
    check(old.rc is not None and old.rc != 0, "the killed instance did not die")
    check_survivors(fleet, report, range(1, RECEIVERS + 1))
    new_log = fleet.current[RELAY].log.read_text(errors="replace")
    snap = re.search(r"took a snapshot of version (\d+) from rank (\d+)", new_log)
    check(snap, "the new instance took no snapshot from a peer")
    caught = re.findall(r"caught up to version (\d+)", new_log)
    check(caught, "the new instance never caught up")
    check(int(caught[-1]) >= int(snap.group(1)), "caught-up version below the snapshot")
    producer_log = fleet.current[0].log.read_text(errors="replace")
    back = re.search(rf"producer: rank {RELAY} is back in the tree at epoch (\d+)", producer_log)
    check(back, f"the producer's log does not say rank {RELAY} is back in the tree")
    summary = fleet.summary(RELAY)
    replayed = int(caught[-1]) - int(snap.group(1))
    print(f"ok: rank {RELAY} killed after version {entry['version'] - 1}, restarted: snapshot of version "
          f"{snap.group(1)} from rank {snap.group(2)}, caught up to {caught[-1]} ({replayed} replayed, "
          f"{len(caught)} catch-up rounds), back at epoch {back.group(1)}, ended at version {summary['version']} "
          f"bit-exact (SHA-256 {summary['sha256'][:16]}...)")


def no_producer(fleet: dcfleet.Fleet) -> None:
    join = 3.0
    p = fleet.start_receiver(1)
    url = fleet.url(0)
    said_at = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = p.log.read_text(errors="replace")
        if said_at is None and "cannot reach the producer" in text:
            said_at = time.monotonic() - p.started
        if p.poll() is not None:
            break
        time.sleep(0.05)
    took = time.monotonic() - p.started
    check(p.poll() is not None, "the receiver still runs 60 s after it started")
    text = p.log.read_text(errors="replace")
    lines = [l for l in text.splitlines() if l.strip()]
    check(said_at is not None, f"the receiver never said it cannot reach the producer:\n{text}")
    first = next(l for l in lines if "cannot reach the producer" in l)
    check(url in first, f"the first message does not name the producer's address {url}: {first}")
    # "At once": the first connection attempt fails immediately (refused); allow a loaded machine.
    check(said_at <= join * SCALE, f"the first 'cannot reach' came {said_at:.2f} s after start (timeouts.join {join} s)")
    check(p.rc != 0, "the receiver exited 0 without a producer")
    check(took >= join, f"it gave up after {took:.2f} s, before timeouts.join ({join} s)")
    check(took <= join + 20 * SCALE, f"it gave up only after {took:.2f} s (timeouts.join {join} s)")
    last = lines[-1]
    check(re.search(r"cannot reach the producer at " + re.escape(url) + r" after \d+(\.\d)? s", last),
          f"the final message is not clear about what failed: {last}")
    print(f"ok: said at {said_at:.2f} s: {first.split('] ')[-1]}\n    exited {p.rc} after {took:.2f} s: {last}")


def producer_dies_before_commit(fleet: dcfleet.Fleet) -> None:
    """The producer writes version 3 into its state file and dies before its COMMIT goes out: every
    receiver rolls version 3 back and keeps version 2. The resumed producer is at version 3, which
    nobody holds: they all catch up from its own snapshot (no peer can serve it), and the chain
    goes on to the end, bit-exact."""
    fleet.start_receivers()
    first = fleet.start_producer(["--fault", "kill@3:commit"])
    check(fleet.wait_line(r"--fault kill@3:commit: killing", 90), "the producer did not reach version 3's commit")
    check(first.wait(20) is not None, "the producer did not die")
    state = json.loads((fleet.dir / "producer-state.json").read_text())
    check(state["version"] == 3 and state["trainer_step"] == 2, f"the state written before COMMIT: {state}")
    fleet.start_producer(["--resume"])
    m = fleet.wait_line(r"producer: resumed at version 3 \(step 2\)", 90)
    check(m, "the resumed producer did not resume at version 3")
    # Enough versions after the resume for every member to catch up (they finish behind if the
    # producer says BYE first); then all must end at the last version, bit-exact.
    check(fleet.wait_line(rf"^step \d+: version \d+ .* verified {RECEIVERS}/{RECEIVERS}", 120),
          "the members never all caught up")
    report = finish_job(fleet, timeout=180)
    every_step_committed(report)
    check_survivors(fleet, report, range(1, RECEIVERS + 1))
    log = fleet.current[0].log.read_text(errors="replace")
    served = re.findall(r"producer: served a snapshot of version 3 \(\d+ pieces\) to rank (\d+)", log)
    check(served, "no member took the producer's snapshot of version 3")
    print(f"ok: killed after writing version 3 and before its COMMIT; resumed at version 3, which ranks "
          f"{sorted(set(int(r) for r in served))} took as the producer's snapshot (no peer held it); ended at "
          f"version {report['version']} on every receiver, bit-exact")


CASES = {
    "kill_relay": (kill_relay, dict(steps=8)),
    "stop_relay": (stop_relay, dict(steps=60, peer="2s")),
    "stall_relay": (stall_relay, dict(steps=6, peer="2s")),
    # The same with the commit delegated to tree 0's root (docs/protocol.md, "Delegated commit"):
    # the producer's laggard rule must run while the delegate decides.
    "stall_relay_delegated": (stall_relay, dict(steps=6, peer="2s", commit="delegated")),
    "restart_member": (restart_member, dict(steps=60)),
    "no_producer": (no_producer, dict(receivers=2, join="3s", connect="1s")),
    "producer_dies_before_commit": (producer_dies_before_commit, dict(steps=60, params="5M")),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("deltacast")
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--keep", action="store_true", help="keep the work directory even when passing")
    args = parser.parse_args()
    run, overrides = CASES[args.case]
    work = Path(tempfile.mkdtemp(prefix=f"dc-recovery-{args.case}."))
    started = time.monotonic()
    fleet = dcfleet.Fleet(args.deltacast, work, job(**overrides))
    passed = False
    try:
        run(fleet)
        passed = True
    except Failed as e:
        fleet.kill_all()
        dump(fleet, str(e))
    finally:
        fleet.kill_all()
    print(f"{args.case}: {'passed' if passed else 'FAILED'} in {time.monotonic() - started:.1f} s")
    if passed and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
