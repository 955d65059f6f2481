"""A receiver writing what it holds (output.checkpoint_dir) onto a disk that fills up.

    full_disk_test.py PATH/TO/deltacast [--keep]

Real processes on 127.0.0.1 (tests/integration/recovery/dcfleet.py): a producer following a
trainer's checkpoint directory (trainer.kind watch, a 2M-parameter model in 3 shards with files
beside them) and 2 receivers writing checkpoint dirs. Rank 1 writes onto its own tmpfs (a real
ENOSPC, sized with `mount -o remount,size=`; exit 77 where no tmpfs can be mounted: not root, or
no CAP_SYS_ADMIN), rank 2 onto /tmp.
  1. versions 1 and 2 are written;
  2. the disk is shrunk to what it holds plus the version's tensor and side-file bytes and a page:
     the space check passes, the write of version 3 does not fit. The refit goes on (version 3
     commits on both receivers), the failed write leaves no partial directory behind, latest
     still names version 2, whole (`deltacast verify` against the trainer's checkpoint);
  3. the disk is shrunk to what it holds: version 4's space check fails and nothing is written
     (the log says how much is free and how much is needed);
  4. the disk is given room again: the writer retries on its own and latest becomes version 4,
     bit for bit the trainer's checkpoint, with no partial directory and keep 2 honoured;
  5. the disk is full again when the run ends (version 5 committed, then SIGTERM): rank 1 exits
     non-zero naming the disk, its latest is still version 4, whole; rank 2 exits 0 holding 5.
Standard library only.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from watch_test import check, drop, run_and_exit, same_version_dir, tensors_sha256, with_side_files, written

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recovery"))
import dcfleet  # noqa: E402

PAGE = 4096


def used_bytes(mount: Path) -> int:
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def resize(mount: Path, size: int) -> None:
    size = -(-size // PAGE) * PAGE
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount)], check=True)


def needed_bytes(checkpoint: Path) -> int:
    """What the writer's space check counts for a version: its tensors' bytes and side files."""
    total = 0
    for p in checkpoint.iterdir():
        if p.name.endswith(".safetensors"):
            data = p.read_bytes()
            total += len(data) - 8 - int.from_bytes(data[:8], "little")
        elif p.name != "model.safetensors.index.json":
            total += p.stat().st_size
    return total


def wait_for(what: str, condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        check(time.monotonic() < deadline, what)
        time.sleep(0.1)


def log_of(fleet: dcfleet.Fleet, rank: int) -> str:
    return fleet.current[rank].log.read_text(errors="replace")


def latest_name(out: Path) -> str:
    link = out / "latest"
    return os.readlink(link) if link.is_symlink() else ""


def partials(out: Path) -> list:
    return [p.name for p in out.iterdir() if p.name.endswith(".partial")] if out.exists() else []


def run(dc: str, work: Path, made: Path, mount: Path) -> None:
    w = work / "ckpts"
    w.mkdir()
    src = [with_side_files(made / f"step-000{i}", work / f"side-{i}", i) for i in range(5)]
    drop(src[0], w / "e-1")
    out1, out2 = mount / "out", work / "out-2"
    job = dcfleet.JobConfig(receivers=2, chunk_bytes="256KiB", peer="5s", join="60s",
                            trainer_yaml=f"  kind: watch\n  dir: {w}\n  steps: 0\n")
    with dcfleet.Fleet(dc, work / "fleet", job) as fleet:
        fleet.start_receiver(1, extra=["--set", f"output.checkpoint_dir={out1}"])
        fleet.start_receiver(2, extra=["--set", f"output.checkpoint_dir={out2}"])
        fleet.start_producer()
        check(fleet.wait_line(r"full checkpoint \(version 1\)", 60), "no bootstrap:\n" + fleet.tail(0, 20))
        drop(src[1], w / "e-2")
        check(fleet.wait_line(r"^step 1: version 2 ", 60), "e-2 was not sent:\n" + fleet.tail(0, 20))
        wait_for("rank 1 did not write version 2", lambda: latest_name(out1) == "v2", 60)

        # 2. Room for the version's bytes as the space check counts them, not for its files.
        resize(mount, used_bytes(mount) + needed_bytes(src[2]) + PAGE)
        drop(src[2], w / "e-3")
        check(fleet.wait_line(r"^step 2: version 3 .*verified 2/2", 60), "version 3 did not commit:\n" + fleet.tail(0, 20))
        wait_for("rank 1 logged no failed write of version 3:\n" + fleet.tail(1, 20),
                 lambda: "version 3 not written" in log_of(fleet, 1), 30)
        text = log_of(fleet, 1)
        check("No space left on device" in text, "the failed write does not say why:\n" + fleet.tail(1, 10))
        check("less than the" not in text, "the space check refused version 3 (the disk was sized for it to pass)")
        check(partials(out1) == [], f"a failed write left {partials(out1)}")
        check(latest_name(out1) == "v2", f"latest names {latest_name(out1)} after the failed write")
        same_version_dir(dc, out1 / "latest", src[1], "rank 1 latest while the disk is full")

        # 3. No room at all: the space check refuses, nothing is written.
        resize(mount, used_bytes(mount))
        drop(src[3], w / "e-4")
        check(fleet.wait_line(r"^step 3: version 4 .*verified 2/2", 60), "version 4 did not commit:\n" + fleet.tail(0, 20))
        wait_for("rank 1 logged no space check for version 4:\n" + fleet.tail(1, 20),
                 lambda: "version 4 not written" in log_of(fleet, 1) and "less than the" in log_of(fleet, 1), 30)
        check(partials(out1) == [] and latest_name(out1) == "v2", f"{partials(out1)}, latest {latest_name(out1)}")

        # 4. Room again: the writer retries by itself.
        resize(mount, 64 << 20)
        wait_for("rank 1 did not write version 4 once the disk had room:\n" + fleet.tail(1, 20),
                 lambda: latest_name(out1) == "v4", 60)
        check("version 4 written after" in log_of(fleet, 1), "no line says the writes resumed")
        written(dc, out1, src[3], src, 1)  # latest = e-4 bit for bit, keep 2 (v2, v4), no partial

        # 5. Full when the run ends.
        resize(mount, used_bytes(mount))
        drop(src[4], w / "e-5")
        check(fleet.wait_line(r"^step 4: version 5 .*verified 2/2", 60), "version 5 did not commit:\n" + fleet.tail(0, 20))
        wait_for("rank 1 logged no space check for version 5", lambda: "version 5 not written" in log_of(fleet, 1), 30)
        fleet.signal(0, signal.SIGTERM)
        check(fleet.wait_producer(30) == 0, "SIGTERM: producer status " + str(fleet.producer.poll()))
        statuses = fleet.wait_receivers(60)
        check(statuses[2] == 0 and statuses[1] not in (0, None), f"receiver exit statuses {statuses}")
        check("output.checkpoint_dir" in fleet.tail(1, 3) and "less than the" in fleet.tail(1, 3),
              "rank 1's exit does not name the full disk:\n" + fleet.tail(1, 5))
        check(latest_name(out1) == "v4" and partials(out1) == [], f"after the run: latest {latest_name(out1)}")
        same_version_dir(dc, out1 / "latest", src[3], "rank 1 latest after the run")
        s2 = fleet.summary(2)
        want = tensors_sha256(made / "step-0004")
        check(s2["version"] == 5 and s2["sha256"] == want and s2["checkpoint_dir"]["latest"] == 5, f"rank 2: {s2}")
        written(dc, out2, src[4], src, 2)
        failed = log_of(fleet, 1).count("not written")
        print(f"ok: a full disk stops no refit and leaves latest whole ({failed} failure lines logged)")


def main():
    dc = sys.argv[1]
    keep = "--keep" in sys.argv
    if os.geteuid() != 0:
        print("mounting a size-limited tmpfs needs root")
        sys.exit(77)
    work = Path(tempfile.mkdtemp(prefix="dc-fulldisk-"))
    made, mount = work / "made", work / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if mounted.returncode != 0:  # root without CAP_SYS_ADMIN (a container): nothing to test with
        print("cannot mount a tmpfs here: " + mounted.stdout.decode(errors="replace").strip())
        shutil.rmtree(work, ignore_errors=True)
        sys.exit(77)

    def body():
        subprocess.run([dc, "synth", "--out", str(made), "--params", "2M", "--steps", "4", "--seed", "11",
                        "--shards", "3"], check=True, stdout=subprocess.DEVNULL)
        run(dc, work, made, mount)

    run_and_exit(work, keep, body, cleanup=lambda: subprocess.run(["umount", "-l", str(mount)], check=False))


if __name__ == "__main__":
    main()
