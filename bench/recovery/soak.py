#!/usr/bin/env python3
"""Soak: many consecutive versions with a fault every ~25 of them, watching every process's
memory, descriptors and threads (issue 35, "2. Soak"; results in docs/reliability.md, "Soak").

    soak.py [--versions 1000] [--receivers 8] [--params 20M] [--fault-every 25] [--seed 1]
            [--sample-every 10] [--stop-share 0.33] [--retain-versions 4] [--chunk-bytes 256KiB]
            [--peer 2s] [--topology binary] [--transport tcp] [--deltacast PATH] [--work DIR]
            [--out results.json] [--keep] [--smoke]

The job: one producer and --receivers receivers as `deltacast run` processes on 127.0.0.1
(tests/integration/recovery/dcfleet.py), the synthetic trainer making --versions versions
(version 1 the full checkpoint, then --versions - 1 steps: the trainer makes them in memory, so
no checkpoint file is written or consumed). Every --fault-every versions (+-20%, drawn from
--seed) one receiver drawn at random, all live, is faulted:

  kill   SIGKILL, then (once the producer has repaired around it) a new `deltacast run` process
         for the same rank, which rejoins (snapshot from a peer + replay, docs/protocol.md);
  stop   SIGSTOP until the producer declares it failed (silent, after timeouts.peer), then
         SIGKILL and a new process as above (--stop-share of the faults).

The next fault waits for the victim to be back in the tree (the producer's log says so) and for
--fault-every more versions.

Every --sample-every versions (the producer's progress lines), every running process is sampled
from /proc/PID: VmRSS, RssAnon, VmHWM, the open descriptors (/proc/PID/fd) and the threads
(Threads:). A restarted rank is a new process: samples are kept per incarnation (rank, instance).

At the end: the producer's report (every version committed?), every receiver's summary (its
version and SHA-256 equal to the report's?), the retained-delta figures of the summaries (peak
bytes and versions of the frames a receiver keeps for replay, bounded by retain_versions), and per
incarnation the RSS slope (least squares, KiB per 100 versions) and max-min after warm-up, and the
descriptor and thread counts' min/max. Warm-up: the first --warmup versions of the job for the
first incarnations; a restarted one's first --warmup-restarted versions of its own life.

The results go to --out (JSON: the plan, every sample, the analysis) and a table on stdout.

--smoke: the short form ctest runs (60 versions, 2 faults: one kill, one stop, 4M parameters)
with assertions: every version committed, every receiver exact, the descriptors and threads of
each process that lived through the run flat after warm-up (their last sample within a small
tolerance of their first), and the retained bytes within the bound. Exit 1 when one fails.

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "recovery"))
sys.dont_write_bytecode = True
import dcfleet  # noqa: E402

SCALE = float(os.environ.get("DELTACAST_TEST_TIME_SCALE", "1"))
_VERSION_LINE = re.compile(r"^(?:full checkpoint \(version (\d+)\)|step \d+: version (\d+) )")


class Failed(Exception):
    pass


# --- /proc ----------------------------------------------------------------------------------------
def proc_sample(pid: int) -> dict | None:
    """RSS, anonymous RSS and peak RSS (KiB), threads, open descriptors and run state of `pid`;
    None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    out = {"fds": fds}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key in ("VmRSS", "RssAnon", "VmHWM"):
            out[key] = int(value.split()[0])
        elif key == "Threads":
            out["threads"] = int(value)
        elif key == "State":
            out["state"] = value.split()[0]
    return out if "VmRSS" in out else None


# --- the producer's progress ------------------------------------------------------------------------
class Progress:
    """The newest version the producer's stdout announced (committed or not: a step line is
    written after the version ended), and its log, read as it grows."""

    def __init__(self, fleet: dcfleet.Fleet):
        self.fleet = fleet
        self.checked = 0
        self.version = 0
        self.log_path = fleet.dir / "rank-0.log"
        self.log_offset = 0

    def update(self) -> int:
        lines = self.fleet.producer.lines
        for i in range(self.checked, len(lines)):
            m = _VERSION_LINE.search(lines[i][1])
            if m:
                self.version = max(self.version, int(m.group(1) or m.group(2)))
        self.checked = len(lines)
        return self.version

    def wait_version(self, version: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.update() >= version:
                return True
            if self.fleet.producer.poll() is not None and self.fleet.producer.eof:
                return self.update() >= version
            time.sleep(0.05)
        return False

    def wait_log(self, pattern: str, timeout: float, since: int) -> tuple[re.Match | None, int]:
        """The first line of the producer's log after byte `since` that matches; (match, offset after it)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        offset = since
        pending = b""
        while True:
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                chunk = b""
            if chunk:
                data = pending + chunk
                offset += len(chunk)
                *complete, pending = data.split(b"\n")
                consumed = offset - len(pending)
                for line in complete:
                    m = rx.search(line.decode(errors="replace"))
                    if m:
                        return m, consumed
            if time.monotonic() >= deadline or (self.fleet.producer.poll() is not None and not chunk):
                return None, offset - len(pending)
            time.sleep(0.05)

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0


# --- sampling -------------------------------------------------------------------------------------
class Sampler(threading.Thread):
    """Samples every running process each time the producer's version crosses a multiple of
    `every` (and once at the start and end)."""

    def __init__(self, fleet: dcfleet.Fleet, progress: Progress, every: int):
        super().__init__(daemon=True)
        self.fleet, self.progress, self.every = fleet, progress, every
        self.samples: list = []  # {version, t, rank, instance, pid, VmRSS, ...}
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def sample_all(self, version: int) -> None:
        t = time.monotonic()
        with self.lock:
            procs = [p for p in self.fleet.procs.values() if p.rc is None]
        for p in procs:
            if p.popen.poll() is not None:
                continue
            s = proc_sample(p.pid)
            if s is not None:
                s.update(version=version, t=round(t, 3), rank=p.rank, instance=p.instance, pid=p.pid)
                self.samples.append(s)

    def run(self) -> None:
        next_at = self.every
        while not self.stop.is_set():
            v = self.progress.update()
            if v >= next_at:
                self.sample_all(v)
                next_at = (v // self.every + 1) * self.every
            if self.fleet.producer.poll() is not None:
                return
            time.sleep(0.02)


# --- the faults -------------------------------------------------------------------------------------
def plan_faults(rng: random.Random, versions: int, every: int, stop_share: float, receivers: int) -> list:
    """(version, rank, kind) for each fault: about every `every` versions (+-20%), none in the
    first `every` versions or in the last `every` (the victim must be back before the end)."""
    plan = []
    v = every
    while v <= versions - every:
        kind = "stop" if rng.random() < stop_share else "kill"
        plan.append({"at_version": v, "rank": rng.randint(1, receivers), "kind": kind})
        v += max(1, round(every * rng.uniform(0.8, 1.2)))
    return plan


def do_fault(fleet: dcfleet.Fleet, progress: Progress, fault: dict, sampler: Sampler, peer_s: float) -> dict:
    """Carries one fault out: signal, wait for the producer's verdict, restart, wait for the rejoin."""
    rank, kind = fault["rank"], fault["kind"]
    since = progress.log_size()
    victim = fleet.current[rank]
    t0 = time.monotonic()
    out = dict(fault, victim_instance=victim.instance, fired_at_version=progress.update())
    if kind == "stop":
        fleet.signal(rank, signal.SIGSTOP)
    else:
        fleet.signal(rank, signal.SIGKILL)
    verdict, since = progress.wait_log(rf"producer: rank {rank} failed \((\w+)", (peer_s + 60) * SCALE, since)
    if verdict is None:
        raise Failed(f"fault {fault}: the producer never declared rank {rank} failed")
    out["cause"] = verdict.group(1)
    out["detected_s"] = round(time.monotonic() - t0, 3)
    with sampler.lock:
        fleet.kill(rank)  # a stopped victim is SIGKILLed now; a killed one is reaped
    # The repair is decided once the producer said so; a HELLO for a rank still counted live
    # would fence the old one as 'replaced' (recovery_test.py restart_member waits likewise).
    with sampler.lock:
        fleet.start_receiver(rank)
    back, _ = progress.wait_log(rf"producer: rank {rank} is back in the tree at epoch (\d+)", 180 * SCALE, since)
    if back is None:
        raise Failed(f"fault {fault}: rank {rank}'s new process was not back in the tree within 180 s")
    out["back_s"] = round(time.monotonic() - t0, 3)
    out["back_at_version"] = progress.update()
    out["new_instance"] = fleet.current[rank].instance
    return out


# --- analysis -----------------------------------------------------------------------------------
def slope(points: list) -> float | None:
    """Least-squares slope of (x, y) points; None with fewer than 3 distinct x."""
    if len({x for x, _ in points}) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def analyse_incarnations(samples: list, warmup: int, warmup_restarted: int, min_window: int = 100) -> list:
    by = {}
    for s in samples:
        by.setdefault((s["rank"], s["instance"]), []).append(s)
    rows = []
    for (rank, instance), ss in sorted(by.items()):
        ss.sort(key=lambda s: s["version"])
        first_v = ss[0]["version"]
        start = warmup if (instance == 0) else first_v + warmup_restarted
        after = [s for s in ss if s["version"] >= start and s.get("state") != "T"]
        row = {"rank": rank, "instance": instance, "pid": ss[0]["pid"], "first_version": first_v,
               "last_version": ss[-1]["version"], "samples": len(ss), "window": [start, ss[-1]["version"]],
               "samples_after_warmup": len(after),
               "rss_kib_first_last": [ss[0]["VmRSS"], ss[-1]["VmRSS"]],
               "peak_rss_kib": max(s.get("VmHWM", s["VmRSS"]) for s in ss),
               "fds_min_max_all": [min(s["fds"] for s in ss), max(s["fds"] for s in ss)],
               "threads_min_max_all": [min(s["threads"] for s in ss), max(s["threads"] for s in ss)]}
        if len(after) >= 3 and after[-1]["version"] - after[0]["version"] >= min_window:
            for key, name in (("VmRSS", "rss"), ("RssAnon", "anon")):
                k = slope([(s["version"], s[key]) for s in after if key in s])
                row[f"{name}_kib_per_100_versions"] = None if k is None else round(k * 100, 1)
                vals = [s[key] for s in after if key in s]
                row[f"{name}_kib_max_minus_min"] = max(vals) - min(vals)
            row["fds_min_max"] = [min(s["fds"] for s in after), max(s["fds"] for s in after)]
            row["threads_min_max"] = [min(s["threads"] for s in after), max(s["threads"] for s in after)]
            row["fds_first_last"] = [after[0]["fds"], after[-1]["fds"]]
            row["threads_first_last"] = [after[0]["threads"], after[-1]["threads"]]
        rows.append(row)
    return rows


def check_results(fleet: dcfleet.Fleet, versions: int, receivers: int) -> dict:
    rc = fleet.wait_producer(120 * SCALE)
    out = {"producer_rc": rc}
    report = fleet.report()
    if rc != 0 or report is None:
        raise Failed(f"the producer exited {rc}" + ("" if report else " and wrote no report"))
    entries = dcfleet.entries(report)
    out["versions_in_report"] = len(entries)
    out["versions_committed"] = sum(1 for e in entries if e["committed"])
    out["last_version"] = report["version"]
    out["failed_members"] = len(dcfleet.failures(report))
    out["payload_bytes_max"] = max(e.get("payload_bytes", 0) for e in entries[1:]) if len(entries) > 1 else 0
    out["report_peak_rss_bytes"] = report.get("peak_rss_bytes")
    codes = fleet.wait_receivers(60 * SCALE)
    exact, summaries = [], {}
    for r, code in codes.items():
        s = fleet.summary(r)
        summaries[r] = s
        ok = code == 0 and s is not None and s["version"] == report["version"] and s["sha256"] == report["sha256"]
        exact.append({"rank": r, "instance": fleet.current[r].instance, "rc": code, "exact": ok,
                      "version": s and s["version"], "retained": s and s.get("retained")})
    out["receivers"] = exact
    out["receivers_exact"] = sum(1 for e in exact if e["exact"])
    out["report_ok"] = report.get("ok")
    return out


def retained_check(results: dict, retain_versions: int) -> dict | None:
    """The retained-delta figures of the summaries against retain_versions: at most that many
    versions, and at most that many times the largest version's messages (frames and seal)."""
    rows = [e for e in results["receivers"] if e.get("retained")]
    if not rows:
        return None
    peak_versions = max(e["retained"]["peak_versions"] for e in rows)
    peak_bytes = max(e["retained"]["peak_bytes"] for e in rows)
    largest = max(e["retained"]["largest_version_bytes"] for e in rows)
    return {"receivers_reporting": len(rows), "retain_versions": retain_versions,
            "peak_versions": peak_versions, "peak_bytes": peak_bytes,
            "largest_version_bytes": largest, "bound_bytes": retain_versions * largest,
            "end_bytes": [e["retained"]["bytes"] for e in rows],
            "within_bound": peak_versions <= retain_versions and peak_bytes <= retain_versions * largest}


def print_table(analysis: list, versions: int) -> None:
    print("| rank.inst | versions sampled | RSS first/last MiB | RSS slope KiB/100v | RSS max-min KiB | "
          "anon slope KiB/100v | fds min-max | threads min-max |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in analysis:
        f, l = r["rss_kib_first_last"]
        print(f"| {r['rank']}.{r['instance']} | {r['first_version']}-{r['last_version']} | "
              f"{f / 1024:.1f} / {l / 1024:.1f} | {r.get('rss_kib_per_100_versions', '-')} | "
              f"{r.get('rss_kib_max_minus_min', '-')} | {r.get('anon_kib_per_100_versions', '-')} | "
              f"{'-'.join(map(str, r.get('fds_min_max', r['fds_min_max_all'])))} | "
              f"{'-'.join(map(str, r.get('threads_min_max', r['threads_min_max_all'])))} |")


def summarize(result: dict) -> str:
    """The markdown docs/reliability.md cites: the whole-run figures, then per process."""
    a, res, rows = result["args"], result.get("results", {}), result.get("analysis", [])
    faults = result.get("faults", [])
    out = []
    kinds = {k: [f for f in faults if f["kind"] == k] for k in ("kill", "stop")}
    out.append(f"{a['versions']} versions, {a['receivers']} receivers, {a['params']} parameters, "
               f"{a['topology']}/{a['transport']}, seed {a['seed']}: {result.get('seconds')} s; "
               f"{res.get('versions_committed')}/{a['versions']} versions committed, "
               f"{res.get('receivers_exact')}/{a['receivers']} receivers exact at version {res.get('last_version')}; "
               f"{len(faults)} faults ({len(kinds['kill'])} SIGKILL, {len(kinds['stop'])} SIGSTOP then SIGKILL), "
               f"each victim restarted and back in the tree "
               f"{min((f['back_s'] for f in faults), default=0):.1f}-{max((f['back_s'] for f in faults), default=0):.1f} s "
               f"after the fault.")
    r = result.get("retained")
    if r:
        out.append(f"Retained deltas (receivers' summaries, {r['receivers_reporting']} receivers): at most "
                   f"{r['peak_versions']} versions (retain_versions {r['retain_versions']}), at most "
                   f"{r['peak_bytes']} bytes against a bound of {r['bound_bytes']} "
                   f"({r['retain_versions']} x the largest version, {r['largest_version_bytes']} bytes); at the end "
                   f"{min(r['end_bytes'])}-{max(r['end_bytes'])} bytes.")
    out.append("")
    out.append("| process | versions | RSS after warm-up -> end, MiB | RSS slope, KiB per 100 versions | "
               "RSS max-min, MiB | fds min-max | threads min-max |")
    out.append("| --- | --- | --- | --- | --- | --- | --- |")

    def line(name, rr):
        w = [s for s in result["samples"] if s["rank"] == rr["rank"] and s["instance"] == rr["instance"]
             and s["version"] >= rr["window"][0]]
        first = w[0]["VmRSS"] / 1024 if w else 0
        out.append(f"| {name} | {rr['window'][0]}-{rr['window'][1]} | {first:.1f} -> {rr['rss_kib_first_last'][1] / 1024:.1f} | "
                   f"{rr['rss_kib_per_100_versions']:+.0f} | {rr['rss_kib_max_minus_min'] / 1024:.1f} | "
                   f"{rr['fds_min_max'][0]}-{rr['fds_min_max'][1]} | {rr['threads_min_max'][0]}-{rr['threads_min_max'][1]} |")

    judged = [rr for rr in rows if "rss_kib_per_100_versions" in rr and rr["rss_kib_per_100_versions"] is not None]
    for rr in judged:
        if rr["instance"] == 0:
            line("producer" if rr["rank"] == 0 else f"receiver {rr['rank']}", rr)
    restarted = [rr for rr in judged if rr["instance"] > 0]
    if restarted:
        slopes = sorted(rr["rss_kib_per_100_versions"] for rr in restarted)
        spans = [rr["rss_kib_max_minus_min"] / 1024 for rr in restarted]
        out.append(f"| {len(restarted)} restarted receivers (of {sum(1 for rr in rows if rr['instance'] > 0)}; those "
                   f"with >= 100 versions after their warm-up) | - | - | median {slopes[len(slopes) // 2]:+.0f}, "
                   f"{slopes[0]:+.0f} to {slopes[-1]:+.0f} | {min(spans):.1f}-{max(spans):.1f} | "
                   f"{min(rr['fds_min_max'][0] for rr in restarted)}-{max(rr['fds_min_max'][1] for rr in restarted)} | "
                   f"{min(rr['threads_min_max'][0] for rr in restarted)}-{max(rr['threads_min_max'][1] for rr in restarted)} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", type=int, default=1000)
    ap.add_argument("--receivers", type=int, default=8)
    ap.add_argument("--params", default="20M")
    ap.add_argument("--fault-every", type=int, default=25)
    ap.add_argument("--stop-share", type=float, default=0.33)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample-every", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--warmup-restarted", type=int, default=30)
    ap.add_argument("--retain-versions", type=int, default=4)
    ap.add_argument("--chunk-bytes", default="256KiB")
    ap.add_argument("--peer", default="2s")
    ap.add_argument("--topology", default="binary")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--deltacast")
    ap.add_argument("--work")
    ap.add_argument("--out")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="ctest's short form with assertions")
    ap.add_argument("--summarize", metavar="RESULTS_JSON", help="print a run's tables again (from --out)")
    ap.add_argument("positional_deltacast", nargs="?", help="the binary (as ctest passes it)")
    a = ap.parse_args()
    if a.summarize:
        print(summarize(json.loads(Path(a.summarize).read_text())))
        return 0
    if a.smoke:
        a.versions, a.params, a.fault_every, a.warmup, a.warmup_restarted, a.sample_every = 60, "4M", 20, 10, 10, 2
    dc = dcfleet.find_deltacast(a.deltacast or a.positional_deltacast)
    rng = random.Random(a.seed)
    plan = plan_faults(rng, a.versions, a.fault_every, a.stop_share, a.receivers)
    if a.smoke:  # one of each kind, whatever the draw
        plan = [dict(plan[0], kind="kill"), dict(plan[1], kind="stop")]
    peer_s = float(a.peer.rstrip("s"))
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="dc-soak."))
    job = dcfleet.JobConfig(receivers=a.receivers, topology=a.topology, transport=a.transport, params=a.params,
                            steps=a.versions - 1, lr="1e-5", seed=a.seed, chunk_bytes=a.chunk_bytes,
                            retain_versions=a.retain_versions, heartbeat="500ms", peer=a.peer, refit="2m",
                            join="2m", producer_loss="30s")
    started_unix = time.time()
    t0 = time.monotonic()
    result = {"args": vars(a), "deltacast": dc, "plan": plan, "started_unix": started_unix, "faults": []}
    passed = False
    fleet = dcfleet.Fleet(dc, work, job)
    try:
        fleet.start()
        progress = Progress(fleet)
        sampler = Sampler(fleet, progress, a.sample_every)
        if not progress.wait_version(1, 180 * SCALE):
            raise Failed("the full checkpoint never committed")
        sampler.sample_all(1)
        sampler.start()
        for fault in plan:
            if not progress.wait_version(fault["at_version"], 600 * SCALE):
                raise Failed(f"no progress to version {fault['at_version']}")
            done = do_fault(fleet, progress, fault, sampler, peer_s)
            result["faults"].append(done)
            print(f"fault {len(result['faults'])}/{len(plan)}: {done['kind']} rank {done['rank']} at version "
                  f"{done['fired_at_version']}: {done['cause']} after {done['detected_s']} s, back at version "
                  f"{done['back_at_version']} ({done['back_s']} s)", flush=True)
        results = check_results(fleet, a.versions, a.receivers)
        sampler.stop.set()
        sampler.join(5)
        result["results"] = results
        result["samples"] = sampler.samples
        analysis = analyse_incarnations(sampler.samples, a.warmup, a.warmup_restarted, min(100, a.versions // 2))
        result["analysis"] = analysis
        result["retained"] = retained_check(results, a.retain_versions)
        result["seconds"] = round(time.monotonic() - t0, 1)
        print_table(analysis, a.versions)
        print(json.dumps({k: v for k, v in results.items() if k != "receivers"}))
        print("retained:", json.dumps(result["retained"]))
        problems = []
        if results["versions_committed"] != a.versions or results["versions_in_report"] != a.versions:
            problems.append(f"{results['versions_committed']}/{results['versions_in_report']} versions committed,"
                            f" {a.versions} expected")
        if results["receivers_exact"] != a.receivers:
            problems.append(f"{results['receivers_exact']}/{a.receivers} receivers exact: {results['receivers']}")
        if result["retained"] is not None and not result["retained"]["within_bound"]:
            problems.append(f"retained frames over the bound: {result['retained']}")
        if a.smoke:
            problems += smoke_checks(analysis, a.versions)
        result["problems"] = problems
        for p in problems:
            print("PROBLEM:", p)
        passed = not problems
    except Failed as e:
        result["problems"] = [str(e)]
        print("FAIL:", e, file=sys.stderr)
        print(f"--- work directory: {work}", file=sys.stderr)
    finally:
        fleet.kill_all()
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"soak: {'passed' if passed else 'FAILED'} in {time.monotonic() - t0:.1f} s ({a.versions} versions, "
          f"{len(result['faults'])} faults); work directory {work}")
    if passed and not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


def smoke_checks(analysis: list, versions: int) -> list:
    """A process that lived through the whole run ends with the descriptors and threads it had
    after warm-up (a tolerance for connections being opened or closed at the moment of the sample)."""
    problems = []
    for r in analysis:
        if r["instance"] != 0 or r["last_version"] < versions - 5 or "fds_first_last" not in r:
            continue
        (f0, f1), (t0, t1) = r["fds_first_last"], r["threads_first_last"]
        if f1 > f0 + 4:
            problems.append(f"rank {r['rank']}: {f0} descriptors after warm-up, {f1} at the end")
        if t1 > t0 + 2:
            problems.append(f"rank {r['rank']}: {t0} threads after warm-up, {t1} at the end")
    return problems


if __name__ == "__main__":
    sys.exit(main())
