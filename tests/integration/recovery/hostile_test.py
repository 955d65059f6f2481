#!/usr/bin/env python3
"""Hostile peers stay harmless (issue 13): a real `deltacast run` (producer + 4 receivers on
127.0.0.1, tcp, a 0600 secret) is run twice with the same seed, first undisturbed, then while
attackers hammer every listener for the whole run:

  keyless (no secret):
    junk        connect, write random bytes, close, in a loop;
    huge        a transport frame header announcing a 2^62-byte body instead of the handshake;
    forged      a tree HELLO (rank 2) and a JOIN (rank 3, tree 0) written raw, without the handshake;
    half-open   connections that send half a handshake HELLO (or nothing) and stay open to the end;
    storm       connect/close storms (no byte sent);
  with the secret (what a member holding it could send; docs/security.md):
    auth-huge   after a valid handshake, a frame header announcing 2^62 bytes;
    auth-junk   a tree message whose header announces a 2^62-byte body, then junk messages;
    auth-hello  a HELLO for rank 99 (not in the job) to the producer;
    auth-join   a JOIN to a member for a rank that is not its child, then a FRAME of version 999
                and a replay of it pushed up that link; the same FRAME to the producer.

Checks: both runs end with every version committed by every receiver and no member failed; the
attacked run's bits (every receiver's SHA-256 and the producer's) equal the undisturbed run's; no
process's peak resident memory (VmHWM) grows by more than 64 MiB over the undisturbed run's (no
allocation sized by an attacker's length); the attacked run ends within 3x + 30 s of the
undisturbed one (bounded effect on time; the figure is printed, not a benchmark). Standard
library only.
"""

import hashlib
import hmac
import os
import random
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.dont_write_bytecode = True
import dcfleet  # noqa: E402

RECEIVERS = 4
TRANSPORT_MAGIC = 0x31544344  # "DCT1": transport frame header (magic, kind, length)
MESSAGE_MAGIC = 0x4D544344    # "DCTM": tree message header (magic, type, epoch, body size)
HELLO, JOIN, FRAME = 1, 3, 5


class Failed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failed(message)


# --- wire helpers ----------------------------------------------------------------------------------
def connect(port: int, timeout: float = 2.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def tstr(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<I", len(b)) + b


def message(mtype: int, body: bytes, epoch: int = 0, announced: int = None) -> bytes:
    size = len(body) if announced is None else announced
    return struct.pack("<IB3xQQ", MESSAGE_MAGIC, mtype, epoch, size) + body


def hello_body(rank: int) -> bytes:
    return (struct.pack("<I", rank) + tstr("tcp://127.0.0.1:1") + tstr("evil") +
            struct.pack("<QQQQ", 0, 0, 0, random.getrandbits(64)))


def frame_message(version: int) -> bytes:
    # An envelope (attempt, route, reserved) and a codec frame header of `version` with junk after.
    codec = struct.pack("<IHBBQQQQQIIII", 0x46584344, 2, 1, 0, 64, 0, version - 1, 0, version, 0, 1, 0, 0)
    return message(FRAME, struct.pack("<QII", 1 << 40, 0, 0) + codec + os.urandom(64) + bytes(8))


def transport_frame(payload: bytes) -> bytes:
    return struct.pack("<IIQ", TRANSPORT_MAGIC, 1, len(payload)) + payload


def authenticate(port: int, secret: bytes) -> socket.socket:
    """A client handshake (transport/auth.h): HELLO, the server's CHALLENGE, PROOF."""
    s = connect(port)
    nonce = os.urandom(32)
    s.sendall(b"DCA1" + nonce)
    challenge = b""
    while len(challenge) < 64:
        part = s.recv(64 - len(challenge))
        if not part:
            raise ConnectionError("closed during the handshake")
        challenge += part
    server_nonce, server_mac = challenge[:32], challenge[32:]
    want = hmac.new(secret, b"deltacast/server" + nonce + server_nonce, hashlib.sha256).digest()
    if not hmac.compare_digest(want, server_mac):
        raise ConnectionError("the server did not prove the secret")
    s.sendall(hmac.new(secret, b"deltacast/client" + nonce + server_nonce, hashlib.sha256).digest())
    return s


def quietly(fn):
    try:
        fn()
    except OSError:
        pass


# --- attackers --------------------------------------------------------------------------------------
class Attack:
    def __init__(self, ports, secret: bytes):
        self.ports = ports          # [producer, member 1..N]
        self.secret = secret
        self.stop = threading.Event()
        self.held = []              # half-open sockets kept to the end
        self.counts = {}
        self.lock = threading.Lock()

    def count(self, what: str):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def loop(self, what: str, fn, pause: float):
        def run():
            rng = random.Random(what)
            while not self.stop.is_set():
                port = rng.choice(self.ports)
                quietly(lambda: fn(port, rng))
                self.count(what)
                self.stop.wait(pause)
        t = threading.Thread(target=run, daemon=True, name=what)
        t.start()
        return t

    # keyless
    def junk(self, port, rng):
        with connect(port) as s:
            s.sendall(rng.randbytes(rng.choice([1, 35, 36, 37, 4096, 65536])))

    def huge(self, port, rng):
        with connect(port) as s:
            s.sendall(struct.pack("<IIQ", TRANSPORT_MAGIC, 1, 1 << 62) + bytes(64))

    def forged(self, port, rng):
        with connect(port) as s:
            s.sendall(transport_frame(message(HELLO, hello_body(2))) +
                      transport_frame(message(JOIN, struct.pack("<II", 3, 0))))

    def storm(self, port, rng):
        for _ in range(50):
            quietly(lambda: connect(port, 1.0).close())

    def half_open(self, ports):
        for port in ports:
            for k in range(8):
                try:
                    s = connect(port)
                    if k % 2:
                        s.sendall(b"DCA1" + bytes(10))  # half a handshake HELLO
                    self.held.append(s)
                except OSError:
                    pass

    # with the secret
    def auth_huge(self, port, rng):
        with authenticate(port, self.secret) as s:
            s.sendall(struct.pack("<IIQ", TRANSPORT_MAGIC, 1, 1 << 62))
            s.settimeout(2.0)
            quietly(lambda: s.recv(1))

    def auth_junk(self, port, rng):
        with authenticate(port, self.secret) as s:
            s.sendall(transport_frame(message(HELLO, b"", announced=1 << 62)))
            for _ in range(4):
                s.sendall(transport_frame(rng.randbytes(rng.choice([3, 24, 100]))))

    def auth_hello(self, port, rng):
        with authenticate(self.ports[0], self.secret) as s:
            s.sendall(transport_frame(message(HELLO, hello_body(99))))
            s.settimeout(2.0)
            quietly(lambda: s.recv(4096))

    def auth_join(self, port, rng):
        member = rng.choice(self.ports[1:])
        with authenticate(member, self.secret) as s:
            s.sendall(transport_frame(message(JOIN, struct.pack("<II", 77, 0))))
            bad = transport_frame(frame_message(999))
            s.sendall(bad + bad)  # a frame of a version nobody is at, and its replay
        with authenticate(self.ports[0], self.secret) as s:
            s.sendall(transport_frame(frame_message(999)))

    def start(self):
        threads = [self.loop("junk", self.junk, 0.02), self.loop("huge", self.huge, 0.05),
                   self.loop("forged", self.forged, 0.05), self.loop("storm", self.storm, 0.2),
                   self.loop("auth-huge", self.auth_huge, 0.2), self.loop("auth-junk", self.auth_junk, 0.2),
                   self.loop("auth-hello", self.auth_hello, 0.3), self.loop("auth-join", self.auth_join, 0.3)]
        return threads

    def finish(self, threads):
        self.stop.set()
        for t in threads:
            t.join(10)
        for s in self.held:
            quietly(s.close)


# --- the runs ---------------------------------------------------------------------------------------
def peak_rss_watch(fleet: dcfleet.Fleet, peaks: dict, stop: threading.Event):
    """Samples every process's VmHWM (peak RSS) until stop: the last value read is its peak."""
    def run():
        while not stop.is_set():
            for rank, p in list(fleet.current.items()):
                try:
                    for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            peaks[rank] = max(peaks.get(rank, 0), int(line.split()[1]) * 1024)
                except OSError:
                    pass
            stop.wait(0.05)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def one_run(dc: str, work: Path, attacked: bool) -> dict:
    job = dcfleet.JobConfig(receivers=RECEIVERS, topology="binary", params="10M", steps=10, seed=5,
                            chunk_bytes="1MiB", peer="10s", join="60s")
    fleet = dcfleet.Fleet(dc, work, job)
    peaks, stop = {}, threading.Event()
    attack, threads = None, []
    started = time.monotonic()
    try:
        fleet.start_receivers()
        watcher = peak_rss_watch(fleet, peaks, stop)
        if attacked:
            # The listeners: each member's, then the producer's (it listens once started).
            # Half-open connections take the members' listeners before any tree edge exists, and
            # the producer's as soon as it listens, before the members' HELLOs are answered.
            attack = Attack([fleet.port(r) for r in range(RECEIVERS + 1)],
                            (work / "secret").read_text().strip().encode())
            time.sleep(0.5)
            attack.half_open(attack.ports[1:])
        fleet.start_producer()
        if attacked:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    connect(fleet.port(0), 0.5).close()
                    break
                except OSError:
                    time.sleep(0.01)
            attack.half_open(attack.ports[:1])
            threads = attack.start()
        code = fleet.wait_producer(240)
        statuses = fleet.wait_receivers(60)
        elapsed = time.monotonic() - started
        if attack:
            attack.finish(threads)
        stop.set()
        watcher.join(5)
        report = fleet.report()
        check(code == 0 and report and report["ok"],
              f"{'attacked' if attacked else 'undisturbed'} run: producer status {code}:\n" + fleet.tail(0, 30))
        check(all(s == 0 for s in statuses.values()), f"receiver statuses {statuses}")
        failed = [m for st in report["steps"] for m in st.get("failed_members", [])]
        check(not failed and not report["full"].get("failed_members"), f"members failed under attack: {failed}")
        sums = {r: fleet.summary(r)["sha256"] for r in range(1, RECEIVERS + 1)}
        return {"sha": report["sha256"], "receivers": sums, "peaks": dict(peaks), "seconds": elapsed,
                "counts": dict(attack.counts) if attack else {}}
    finally:
        stop.set()
        if attack:
            attack.finish(threads)
        fleet.kill_all()


def main() -> int:
    dc = sys.argv[1]
    work = Path(tempfile.mkdtemp(prefix="dc-hostile."))
    passed = False
    try:
        calm = one_run(dc, work / "undisturbed", attacked=False)
        hit = one_run(dc, work / "attacked", attacked=True)
        check(hit["sha"] == calm["sha"], "the attacked run's producer bits differ from the undisturbed run's")
        check(all(v == calm["sha"] for v in hit["receivers"].values()), f"receivers differ: {hit['receivers']}")
        # Under ASan (scripts/test.sh --sanitize) a peak holds the sanitizer's shadow and quarantine
        # (up to 256 MiB of freed memory held back), which are not deltacast's to bound.
        sanitized = os.environ.get("DELTACAST_SANITIZER") == "address"
        for rank, peak in hit["peaks"].items():
            base = calm["peaks"].get(rank, 0)
            check(sanitized or peak <= base + (64 << 20), f"rank {rank}: peak RSS {peak >> 20} MiB under attack, "
                                                          f"{base >> 20} MiB undisturbed")
        check(hit["seconds"] <= 3 * calm["seconds"] + 30, f"attacked run took {hit['seconds']:.1f} s, "
                                                          f"undisturbed {calm['seconds']:.1f} s")
        check(min(hit["counts"].values(), default=0) > 0, f"an attacker never ran: {hit['counts']}")
        print(f"ok: attacks {hit['counts']}")
        print(f"ok: bits identical; time {hit['seconds']:.1f} s vs {calm['seconds']:.1f} s undisturbed; peak RSS "
              + ", ".join(f"rank {r}: {hit['peaks'][r] >> 20} vs {calm['peaks'].get(r, 0) >> 20} MiB"
                          for r in sorted(hit["peaks"])))
        passed = True
    except Failed as e:
        print(f"FAIL: {e}", file=sys.stderr)
    finally:
        if passed:
            import shutil
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", file=sys.stderr)
    print("PASS" if passed else "FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
