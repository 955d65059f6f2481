#!/usr/bin/env python3
"""Recovery time: how long a version that loses a relay mid-step takes, against the same version
without a fault, in the same run of this script (interleaved rounds).

    recovery_time.py [--where loopback|netns] [--rounds 5] [--params 50M] [--receivers 6]
                     [--steps 4] [--version 3] [--peer 2s] [--heartbeat 100ms] [--rate 100mbit]
                     [--deltacast PATH] [--out FILE.jsonl]

Each round runs three jobs of real `deltacast run` processes (tests/integration/recovery/
dcfleet.py), same model, same seed, same trainer steps, in a rotating order:
  clean  no fault
  kill   rank 2 (an interior relay of the binary tree: children 4 and 5) SIGKILLs itself in the
         middle of --version (`--fault kill@V:N`, N = half the version's data messages): the
         producer sees a closed link, detection ~0
  stop   the same with SIGSTOP: the producer finds it silent after timeouts.peer
The faulted version V's figures: refit_seconds (report), detection_seconds (report: from the
member's last sign of life to the decision), the same from the fault itself (the victim's
'--fault' log line to the producer's 'rank 2 failed' line; for a freeze the last sign of life
can precede the version's start by up to a heartbeat, which the report's figure counts as
detection), repair_seconds and resent_chunks. The ratio the issue asks for is
(refit_seconds(faulted) - detection_seconds) / refit_seconds(clean) for the same V and round;
its target is <= 1.2.

--where netns: the producer and each receiver in its own network namespace (scripts/netns.sh,
prefix "dcrec", so other sets are left alone) with a tbf-shaped egress per node. The bootstrap
runs at 1 Gbit/s per node to keep the runs short; right after the producer prints the bootstrap
line every node's egress is switched to --rate (tc qdisc replace), so every delta version from
version 3 on (the faulted one included) runs at --rate per node. Needs root; skipped (exit 77)
where `ip netns add` is not permitted.

Output: one JSON line per job to --out (default bench/recovery/results/recovery-<where>.jsonl)
and a table per round plus ranges (stdout and FILE.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import shutil
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "recovery"))
sys.dont_write_bytecode = True  # nothing written into the source tree
import dcfleet  # noqa: E402

VICTIM = 2
NETNS = str(ROOT / "scripts" / "netns.sh")
PREFIX = "dcrec"


def netns(*args, rate=None):
    env = dict(os.environ, DELTACAST_NETNS_PREFIX=PREFIX)
    if rate:
        env["DELTACAST_NETNS_RATE"] = rate
    return subprocess.run([NETNS, *args], env=env, check=True, capture_output=True, text=True)


def shape_all(nodes: int, rate: str) -> None:
    for k in range(nodes + 1):
        subprocess.run(["ip", "netns", "exec", f"{PREFIX}{k}", "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                        "rate", rate, "burst", "128kb", "latency", "50ms"], check=True)


def run_job(args, kind: str, after: int, work: Path) -> dict:
    job = dcfleet.JobConfig(receivers=args.receivers, topology="binary", transport="tcp", params=args.params,
                            steps=args.steps, lr=args.lr, seed=args.seed, chunk_bytes=args.chunk_bytes,
                            connect="10s", heartbeat=args.heartbeat, peer=args.peer, refit="5m", join="5m",
                            producer_loss="20s", log_level="info",
                            hosts=[f"10.200.0.{k + 1}" for k in range(args.receivers + 1)]
                            if args.where == "netns" else None)
    wrap = (lambda rank: ["ip", "netns", "exec", f"{PREFIX}{rank}"]) if args.where == "netns" else None
    faults = {}
    if kind != "clean":
        faults[VICTIM] = f"{kind}@{args.version}:{after}"
    if args.where == "netns":
        shape_all(args.receivers, "1gbit")
    t0 = time.monotonic()
    with dcfleet.Fleet(args.deltacast, work, job, wrap=wrap, base_port=29700 if args.where == "netns" else None) \
            as fleet:
        fleet.start(faults)
        if args.where == "netns":
            if fleet.wait_line(r"^full checkpoint \(version 1\)", 600):
                shape_all(args.receivers, args.rate)
        rc = fleet.wait_producer(900)
        codes = fleet.wait_receivers(60, [r for r in range(1, args.receivers + 1) if not (kind == "stop" and r == VICTIM)])
        fleet.kill_all()
        report = fleet.report()
        out = {"kind": kind, "where": args.where, "params": args.params, "receivers": args.receivers,
               "version": args.version, "fault": faults.get(VICTIM), "producer_rc": rc,
               "receiver_rcs": codes, "loadavg_1min": os.getloadavg()[0], "wall_seconds": time.monotonic() - t0,
               "rate": args.rate if args.where == "netns" else None}
        if not report:
            out["error"] = "no report"
            return out
        exact = 0
        for r in range(1, args.receivers + 1):
            s = fleet.summary(r)
            if s and s["sha256"] == report["sha256"] and s["version"] == report["version"]:
                exact += 1
        out["bit_exact"] = exact
        out["survivors"] = args.receivers - (1 if kind != "clean" else 0)
        out["ok"] = report.get("ok")
        steps = {e["version"]: e for e in dcfleet.entries(report)}
        out["refit_seconds_by_version"] = {v: round(e["refit_seconds"], 4) for v, e in steps.items()}
        out["chunks_by_version"] = {v: e.get("chunks") for v, e in steps.items()}
        out["payload_bytes_by_version"] = {v: e.get("payload_bytes") for v, e in steps.items()}
        e = steps.get(args.version)
        if e:
            out["refit_seconds"] = e["refit_seconds"]
            out["failed_members"] = e["failed_members"]
            out["detection_seconds"] = max((m["detection_seconds"] for m in e["failed_members"]), default=0.0)
            out["fault_to_detection_seconds"] = dcfleet.fault_to_detection(fleet, VICTIM) if kind != "clean" else 0.0
            out["repair_seconds"] = e["repair_seconds"]
            out["resent_chunks"] = e["resent_chunks"]
            out["committed"] = e["committed"]
        named = [(v, m["rank"]) for v, m in dcfleet.failures(report)]
        out["failures"] = named
        if named and kind != "clean" and not any(v == args.version for v, _ in named):
            out["error"] = f"the fault was reported at another version: {named}"
        if kind == "clean" and named:
            out["error"] = f"a clean run lost members: {named}"
        if kind != "clean" and not named:
            out["error"] = "the fault did not fire (no failure reported)"
        return out


def fmt_range(xs, f="{:.2f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{f.format(min(xs))}-{f.format(max(xs))} (median {f.format(statistics.median(xs))})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--where", choices=["loopback", "netns"], default="loopback")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--params", default=None, help="default 50M on loopback, 100M in netns")
    p.add_argument("--receivers", type=int, default=6)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--version", type=int, default=3, help="the faulted version (3 = step 2)")
    p.add_argument("--lr", default="1e-5")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--chunk-bytes", default="4MiB")
    p.add_argument("--peer", default="2s")
    p.add_argument("--heartbeat", default="100ms")
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--deltacast", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    args.deltacast = dcfleet.find_deltacast(args.deltacast)
    args.params = args.params or ("50M" if args.where == "loopback" else "100M")
    out = Path(args.out) if args.out else HERE / "results" / f"recovery-{args.where}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.where == "netns":
        try:
            netns("create", str(args.receivers), rate="1gbit")
        except subprocess.CalledProcessError as e:
            if e.returncode == 77:
                print("recovery_time: ip netns add is not permitted here; skipped")
                return 77
            raise
    rows = []
    after = None
    try:
        with open(out, "a") as sink:
            for rnd in range(args.rounds):
                order = ["clean", "kill", "stop"]
                order = order[rnd % 3:] + order[:rnd % 3]
                if after is None:
                    order = ["clean"] + [k for k in order if k != "clean"]
                round_rows = {}
                for kind in order:
                    work = Path(tempfile.mkdtemp(prefix=f"dc-rt-{kind}."))
                    r = run_job(args, kind, after or 1, work)
                    r["round"] = rnd
                    r["deltacast"] = args.deltacast
                    if kind == "clean" and after is None and r.get("chunks_by_version"):
                        after = max(1, (r["chunks_by_version"].get(args.version) or 2) // 2)
                    if r.get("error") or r.get("bit_exact") != r.get("survivors"):
                        keep = out.parent / f"recovery-{args.where}-failed" / f"round{rnd}-{kind}"
                        shutil.rmtree(keep, ignore_errors=True)
                        shutil.copytree(work, keep, ignore=shutil.ignore_patterns("secret"))
                        r["kept"] = str(keep)
                    shutil.rmtree(work, ignore_errors=True)
                    sink.write(json.dumps(r) + "\n")
                    sink.flush()
                    round_rows[kind] = r
                    print(f"round {rnd} {kind:5s} V{args.version} refit {r.get('refit_seconds', float('nan')):.3f} s "
                          f"detection {r.get('detection_seconds', float('nan')):.3f} (from fault "
                          f"{r.get('fault_to_detection_seconds')}) repair {r.get('repair_seconds', float('nan')):.3f} "
                          f"resent {r.get('resent_chunks')} exact {r.get('bit_exact')}/{r.get('survivors')} "
                          f"{r.get('error', '')} load {r['loadavg_1min']:.1f}", flush=True)
                rows.append(round_rows)
    finally:
        if args.where == "netns":
            netns("destroy")
    # Table.
    lines = [f"{args.where}: {args.params} params, {args.receivers} receivers, binary, tcp, version {args.version} "
             f"(step {args.version - 1}), timeouts.peer {args.peer}, heartbeat {args.heartbeat}"
             + (f", {args.rate} per node" if args.where == "netns" else ""), "",
             "| round | clean s | kill s | kill detection s | (kill - det) / clean | stop s | stop detection s "
             "(report / from fault) | (stop - det) / clean | (stop - det from fault) / clean | repair s kill / stop "
             "| resent kill / stop | exact |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ratios = {"kill": [], "stop": [], "stop_fault": [], "kill_fault": []}
    for rnd, rr in enumerate(rows):
        c, k, s = rr.get("clean", {}), rr.get("kill", {}), rr.get("stop", {})
        cs = c.get("refit_seconds")

        def ratio(run, key):
            if not cs or run.get("refit_seconds") is None or run.get(key) is None:
                return None
            return (run["refit_seconds"] - run[key]) / cs
        rk, rs = ratio(k, "detection_seconds"), ratio(s, "detection_seconds")
        rkf, rsf = ratio(k, "fault_to_detection_seconds"), ratio(s, "fault_to_detection_seconds")
        for name, v in (("kill", rk), ("stop", rs), ("stop_fault", rsf), ("kill_fault", rkf)):
            if v is not None:
                ratios[name].append(v)

        def f(x, p=3):
            return "-" if x is None else f"{x:.{p}f}"
        exact = "/".join(f"{x.get('bit_exact')}/{x.get('survivors')}" for x in (c, k, s))
        lines.append(f"| {rnd} | {f(cs)} | {f(k.get('refit_seconds'))} | {f(k.get('detection_seconds'))} | {f(rk, 2)} | "
                     f"{f(s.get('refit_seconds'))} | {f(s.get('detection_seconds'), 2)} / "
                     f"{f(s.get('fault_to_detection_seconds'), 2)} | {f(rs, 2)} | {f(rsf, 2)} | "
                     f"{f(k.get('repair_seconds'))} / {f(s.get('repair_seconds'))} | {k.get('resent_chunks')} / "
                     f"{s.get('resent_chunks')} | {exact} |")
    lines.append("")
    lines.append(f"(kill - detection) / clean: {fmt_range(ratios['kill'])}; from the fault: "
                 f"{fmt_range(ratios['kill_fault'])}")
    lines.append(f"(stop - detection) / clean: {fmt_range(ratios['stop'])}; with detection from the fault: "
                 f"{fmt_range(ratios['stop_fault'])}")
    lines.append(f"clean refit of version {args.version}: "
                 f"{fmt_range([rr.get('clean', {}).get('refit_seconds') for rr in rows], '{:.3f}')} s")
    text = "\n".join(lines)
    print()
    print(text)
    out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
