#!/usr/bin/env python3
"""Chaos harness for the relay tree's failure repair (a benchmark, not a ctest test).

    chaos.py [--trials 50] [--seed 1] [--deltacast PATH] [--out FILE.jsonl] [--hang 120]
             [--keep DIR] [--only N,M] [--keep-all] [--peer S] [--plan] [--summarize FILE.jsonl]

Each trial is a real job (1 producer + 6-8 receivers as `deltacast run` processes on 127.0.0.1,
tests/integration/recovery/dcfleet.py) in which one or two receivers are killed (SIGKILL) or
frozen (SIGSTOP). Everything a trial varies is drawn from random.Random(f"{seed}:{trial}"), so
`--seed S --only N` replays trial N exactly (up to the machine's timing):

  victims    one or two ranks, each by role in the epoch-0 trees: the root of tree 0 (rank 1),
             an interior relay, or a leaf
  signal     SIGKILL or SIGSTOP per victim (timeouts.peer --peer, default 5 s; heartbeat 1/4 of it)
  moment     `--fault ACTION@VERSION:N` (the victim signals itself after its N-th data message of
             VERSION; version 1 = the bootstrap), or an external signal from this harness a random
             0-300 ms after a producer line ("receivers joined": during the bootstrap; "step K:")
  topology   binary, double_binary, chain
  transport  tcp, ucx, ofi+tcp (UCX/libfabric pinned to lo)
  commit     producer, delegated (docs/protocol.md, "Delegated commit")
  model      10-20M parameters, 4-5 steps, lr 1e-5 (~5% of elements change), 256 KiB chunks
             (the bootstrap and each delta are ~80-160 data messages)

A trial that does not finish within --hang seconds is a hang: every process is killed. Frozen
victims are SIGKILLed at the end. A victim whose fault never fired (its version carried fewer
messages than N, or it was moved away first) is a survivor like any other member.

One JSON line per trial to --out, then a summary table (stdout, and FILE.md beside FILE.jsonl).
Survivors are classed: exact (SHA-256 and version equal the producer's report), divergent (same
version, other bits: the failure this harness exists to find), stale (exit 0 at an older
version), failed (non-zero exit or no summary). Work directories of trials with anything but
"every survivor exact, producer exit 0" are kept (--keep, default bench/recovery/results/failed-
seed<S>/trial-<N>) with their logs; the others are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "recovery"))
sys.dont_write_bytecode = True  # nothing written into the source tree
import dcfleet  # noqa: E402

TOPOLOGIES = ["binary", "double_binary", "chain"]
TRANSPORTS = ["tcp", "ucx", "ofi+tcp"]


# --- roles in the epoch-0 trees (tree/topology.h; job rank = member index + 1) ------------------
def binary_parent(m: int) -> int:
    return -1 if m == 0 else (m - 1) // 2


def chain_parent(m: int) -> int:
    return m - 1


def _bit_tree_parent(m: int, r: int) -> int:
    """tree/topology.cpp bit_tree_links: the parent of r in the in-order bit tree over 0..m-1."""
    if r == 0:
        return -1
    b = r & -r
    up = (r ^ b) | (b << 1)
    if up >= m:
        up = r ^ b
    return up


def double_binary_parents(n: int) -> list:
    """[tree 0 parents, tree 1 parents] over member indices (-1 = the producer), as
    tree/topology.cpp double_binary_tree_links builds them: the bit tree over the first
    m = n - n % 2 members, its mirror r -> m-1-r, and an odd n's last member a leaf under both
    roots."""
    m = n - n % 2
    t0 = [_bit_tree_parent(m, r) for r in range(m)]
    t1 = []
    for r in range(m):
        p = _bit_tree_parent(m, m - 1 - r)
        t1.append(-1 if p == -1 else m - 1 - p)
    if n % 2:
        t0.append(0)
        t1.append(m - 1)
    return [t0, t1]


def tree_parents(topology: str, n: int) -> list:
    if topology == "binary":
        return [[binary_parent(m) for m in range(n)]]
    if topology == "chain":
        return [[chain_parent(m) for m in range(n)]]
    return double_binary_parents(n)


def roles(topology: str, n: int) -> dict:
    """Job rank -> its role in tree 0: 'root' (rank 1), 'interior' (has a child) or 'leaf'. In a
    double binary tree a leaf of tree 0 is interior in tree 1 (except an odd n's last member)."""
    parents = tree_parents(topology, n)[0]
    out = {}
    for m in range(n):
        out[m + 1] = "root" if parents[m] == -1 else ("interior" if m in parents else "leaf")
    return out


# --- one trial -----------------------------------------------------------------------------------
def plan_trial(seed: int, trial: int) -> dict:
    rng = random.Random(f"{seed}:{trial}")
    receivers = rng.choice([6, 7, 8])
    topology = rng.choice(TOPOLOGIES)
    transport = rng.choice(TRANSPORTS)
    params_m = rng.choice([10, 16, 20])
    steps = rng.choice([4, 5])
    role_of = roles(topology, receivers)
    by_role = {}
    for rank, role in role_of.items():
        by_role.setdefault(role, []).append(rank)
    count = 1 if rng.random() < 0.6 else 2
    victims = []
    same_moment = count == 2 and rng.random() < 0.3
    for i in range(count):
        role = rng.choice([r for r in ("root", "interior", "leaf") if any(
            x not in [v["rank"] for v in victims] for x in by_role.get(r, []))])
        rank = rng.choice([x for x in by_role[role] if x not in [v["rank"] for v in victims]])
        action = rng.choice(["kill", "stop"])
        if same_moment and i == 1:
            moment = dict(victims[0]["moment"])
        elif rng.random() < 0.7:
            version = 1 if rng.random() < 0.25 else rng.randint(2, steps + 1)
            # Chunks of 256 KiB cut the checkpoint's bytes, so the bootstrap and every delta of
            # a P-million-parameter model carry about 8P data messages (fewer bytes each for a
            # delta): N anywhere up to 0.9 of that lands inside the version.
            after = rng.randint(1, max(2, params_m * 8 * 9 // 10))
            moment = {"kind": "fault", "version": version, "after": after}
        else:
            step = rng.randint(0, steps - 1)  # 0: after "receivers joined" (the bootstrap)
            moment = {"kind": "external", "after_step": step, "delay_s": round(rng.uniform(0.0, 0.3), 3)}
        victims.append({"rank": rank, "role": role, "signal": "SIGKILL" if action == "kill" else "SIGSTOP",
                        "moment": moment})
    # Drawn last, so that a seed's earlier plans stay what they were before the commit mode existed.
    commit = rng.choice(["producer", "delegated"])
    return {"seed": seed, "trial": trial, "receivers": receivers, "topology": topology, "transport": transport,
            "params": f"{params_m}M", "steps": steps, "victims": victims, "commit": commit}


def moment_text(v: dict) -> str:
    m = v["moment"]
    action = "kill" if v["signal"] == "SIGKILL" else "stop"
    if m["kind"] == "fault":
        return f"--fault {action}@{m['version']}:{m['after']}"
    line = "receivers joined" if m["after_step"] == 0 else f"step {m['after_step']}:"
    return f"external {v['signal']} {m['delay_s']:.3f} s after '{line}'"


def run_trial(dc: str, plan: dict, hang_s: float, work: Path, peer_s: float) -> dict:
    job = dcfleet.JobConfig(receivers=plan["receivers"], topology=plan["topology"], transport=plan["transport"],
                            params=plan["params"], steps=plan["steps"], lr="1e-5", seed=plan["trial"] + 1,
                            chunk_bytes="256KiB", connect="5s", heartbeat=f"{int(peer_s * 250)}ms",
                            peer=f"{int(peer_s * 1000)}ms",
                            refit="60s", join="60s", producer_loss="10s", log_level="info",
                            commit=plan.get("commit", "auto"))
    t0 = time.monotonic()
    result = dict(plan)
    result["victims"] = [dict(v) for v in plan["victims"]]
    faults = {}
    for v in result["victims"]:
        v["moment_text"] = moment_text(v)
        if v["moment"]["kind"] == "fault":
            action = "kill" if v["signal"] == "SIGKILL" else "stop"
            faults[v["rank"]] = f"{action}@{v['moment']['version']}:{v['moment']['after']}"
    hang = None
    with dcfleet.Fleet(dc, work, job) as fleet:
        fleet.start(faults)
        deadline = t0 + hang_s
        # External signals, in the order their moments come.
        external = sorted((v for v in result["victims"] if v["moment"]["kind"] == "external"),
                          key=lambda v: (v["moment"]["after_step"], v["moment"]["delay_s"]))
        for v in external:
            m = v["moment"]
            pattern = r"receivers joined" if m["after_step"] == 0 else rf"^step {m['after_step']}: "
            seen = fleet.wait_line(pattern, max(0.0, deadline - time.monotonic()))
            v["fired"] = False
            if not seen:
                continue
            time.sleep(m["delay_s"])
            if fleet.current[v["rank"]].poll() is None:
                v["signalled_at"] = dcfleet.seconds_of_day()
                fleet.signal(v["rank"], signal.SIGKILL if v["signal"] == "SIGKILL" else signal.SIGSTOP)
                v["fired"] = True
        rc0 = fleet.wait_producer(max(0.0, deadline - time.monotonic()))
        if rc0 is None:
            hang = "producer"
        victim_ranks = {v["rank"] for v in result["victims"]}
        # Survivors follow the producer's BYE (or its loss, within producer_loss).
        rest_deadline = min(deadline, time.monotonic() + 30) if rc0 is not None else time.monotonic()
        codes = {}
        for r in range(1, plan["receivers"] + 1):
            p = fleet.current[r]
            stopped_victim = r in victim_ranks and v_fired_stop(result, r, fleet)
            if stopped_victim:
                codes[r] = p.poll()
                continue
            codes[r] = p.wait(max(0.0, rest_deadline - time.monotonic()))
            if codes[r] is None and rc0 is not None and not (r in victim_ranks):
                hang = hang or f"rank {r}"
        fleet.kill_all()
        codes = {r: fleet.current[r].rc for r in codes}
        result["exit_codes"] = {str(r): c for r, c in [(0, fleet.producer.rc)] + sorted(codes.items())}
        result["hang"] = hang is not None
        result["hang_what"] = hang
        report = fleet.report()
        logs = {r: fleet.current[r].log.read_text(errors="replace") for r in range(1, plan["receivers"] + 1)}
        # A listener that lost its randomly picked port to another process: the harness's fault,
        # not a finding (main() runs the trial again on other ports).
        result["bind_failed"] = any("Address already in use" in text for text in
                                    [fleet.current[0].log.read_text(errors="replace"), *logs.values()])
        for v in result["victims"]:
            if v["moment"]["kind"] == "fault":
                v["fired"] = "--fault" in logs[v["rank"]] and "this process now" in logs[v["rank"]]
        # A signal that landed after the producer's last commit hit no version: the job was over
        # for that member (it is not a survivor either: it was frozen or killed before BYE).
        commits = dcfleet.log_times(fleet.current[0].log, r"committed in")
        for v in result["victims"]:
            at = v.get("signalled_at")
            if at is None and v.get("fired"):
                own = dcfleet.log_times(fleet.current[v["rank"]].log, r"--fault .* this process now")
                at = own[0] if own else None
            v["after_last_commit"] = bool(v.get("fired") and at is not None and commits and at > max(commits))
        fired = {v["rank"] for v in result["victims"] if v.get("fired")}
        survivors = [r for r in range(1, plan["receivers"] + 1) if r not in fired]
        classes = {"exact": [], "divergent": [], "stale": [], "failed": []}
        for r in survivors:
            s = fleet.summary(r)
            if report is None or s is None or codes[r] != 0:
                # no producer report: nothing to compare with; the producer's failure is counted
                # on its own
                if report is not None and s is not None and s["sha256"] != report["sha256"] \
                        and s["version"] == report["version"]:
                    classes["divergent"].append(r)
                else:
                    classes["failed"].append(r)
            elif s["version"] == report["version"] and s["sha256"] == report["sha256"]:
                classes["exact"].append(r)
            elif s["version"] == report["version"]:
                classes["divergent"].append(r)
            else:
                classes["stale"].append(r)
        result["survivors"] = len(survivors)
        result["survivors_exact"] = len(classes["exact"])
        result["divergent_survivors"] = classes["divergent"]
        result["stale_survivors"] = classes["stale"]
        result["failed_survivors"] = classes["failed"]
        result["producer_ok"] = bool(report and report.get("ok") and fleet.producer.rc == 0)
        result["versions_expected"] = plan["steps"] + 1
        if report:
            ents = dcfleet.entries(report)
            result["versions_committed"] = sum(1 for e in ents if e.get("committed"))
            faulted = [e for e in ents if e.get("failed_members")]
            clean = [e["refit_seconds"] for e in ents[2:] if not e.get("failed_members")]  # deltas after the 1st
            clean_ref = statistics.median(clean) if clean else None
            result["clean_refit_seconds_median"] = clean_ref
            result["faulted"] = []
            signalled = {v["rank"]: v.get("signalled_at") for v in result["victims"]}
            for e in faulted:
                det = max(m["detection_seconds"] for m in e["failed_members"])
                # Also from the moment of the fault (logs: the victim's --fault line or this
                # harness's signal, to the producer's 'rank R failed'): the report's
                # detection_seconds starts at the last sign of life, which for a freeze may lie
                # before the version began.
                from_fault = [dcfleet.fault_to_detection(fleet, m["rank"], signalled.get(m["rank"]))
                              for m in e["failed_members"]]
                item = {"version": e["version"], "committed": e["committed"],
                        "failed": [{"rank": m["rank"], "cause": m["cause"],
                                    "detection_seconds": round(m["detection_seconds"], 3),
                                    "fault_to_detection_seconds": f}
                                   for m, f in zip(e["failed_members"], from_fault)],
                        "refit_seconds": round(e["refit_seconds"], 4), "detection_seconds": round(det, 3),
                        "repair_seconds": round(e["repair_seconds"], 4), "resent_chunks": e["resent_chunks"]}
                if e["version"] > 2 and clean_ref:
                    item["overhead_ratio"] = round((e["refit_seconds"] - det) / clean_ref, 3)
                    if all(f is not None for f in from_fault):
                        item["overhead_ratio_from_fault"] = round((e["refit_seconds"] - max(from_fault)) / clean_ref, 3)
                result["faulted"].append(item)
            named = {m["rank"] for e in faulted for m in e["failed_members"]}
            late = {v["rank"] for v in result["victims"] if v.get("after_last_commit")}
            result["unreported_victims"] = sorted(fired - named - late)
            result["failed_non_victims"] = sorted(named - fired)
        else:
            result["versions_committed"] = 0
            result["faulted"] = []
            result["unreported_victims"] = sorted(fired)
            result["failed_non_victims"] = []
    result["wall_seconds"] = round(time.monotonic() - t0, 2)
    result["loadavg_1min"] = os.getloadavg()[0]
    result["clean"] = (not result["hang"] and result["producer_ok"] and not result["divergent_survivors"]
                       and not result["stale_survivors"] and not result["failed_survivors"]
                       and result["versions_committed"] == result["versions_expected"])
    return result


def v_fired_stop(result: dict, rank: int, fleet) -> bool:
    """A SIGSTOP victim that is (probably) frozen now: not waited for, killed at the end."""
    for v in result["victims"]:
        if v["rank"] == rank and v["signal"] == "SIGSTOP":
            if v["moment"]["kind"] == "external":
                return bool(v.get("fired"))
            text = fleet.current[rank].log.read_text(errors="replace")
            return "stopping this process now" in text
    return False


# --- summary -------------------------------------------------------------------------------------
def summarize(results: list) -> str:
    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")

    n = len(results)
    committed = sum(r["versions_committed"] for r in results)
    expected = sum(r["versions_expected"] for r in results)
    survivors = sum(r["survivors"] for r in results)
    exact = sum(r["survivors_exact"] for r in results)
    divergent = sum(len(r["divergent_survivors"]) for r in results)
    stale = sum(len(r["stale_survivors"]) for r in results)
    failed = sum(len(r["failed_survivors"]) for r in results)
    hangs = sum(1 for r in results if r["hang"])
    producer_failed = sum(1 for r in results if not r["producer_ok"])
    fired = sum(1 for r in results for v in r["victims"] if v.get("fired"))
    late = sum(1 for r in results for v in r["victims"] if v.get("after_last_commit"))
    planned = sum(len(r["victims"]) for r in results)
    unreported = sum(len(r.get("unreported_victims", [])) for r in results)
    ratios = [f["overhead_ratio"] for r in results for f in r["faulted"] if "overhead_ratio" in f]
    ratios_fault = [f["overhead_ratio_from_fault"] for r in results for f in r["faulted"]
                    if "overhead_ratio_from_fault" in f]
    det_kill = [f["detection_seconds"] for r in results for f in r["faulted"]
                if all(m["cause"] == "link_closed" for m in f["failed"])]
    det_stop = [m["detection_seconds"] for r in results for f in r["faulted"] for m in f["failed"]
                if m["cause"] in ("silent", "stalled")]
    repair = [f["repair_seconds"] for r in results for f in r["faulted"]]
    resent = [f["resent_chunks"] for r in results for f in r["faulted"]]
    lines = ["| trials | versions committed | survivors exact | divergent survivors | stale / failed survivors "
             "| hangs | producer not ok | victims fired / planned (after the last commit; unreported) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |",
             f"| {n} | {committed}/{expected} | {exact}/{survivors} | {divergent} | {stale} / {failed} | {hangs} "
             f"| {producer_failed} | {fired}/{planned} ({late}; {unreported}) |", ""]

    def rng_text(xs, fmt="{:.2f}"):
        if not xs:
            return "-"
        return (f"median {fmt.format(statistics.median(xs))}, p10-p90 {fmt.format(pct(xs, 0.1))}-"
                f"{fmt.format(pct(xs, 0.9))}, range {fmt.format(min(xs))}-{fmt.format(max(xs))} (n={len(xs)})")

    lines.append("Recovery overhead of faulted delta versions (after the first delta): "
                 "(refit_seconds - detection_seconds) / median clean delta refit of the same trial: "
                 + rng_text(ratios))
    lines.append("")
    lines.append("The same with the detection time counted from the fault itself (victim's or harness's signal "
                 "to the producer's 'rank R failed' log line): " + rng_text(ratios_fault))
    lines.append("")
    def kind(f):
        return "kill" if all(m["cause"] == "link_closed" for m in f["failed"]) else "stop"
    for t in sorted({r["transport"] for r in results}):
        for k in ("kill", "stop"):
            xs = [f["overhead_ratio_from_fault"] for r in results if r["transport"] == t for f in r["faulted"]
                  if "overhead_ratio_from_fault" in f and kind(f) == k]
            rep = [f["repair_seconds"] for r in results if r["transport"] == t for f in r["faulted"] if kind(f) == k]
            lines.append(f"- {t}, {k} (every failure a closed link)" if k == "kill" else f"- {t}, {k} (a silent member)")
            lines[-1] += ": overhead from the fault " + rng_text(xs) + "; repair s " + rng_text(rep, "{:.3f}")
    lines.append("")
    peers = sorted({r.get("peer_s") for r in results})
    lines.append("Detection: SIGKILL (link_closed) " + rng_text(det_kill, "{:.3f}") + " s; SIGSTOP (silent/"
                 "stalled) " + rng_text(det_stop) + f" s (timeouts.peer {peers} s)")
    lines.append("")
    lines.append("Repair seconds " + rng_text(repair, "{:.3f}") + "; resent chunks " + rng_text(resent, "{:.0f}"))
    root_frozen = [(r["trial"], f["repair_seconds"]) for r in results for f in r["faulted"]
                   if any(m["rank"] == 1 and m["cause"] != "link_closed" for m in f["failed"])]
    slow = [t for t, rep in root_frozen if rep > 0.9 * r_peer(results, t)]
    lines.append("")
    lines.append(f"Frozen root (rank 1 silent): {len(root_frozen)} versions; repair longer than 0.9 x timeouts.peer in "
                 f"{len(slow)} (trials {slow}); repairs {sorted(round(x, 2) for _, x in root_frozen)} s")
    lines.append("")
    # by transport / topology
    lines.append("| by | trials | clean trials | survivors exact | hangs |")
    lines.append("| --- | --- | --- | --- | --- |")
    for key in ("transport", "topology", "commit"):
        for value in sorted({r[key] for r in results}):
            rs = [r for r in results if r[key] == value]
            lines.append(f"| {key} {value} | {len(rs)} | {sum(r['clean'] for r in rs)} | "
                         f"{sum(r['survivors_exact'] for r in rs)}/{sum(r['survivors'] for r in rs)} | "
                         f"{sum(r['hang'] for r in rs)} |")
    bad = [r for r in results if not r["clean"]]
    if bad:
        lines.append("")
        lines.append("Trials that were not clean:")
        for r in bad:
            vs = "; ".join(f"rank {v['rank']} ({v['role']}) {v['moment_text']}{'' if v.get('fired') else ' [not fired]'}"
                           for v in r["victims"])
            lines.append(f"- trial {r['trial']} ({r['topology']}, {r['transport']}, {r['receivers']} receivers): {vs}: "
                         f"exit codes {r['exit_codes']}, committed {r['versions_committed']}/{r['versions_expected']}, "
                         f"hang {r['hang_what']}, divergent {r['divergent_survivors']}, stale {r['stale_survivors']}, "
                         f"failed {r['failed_survivors']}; logs {r.get('kept', '-')}")
    return "\n".join(lines)


def r_peer(results: list, trial: int) -> float:
    return next((r.get("peer_s") or 5.0) for r in results if r["trial"] == trial)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--deltacast", default=None)
    parser.add_argument("--out", default=None, help="JSON lines (default bench/recovery/results/chaos-seed<S>.jsonl)")
    parser.add_argument("--hang", type=float, default=120.0, help="seconds before a trial counts as a hang")
    parser.add_argument("--peer", type=float, default=5.0,
                        help="timeouts.peer in seconds (heartbeat: a quarter of it); 2 s gives ofi+tcp false "
                             "'silent' failures on a loaded 2-core machine")
    parser.add_argument("--keep", default=None, help="where to keep failing trials' logs")
    parser.add_argument("--only", default=None, help="comma-separated trial numbers to run")
    parser.add_argument("--keep-all", action="store_true", help="keep every trial's logs, clean or not")
    parser.add_argument("--plan", action="store_true", help="print the trials' plans and exit")
    parser.add_argument("--summarize", metavar="JSONL", help="print the summary of an earlier run's results and exit")
    args = parser.parse_args()
    if args.summarize:
        print(summarize([json.loads(line) for line in open(args.summarize) if line.strip()]))
        return 0
    dc = dcfleet.find_deltacast(args.deltacast)
    results_dir = HERE / "results"
    out = Path(args.out) if args.out else results_dir / f"chaos-seed{args.seed}.jsonl"
    keep = Path(args.keep) if args.keep else results_dir / f"failed-seed{args.seed}"
    trials = [int(x) for x in args.only.split(",")] if args.only else list(range(args.trials))
    if args.plan:
        for t in trials:
            print(json.dumps(plan_trial(args.seed, t)))
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"chaos: {len(trials)} trials, seed {args.seed}, {dc}, results to {out}", flush=True)
    with open(out, "a") as sink:
        for t in trials:
            plan = plan_trial(args.seed, t)
            for attempt in range(3):
                work = Path(tempfile.mkdtemp(prefix=f"dc-chaos-s{args.seed}-t{t}."))
                r = run_trial(dc, plan, args.hang, work, args.peer)
                r["bind_retries"] = attempt
                if not r["bind_failed"] or attempt == 2:
                    break
                print(f"trial {t:3d}: a listener's port was taken (Address already in use); running it again",
                      flush=True)
                shutil.rmtree(work, ignore_errors=True)
            r["peer_s"] = args.peer
            r["deltacast"] = dc
            if not r["clean"] or args.keep_all:
                dest = keep / f"trial-{t}"
                shutil.rmtree(dest, ignore_errors=True)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(work, dest, ignore=shutil.ignore_patterns("secret"))
                r["kept"] = str(dest)
            shutil.rmtree(work, ignore_errors=True)
            sink.write(json.dumps(r) + "\n")
            sink.flush()
            results.append(r)
            vs = ", ".join(f"{v['rank']}:{v['role']}:{v['moment_text']}{'' if v.get('fired') else '(not fired)'}"
                           for v in r["victims"])
            print(f"trial {t:3d} {r['topology']:13s} {r['transport']:7s} n={r['receivers']} [{vs}] -> "
                  f"{'ok' if r['clean'] else 'NOT CLEAN'} exact {r['survivors_exact']}/{r['survivors']} "
                  f"committed {r['versions_committed']}/{r['versions_expected']} hang={r['hang']} "
                  f"({r['wall_seconds']:.1f} s)", flush=True)
    table = summarize(results)
    print()
    print(table)
    out.with_suffix(".md").write_text(table + "\n")
    bad = sum(1 for r in results if r["hang"] or r["divergent_survivors"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
