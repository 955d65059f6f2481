"""A relay-tree job as real `deltacast run` processes, for the recovery tests and benchmarks.

One producer (rank 0) and N receivers (ranks 1..N), each its own process started by this module
with a generated config (members shorthand on 127.0.0.1 and random free ports, or an explicit
member list for network namespaces), a 0600 secret file, and UCX/libfabric pinned to loopback as
`deltacast demo` does (tools/demo/tree_demo.cpp). The caller signals processes from outside
(SIGKILL, SIGSTOP, SIGCONT), restarts a rank, watches the producer's progress lines, and reads
the producer's --report and the receivers' --summary files.

Rules this module keeps, so that a test or a benchmark never leaves anything behind:
  * every child gets PR_SET_PDEATHSIG = SIGKILL (through `setpriv --pdeathsig`, which execs the
    command under the same pid): if the script itself is killed (ctest timeout, Ctrl-C, a crash),
    the kernel kills its children;
  * Fleet.kill_all() (also run by `with Fleet(...)`, atexit and SIGTERM/SIGINT) SIGKILLs and reaps
    every child that still runs, frozen ones included (SIGKILL ends a stopped process);
  * nothing here sleeps on a fixed schedule to find a moment: callers wait for a producer line or
    a file, with generous deadlines.

Standard library only (the pyenv python3 on PATH sees no Debian packages).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
_LIVE_FLEETS: list["Fleet"] = []
# util-linux `setpriv --pdeathsig KILL CMD` sets the death signal and execs CMD (same pid). It is
# preferred to a preexec_fn, which Python documents as unsafe once threads run (the producer's
# stdout reader is a thread, and ranks are restarted while it runs).
_SETPRIV = shutil.which("setpriv")


def _die_with_parent() -> None:  # fallback: runs in the child between fork and exec
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _kill_every_fleet(*_args) -> None:
    for fleet in list(_LIVE_FLEETS):
        fleet.kill_all()


def _on_signal(signum, _frame):
    _kill_every_fleet()
    raise SystemExit(128 + signum)


atexit.register(_kill_every_fleet)
for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    try:
        signal.signal(_sig, _on_signal)
    except ValueError:  # not the main thread
        pass


def find_deltacast(explicit: Optional[str] = None) -> str:
    """The deltacast binary: an explicit path, $DELTACAST, or build/tools/deltacast of this tree."""
    candidates = [explicit, os.environ.get("DELTACAST")]
    root = Path(__file__).resolve().parents[3]
    candidates.append(str(root / "build" / "tools" / "deltacast"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("no deltacast binary (pass it, or set DELTACAST)")


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


# The fixed ports of the examples and the launcher tests: random pickers stay out of them.
FIXED_PORTS = (29400, 29699)


def pick_base_port(count: int, rng: Optional[random.Random] = None) -> int:
    """A run of `count` consecutive free loopback ports, chosen at random outside the kernel's
    ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): there any test's outgoing connection
    may take a port between this check and a member's bind (CI: "Address already in use"), or
    while a killed producer is down before it binds again. tests/integration/ports.sh (the shell
    scripts' free_ports) calls this. Never a run that touches 29400-29699: the fixed ports of the
    examples and the launcher tests (tree.launcher.*_local9: 127.0.0.1:29500..29508)."""
    rng = rng or random.Random()
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    starts = [b for b in list(range(20000, low - count)) + list(range(high + 1, 65536 - count))
              if b + count <= FIXED_PORTS[0] or b > FIXED_PORTS[1]]
    for _ in range(500):
        base = rng.choice(starts)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no run of free loopback ports")


def synth_watch(dc: str, work: Path, params: str, steps: int, seed: int) -> tuple:
    """`deltacast synth` checkpoints step-0..step-STEPS under work/made, and a watch directory
    work/watch holding step 0 as ckpt-0.safetensors (a trainer.kind watch producer's first
    version). Returns (the step files in order, the watch directory); drop step s with drop()."""
    made = Path(work) / "made"
    subprocess.run([dc, "synth", "--out", str(made), "--params", params, "--steps", str(steps), "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)
    files = sorted(made.glob("step-*.safetensors"))
    if len(files) != steps + 1:
        raise RuntimeError(f"deltacast synth wrote {files}")
    watch = Path(work) / "watch"
    watch.mkdir()
    shutil.copy(files[0], watch / "ckpt-0.safetensors")
    return files, watch


def drop(files: list, watch: Path, step: int) -> None:
    """Step `step`'s checkpoint into the watch directory, whole at once (a rename)."""
    shutil.copy(files[step], watch / f"ckpt-{step}.safetensors.tmp")
    (watch / f"ckpt-{step}.safetensors.tmp").rename(watch / f"ckpt-{step}.safetensors")


def read_env_file(path: Path) -> dict:
    """KEY=VALUE lines (an s3-server.sh env file), quotes stripped."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v.strip("'\"")
    return out


def loopback_env() -> dict:
    """The environment for children: UCX and libfabric on lo (values already set win)."""
    env = dict(os.environ)
    for key, value in (("UCX_TLS", "tcp,self"), ("UCX_NET_DEVICES", "lo"), ("FI_TCP_IFACE", "lo"),
                       ("FI_SOCKETS_IFACE", "lo")):
        env.setdefault(key, value)
    return env


@dataclass
class JobConfig:
    receivers: int
    topology: str = "binary"
    transport: str = "tcp"
    params: str = "10M"
    steps: int = 4
    lr: str = "1e-5"
    seed: int = 1
    chunk_bytes: str = "4MiB"
    retain_versions: int = 4
    connect: str = "5s"
    heartbeat: str = "500ms"
    peer: str = "10s"
    refit: str = "5m"
    join: str = "2m"
    producer_loss: str = "30s"
    log_level: str = "info"
    commit: str = "auto"  # auto | producer | delegated (docs/config.md)
    # A producer group (docs/producer-group.md): job ranks 0..producers-1 are its ranks (0 the
    # coordinator, the one with --report), the receivers ranks producers..producers+receivers-1.
    producers: int = 1
    # Network namespaces: the address of each rank (index 0 = producer). None: all on 127.0.0.1.
    hosts: Optional[list] = None
    cluster: str = "local"
    # Per receiver rank 1..N (index 0 = rank 1): its cluster label; None: `cluster` for all.
    clusters: Optional[list] = None
    # YAML appended to the config as is (e.g. a `store:` section).
    extra_yaml: str = ""
    # The trainer section's YAML body (indented two spaces); None: the synth trainer above.
    trainer_yaml: Optional[str] = None


@dataclass
class Proc:
    rank: int
    instance: int
    popen: subprocess.Popen
    log: Path
    summary: Optional[Path]
    started: float
    rc: Optional[int] = None
    lines: list = field(default_factory=list)  # (monotonic time, text) of stdout (the producer)
    eof: bool = False  # its stdout reader saw the end

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> Optional[int]:
        if self.rc is None:
            self.rc = self.popen.poll()
        return self.rc

    def wait(self, timeout: float) -> Optional[int]:
        if self.rc is None:
            try:
                self.rc = self.popen.wait(timeout=max(0.0, timeout))
            except subprocess.TimeoutExpired:
                return None
        return self.rc


class Fleet:
    """One job: config, processes, signals, results. Use as a context manager."""

    def __init__(self, deltacast: str, workdir: Path, job: JobConfig, wrap: Optional[Callable[[int], list]] = None,
                 base_port: Optional[int] = None, rng: Optional[random.Random] = None):
        self.dc = deltacast
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.job = job
        self.wrap = wrap or (lambda rank: [])
        self.base_port = base_port if base_port is not None else pick_base_port(job.receivers + job.producers, rng)
        self.procs: dict = {}  # (rank, instance) -> Proc
        self.current: dict = {}  # rank -> latest Proc
        self._cv = threading.Condition()
        self.env = loopback_env()
        self.config = self._write_config()
        _LIVE_FLEETS.append(self)

    # --- config -------------------------------------------------------------------------------
    def host(self, rank: int) -> str:
        return self.job.hosts[rank] if self.job.hosts else "127.0.0.1"

    def port(self, rank: int) -> int:
        return self.base_port + rank

    @property
    def size(self) -> int:
        return self.job.receivers + self.job.producers

    @property
    def receiver_ranks(self) -> range:
        """The receivers' job ranks: 1..N with one producer, M..M+N-1 with a group of M."""
        return range(self.job.producers, self.size)

    def url(self, rank: int) -> str:
        return f"{self.job.transport}://{self.host(rank)}:{self.port(rank)}"

    def _write_config(self) -> Path:
        j = self.job
        secret = self.dir / "secret"
        secret.write_text(secrets.token_hex(32) + "\n")
        os.chmod(secret, 0o600)
        if j.hosts or j.clusters:
            label = (lambda r: j.clusters[r - 1]) if j.clusters else (lambda r: j.cluster)
            members = "members:\n" + "".join(
                f"  - {{rank: {r - j.producers}, host: {self.host(r)}, port: {self.port(r)}, cluster: {label(r)}}}\n"
                for r in range(j.producers, j.producers + j.receivers))
        else:
            members = (f"members:\n  count: {j.receivers}\n  host: 127.0.0.1\n  base_port: {self.base_port + j.producers}\n"
                       f"  cluster: {j.cluster}\n")
        text = (f"producer: {self.url(0)}\n"
                + (f"producers: {j.producers}\n" if j.producers > 1 else "") +
                f"transport: {j.transport}\n"
                f"topology: {j.topology}\n"
                f"chunk_bytes: {j.chunk_bytes}\n"
                f"retain_versions: {j.retain_versions}\n"
                f"{members}"
                f"timeouts:\n  connect: {j.connect}\n  heartbeat: {j.heartbeat}\n  peer: {j.peer}\n"
                f"  refit: {j.refit}\n  join: {j.join}\n  producer_loss: {j.producer_loss}\n"
                f"secret_file: {secret}\n"
                + (f"trainer:\n{j.trainer_yaml}" if j.trainer_yaml else
                   f"trainer:\n  kind: synth\n  params: {j.params}\n  steps: {j.steps}\n  lr: {j.lr}\n"
                   f"  seed: {j.seed}\n") +
                f"output:\n  dir: {self.dir}\n  log_file: \"\"\n"
                f"log_level: {j.log_level}\n"
                f"commit: {j.commit}\n"
                + j.extra_yaml)
        path = self.dir / "cluster.yaml"
        path.write_text(text)
        return path

    # --- processes ----------------------------------------------------------------------------
    def _spawn(self, rank: int, extra: list, stdout_to_lines: bool) -> Proc:
        instance = sum(1 for (r, _) in self.procs if r == rank)
        suffix = f"rank-{rank}" + (f".{instance}" if instance else "")
        log = self.dir / f"{suffix}.log"
        summary = None if rank < self.job.producers else self.dir / f"{suffix}.json"
        guard = [_SETPRIV, "--pdeathsig", "KILL", "--"] if _SETPRIV else []
        argv = guard + self.wrap(rank) + [self.dc, "run", "--config", str(self.config), "--rank", str(rank),
                                  "--size", str(self.size)] + extra
        if summary is not None:
            argv += ["--summary", str(summary)]
        elif rank == 0:
            argv += ["--report", str(self.dir / "report.json")]
        err = open(log, "ab")
        out = subprocess.PIPE if stdout_to_lines else open(self.dir / f"{suffix}.out", "ab")
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=self.env,
                                 preexec_fn=None if _SETPRIV else _die_with_parent, close_fds=True)
        err.close()
        if not stdout_to_lines:
            out.close()
        p = Proc(rank, instance, popen, log, summary, time.monotonic())
        self.procs[(rank, instance)] = p
        self.current[rank] = p
        if stdout_to_lines:
            threading.Thread(target=self._read_lines, args=(p,), daemon=True).start()
        return p

    def _read_lines(self, p: Proc) -> None:
        with open(self.dir / f"rank-{p.rank}.out", "a") as copy:
            for raw in p.popen.stdout:
                text = raw.decode(errors="replace").rstrip("\n")
                copy.write(text + "\n")
                copy.flush()
                with self._cv:
                    p.lines.append((time.monotonic(), text))
                    self._cv.notify_all()
        with self._cv:
            p.eof = True
            self._cv.notify_all()

    def start_receiver(self, rank: int, fault: Optional[str] = None, extra: Optional[list] = None) -> Proc:
        args = list(extra or [])
        if fault:
            args += ["--fault", fault]
        return self._spawn(rank, args, stdout_to_lines=False)

    def start_receivers(self, faults: Optional[dict] = None) -> None:
        for r in self.receiver_ranks:
            self.start_receiver(r, (faults or {}).get(r))

    def start_producer(self, extra: Optional[list] = None, rank: int = 0) -> Proc:
        """Producer rank `rank` (0: the producer, or a group's coordinator: its stdout lines are
        what wait_line reads; a part rank's lines are in its Proc's lines too)."""
        return self._spawn(rank, list(extra or []), stdout_to_lines=True)

    def start(self, faults: Optional[dict] = None) -> None:
        """Receivers first (they wait up to timeouts.join for the producer), then the producer's
        ranks (a group: the part ranks before the coordinator). `faults` may name producer ranks."""
        self.start_receivers(faults)
        for p in range(self.job.producers - 1, -1, -1):
            f = (faults or {}).get(p)
            self.start_producer(["--fault", f] if f else [], rank=p)

    @property
    def producer(self) -> Proc:
        return self.current[0]

    def wait_line(self, pattern: str, timeout: float, since: int = 0) -> Optional[re.Match]:
        """The first producer stdout line (index >= since) matching `pattern`, waiting up to timeout
        seconds; None when the producer's stdout ended or the time passed first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        checked = since
        with self._cv:
            while True:
                lines = self.producer.lines
                for i in range(checked, len(lines)):
                    m = rx.search(lines[i][1])
                    if m:
                        return m
                checked = len(lines)
                left = deadline - time.monotonic()
                if self.producer.eof or left <= 0:
                    return None
                self._cv.wait(min(left, 0.5))

    def signal(self, rank: int, sig: int) -> None:
        p = self.current[rank]
        if p.poll() is None:
            os.kill(p.pid, sig)

    def kill(self, rank: int) -> None:
        """SIGKILL the rank's current process (frozen or not) and reap it."""
        p = self.current[rank]
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(30)

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            if p.rc is None:
                p.wait(30)
        if self in _LIVE_FLEETS:
            _LIVE_FLEETS.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.kill_all()

    def wait_producer(self, timeout: float) -> Optional[int]:
        return self.producer.wait(timeout)

    def wait_receivers(self, timeout: float, ranks=None) -> dict:
        """Exit codes of the receivers' current processes (None: still running at the deadline)."""
        deadline = time.monotonic() + timeout
        codes = {}
        for r in sorted(ranks if ranks is not None else self.receiver_ranks):
            codes[r] = self.current[r].wait(deadline - time.monotonic())
        return codes

    # --- results ------------------------------------------------------------------------------
    def report(self) -> Optional[dict]:
        path = self.dir / "report.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def summary(self, rank: int) -> Optional[dict]:
        p = self.current[rank]
        try:
            return json.loads(p.summary.read_text())
        except (OSError, ValueError, AttributeError):
            return None

    def tail(self, rank: int, lines: int = 8, instance: Optional[int] = None) -> str:
        p = self.current[rank] if instance is None else self.procs[(rank, instance)]
        try:
            return "\n".join(p.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


# --- reading the report -------------------------------------------------------------------------
def entries(report: dict) -> list:
    """[full, step 1, ...] with a 'version' key on each (full: 'versions')."""
    full = dict(report["full"])
    full.setdefault("version", full.get("versions", 1))
    full.setdefault("refit_seconds", full.get("seconds"))
    return [full] + list(report.get("steps", []))


def failures(report: dict) -> list:
    """(version, failed member) for every failure the report names."""
    return [(e["version"], m) for e in entries(report) for m in e.get("failed_members", [])]


_STAMP = re.compile(r"^\[(?:\d{4}-\d\d-\d\d )?(\d\d):(\d\d):(\d\d)\.(\d{3})\]")


def log_times(path: Path, pattern: str) -> list:
    """Seconds since midnight (the logs' clock: spdlog's local time, same machine) of every line
    of the log at `path` that matches `pattern`."""
    rx = re.compile(pattern)
    out = []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        m = _STAMP.match(line)
        if m and rx.search(line):
            h, mi, sec, ms = (int(x) for x in m.groups())
            out.append(h * 3600 + mi * 60 + sec + ms / 1000)
    return out


def seconds_of_day(t: Optional[float] = None) -> float:
    """time.time() as the logs write it (local time of day, in seconds)."""
    lt = time.localtime(t if t is not None else time.time())
    frac = (t if t is not None else time.time()) % 1
    return lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + frac


def fault_to_detection(fleet: "Fleet", rank: int, fault_at: Optional[float] = None) -> Optional[float]:
    """Seconds from the moment `rank` was signalled to the producer's decision that it failed, from
    the two processes' logs: the victim's own '--fault ... this process now' line (or fault_at, a
    seconds_of_day() taken when this script signalled it) and the producer's 'rank R failed' line.
    None when either is missing."""
    if fault_at is None:
        times = []
        for (r, _), p in fleet.procs.items():
            if r == rank:
                times += log_times(p.log, r"--fault .* this process now")
        if not times:
            return None
        fault_at = times[0]
    failed = [t for t in log_times(fleet.current[0].log, rf"producer: rank {rank} failed \(") if t >= fault_at - 0.5]
    return round(failed[0] - fault_at, 3) if failed else None
