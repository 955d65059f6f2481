#!/usr/bin/env python3
"""Network faults for the relay tree: partitions and stragglers, in network namespaces (issue 35).

    netfault.py [--trials 8] [--seed 1] [--kinds leaf,interior,subtree,straggler] [--only N,M]
                [--transports tcp,ucx,ofi+tcp]
                [--rate 200mbit] [--ratio 20] [--params 10M] [--steps 10] [--peer 2]
                [--deltacast PATH] [--out FILE.jsonl] [--keep-all]
    netfault.py --straggler-rounds R [--role interior] [--straggle-from delta] ...
                                                             version time with and without a straggler,
                                                             R rounds of a clean and a straggled job
                                                             (alternating which goes first)
    netfault.py --summarize FILE.jsonl
    netfault.py --cleanup                                    removes namespaces left by a killed run

Every job is real `deltacast run` processes (tests/integration/recovery/dcfleet.py), one
producer and 6-8 receivers, each in its own network namespace (tests/integration/recovery/
dcnetns.py): `dcnf-<pid>x<trial>-K` for rank K, one veth to a bridge namespace, addresses
10.203.0.(K+1)/24; nothing is added to the host's namespace, and every namespace is removed on exit
(atexit, SIGTERM/SIGINT; --cleanup removes the sets of dead runs). Every node's egress is a tbf at
--rate (burst 128kb, latency 50 ms), so each member has the same uplink and a straggler's
1/--ratio of it means something. A `subtree` trial puts an interior member and its tree-0
descendants (a "rack") behind a second bridge namespace joined to the main one by one veth.
The transport is drawn per trial from --transports (tcp, ucx and ofi+tcp, UCX and libfabric on
each namespace's eth0); drawn after the rest of the plan, so a seed's other draws are as before.

The producer reads a watch directory (trainer.kind watch): the harness drops step s+1 once step s
committed and at least --pace seconds after the previous drop, so versions keep flowing while a
member is cut off; the last --tail steps are dropped only once the link is back up, so a cut
member always has versions to rejoin into (without that, a cut that outlasts the job leaves it
outside: it exits 1 with "could not rejoin within timeouts.producer_loss ... version V is intact").

Fault kinds (one per trial; kind = the trial number modulo the list, so every kind is covered):
  leaf      the veth of a leaf of tree 0 (on the bridge side) down for 1-10 s, then up
  interior  the same for an interior member of tree 0 (its children lose their parent; it
            loses everyone)
  subtree   the rack's uplink down for 1-10 s: an interior member and its whole subtree cut off
            from the producer and the rest, still connected among themselves
  straggler one member's egress at --rate/--ratio (root, interior or leaf, drawn from the seed)
            for the whole run (--straggle-from bootstrap) or from the first delta on (delta); the
            trial runs the same job twice, clean then with the straggler, and compares their
            delta version times
A partition starts a random 0-0.8 s after the harness dropped a random delta version (3-5),
that is inside that version's delivery or its commit. Everything is drawn from
random.Random(f"{seed}:{trial}"), so `--seed S --only N` replays trial N's plan.

Recorded per trial, as bench/recovery/chaos.py does: survivors exact (SHA-256 and version equal
the producer's report), divergent, stale, failed; the cut members' fate (rejoined and exact, exited
with an error, divergent); versions committed; a hang (no exit within 2 x timeouts.refit of the
last progress); detection from the link going down to the producer's "rank R failed" line; the
faulted version's refit over the median clean delta refit of the same job (the straggler: the
straggled job's median delta over the clean job's), and that ratio less the part of the detection
inside the faulted version. One JSON line per trial to --out (default
bench/recovery/results/netfault-seed<S>.jsonl), the table to FILE.md; logs of trials that were not
clean under results/netfault-failed-seed<S>/.

Needs root (CAP_NET_ADMIN); exits 77 where `ip netns add` is not permitted. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "recovery"))
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # nothing written into the source tree
import dcfleet  # noqa: E402
from chaos import roles, tree_parents  # noqa: E402  (read only: the epoch-0 trees)
from dcnetns import Job, bits_rate, cleanup_dead_sets, netns_permitted, rate_bits  # noqa: E402

KINDS = ["leaf", "interior", "subtree", "straggler"]


# --- plans -------------------------------------------------------------------------------------
def plan_trial(seed: int, trial: int, kinds: list, transports: tuple = ("tcp",)) -> dict:
    rng = random.Random(f"{seed}:{trial}")
    kind = kinds[trial % len(kinds)]
    receivers = rng.choice([6, 7, 8])
    topology = rng.choice(["binary", "double_binary"])
    role_of = roles(topology, receivers)
    plan = {"seed": seed, "trial": trial, "kind": kind, "receivers": receivers, "topology": topology,
            "commit": rng.choice(["producer", "delegated"])}
    if kind == "straggler":
        role = rng.choice(["root", "interior", "leaf"])
        plan["role"] = role
        plan["victim"] = rng.choice([r for r, x in role_of.items() if x == role])
        plan["transport"] = rng.choice(transports)  # drawn last: a seed's other draws stay as they were
        return plan
    want = "leaf" if kind == "leaf" else "interior"
    plan["role"] = want
    plan["victim"] = rng.choice([r for r, x in role_of.items() if x == want])
    plan["version"] = rng.randint(3, 5)  # delta versions 3-5 (steps 2-4): a clean delta before it
    plan["delay_s"] = round(rng.uniform(0.0, 0.8), 3)
    plan["down_s"] = round(rng.uniform(1.0, 10.0), 2)
    plan["transport"] = rng.choice(transports)
    return plan


def subtree(topology: str, n: int, rank: int) -> set:
    """rank and its descendants in tree 0 (job ranks)."""
    parents = tree_parents(topology, n)[0]
    out = {rank}
    grew = True
    while grew:
        grew = False
        for m, p in enumerate(parents):
            if p >= 0 and (p + 1) in out and (m + 1) not in out:
                out.add(m + 1)
                grew = True
    return out


def log_lines(path: Path) -> list:
    """(seconds of day, text) of every stamped line of a log (dcfleet.log_times' clock)."""
    out = []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        m = dcfleet._STAMP.match(line)
        if m:
            h, mi, sec, ms = (int(x) for x in m.groups())
            out.append((h * 3600 + mi * 60 + sec + ms / 1000, line))
    return out


def delta_medians(result: dict, skip: set) -> Optional[float]:
    xs = [v for k, v in result["refit_seconds"].items() if int(k) >= 3 and int(k) not in skip]
    return statistics.median(xs) if xs else None


def run_partition(args, plan: dict, work: Path, tag: str) -> dict:
    n = plan["receivers"]
    rates = {k: args.rate for k in range(n + 1)}
    rack = subtree(plan["topology"], n, plan["victim"]) if plan["kind"] == "subtree" else set()
    cut = rack if rack else {plan["victim"]}
    result = dict(plan)
    job = Job(args, plan, work, rates, rack, tag)
    try:
        job.start()
        step = plan["version"] - 1
        at = job.wait_dropped(step, args.refit * 3)
        result["fired"] = False
        if at is not None:
            time.sleep(max(0.0, at + plan["delay_s"] - time.monotonic()))
            down_at = dcfleet.seconds_of_day()
            job.net.link("rack" if rack else plan["victim"], up=False)
            result["fired"] = True
            result["down_at_version_age_s"] = round(time.monotonic() - at, 3)
            time.sleep(plan["down_s"])
            job.net.link("rack" if rack else plan["victim"], up=True)
            result["up_after_s"] = round(dcfleet.seconds_of_day() - down_at, 3)
        job.tail_release.set()
        job.finish(result, cut)
        # Detection from the link going down to the producer's verdict, per cut member.
        det = []
        if result["fired"]:
            for r in sorted(cut):
                t = [x for x in dcfleet.log_times(job.fleet.current[0].log, rf"producer: rank {r} failed \(")
                     if x >= down_at - 0.5]
                det.append({"rank": r, "fault_to_detection_seconds": round(t[0] - down_at, 3) if t else None})
        result["detection"] = det
        # The faulted version: the one in which the cut members were failed (a cut late in a
        # version can be detected in the next); the version the cut began in when none was.
        failed_at = {f["version"] for f in result["failures"] if f["rank"] in cut}
        faulted = min(failed_at) if failed_at else plan["version"]
        # Clean reference: deltas from version 3 on with no failure, not the one the cut began in.
        ref = delta_medians(result, {f["version"] for f in result["failures"]} | {plan["version"]})
        result["clean_refit_seconds_median"] = ref
        result["faulted_version"] = faulted
        result["faulted_refit_seconds"] = result["refit_seconds"].get(str(faulted))
        if ref and result["faulted_refit_seconds"] is not None:
            result["overhead_ratio"] = round(result["faulted_refit_seconds"] / ref, 3)
            d = [x["fault_to_detection_seconds"] for x in det if x["fault_to_detection_seconds"] is not None]
            ends = [t for t, text in log_lines(job.fleet.current[0].log)
                    if re.search(rf"\bversion {faulted} committed in ", text)]
            if d and ends:
                # Less the part of the detection (from the link going down, as chaos.py counts it
                # from the fault) that fell inside this version: a cut made in the version before
                # is partly detected before this one began.
                began = ends[0] - result["faulted_refit_seconds"]
                inside = max(0.0, down_at + max(d) - max(down_at, began))
                result["detection_inside_faulted_version_s"] = round(inside, 3)
                result["overhead_ratio_less_detection"] = round(
                    max(0.0, result["faulted_refit_seconds"] - inside) / ref, 3)
    finally:
        job.close()
    return result


def run_straggler_job(args, plan: dict, work: Path, tag: str, straggle: bool) -> dict:
    n = plan["receivers"]
    rates = {k: args.rate for k in range(n + 1)}
    slow = bits_rate(rate_bits(args.delta_rate or args.rate) / args.ratio)
    if straggle and args.straggle_from == "bootstrap":
        rates[plan["victim"]] = slow
    result = dict(plan, straggle=straggle, victim_rate=slow if straggle else args.rate,
                  straggle_from=args.straggle_from)
    job = Job(args, plan, work, rates, set(), tag)
    try:
        job.tail_release.set()
        job.start()
        if (straggle and args.straggle_from == "delta") or args.delta_rate:
            # Once the bootstrap committed: every delta version runs at --delta-rate (when given)
            # and with the straggler (--straggle-from delta).
            if job.fleet.wait_line(r"^full checkpoint \(version 1\)", args.refit * 2):
                base = args.delta_rate or args.rate
                for k in range(n + 1):
                    if k == plan["victim"] and straggle:
                        job.net.shape(k, bits_rate(rate_bits(base) / args.ratio))
                    elif args.delta_rate:
                        job.net.shape(k, base)
        job.finish(result, set())
        result["clean_refit_seconds_median"] = delta_medians(result, set())
        result["bootstrap_seconds"] = result["refit_seconds"].get("1")
    finally:
        job.close()
    return result


def run_straggler(args, plan: dict, work: Path, tag: str) -> dict:
    clean = run_straggler_job(args, plan, work / "clean", tag + "c", False)
    slow = run_straggler_job(args, plan, work / "straggler", tag + "s", True)
    result = dict(slow)
    result["fired"] = True
    result["clean_job"] = {k: clean.get(k) for k in ("refit_seconds", "clean_refit_seconds_median", "exit_codes",
                                                      "survivors_exact", "failures", "producer_ok", "hang")}
    ref = clean.get("clean_refit_seconds_median")
    mine = slow.get("clean_refit_seconds_median")
    result["clean_refit_seconds_median"] = ref
    result["straggled_refit_seconds_median"] = mine
    if ref and mine:
        result["overhead_ratio"] = round(mine / ref, 3)
    result["detection"] = []
    result["straggler_failed"] = [f for f in slow["failures"] if f["rank"] == plan["victim"]]
    result["others_failed"] = [f for f in slow["failures"] if f["rank"] != plan["victim"]]
    return result


def run_trial(args, plan: dict, work: Path, tag: str) -> dict:
    t0 = time.monotonic()
    r = run_straggler(args, plan, work, tag) if plan["kind"] == "straggler" else run_partition(args, plan, work, tag)
    r["wall_seconds"] = round(time.monotonic() - t0, 2)
    r["loadavg_1min"] = os.getloadavg()[0]
    r["clean"] = (not r["hang"] and r["producer_ok"] and not r["divergent_survivors"] and not r["stale_survivors"]
                  and not r["failed_survivors"] and not r.get("cut_divergent")
                  and r["versions_committed"] == r["versions_expected"])
    return r


# --- the table ---------------------------------------------------------------------------------
def rng_text(xs, fmt="{:.2f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))}, n={len(xs)})"


def summarize(results: list) -> str:
    lines = ["| kind | trials | clean | versions committed | survivors exact | divergent (survivors / cut) | hangs "
             "| cut members: rejoined exact / exited / other | detection from link down, s | faulted / clean delta "
             "| (faulted - detection) / clean |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups = [(kind, [r for r in results if r["kind"] == kind]) for kind in KINDS]
    transports = sorted({r.get("transport", "tcp") for r in results})
    if len(transports) > 1:
        groups += [(f"all, {t}", [r for r in results if r.get("transport", "tcp") == t]) for t in transports]
    for kind, rs in groups:
        if not rs:
            continue
        fates = [f for r in rs for f in r.get("cut_fate", {}).values()]
        det = [d["fault_to_detection_seconds"] for r in rs for d in r.get("detection", [])]
        lines.append(
            f"| {kind} | {len(rs)} | {sum(r['clean'] for r in rs)} | "
            f"{sum(r['versions_committed'] for r in rs)}/{sum(r['versions_expected'] for r in rs)} | "
            f"{sum(r['survivors_exact'] for r in rs)}/{sum(r['survivors'] for r in rs)} | "
            f"{sum(len(r['divergent_survivors']) for r in rs)} / {sum(len(r.get('cut_divergent', [])) for r in rs)} | "
            f"{sum(r['hang'] for r in rs)} | "
            + (f"{sum(f['class'] == 'exact' for f in fates)} / {sum(f['exit'] not in (0, None) for f in fates)} / "
               f"{sum(f['class'] != 'exact' and f['exit'] in (0, None) for f in fates)}" if fates else "-")
            + f" | {rng_text(det, '{:.2f}')} | {rng_text([r.get('overhead_ratio') for r in rs])} | "
            f"{rng_text([r.get('overhead_ratio_less_detection') for r in rs])} |")
    lines.append("")
    lines.append("| trial | kind | transport | topology | n | commit | victim (role) | fault | committed | exact | cut fate "
                 "| failures (version:rank:cause) | faulted/clean | wall s |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        fault = (f"rate {r.get('victim_rate')}" if r["kind"] == "straggler" else
                 f"v{r['version']}+{r['delay_s']}s, down {r['down_s']}s" + ("" if r.get("fired") else " (not fired)"))
        fate = ", ".join(f"{k}:{v['class']}/rc{v['exit']}" for k, v in r.get("cut_fate", {}).items()) or "-"
        fails = " ".join(f"{f['version']}:{f['rank']}:{f['cause']}" for f in r["failures"]) or "-"
        lines.append(f"| {r['trial']} | {r['kind']} | {r.get('transport', 'tcp')} | {r['topology']} | {r['receivers']} | {r.get('commit')} | "
                     f"{r['victim']} ({r['role']}) | {fault} | {r['versions_committed']}/{r['versions_expected']} | "
                     f"{r['survivors_exact']}/{r['survivors']} | {fate} | {fails} | {r.get('overhead_ratio', '-')} | "
                     f"{r['wall_seconds']} |")
    return "\n".join(lines)


def summarize_rounds(rows: list) -> str:
    lines = ["| round | job | straggler rate | delta refit s, median (range) | bootstrap s | failures "
             "(version:rank:cause) | survivors exact | wall s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        xs = [v for k, v in r["refit_seconds"].items() if int(k) >= 3]
        fails = " ".join(f"{f['version']}:{f['rank']}:{f['cause']}" for f in r["failures"]) or "-"
        lines.append(f"| {r['round']} | {'straggler' if r['straggle'] else 'clean'} | "
                     f"{r['victim_rate'] if r['straggle'] else '-'} | {rng_text(xs, '{:.3f}')} | "
                     f"{r.get('bootstrap_seconds')} | {fails} | {r['survivors_exact']}/{r['survivors']} | "
                     f"{r['wall_seconds']} |")
    for s in (False, True):
        xs = [v for r in rows if r["straggle"] == s for k, v in r["refit_seconds"].items() if int(k) >= 3]
        lines.append(f"\nAll {'straggler' if s else 'clean'} jobs, delta refit s: {rng_text(xs, '{:.3f}')}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--only", default=None)
    p.add_argument("--transports", default="tcp,ucx,ofi+tcp", help="drawn per trial (UCX and libfabric on each "
                   "namespace's eth0)")
    p.add_argument("--rate", default="200mbit", help="every node's egress")
    p.add_argument("--ratio", type=float, default=20.0, help="the straggler's egress is --rate / --ratio")
    p.add_argument("--straggle-from", choices=["bootstrap", "delta"], default="bootstrap",
                   help="the straggler's cap from the start (the whole run) or from the first delta on")
    p.add_argument("--delta-rate", default=None,
                   help="every egress from the first delta on (the bootstrap at --rate); the straggler's 1/--ratio "
                        "of it")
    p.add_argument("--params", default="10M")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", default="1e-5")
    p.add_argument("--model-seed", type=int, default=7)
    p.add_argument("--pace", type=float, default=1.5, help="least seconds between two drops")
    p.add_argument("--tail", type=int, default=3,
                   help="a partition trial drops its last TAIL steps only after the link is back up")
    p.add_argument("--peer", type=float, default=2.0, help="timeouts.peer, s (heartbeat: a quarter)")
    p.add_argument("--refit", type=float, default=60.0, help="timeouts.refit, s (a hang: 2x this)")
    p.add_argument("--producer-loss", type=float, default=30.0, help="timeouts.producer_loss, s")
    p.add_argument("--straggler-rounds", type=int, default=0,
                   help="instead of trials: R rounds of a clean and a straggler job, alternating first")
    p.add_argument("--role", default="interior", help="--straggler-rounds: the straggler's role")
    p.add_argument("--topology", default="binary", help="--straggler-rounds: topology")
    p.add_argument("--receivers", type=int, default=7, help="--straggler-rounds: receivers")
    p.add_argument("--deltacast", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--keep-all", action="store_true")
    p.add_argument("--plan", action="store_true")
    p.add_argument("--summarize", metavar="JSONL")
    p.add_argument("--cleanup", action="store_true")
    args = p.parse_args()
    if args.summarize:
        rows = [json.loads(line) for line in open(args.summarize) if line.strip()]
        print(summarize_rounds(rows) if rows and "round" in rows[0] else summarize(rows))
        return 0
    if args.cleanup:
        print(f"netfault: removed {cleanup_dead_sets()} namespaces of dead runs")
        return 0
    kinds = args.kinds.split(",")
    trials = [int(x) for x in args.only.split(",")] if args.only else list(range(args.trials))
    if args.plan:
        for t in trials:
            print(json.dumps(plan_trial(args.seed, t, kinds, args.transports.split(","))))
        return 0
    if not netns_permitted():
        print("netfault: 'ip netns add' is not permitted here; skipped")
        return 77
    cleanup_dead_sets()
    args.deltacast = dcfleet.find_deltacast(args.deltacast)
    results_dir = HERE / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    tag = str(os.getpid())
    if args.straggler_rounds:
        out = Path(args.out) if args.out else results_dir / f"netfault-straggler-{args.role}.jsonl"
        role_of = roles(args.topology, args.receivers)
        victim = min(r for r, x in role_of.items() if x == args.role)
        plan = {"kind": "straggler", "receivers": args.receivers, "topology": args.topology, "commit": "producer",
                "role": args.role, "victim": victim}
        rows = []
        with open(out, "a") as sink:
            for rnd in range(args.straggler_rounds):
                for straggle in ((False, True) if rnd % 2 == 0 else (True, False)):
                    work = Path(tempfile.mkdtemp(prefix="dcnf-round."))
                    t0 = time.monotonic()
                    r = run_straggler_job(args, plan, work, f"{tag}x{rnd}", straggle)
                    r.update(round=rnd, wall_seconds=round(time.monotonic() - t0, 2),
                             loadavg_1min=os.getloadavg()[0], rate=args.rate, ratio=args.ratio,
                             deltacast=args.deltacast)
                    if args.keep_all or r["hang"] or r["divergent_survivors"]:
                        dest = results_dir / "netfault-kept" / f"round{rnd}-{'s' if straggle else 'c'}"
                        shutil.rmtree(dest, ignore_errors=True)
                        shutil.copytree(work / "job", dest, ignore=shutil.ignore_patterns("secret"))
                        r["kept"] = str(dest)
                    shutil.rmtree(work, ignore_errors=True)
                    sink.write(json.dumps(r) + "\n")
                    sink.flush()
                    rows.append(r)
                    xs = [v for k, v in r["refit_seconds"].items() if int(k) >= 3]
                    print(f"round {rnd} {'straggler' if straggle else 'clean    '} deltas {rng_text(xs, '{:.3f}')} "
                          f"failures {[(f['version'], f['rank'], f['cause']) for f in r['failures']]} "
                          f"exact {r['survivors_exact']}/{r['survivors']} ({r['wall_seconds']} s)", flush=True)
        table = summarize_rounds(rows)
        print(table)
        out.with_suffix(".md").write_text(table + "\n")
        return 0
    out = Path(args.out) if args.out else results_dir / f"netfault-seed{args.seed}.jsonl"
    keep = results_dir / f"netfault-failed-seed{args.seed}"
    results = []
    with open(out, "a") as sink:
        for t in trials:
            plan = plan_trial(args.seed, t, kinds, args.transports.split(","))
            work = Path(tempfile.mkdtemp(prefix=f"dcnf-s{args.seed}-t{t}."))
            r = run_trial(args, plan, work, f"{tag}x{t}")
            r.update(deltacast=args.deltacast, rate=args.rate, ratio=args.ratio, peer_s=args.peer)
            if not r["clean"] or args.keep_all:
                dest = keep / f"trial-{t}"
                shutil.rmtree(dest, ignore_errors=True)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(work, dest, ignore=shutil.ignore_patterns("secret", "watch", "*.safetensors*"))
                r["kept"] = str(dest)
            shutil.rmtree(work, ignore_errors=True)
            sink.write(json.dumps(r) + "\n")
            sink.flush()
            results.append(r)
            print(f"trial {t:3d} {r['kind']:9s} {r.get('transport', 'tcp'):7s} {r['topology']:13s} n={r['receivers']} victim {r['victim']} "
                  f"({r['role']}) -> {'ok' if r['clean'] else 'NOT CLEAN'} exact {r['survivors_exact']}/"
                  f"{r['survivors']} cut {r.get('cut_fate', {})} committed {r['versions_committed']}/"
                  f"{r['versions_expected']} ratio {r.get('overhead_ratio')} ({r['wall_seconds']} s)", flush=True)
    table = summarize(results)
    print()
    print(table)
    out.with_suffix(".md").write_text(table + "\n")
    return 1 if any(r["hang"] or r["divergent_survivors"] or r.get("cut_divergent") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
