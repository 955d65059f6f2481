"""`deltacast run` with object storage (store.*): the producer's tree, a store cluster behind a
gateway and store-only members, as processes against the real S3 server (Ceph RGW) of the
s3_server fixture.

    store_run_test.py PATH/TO/deltacast PATH/TO/s3.env PATH/TO/s3-server.sh

A producer follows a trainer's checkpoints (trainer.kind watch, paced by this script; 2M
parameters from `deltacast synth`) with 7 receivers: ranks 1-2 in its own cluster (its tree),
ranks 3-5 in cluster east (rank 3 the gateway, 4 and 5 its tree), rank 6 in west and rank 7 in
north (each alone: store-only). Faults while it runs:
  * after step 2 the east gateway is killed (SIGKILL) and restarted: it comes back from the store
    (snapshot, then replay) and its members, which kept version 3, rejoin its tree;
  * after step 3 west is killed; it is restarted after step 4 and catches up from the store;
  * during step 5 radosgw itself is killed for 4 s: the tree goes on, the producer's uplink tries
    the publish again until it succeeds, the gateways keep polling.
At the end every receiver holds the last checkpoint bit for bit (SHA-256 of its buffers, and one
digest), and north, which never failed, downloaded at most 1.05x what was published for it (the
whole version 1 plus every delta). Then a second job (retain_versions 2): east's gateway is frozen
(SIGSTOP) until the delta after its version is pruned; it comes back by a snapshot, its cluster's
tree starts again there, and its members catch up to it by a snapshot and end exact. Then bad input: a bucket that does not exist fails the producer
naming it, and a gateway with a wrong secret exits 1 naming S3's refusal, before anything is
applied.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
import placed_run_test  # noqa: E402  (its readers of safetensors files and placement files)

STEPS = 5
CLUSTERS = ["train", "train", "east", "east", "east", "west", "north"]


class Failed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failed(message)


class _Kept:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        shutil.rmtree(self.path, ignore_errors=True)
        Path(self.path).mkdir(parents=True)
        return self.path

    def __exit__(self, *_exc):
        return False


def checkpoint_sha256(path: Path) -> str:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    h = hashlib.sha256()
    for name in sorted((k for k in header if k != "__metadata__"), key=lambda s: s.encode()):
        a, b = header[name]["data_offsets"]
        h.update(data[8 + n + a:8 + n + b])
    return h.hexdigest()


def store_yaml(env: dict, prefix: str, bucket=None, clusters="east, west, north") -> str:
    return (f"producer_cluster: train\n"
            f"store:\n  endpoint: {env['S3_ENDPOINT']}\n  region: {env.get('S3_REGION', 'us-east-1')}\n"
            f"  bucket: {bucket or env['S3_BUCKET']}\n  prefix: {prefix}\n  clusters: [{clusters}]\n"
            f"  poll: 50ms\n  part_bytes: 5MiB\n  retain_versions: 3\n")


def wait_file_text(path: Path, text: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if text in path.read_text(errors="replace"):
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def http_status(server: str, s3_dir: str, url: str) -> str:
    """The HTTP status of a signed HEAD of `url` (scripts/s3-server.sh curl)."""
    r = subprocess.run(["bash", server, "curl", s3_dir, "-I", "-o", "/dev/null", "-w", "%{http_code}", url],
                       capture_output=True, text=True)
    return r.stdout.strip()


def main() -> None:
    dc, env_path, server = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    env = dcfleet.read_env_file(env_path)
    s3_dir = env.get("S3_DIR", str(env_path.parent))
    creds = {"AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"]}
    keep = os.environ.get("DELTACAST_KEEP_TMP")  # a directory to leave the job's files in (debugging)
    with (tempfile.TemporaryDirectory(prefix="dc-store-run.") if not keep else _Kept(keep)) as tmp:
        work = Path(tmp)
        steps, watch = dcfleet.synth_watch(dc, work, "2M", STEPS, 7)
        prefix = f"store-run-{os.getpid()}"
        job = dcfleet.JobConfig(receivers=len(CLUSTERS), clusters=CLUSTERS, chunk_bytes="256KiB", peer="5s",
                                join="60s", producer_loss="60s", extra_yaml=store_yaml(env, prefix),
                                trainer_yaml=f"  kind: watch\n  dir: {watch}\n  steps: {STEPS}\n")
        with dcfleet.Fleet(dc, work / "job", job) as fleet:
            fleet.env.update(creds)
            d = fleet.dir

            def out(rank, instance=0):
                return d / (f"rank-{rank}" + (f".{instance}" if instance else "") + ".out")

            def gateway_reached(rank, version, instance=0, timeout=60):
                # A gateway's tree line, or (alone) its summary at the end: poll its log for the version.
                return wait_file_text(out(rank, instance), f"version {version} through the cluster", timeout)

            fleet.start()
            check(fleet.wait_line(r"full checkpoint \(version 1\).*verified by 2/2", 60),
                  "no bootstrap in the producer's tree:\n" + fleet.tail(0, 20))
            check(wait_file_text(out(3), "2 members joined its tree at version 1", 60),
                  "the east gateway's tree did not start:\n" + fleet.tail(3, 20))
            for s in range(1, STEPS + 1):
                if s == 5:
                    subprocess.run(["bash", server, "kill-rgw", s3_dir], check=True, stdout=subprocess.DEVNULL)
                dcfleet.drop(steps, watch, s)
                check(fleet.wait_line(rf"^step {s}: version {s + 1} .* verified 2/2", 60),
                      f"step {s} did not commit in the producer's tree:\n" + fleet.tail(0, 20))
                if s == 5:
                    time.sleep(4)  # longer than the S3 client's own retries (about 1.5 s)
                    subprocess.run(["bash", server, "restart-rgw", s3_dir], check=True, stdout=subprocess.DEVNULL)
                east_instance = 1 if s >= 3 else 0
                check(gateway_reached(3, s + 1, east_instance, 90),
                      f"version {s + 1} did not reach the east cluster:\n" + fleet.tail(3, 20, east_instance))
                if s == 2:
                    fleet.kill(3)
                    fleet.start_receiver(3)
                    check(wait_file_text(out(3, 1), "2 members joined its tree at version 3", 60),
                          "east's members did not rejoin the restarted gateway:\n" + fleet.tail(3, 20, 1) +
                          fleet.tail(4, 20))
                if s == 3:
                    fleet.kill(6)
                if s == 4:
                    fleet.start_receiver(6)
            check(fleet.wait_producer(120) == 0, "the producer did not exit 0:\n" + fleet.tail(0, 30))
            codes = fleet.wait_receivers(120)
            check(all(code == 0 for code in codes.values()),
                  f"receivers exited {codes}:\n" + "".join(fleet.tail(r, 15) for r in range(1, len(CLUSTERS) + 1)))
            report = fleet.report()
            check(report and report["ok"] and report["version"] == STEPS + 1, f"producer report: {report}")
            store = report["store"]
            check(store["failed"] == 0 and store["deltas"] == STEPS and store["retried"] >= 1,
                  f"the uplink did not publish every version through the outage: {store}")
            want = checkpoint_sha256(steps[-1])
            check(report["sha256"] == want, f"the producer's last version is not the checkpoint: {report['sha256']}")
            for r in range(1, len(CLUSTERS) + 1):
                summary = fleet.summary(r)
                check(summary is not None and summary["version"] == STEPS + 1 and summary["sha256"] == want and
                      summary["digest"] == report["digest"], f"rank {r} ({CLUSTERS[r - 1]}) differs: {summary}")
            for r in (3, 6, 7):
                check(fleet.summary(r).get("gateway"), f"rank {r} was not a gateway: {fleet.summary(r)}")
            west = fleet.summary(6)["store"]
            check(west["snapshots_taken"] >= 1, f"the restarted west member did not start from a snapshot: {west}")
            north = fleet.summary(7)["store"]
            published = report["checkpoint_bytes"] + sum(e["payload_bytes"] for e in report["steps"])
            check(north["snapshots_taken"] == 1 and north["deltas_applied"] == STEPS,
                  f"north did not take version 1 whole and replay every delta: {north}")
            check(north["bytes_received"] <= 1.05 * published,
                  f"north downloaded {north['bytes_received']} bytes for {published} published (> 1.05x)")
            print(f"store_run_test: north downloaded {north['bytes_received']} bytes for {published} published "
                  f"({north['bytes_received'] / published:.4f}x); uplink retried {store['retried']} times")

        # A gateway away for longer than store.retain_versions deltas (frozen by SIGSTOP while the
        # producer's tree goes on): once it runs again, the delta after the version it held is
        # pruned, it takes a snapshot, and its cluster's tree starts again there; its members catch
        # up to it by a snapshot and take the versions after it. Rank 2 is east's gateway, 3 and 4
        # its members (rank 4 placed: tensor-parallel rank 0 of 2, for which the gateway encodes
        # each version again); retain_versions 2.
        jump_clusters = ["train", "east", "east", "east"]
        job = dcfleet.JobConfig(receivers=len(jump_clusters), clusters=jump_clusters, chunk_bytes="256KiB",
                                peer="5s", join="60s", producer_loss="60s",
                                extra_yaml=store_yaml(env, prefix + "-jump", clusters="east").replace(
                                    "retain_versions: 3", "retain_versions: 2"),
                                trainer_yaml=f"  kind: watch\n  dir: {watch}-jump\n  steps: {STEPS}\n")
        Path(f"{watch}-jump").mkdir()
        shutil.copy(steps[0], Path(f"{watch}-jump") / "ckpt-0.safetensors")
        placement = work / "p4.yaml"  # rank 4 holds tensor-parallel rank 0 of 2
        subprocess.run([dc, "placement", "tp", "--checkpoint", str(steps[0]), "--rank", "0", "--size", "2", "-o",
                        str(placement)], check=True, stdout=subprocess.DEVNULL)
        with dcfleet.Fleet(dc, work / "jump", job) as fleet:
            fleet.env.update(creds)
            gateway_log = fleet.dir / "rank-2.out"
            for r in (1, 2, 3):
                fleet.start_receiver(r)
            fleet.start_receiver(4, extra=["--placement", str(placement)])
            fleet.start_producer()
            check(wait_file_text(gateway_log, "2 members joined its tree at version 1", 60),
                  "the east gateway's tree did not start:\n" + fleet.tail(2, 20))
            for s in range(1, STEPS + 1):
                dcfleet.drop(steps, Path(f"{watch}-jump"), s)
                check(fleet.wait_line(rf"^step {s}: version {s + 1} .* verified 1/1", 60),
                      f"step {s} did not commit in the producer's tree:\n" + fleet.tail(0, 20))
                if s == 1:
                    check(wait_file_text(gateway_log, "version 2 through the cluster", 60),
                          "version 2 did not reach the east cluster:\n" + fleet.tail(2, 20))
                    fleet.signal(2, signal.SIGSTOP)  # away for versions 3-5: delta 3 is pruned by 5
                if s == 4:
                    # The uplink publishes (and prunes) on its own thread: wait until delta 3 is gone.
                    delta3 = (f"{env['S3_ENDPOINT']}/{env['S3_BUCKET']}/{prefix}-jump/deltas/"
                              f"v{3:020d}/manifest.json")
                    check(wait_until(lambda: http_status(server, s3_dir, delta3) == "404", 30),
                          f"delta 3 was not pruned (retain_versions 2):\n" + fleet.tail(0, 20))
                    fleet.signal(2, signal.SIGCONT)
                    check(wait_file_text(gateway_log, "2 members joined its tree at version 5", 90),
                          "east's tree did not start again at the snapshot:\n" + fleet.tail(2, 20) +
                          fleet.tail(3, 20))
            check(wait_file_text(gateway_log, f"version {STEPS + 1} through the cluster", 90),
                  "the version after the jump did not reach east:\n" + fleet.tail(2, 20))
            check(fleet.wait_producer(120) == 0, "the producer did not exit 0:\n" + fleet.tail(0, 30))
            codes = fleet.wait_receivers(120)
            check(all(code == 0 for code in codes.values()),
                  f"receivers exited {codes}:\n" + "".join(fleet.tail(r, 15) for r in range(1, 5)))
            want = checkpoint_sha256(steps[-1])
            cut = work / "cut4.safetensors"
            subprocess.run([dc, "placement", "check", str(placement), "--checkpoint", str(steps[-1]), "--extract",
                            str(cut)], check=True, stdout=subprocess.DEVNULL)
            shard = placed_run_test.safetensors(cut)
            want_shard = placed_run_test.sha256(shard[name] for name in placed_run_test.placement_buffers(placement))
            for r in range(1, len(jump_clusters) + 1):
                summary = fleet.summary(r)
                check(summary is not None and summary["version"] == STEPS + 1 and
                      summary["sha256"] == (want_shard if r == 4 else want),
                      f"rank {r} ({jump_clusters[r - 1]}{', placed' if r == 4 else ''}) differs after the jump: "
                      f"{summary}")
            jumped = fleet.summary(2)["store"]
            check(jumped["snapshots_taken"] >= 2, f"the gateway did not jump by a snapshot: {jumped}")
            for r in (3, 4):
                check(fleet.summary(r)["snapshots_taken"] >= 1 and fleet.summary(r)["last_snapshot_source"] >= 0,
                      f"rank {r} did not catch up by a snapshot: {fleet.summary(r)}")
            print(f"store_run_test: the gateway jumped from version 2 by a snapshot ({jumped}); its members followed")

        # Bad input: a bucket that does not exist (the producer fails at start, naming it), a gateway
        # whose secret is wrong (exits 1 naming the refusal).
        job = dcfleet.JobConfig(receivers=2, clusters=["train", "east"], join="10s",
                                extra_yaml=store_yaml(env, prefix + "-bad", bucket="no-such-bucket-dc", clusters="east"))
        with dcfleet.Fleet(dc, work / "nobucket", job) as fleet:
            fleet.env.update(creds)
            fleet.start_producer()
            check(fleet.wait_producer(60) == 1, "a missing bucket did not fail the producer")
            log = (work / "nobucket" / "rank-0.log").read_text(errors="replace")
            check("NoSuchBucket" in log, f"the producer's error does not name the bucket: {log[-1500:]}")
        job = dcfleet.JobConfig(receivers=2, clusters=["train", "east"], join="20s",
                                extra_yaml=store_yaml(env, prefix + "-key", clusters="east"))
        with dcfleet.Fleet(dc, work / "badkey", job) as fleet:
            fleet.env.update(creds)
            fleet.env["AWS_SECRET_ACCESS_KEY"] = "0" * 40
            started = time.monotonic()
            fleet.start_receiver(2)
            codes = fleet.wait_receivers(60, ranks=[2])
            log = (work / "badkey" / "rank-2.log").read_text(errors="replace")
            check(codes.get(2) == 1 and "SignatureDoesNotMatch" in log and time.monotonic() - started < 20,
                  f"a wrong secret: exit {codes}: {log[-1500:]}")
            check(fleet.summary(2) is None, "the refused gateway wrote a summary")
    print("store_run_test: OK")


if __name__ == "__main__":
    try:
        main()
    except Failed as e:
        sys.exit(f"FAIL: {e}")
