"""`deltacast run` with trainer.kind watch: the producer follows a trainer's checkpoint directory.

    watch_test.py PATH/TO/deltacast [--keep]

Real processes on 127.0.0.1 (tests/integration/recovery/dcfleet.py), 2 receivers, a 2M-parameter
model written by `deltacast synth --shards 3` (Hugging Face sharded directories):
  1. two checkpoints are present at start: the bootstrap is the later one, the older is ignored;
  2. a checkpoint dropped half-written (its index and 2 of its 3 shards) is waited for, not read:
     no version commits until its last shard lands; a name sorting before the current version
     appears meanwhile and is ignored;
  3. the next checkpoint lands (written as .tmp, renamed): trainer.steps 2 reached, the producer
     says BYE; every receiver's SHA-256 equals the producer's and an independent SHA-256 of the
     last checkpoint's tensors (read here from its shards, in name order); the report names each
     step's checkpoint and the time from its appearance to its commit;
  4. trainer.steps 0: a checkpoint of another model stops the producer with an error naming it;
  5. trainer.steps 0: SIGTERM ends the producer cleanly (exit 0, BYE, receivers exit 0).
Standard library only.
"""

import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recovery"))
import dcfleet  # noqa: E402


class Failed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failed(message)


def tensors_sha256(checkpoint: Path) -> str:
    """SHA-256 of every tensor's bytes, tensors in name order (the canonical manifest order)."""
    found = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        data = shard.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            found[name] = data[8 + n + begin:8 + n + end]
    h = hashlib.sha256()
    for name in sorted(found, key=lambda s: s.encode()):
        h.update(found[name])
    return h.hexdigest()


def job(watch_dir: Path, steps: int) -> dcfleet.JobConfig:
    return dcfleet.JobConfig(receivers=2, chunk_bytes="256KiB", peer="5s", join="60s",
                             trainer_yaml=f"  kind: watch\n  dir: {watch_dir}\n  steps: {steps}\n")


def drop(src: Path, dst: Path, skip=()):
    """Copies checkpoint directory src to dst as a trainer would write it: into dst.tmp, then a
    rename (files in `skip` are left out: a half-written checkpoint)."""
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copytree(src, tmp, ignore=lambda _d, names: [n for n in names if n in skip])
    os.rename(tmp, dst)


def follow(dc: str, work: Path, made: Path) -> None:
    w = work / "phase1-ckpts"
    w.mkdir()
    drop(made / "step-0000", w / "ckpt-1")
    drop(made / "step-0001", w / "ckpt-2")
    with dcfleet.Fleet(dc, work / "phase1", job(w, 2)) as fleet:
        fleet.start()
        check(fleet.wait_line(r"full checkpoint \(version 1\)", 60), "no bootstrap:\n" + fleet.tail(0, 20))
        check(fleet.wait_line(r"version 1 is checkpoint ckpt-2 ", 1) is not None,
              "the bootstrap is not the latest checkpoint present at start:\n" + fleet.tail(0, 20))
        # Half-written: the index and two of three shards.
        drop(made / "step-0002", w / "ckpt-3", skip={"model-00003-of-00003.safetensors"})
        drop(made / "step-0000", w / "ckpt-0")  # sorts before the current version: ignored
        check(fleet.wait_line(r"^step 1:", 2.0) is None, "a half-written checkpoint was sent")
        shutil.copy(made / "step-0002" / "model-00003-of-00003.safetensors", w / "ckpt-3")
        check(fleet.wait_line(r"^step 1: version 2 ", 60), "the completed checkpoint was not sent:\n" + fleet.tail(0, 20))
        drop(made / "step-0003", w / "ckpt-4")
        check(fleet.wait_line(r"^step 2: version 3 ", 60), "the next checkpoint was not sent:\n" + fleet.tail(0, 20))
        check(fleet.wait_producer(60) == 0, "producer exit status " + str(fleet.producer.poll()) + ":\n" + fleet.tail(0, 20))
        statuses = fleet.wait_receivers(60)
        check(all(s == 0 for s in statuses.values()), f"receiver exit statuses {statuses}")
        report = fleet.report()
        want = tensors_sha256(made / "step-0003")
        check(report["sha256"] == want, f"the producer's last version {report['sha256']} is not ckpt-4's {want}")
        for rank in (1, 2):
            s = fleet.summary(rank)
            check(s["version"] == 3 and s["sha256"] == want, f"receiver {rank} holds {s}, not version 3 = ckpt-4")
        names = [st.get("checkpoint") for st in report["steps"]]
        check(names == ["ckpt-3", "ckpt-4"], f"the report's steps name {names}")
        delays = [st["appeared_to_commit_seconds"] for st in report["steps"]]
        check(delays[0] > 1.5 and all(d > 0 for d in delays), f"appeared_to_commit_seconds {delays}")
        check(report["max_rss_anon_bytes"] > 0 and report["trainer_kind"] == "watch", str(report))
        log = (work / "phase1" / "rank-0.log").read_text(errors="replace")
        check("ignoring checkpoint ckpt-0" in log, "no warning for the checkpoint that sorts before")
        print(f"ok: follows the directory (steps {names}, appeared->commit {[round(d, 3) for d in delays]} s, "
              f"RssAnon max {report['max_rss_anon_bytes'] / 2**20:.1f} MiB for a "
              f"{report['checkpoint_bytes'] / 2**20:.1f} MiB model)")


def other_model(dc: str, work: Path, made: Path, other: Path) -> None:
    w = work / "phase2-ckpts"
    w.mkdir()
    drop(made / "step-0000", w / "a-1")
    with dcfleet.Fleet(dc, work / "phase2", job(w, 0)) as fleet:
        fleet.start()
        check(fleet.wait_line(r"full checkpoint \(version 1\)", 60), "no bootstrap:\n" + fleet.tail(0, 20))
        drop(other / "step-0001", w / "a-2")
        code = fleet.wait_producer(60)
        check(code not in (0, None), f"the producer went on with another model (status {code})")
        log = (work / "phase2" / "rank-0.log").read_text(errors="replace")
        check("a-2 does not hold the model the receivers hold" in log, "no clear error:\n" + fleet.tail(0, 10))
        print("ok: a checkpoint of another model stops the producer, naming it")


def sigterm(dc: str, work: Path, made: Path) -> None:
    w = work / "phase3-ckpts"
    w.mkdir()
    drop(made / "step-0000", w / "b-1")
    with dcfleet.Fleet(dc, work / "phase3", job(w, 0)) as fleet:
        fleet.start()
        check(fleet.wait_line(r"full checkpoint \(version 1\)", 60), "no bootstrap:\n" + fleet.tail(0, 20))
        fleet.signal(0, signal.SIGTERM)
        check(fleet.wait_producer(30) == 0, "SIGTERM: producer status " + str(fleet.producer.poll()))
        statuses = fleet.wait_receivers(30)
        check(all(s == 0 for s in statuses.values()), f"SIGTERM: receiver statuses {statuses}")
        print("ok: SIGTERM ends a producer following the directory cleanly")


def main():
    dc = sys.argv[1]
    keep = "--keep" in sys.argv
    work = Path(tempfile.mkdtemp(prefix="dc-watch-"))
    made, other = work / "made", work / "other"
    subprocess.run([dc, "synth", "--out", str(made), "--params", "2M", "--steps", "3", "--seed", "9", "--shards", "3"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([dc, "synth", "--out", str(other), "--params", "1M", "--steps", "1", "--seed", "9", "--shards", "2"],
                   check=True, stdout=subprocess.DEVNULL)
    passed = False
    try:
        follow(dc, work, made)
        other_model(dc, work, made, other)
        sigterm(dc, work, made)
        passed = True
    except Failed as e:
        print(f"FAIL: {e}", file=sys.stderr)
    finally:
        if passed and not keep:
            shutil.rmtree(work, ignore_errors=True)
        elif not passed:
            print(f"kept {work}", file=sys.stderr)
    print("PASS" if passed else "FAILED")
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
