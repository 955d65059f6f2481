"""`deltacast run --placement`: receivers that hold only their tensor-parallel shard, as processes.

    placed_run_test.py PATH/TO/deltacast

A producer follows a trainer's checkpoints (trainer.kind watch; 2M parameters from `deltacast
synth`, one new checkpoint per step dropped while the job runs) and serves 4 receivers on
127.0.0.1: rank 1 and 2 are TP ranks 0 and 1 of 2, rank 3 is TP rank 3 of 4 (its vocabulary
buffers end in padding rows), each started with `--placement p{rank}.yaml` written by `deltacast
placement tp`; rank 4 holds the whole model. Every step commits with 4 of 4 verified. At the end
each placed receiver's buffers (its --summary's SHA-256, over its buffers in placement order) equal
the shard `deltacast placement check --extract` cuts from the last checkpoint (padding zero), and
the whole receiver's equal the checkpoint. Rank 1 also writes its shard as checkpoints
(`output.checkpoint_dir`): after step 2 it is killed (SIGKILL) and restarted; it rejoins with the
version its latest shard holds (started_at_version 3: by replay, not from scratch), and its last
written shard equals the extract tensor by tensor. A placement file with a slice outside the model makes
the receiver exit 1: the producer refuses its HELLO, naming the slice.
Standard library only.
"""

import hashlib
import json
import time
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recovery"))
import dcfleet  # noqa: E402

STEPS = 3


class Failed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failed(message)


def safetensors(path: Path) -> dict:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {name: data[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]]
            for name, e in header.items() if name != "__metadata__"}


def sha256(chunks) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


def placement_buffers(path: Path) -> list:
    """The buffer names of a placement file `deltacast placement tp` wrote, in order."""
    names = []
    for line in path.read_text().splitlines():
        if line and not line.startswith((" ", "#", "-")) and line.rstrip().endswith(":"):
            names.append(json.loads(line.rstrip()[:-1]) if line.startswith('"') else line.rstrip()[:-1])
    return names


def main() -> None:
    dc = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="dc-placed-run.") as tmp:
        work = Path(tmp)
        steps, watch = dcfleet.synth_watch(dc, work, "2M", STEPS, 5)

        shards = {1: (0, 2), 2: (1, 2), 3: (3, 4)}
        placements = {}
        for rank, (tp_rank, tp_size) in shards.items():
            placements[rank] = work / f"p{rank}.yaml"
            subprocess.run([dc, "placement", "tp", "--checkpoint", str(steps[0]), "--rank", str(tp_rank), "--size",
                            str(tp_size), "-o", str(placements[rank])], check=True)

        job = dcfleet.JobConfig(receivers=4, chunk_bytes="256KiB", peer="5s", join="60s",
                                trainer_yaml=f"  kind: watch\n  dir: {watch}\n  steps: {STEPS}\n")
        ck1 = work / "ck1"

        def extra(rank):
            out = ["--placement", str(placements[rank])]
            return out + ["--set", f"output.checkpoint_dir={ck1}"] if rank == 1 else out

        def latest_version(directory):
            try:
                return json.loads((directory / "latest" / "deltacast.json").read_text())["version"]
            except (OSError, ValueError, KeyError):
                return 0

        with dcfleet.Fleet(dc, work / "job", job) as fleet:
            for rank in shards:
                fleet.start_receiver(rank, extra=extra(rank))
            fleet.start_receiver(4)
            fleet.start_producer()
            check(fleet.wait_line(r"full checkpoint \(version 1\)", 60), "no bootstrap:\n" + fleet.tail(0, 20))
            for s in range(1, STEPS + 1):
                dcfleet.drop(steps, watch, s)
                check(fleet.wait_line(rf"^step {s}: version {s + 1} .* verified 4/4", 60),
                      f"step {s} did not commit on every receiver:\n" + fleet.tail(0, 20) + fleet.tail(1, 20))
                if s == 2:
                    # Rank 1 wrote version 3's shard; killed and restarted, it rejoins from it.
                    deadline = time.monotonic() + 30
                    while latest_version(ck1) < 3:
                        check(time.monotonic() < deadline, "rank 1 did not write version 3:\n" + fleet.tail(1, 20))
                        time.sleep(0.1)
                    fleet.kill(1)
                    fleet.start_receiver(1, extra=extra(1))
                    deadline = time.monotonic() + 60
                    while "caught up to version 3" not in fleet.tail(1, 200):
                        check(time.monotonic() < deadline, "rank 1 did not rejoin:\n" + fleet.tail(1, 30))
                        time.sleep(0.1)
            check(fleet.wait_producer(60) == 0, "the producer did not exit 0:\n" + fleet.tail(0, 20))
            codes = fleet.wait_receivers(60)
            check(all(code == 0 for code in codes.values()),
                  f"receivers exited {codes}:\n" + "".join(fleet.tail(r, 10) for r in range(1, 5)))
            last = steps[-1]
            for rank in shards:
                summary = fleet.summary(rank)
                check(summary is not None and summary["version"] == STEPS + 1, f"rank {rank}: {summary}")
                cut = work / f"cut{rank}.safetensors"
                subprocess.run([dc, "placement", "check", str(placements[rank]), "--checkpoint", str(last),
                                "--extract", str(cut)], check=True, stdout=subprocess.DEVNULL)
                buffers = safetensors(cut)
                order = placement_buffers(placements[rank])
                check(sorted(order) == sorted(buffers), f"rank {rank}: buffers {order} vs {sorted(buffers)}")
                want = sha256(buffers[name] for name in order)
                check(summary["sha256"] == want,
                      f"rank {rank} (TP {shards[rank][0]} of {shards[rank][1]}) does not hold its shard of the last "
                      f"checkpoint: {summary['sha256']} != {want}")
            check(fleet.summary(1)["started_at_version"] == 3,
                  f"rank 1 did not rejoin from its latest shard: {fleet.summary(1)}")
            record = json.loads((ck1 / "latest" / "deltacast.json").read_text())
            check(record["version"] == STEPS + 1 and "files_digest" in record, f"rank 1's latest: {record}")
            written = safetensors(ck1 / "latest" / "model.safetensors")
            cut = safetensors(work / "cut1.safetensors")
            check(sorted(written) == sorted(cut) and all(written[n] == cut[n] for n in cut),
                  "rank 1's last written shard differs from the last checkpoint's")
            whole = fleet.summary(4)
            tensors = safetensors(last)
            want = sha256(tensors[name] for name in sorted(tensors, key=lambda s: s.encode()))
            check(whole["sha256"] == want, f"the whole receiver differs: {whole['sha256']} != {want}")
            # Every receiver names the version it holds alike.
            digests = {fleet.summary(r)["digest"] for r in range(1, 5)}
            check(len(digests) == 1, f"the receivers name the last version differently: {digests}")

        # A placement the model does not have: refused at HELLO naming the slice; the receiver exits 1.
        bad = work / "bad.yaml"
        bad.write_text('w: [["model.norm.weight", 0, 0, 100000]]\n')
        job = dcfleet.JobConfig(receivers=1, join="5s")
        with dcfleet.Fleet(dc, work / "bad", job) as fleet:
            fleet.start_receiver(1, extra=["--placement", str(bad)])
            fleet.start_producer()
            codes = fleet.wait_receivers(60)
            log = (work / "bad" / "rank-1.log").read_text(errors="replace")
            check(codes.get(1) == 1 and "model.norm.weight" in log and "0:100000" in log, f"exit {codes}: {log[-2000:]}")
    print("placed_run_test: OK")


if __name__ == "__main__":
    try:
        main()
    except Failed as e:
        sys.exit(f"FAIL: {e}")
