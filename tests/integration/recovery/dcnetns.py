"""Network namespaces for a relay-tree job of real `deltacast run` processes (dcfleet.py): each rank
in its own namespace behind a veth to a bridge, every egress shaped by tbf, links that can be cut
and brought back, and a producer fed from a watch directory at a pace this module sets.

Used by bench/recovery/netfault.py (partitions and stragglers, issue 35) and by netfault_test.py.

  Net(tag, nodes, rates, rack)   namespaces `dcnf-<tag>-K` (rank K, address 10.203.0.(K+1)/24) and
                                 `dcnf-<tag>-br` (bridge br0); the ranks in `rack` sit behind a
                                 second bridge `dcnf-<tag>-rk` with one uplink ("rack": a subtree
                                 that a single link cut separates from the rest). Nothing is added
                                 to the host's namespace. Node K's egress: tbf rates[K], burst
                                 128kb, latency 50 ms; offloads off (TSO/GSO would let tbf burst).
  Net.link(rank | "rack", up)    a member's veth (bridge side) or the rack's uplink down or up
  Net.shape(rank, rate)          a new egress rate
  Job(args, plan, ...)           a Fleet in those namespaces, trainer.kind watch; a feeder thread
                                 drops step s once step s-1 committed and args.pace s after the
                                 last drop; the last args.tail steps wait for Job.tail_release.
  Job.finish(result, cut)        waits for the end (a hang: no exit within 2 x timeouts.refit of
                                 the last progress line) and classes every receiver as chaos.py
                                 does: exact, divergent, stale, failed; the cut ranks apart.

Cleanup: every Net is destroyed by Net.destroy(), atexit, and SIGTERM/SIGINT/SIGHUP (processes
left inside a namespace are SIGKILLed before it is deleted); cleanup_dead_sets() removes the sets of
runs that were SIGKILLed (their pid no longer exists). Only namespaces named dcnf-<pid>... are
touched. Needs root (CAP_NET_ADMIN): netns_permitted() says whether `ip netns add` works.

Standard library only.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import dcfleet

SUBNET = "10.203.0"

# --- the network -------------------------------------------------------------------------------
def sh(*argv, check=True):
    return subprocess.run(list(argv), check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Net:
    """Namespaces for one job: node K (rank K) = `dcnf-<tag>-K`, bridge `dcnf-<tag>-br`, and a rack
    `dcnf-<tag>-rk` (a second bridge, one uplink) for the members in `rack`. Each node's egress:
    tbf at rates[K]."""

    _LIVE: list = []

    def __init__(self, tag: str, nodes: int, rates: dict, rack: Optional[set] = None):
        self.tag = tag
        self.nodes = nodes
        self.rack = set(rack or ())
        self.prefix = f"dcnf-{tag}-"
        self.made: list = []
        Net._LIVE.append(self)
        try:
            self._create(rates)
        except BaseException:
            self.destroy()
            raise

    def ns(self, k) -> str:
        return f"{self.prefix}{k}"

    @staticmethod
    def addr(k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def _add_ns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.made.append(name)
        sh("ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
           "net.ipv6.conf.default.disable_ipv6=1", check=False)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def _offloads_off(self, name: str, dev: str) -> None:
        sh("ip", "netns", "exec", name, "ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off",
           "sg", "off", check=False)

    def _create(self, rates: dict) -> None:
        br = self.ns("br")
        self._add_ns(br)
        sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", br, "link", "set", "br0", "up")
        if self.rack:
            rk = self.ns("rk")
            self._add_ns(rk)
            sh("ip", "-n", rk, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", rk, "link", "set", "br0", "up")
            sh("ip", "link", "add", "dcnfup", "netns", rk, "type", "veth", "peer", "name", "rk", "netns", br)
            sh("ip", "-n", rk, "link", "set", "dcnfup", "master", "br0")
            sh("ip", "-n", br, "link", "set", "rk", "master", "br0")
            for name, dev in ((rk, "dcnfup"), (br, "rk")):
                sh("ip", "-n", name, "link", "set", dev, "up")
                self._offloads_off(name, dev)
        for k in range(self.nodes + 1):
            node = self.ns(k)
            self._add_ns(node)
            sw = self.ns("rk") if k in self.rack else br
            sh("ip", "link", "add", f"v{k}", "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", node)
            sh("ip", "-n", sw, "link", "set", f"v{k}", "master", "br0")
            sh("ip", "-n", sw, "link", "set", f"v{k}", "up")
            self._offloads_off(sw, f"v{k}")
            sh("ip", "-n", node, "addr", "add", f"{self.addr(k)}/24", "dev", "eth0")
            sh("ip", "-n", node, "link", "set", "eth0", "up")
            self._offloads_off(node, "eth0")
            self.shape(k, rates[k])

    def shape(self, k: int, rate: str) -> None:
        sh("ip", "netns", "exec", self.ns(k), "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
           "burst", "128kb", "latency", "50ms")

    def link(self, what, up: bool) -> None:
        """what: a rank (its veth on the bridge side) or "rack" (the rack's uplink)."""
        if what == "rack":
            sh("ip", "-n", self.ns("br"), "link", "set", "rk", "up" if up else "down")
        else:
            sw = self.ns("rk") if what in self.rack else self.ns("br")
            sh("ip", "-n", sw, "link", "set", f"v{what}", "up" if up else "down")

    def wrap(self, rank: int) -> list:
        return ["ip", "netns", "exec", self.ns(rank)]

    def destroy(self) -> None:
        for name in reversed(self.made):
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
        self.made = []
        if self in Net._LIVE:
            Net._LIVE.remove(self)


def _destroy_all(*_a):
    for net in list(Net._LIVE):
        net.destroy()


atexit.register(_destroy_all)
for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_sig, lambda s, f: (dcfleet._kill_every_fleet(), _destroy_all(), sys.exit(128 + s)))


def cleanup_dead_sets() -> int:
    """Removes dcnf-<pid>-* namespaces whose pid no longer runs (a run killed with SIGKILL)."""
    removed = 0
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(r"^dcnf-(\d+)(?:[a-z][a-z0-9]*)?-", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            sh("ip", "netns", "del", name, check=False)
            removed += 1
    return removed


def netns_permitted() -> bool:
    probe = f"dcnf-{os.getpid()}-probe"
    if sh("ip", "netns", "add", probe, check=False).returncode != 0:
        return False
    sh("ip", "netns", "del", probe, check=False)
    return True


# --- rates -------------------------------------------------------------------------------------
def rate_bits(rate: str) -> float:
    m = re.fullmatch(r"([\d.]+)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"a rate like 200mbit, not {rate!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def bits_rate(bits: float) -> str:
    return f"{int(bits / 1000)}kbit"


# --- checkpoints -------------------------------------------------------------------------------
_STEPS_CACHE: dict = {}


def synth_steps(dc: str, params: str, steps: int, seed: int, lr: str) -> list:
    """step-0..step-STEPS checkpoints, made once per (params, steps, seed, lr) and run."""
    key = (params, steps, seed, lr)
    if key not in _STEPS_CACHE:
        made = Path(tempfile.mkdtemp(prefix="dcnf-steps."))
        atexit.register(shutil.rmtree, made, True)
        subprocess.run([dc, "synth", "--out", str(made), "--params", params, "--steps", str(steps), "--seed",
                        str(seed), "--lr", lr, "--threads", "1"], check=True, stdout=subprocess.DEVNULL)
        files = sorted(made.glob("step-*.safetensors"), key=lambda p: int(p.stem.split("-")[1]))
        if len(files) != steps + 1:
            raise RuntimeError(f"deltacast synth wrote {files}")
        _STEPS_CACHE[key] = files
    return _STEPS_CACHE[key]


# --- one job -----------------------------------------------------------------------------------
class Job:
    """A job in namespaces, with the watch directory fed by a pacing thread."""

    def __init__(self, args, plan: dict, work: Path, rates: dict, rack: set, tag: str):
        self.args = args
        self.plan = plan
        self.work = work
        self.files = synth_steps(args.deltacast, args.params, args.steps, args.model_seed, args.lr)
        self.watch = work / "watch"
        self.watch.mkdir(parents=True)
        shutil.copy(self.files[0], self.watch / "ckpt-0.safetensors")
        n = plan["receivers"]
        self.net = Net(tag, n, rates, rack)
        peer_ms = int(args.peer * 1000)
        job = dcfleet.JobConfig(
            receivers=n, topology=plan["topology"], transport=plan.get("transport", "tcp"), chunk_bytes="256KiB",
            connect="5s",
            heartbeat=f"{peer_ms // 4}ms", peer=f"{peer_ms}ms", refit=f"{int(args.refit)}s", join="60s",
            producer_loss=f"{int(args.producer_loss)}s", log_level="info", commit=plan.get("commit", "auto"),
            hosts=[Net.addr(k) for k in range(n + 1)],
            trainer_yaml=f"  kind: watch\n  dir: {self.watch}\n  steps: {args.steps}\n")
        self.fleet = dcfleet.Fleet(args.deltacast, work / "job", job, wrap=self.net.wrap, base_port=29800)
        # Each node's one interface is eth0 (its veth): UCX and libfabric on it, not on lo.
        self.fleet.env.update(UCX_NET_DEVICES="eth0", FI_TCP_IFACE="eth0", FI_SOCKETS_IFACE="eth0")
        self.dropped: dict = {}  # step -> time.monotonic() of its drop
        self.committed: dict = {}  # step -> time.monotonic() of its progress line
        self.stop = threading.Event()
        # The last --tail steps wait for this (a partition sets it once the link is back up), so
        # that a cut member always finds versions to rejoin into.
        self.tail_release = threading.Event()
        self.feeder: Optional[threading.Thread] = None

    def start(self) -> None:
        self.fleet.start()
        self.feeder = threading.Thread(target=self._feed, daemon=True)
        self.feeder.start()

    def _feed(self) -> None:
        """Drops step s once version s (step s-1) committed and --pace s after the last drop."""
        f = self.fleet
        if not f.wait_line(r"full checkpoint \(version 1\)", self.args.refit * 2):
            return
        self.committed[0] = time.monotonic()
        last = 0.0
        for s in range(1, self.args.steps + 1):
            if self.stop.is_set():
                return
            if s > self.args.steps - self.args.tail:
                while not self.tail_release.wait(0.2):
                    if self.stop.is_set() or self.fleet.producer.poll() is not None:
                        return
            wait = last + self.args.pace - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            dcfleet.drop(self.files, self.watch, s)
            last = self.dropped[s] = time.monotonic()
            if not f.wait_line(rf"^step {s}: version {s + 1} ", self.args.refit * 2):
                return
            self.committed[s] = time.monotonic()

    def wait_dropped(self, step: int, timeout: float) -> Optional[float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if step in self.dropped:
                return self.dropped[step]
            if self.fleet.producer.poll() is not None:
                return None
            time.sleep(0.02)
        return None

    def finish(self, result: dict, cut: set) -> dict:
        """Waits for the end (hang: no exit within 2 x timeouts.refit of the last progress), then
        classes every receiver."""
        f = self.fleet
        hang_s = 2 * self.args.refit
        rc0 = None
        while rc0 is None:
            last_progress = max([f.producer.started] + [t for t, _ in f.producer.lines])
            rc0 = f.wait_producer(1.0)
            if rc0 is None and time.monotonic() - last_progress > hang_s:
                break
        result["hang"] = rc0 is None
        result["hang_what"] = "producer" if rc0 is None else None
        codes = f.wait_receivers(self.args.producer_loss + 30 if rc0 is not None else 0)
        for r, c in codes.items():
            if c is None and rc0 is not None:
                result["hang"] = True
                result["hang_what"] = result["hang_what"] or f"rank {r}"
        self.stop.set()
        f.kill_all()
        codes = {r: f.current[r].rc for r in codes}
        result["exit_codes"] = {str(r): c for r, c in [(0, f.producer.rc)] + sorted(codes.items())}
        report = f.report()
        result["producer_ok"] = bool(report and report.get("ok") and f.producer.rc == 0)
        result["versions_expected"] = self.args.steps + 1
        classes = {"exact": [], "divergent": [], "stale": [], "failed": []}
        for r in range(1, self.plan["receivers"] + 1):
            s = f.summary(r)
            if report is None or s is None or codes[r] != 0:
                if report is not None and s is not None and s["version"] == report["version"] \
                        and s["sha256"] != report["sha256"]:
                    classes["divergent"].append(r)
                else:
                    classes["failed"].append(r)
            elif s["version"] == report["version"] and s["sha256"] == report["sha256"]:
                classes["exact"].append(r)
            elif s["version"] == report["version"]:
                classes["divergent"].append(r)
            else:
                classes["stale"].append(r)
        survivors = [r for r in range(1, self.plan["receivers"] + 1) if r not in cut]
        pick = lambda cls: [r for r in classes[cls] if r in survivors]  # noqa: E731
        result["survivors"] = len(survivors)
        result["survivors_exact"] = len(pick("exact"))
        result["divergent_survivors"] = pick("divergent")
        result["stale_survivors"] = pick("stale")
        result["failed_survivors"] = pick("failed")
        result["cut"] = sorted(cut)
        result["cut_fate"] = {}
        for r in sorted(cut):
            log = f.current[r].log.read_text(errors="replace")
            fate = next(k for k, v in classes.items() if r in v)
            result["cut_fate"][str(r)] = {
                "class": fate, "exit": codes[r],
                "lost_producer": "lost the producer" in log, "fenced": "fenced by the producer" in log,
                "rejoined": bool(re.search(r"caught up to version|rejoin(ed)? .*version", log)),
                "last_error": next((ln[-300:] for ln in reversed(log.splitlines())
                                    if "error" in ln.lower() or "could not rejoin" in ln), None)}
        result["cut_divergent"] = [r for r in cut if r in classes["divergent"]]
        steps = dcfleet.entries(report) if report else []
        result["versions_committed"] = sum(1 for e in steps if e.get("committed"))
        result["versions_aborted"] = sum(1 for e in steps if not e.get("committed"))
        result["refit_seconds"] = {str(e["version"]): round(e["refit_seconds"], 4) for e in steps}
        result["failures"] = [{"version": v, "rank": m["rank"], "cause": m["cause"],
                               "detection_seconds": round(m["detection_seconds"], 3)}
                              for v, m in (dcfleet.failures(report) if report else [])]
        result["rejoins"] = len(dcfleet.log_times(f.current[0].log, r"rank \d+ (re)?joined|admitted|rejoin"))
        result["steps_report"] = [{k: e.get(k) for k in ("version", "refit_seconds", "committed", "repair_seconds",
                                                          "resent_chunks", "verified_receivers", "receivers")}
                                  for e in steps]
        return result

    def close(self) -> None:
        self.stop.set()
        self.fleet.kill_all()
        self.net.destroy()
