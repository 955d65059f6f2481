"""`deltacast run` with trainer.kind watch: the producer follows a trainer's checkpoint directory.

    watch_test.py PATH/TO/deltacast [--keep]

Real processes on 127.0.0.1 (tests/integration/recovery/dcfleet.py), 2 receivers, a 2M-parameter
model written by `deltacast synth --shards 3` (Hugging Face sharded directories):
  1. two checkpoints are present at start: the bootstrap is the later one, the older is ignored;
  2. a checkpoint dropped half-written (its index and 2 of its 3 shards) is waited for, not read:
     no version commits until its last shard lands; a name sorting before the current version
     appears meanwhile and is ignored;
  3. the directory cannot be listed for a while (renamed away and back, as a network file system's
     hiccup): the producer warns and waits;
     the next checkpoint lands (written as .tmp, renamed): trainer.steps 2 reached, the producer
     says BYE; every receiver's SHA-256 equals the producer's and an independent SHA-256 of the
     last checkpoint's tensors (read here from its shards, in name order); the report names each
     step's checkpoint and the time from its appearance to its commit, and says the checkpoints
     were read with pread (trainer.read's default);
  4. trainer.steps 0: a checkpoint of another model stops the producer with an error naming it;
  5. trainer.steps 0: SIGTERM ends the producer cleanly (exit 0, BYE, receivers exit 0);
  6. receivers write what they hold (the producer reading through mappings, trainer.read map;
     output.checkpoint_dir, with {rank}; one behind a slow disk that
     takes 8 s per version, longer than timeouts.peer): no member is failed, the slow one skips
     versions committed during its write, and each receiver's latest is the trainer's last
     checkpoint bit for bit, in its shard layout (file names, index, __metadata__) with the files
     beside the shards; from the third checkpoint on the trainer changes config.json, adds
     generation_config.json and rewrites every shard's __metadata__: each version directory left
     holds exactly that version's checkpoint files (LAYOUT); keep 2 leaves two version directories
     and no partial one;
  7. a receiver killed in the middle of version 3 and restarted rejoins from its latest (version
     2) by replay, not by a snapshot, and ends on the last checkpoint like the others; version 3
     changed the layout while it was away: it writes v3 and v4 with their own files too.
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
        # The directory cannot be listed for a while (a network file system's hiccup): the
        # producer waits for it instead of ending the run.
        away = w.with_name(w.name + ".away")
        os.rename(w, away)
        log0 = work / "phase1" / "rank-0.log"
        deadline = time.monotonic() + 20
        while "cannot list it" not in log0.read_text(errors="replace"):
            check(time.monotonic() < deadline and fleet.producer.poll() is None,
                  "the producer did not wait for its directory:\n" + fleet.tail(0, 10))
            time.sleep(0.1)
        time.sleep(0.5)
        check(fleet.producer.poll() is None, "the producer ended while its directory was away:\n" + fleet.tail(0, 10))
        os.rename(away, w)
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
        reads = [st.get("read") for st in report["steps"]]
        check(reads == ["pread", "pread"], f"the checkpoints were not read with pread: {reads}")
        log = (work / "phase1" / "rank-0.log").read_text(errors="replace")
        check("ignoring checkpoint ckpt-0" in log, "no warning for the checkpoint that sorts before")
        check("can be listed again" in log, "no line says the directory came back")
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


def set_metadata(shard: Path, metadata: dict) -> None:
    """Rewrites a safetensors file's __metadata__ (its tensors' bytes stay; the header is padded
    with spaces to a multiple of 8 bytes, as the format allows)."""
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    shard.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])


def with_side_files(src: Path, dst: Path, step: int) -> Path:
    """A copy of checkpoint src with the small files a trainer writes beside its shards. From step 2
    on the trainer changes them (config.json, a new generation_config.json) and every shard's
    __metadata__: receivers must write each version with its own checkpoint's files."""
    shutil.copytree(src, dst)
    (dst / "config.json").write_text(json.dumps({"model_type": "llama", "layers": 4, "step": min(step, 2)}) + "\n")
    (dst / "tokenizer.model").write_bytes(bytes(range(256)) * 3)
    if step >= 2:
        (dst / "generation_config.json").write_text(json.dumps({"top_p": 0.9, "step": step}) + "\n")
        for shard in dst.glob("*.safetensors"):
            set_metadata(shard, {"format": "pt", "trainer_step": str(step)})
    return dst


def shard_layout(checkpoint: Path, metadata: bool = False) -> dict:
    """File name -> tensor names in file order (or, with metadata, its __metadata__) for every
    shard; the index's weight map."""
    out = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        data = shard.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
        out[shard.name] = header.get("__metadata__") if metadata else names
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    return {"shards": out, "weight_map": index["weight_map"]}


def same_version_dir(dc: str, target: Path, want: Path, what: str) -> None:
    """`target` (a receiver's v<k>) is trainer checkpoint `want` bit for bit: tensors, shard layout,
    each shard's __metadata__, the index, and exactly the trainer's files beside the shards (same
    names, same bytes; deltacast.json is the receiver's own record)."""
    rc = subprocess.run([dc, "verify", str(target), str(want)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    check(rc.returncode == 0, f"{what}: {target.name} is not {want.name}: {rc.stdout.decode(errors='replace')}")
    check(tensors_sha256(target) == tensors_sha256(want), f"{what}: tensor bytes differ")
    check(shard_layout(target) == shard_layout(want), f"{what}: {target} is not in the trainer's shard layout")
    check(shard_layout(target, True)["shards"] == shard_layout(want, True)["shards"],
          f"{what}: {target}'s __metadata__ is not {want.name}'s")
    index = json.loads((target / "model.safetensors.index.json").read_text())
    want_index = json.loads((want / "model.safetensors.index.json").read_text())
    check(index.get("metadata") == want_index.get("metadata"), f"{what}: the index metadata differs")
    side = sorted(p.name for p in want.iterdir() if not p.name.endswith(".safetensors") and p.name != "model.safetensors.index.json")
    got = sorted(p.name for p in target.iterdir()
                 if not p.name.endswith(".safetensors") and p.name not in ("model.safetensors.index.json", "deltacast.json"))
    check(got == side, f"{what}: files beside the shards {got}, the trainer's {side}")
    for name in side:
        check((target / name).read_bytes() == (want / name).read_bytes(), f"{what}: {name} differs from {want.name}'s")


def written(dc: str, out: Path, want: Path, sources: list, rank: int, keep: int = 2) -> None:
    """out/latest must be `want` bit for bit, in its layout, with its own side files and
    __metadata__ (the trainer changed them after the bootstrap); every version directory left,
    v<k>, must be version k's checkpoint sources[k - 1] likewise."""
    latest = out / "latest"
    check(latest.is_symlink(), f"rank {rank}: no {latest} symlink")
    target = latest.resolve()
    same_version_dir(dc, target, want, f"rank {rank} latest")
    versions = sorted(p.name for p in out.iterdir() if p.name.startswith("v"))
    check(len(versions) == keep and target.name in versions, f"rank {rank}: keep {keep} left {versions}")
    for name in versions:
        same_version_dir(dc, out / name, sources[int(name[1:]) - 1], f"rank {rank} {name}")
    check(not [p for p in out.iterdir() if p.name.endswith(".partial")], f"rank {rank}: a partial directory is left")


def write_dirs(dc: str, work: Path, made: Path) -> None:
    w = work / "phase6-ckpts"
    w.mkdir()
    src = [with_side_files(made / f"step-000{i}", work / f"side-{i}", i) for i in range(4)]
    drop(src[0], w / "c-1")
    out = work / "phase6-out-{rank}"
    job6 = dcfleet.JobConfig(receivers=2, chunk_bytes="256KiB", peer="3s", join="60s",
                             trainer_yaml=f"  kind: watch\n  dir: {w}\n  steps: 3\n  read: map\n")
    extra = ["--set", f"output.checkpoint_dir={out}", "--set", "output.keep=2"]
    with dcfleet.Fleet(dc, work / "phase6", job6) as fleet:
        fleet.start_receiver(1, extra=extra)
        fleet.start_receiver(2, extra=extra + ["--slow-disk", "512KiB"])
        fleet.start_producer()
        check(fleet.wait_line(r"full checkpoint \(version 1\)", 60), "no bootstrap:\n" + fleet.tail(0, 20))
        drop(src[1], w / "c-2", skip={"model-00002-of-00003.safetensors"})
        time.sleep(1.0)
        shutil.copy(src[1] / "model-00002-of-00003.safetensors", w / "c-2")
        check(fleet.wait_line(r"^step 1: version 2 ", 60), "c-2 was not sent:\n" + fleet.tail(0, 20))
        drop(src[2], w / "c-3")
        drop(src[3], w / "c-4")
        check(fleet.wait_line(r"^step 3: version 4 ", 60), "c-4 was not sent:\n" + fleet.tail(0, 20))
        check(fleet.wait_producer(60) == 0, "producer status " + str(fleet.producer.poll()) + ":\n" + fleet.tail(0, 20))
        statuses = fleet.wait_receivers(90)
        check(all(s == 0 for s in statuses.values()), f"receiver exit statuses {statuses}")
        report = fleet.report()
        failed = [m for st in report["steps"] for m in st.get("failed_members", [])]
        check(not failed and report["ok"], f"writing stalled the tree: failed members {failed}")
        reads = [st.get("read") for st in report["steps"]]
        check(reads == ["map"] * 3, f"read: map was not used: {reads}")
        for rank in (1, 2):
            s = fleet.summary(rank)
            check(s["version"] == 4 and s["checkpoint_dir"]["latest"] == 4, f"rank {rank}: {s}")
            written(dc, Path(str(out).replace("{rank}", str(rank))), src[3], src, rank)
        slow = fleet.summary(2)["checkpoint_dir"]
        check(slow["skipped"] >= 1, f"the slow disk skipped no version: {slow}")
        print(f"ok: receivers write what they hold (fast: {fleet.summary(1)['checkpoint_dir']}, slow: {slow})")


def rejoin_from_latest(dc: str, work: Path, made: Path) -> None:
    w = work / "phase7-ckpts"
    w.mkdir()
    src = [with_side_files(made / f"step-000{i}", work / f"side7-{i}", i) for i in range(4)]
    drop(src[0], w / "d-1")
    out = work / "phase7-out-{rank}"
    job7 = dcfleet.JobConfig(receivers=2, chunk_bytes="256KiB", peer="3s", join="60s",
                             trainer_yaml=f"  kind: watch\n  dir: {w}\n  steps: 3\n")
    extra = ["--set", f"output.checkpoint_dir={out}"]
    out2 = Path(str(out).replace("{rank}", "2"))
    with dcfleet.Fleet(dc, work / "phase7", job7) as fleet:
        fleet.start_receiver(1, extra=extra)
        fleet.start_receiver(2, fault="kill@3", extra=extra)
        fleet.start_producer()
        check(fleet.wait_line(r"full checkpoint \(version 1\)", 60), "no bootstrap:\n" + fleet.tail(0, 20))
        drop(src[1], w / "d-2")
        check(fleet.wait_line(r"^step 1: version 2 ", 60), "d-2 was not sent:\n" + fleet.tail(0, 20))
        deadline = time.monotonic() + 60
        while not (out2 / "latest").is_symlink() or os.readlink(out2 / "latest") != "v2":
            check(time.monotonic() < deadline, "rank 2 did not write version 2")
            time.sleep(0.1)
        drop(src[2], w / "d-3")
        check(fleet.wait_line(r"^step 2: version 3 .*repaired: rank 2", 60), "rank 2's death:\n" + fleet.tail(0, 20))
        check(fleet.current[2].wait(30) is not None, "rank 2 did not die")
        fleet.start_receiver(2, extra=extra)
        log0 = work / "phase7" / "rank-0.log"
        deadline = time.monotonic() + 60
        while "rank 2 caught up to version 3" not in log0.read_text(errors="replace"):
            check(time.monotonic() < deadline, "rank 2 did not catch up:\n" + log0.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        text = log0.read_text(errors="replace")
        check("rank 2 rejoins holding version 2" in text and "rank 2 catches up from version 2 to 3 by replay" in text,
              "rank 2 did not rejoin from its latest by replay:\n" + text[-3000:])
        drop(src[3], w / "d-4")
        check(fleet.wait_line(r"^step 3: version 4 .*verified 2/2", 60), "d-4 was not sent to both:\n" + fleet.tail(0, 20))
        check(fleet.wait_producer(60) == 0, "producer status " + str(fleet.producer.poll()))
        statuses = fleet.wait_receivers(60)
        check(statuses.get(1) == 0 and fleet.current[2].poll() == 0, f"receiver statuses {statuses}")
        s2 = json.loads(fleet.current[2].summary.read_text())
        check(s2["started_at_version"] == 2 and s2["version"] == 4, f"restarted rank 2: {s2}")
        for rank in (1, 2):
            written(dc, Path(str(out).replace("{rank}", str(rank))), src[3], src, rank)
        print("ok: a restarted receiver rejoins from its latest by replay, and writes each version with its files")


def run_and_exit(work: Path, keep: bool, body, cleanup=lambda: None) -> None:
    """Runs body(); a failed check prints FAIL and its reason. Then cleanup(); `work` is removed
    when it passed (unless --keep), named when it failed; prints PASS or FAILED and exits 0 or 1."""
    passed = False
    try:
        body()
        passed = True
    except Failed as e:
        print(f"FAIL: {e}", file=sys.stderr)
    finally:
        cleanup()
        if passed and not keep:
            shutil.rmtree(work, ignore_errors=True)
        elif not passed:
            print(f"kept {work}", file=sys.stderr)
    print("PASS" if passed else "FAILED")
    sys.exit(0 if passed else 1)


def main():
    dc = sys.argv[1]
    keep = "--keep" in sys.argv
    work = Path(tempfile.mkdtemp(prefix="dc-watch-"))
    made, other = work / "made", work / "other"
    subprocess.run([dc, "synth", "--out", str(made), "--params", "2M", "--steps", "3", "--seed", "9", "--shards", "3"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([dc, "synth", "--out", str(other), "--params", "1M", "--steps", "1", "--seed", "9", "--shards", "2"],
                   check=True, stdout=subprocess.DEVNULL)

    def phases():
        follow(dc, work, made)
        other_model(dc, work, made, other)
        sigterm(dc, work, made)
        write_dirs(dc, work, made)
        rejoin_from_latest(dc, work, made)

    run_and_exit(work, keep, phases)


if __name__ == "__main__":
    main()
