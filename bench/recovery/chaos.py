#!/usr/bin/env python3
"""Chaos harness for the relay tree's failure repair (a benchmark; its --small form is a ctest test).

    chaos.py [--trials 50] [--seed 1] [--deltacast PATH] [--out FILE.jsonl] [--hang 300] [--refit 60]
             [--keep DIR] [--only N,M] [--kinds K,..] [--keep-all] [--peer S] [--plan] [--small] [--strict]
             [--break no_restart|no_resume|divergent] [--summarize FILE.jsonl]

Each trial is a real job (1 producer, or a group of 2 producer ranks, + 5-8 receivers as `deltacast
run` processes on 127.0.0.1, tests/integration/recovery/dcfleet.py) with one kind of fault (KINDS
below). Everything a trial varies is drawn from its seed: the base from
random.Random(f"{seed}:{trial}") exactly as before the kinds existed, the kind and its victims
from random.Random(f"{seed}:{trial}:kind") (about 30% of trials keep the old one-or-two-victim
draw), so `--seed S --only N` replays trial N (up to the machine's timing):

  kind       kill, stop (one receiver), two, three (at once), bootstrap (in the victim's own
             bootstrap), second_in_repair (signalled at the producer's 'rank R failed' of the
             first), restart (killed, relaunched 0.5-5 s after it died: must rejoin and end
             exact), producer (SIGKILLed mid-version, `run --resume` 0.5-3 s after), group_rank
             (M = 2: the part rank or the coordinator SIGKILLed mid-version and resumed); receiver
             kinds but restart run under M = 2 producer ranks in 20% of trials
  victims    by role in the epoch-0 trees: the root of tree 0 (rank 1), an interior relay, a leaf
  signal     SIGKILL or SIGSTOP per victim (timeouts.peer --peer, default 5 s; heartbeat 1/4 of it)
  moment     `--fault ACTION@VERSION:N` (the victim signals itself after its N-th data message of
             VERSION; version 1 = the bootstrap), or an external signal from this harness a random
             0-300 ms after a producer line ("receivers joined": during the bootstrap; "step K:"),
             or at another victim's fault line, or at the producer's verdict on another victim
  topology   binary, double_binary, chain
  transport  tcp, ucx, ofi+tcp (UCX/libfabric pinned to lo)
  commit     producer, delegated (docs/protocol.md, "Delegated commit")
  model      10-20M parameters, 4-5 steps, lr 1e-5 (~5% of elements change), 256 KiB chunks;
             restart trials: the producer follows a checkpoint directory (trainer.kind watch) this
             harness fills, one checkpoint 0.3 s after the previous version's line, until the
             victim is back in the tree and two more versions committed (then SIGTERM: BYE)

A hang: no new producer line or log byte for 2 x timeouts.refit (--refit), or the trial past --hang
seconds; every process is then killed. Frozen victims are SIGKILLed at the end. A victim whose
fault never fired (its version carried fewer messages than N, or it was moved away first) is a
survivor like any other member.

Recorded per trial (one JSON line to --out; a summary table per transport x kind, and a strip plot
of the ratios as SVG, beside it): survivors (restarted victims included) exact (SHA-256, or a
group's digest, and version equal the producer's report), divergent (same version, other bits:
the failure this harness exists to find), stale (an older version), failed (a non-zero exit or no
summary; exit 1 after an aborted version is legitimate when the member ends exact); versions
committed and aborted; detection from the fault (this harness's signal time or the victim's
--fault line) to the producer's verdict (the report's FailedMember detected_at_unix); the
faulted version's (refit - detection inside it: the union of each failed member's window from its
fault, or the version's start, to its verdict) / the trial's median clean delta; a restarted
victim's rejoin time (relaunch to the producer's 'back in the tree'); a killed producer's
detection (the receivers' 'lost the producer', or the coordinator's 'rank 1 lost') and the time
to the resumed producer's first commit. A trial is clean when nothing hung, the producer (every
rank) exited 0 with ok, every survivor is exact, every relaunched victim is back exact, and
every version committed. Work directories of trials that were not clean are kept (--keep,
default bench/recovery/results/failed-seed<S>/trial-<N>) with their logs; the others are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

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


def union_seconds(windows: list) -> float:
    """The length of the union of [begin, end] intervals (seconds)."""
    total, reach = 0.0, None
    for begin, end in sorted(windows):
        if reach is None or begin > reach:
            total += end - begin
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


# --- the plan of one trial -----------------------------------------------------------------------
# Fault kinds (one a trial; docs/reliability.md "Chaos trials"):
#   kill, stop        one receiver SIGKILLed / SIGSTOPped (root, interior or leaf)
#   two               two receivers, each killed or frozen, at one moment or two
#   three             three receivers at once (one external moment, or one --fault moment)
#   bootstrap         one receiver killed or frozen in the middle of its own bootstrap (--fault ACTION@1:N)
#   second_in_repair  a second receiver signalled as soon as the producer logs the first one's failure
#   restart           one receiver SIGKILLed, then relaunched 0.5-5 s after it died: it must rejoin and end
#                     exact (the producer follows a checkpoint directory the harness fills, so that the
#                     job runs until the victim is back and two more versions committed)
#   producer          the producer SIGKILLed mid-version, restarted with --resume 0.5-3 s later
#   group_rank        M = 2 producer ranks: the part rank (70%) or the coordinator (30%) SIGKILLed
#                     mid-version and resumed with --resume (the coordinator: both ranks)
# Receiver kinds also run under a producer group of M = 2 in 20% of trials (not restart: a group
# over the checkpoint directory needs a sharded checkpoint).
KINDS = ["kill", "stop", "two", "three", "bootstrap", "second_in_repair", "restart", "producer", "group_rank"]
RECEIVER_KINDS = KINDS[:7]


def legacy_plan(seed: int, trial: int) -> dict:
    """The plan every trial had before the fault kinds (kept so that old seeds keep their draws)."""
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
        else:
            moment = draw_moment(rng, steps, params_m)
        victims.append({"rank": rank, "role": role, "signal": "SIGKILL" if action == "kill" else "SIGSTOP",
                        "moment": moment})
    # Drawn last, so that a seed's earlier plans stay what they were before the commit mode existed.
    commit = rng.choice(["producer", "delegated"])
    return {"seed": seed, "trial": trial, "receivers": receivers, "topology": topology, "transport": transport,
            "params": f"{params_m}M", "steps": steps, "victims": victims, "commit": commit}


def draw_moment(rng: random.Random, steps: int, params_m: int, version: Optional[int] = None,
                external_p: float = 0.3, ext_delay: float = 0.3) -> dict:
    """`--fault` at a data message of a version (the bootstrap 25% of the time), or an external
    signal 0-300 ms (ext_delay) after a producer line ("receivers joined" or "step K:")."""
    if version is not None or rng.random() < 1 - external_p:
        if version is None:
            version = 1 if rng.random() < 0.25 else rng.randint(2, steps + 1)
        # Chunks of 256 KiB cut the checkpoint's bytes, so the bootstrap and every delta of a
        # P-million-parameter model carry about 8P data messages (fewer bytes each for a delta):
        # N anywhere up to 0.9 of that lands inside the version.
        after = rng.randint(1, max(2, params_m * 8 * 9 // 10))
        return {"kind": "fault", "version": version, "after": after}
    step = rng.randint(0, steps - 1)  # 0: after "receivers joined" (the bootstrap)
    return {"kind": "external", "after_step": step, "delay_s": round(rng.uniform(0.0, ext_delay), 3)}


def plan_trial(seed: int, trial: int, small: bool = False) -> dict:
    """Trial `trial` of seed `seed`. The base (receivers, topology, transport, model, steps, commit
    mode) is legacy_plan's; the kind, and for every kind but a legacy draw its victims, come from a
    second stream f"{seed}:{trial}:kind". About 30% of trials keep the legacy victims (kill / stop /
    two by what they hold), so older seeds' trials of one or two victims stay what they were.
    small: the ctest form (smaller models, fewer steps, shorter delays; kind and transport cycle
    with the trial number so that any 27 consecutive trials cover every kind on every transport)."""
    plan = legacy_plan(seed, trial)
    x = random.Random(f"{seed}:{trial}:kind")
    if small:
        kind = KINDS[trial % len(KINDS)]
        plan["transport"] = TRANSPORTS[(trial // len(KINDS)) % len(TRANSPORTS)]
        plan["receivers"] = x.choice([5, 6])
        plan["params"] = x.choice(["2M", "4M"])
        plan["steps"] = x.choice([3, 4])
        legacy = False
    else:
        legacy = x.random() < 0.3
        kind = None if legacy else x.choice(KINDS[2:])
    params_m = int(plan["params"].rstrip("M"))
    steps = plan["steps"]
    n = plan["receivers"]
    role_of = roles(plan["topology"], n)
    plan["producers"] = 1
    plan["producer_fault"] = None
    plan["watch"] = False
    max_delay = 2.5 if small else 5.0
    # A small model's version takes 30-100 ms: an external signal more than 50 ms after a line
    # lands in the next version or after the last.
    ext_delay = 0.05 if small else 0.3
    if legacy:
        kind = "two" if len(plan["victims"]) == 2 else (
            "kill" if plan["victims"][0]["signal"] == "SIGKILL" else "stop")
        plan["legacy_victims"] = True
    else:
        plan["victims"] = []

    def pick(count: int) -> list:
        ranks = x.sample(range(1, n + 1), count)
        return [{"rank": r, "role": role_of[r]} for r in ranks]

    def sig(p_kill: float = 0.5) -> str:
        return "SIGKILL" if x.random() < p_kill else "SIGSTOP"

    if kind in ("kill", "stop") and not legacy:
        v = pick(1)[0]
        v.update(signal="SIGKILL" if kind == "kill" else "SIGSTOP", moment=draw_moment(x, steps, params_m, ext_delay=ext_delay))
        plan["victims"] = [v]
    elif kind == "two" and not legacy:
        vs = pick(2)
        m = draw_moment(x, steps, params_m, ext_delay=ext_delay)
        for i, v in enumerate(vs):
            v.update(signal=sig(), moment=dict(m) if i == 0 or x.random() < 0.3 else draw_moment(x, steps, params_m, ext_delay=ext_delay))
        plan["victims"] = vs
    elif kind == "three":
        # At once: the first by its --fault, the other two signalled as soon as its log says it
        # fired (within ~10 ms); or all three by one external signal.
        vs = pick(3)
        m = draw_moment(x, steps, params_m, ext_delay=ext_delay, external_p=0.3)
        for i, v in enumerate(vs):
            v.update(signal=sig(), moment=dict(m) if i == 0 or m["kind"] == "external" else
                     {"kind": "with", "of": vs[0]["rank"]})
        plan["victims"] = vs
    elif kind == "bootstrap":
        v = pick(1)[0]
        v.update(signal=sig(), moment=draw_moment(x, steps, params_m, ext_delay=ext_delay, version=1))
        plan["victims"] = [v]
    elif kind == "second_in_repair":
        first, second = pick(2)
        first.update(signal=sig(), moment=draw_moment(x, steps, params_m, ext_delay=ext_delay))
        second.update(signal=sig(), moment={"kind": "on_failure", "of": first["rank"]})
        plan["victims"] = [first, second]
    elif kind == "restart":
        v = pick(1)[0]
        version = x.randint(1, 4)
        v.update(signal="SIGKILL", moment=draw_moment(x, 3, params_m, ext_delay=ext_delay, version=None if x.random() < 0.3 else version),
                 restart_after_s=round(x.uniform(0.5, max_delay), 3))
        plan["victims"] = [v]
        plan["watch"] = True
        plan["steps"] = 4  # at least: the harness drops checkpoints until the victim is back (+2)
    elif kind == "producer":
        if x.random() < 0.8:
            version = x.randint(2, steps + 1)
            after = "commit" if x.random() < 0.15 else x.randint(1, max(2, params_m * 8 * 9 // 10))
            moment = {"kind": "fault", "version": version, "after": after}
        else:
            moment = {"kind": "external", "after_step": x.randint(1, steps - 1), "delay_s": round(x.uniform(0, 0.3), 3)}
        plan["producer_fault"] = {"rank": 0, "moment": moment, "resume_after_s": round(x.uniform(0.5, 3.0), 3)}
    elif kind == "group_rank":
        plan["producers"] = 2
        rank = 1 if x.random() < 0.7 else 0
        version = x.randint(2, steps + 1)
        # A part rank sends about half the chunks.
        after = x.randint(1, max(2, params_m * 8 * 9 // 20))
        plan["producer_fault"] = {"rank": rank, "moment": {"kind": "fault", "version": version, "after": after},
                                  "resume_after_s": round(x.uniform(0.5, 3.0), 3)}
    if kind in RECEIVER_KINDS and kind != "restart" and not legacy and x.random() < 0.2:
        plan["producers"] = 2
    plan["kind"] = kind
    plan["small"] = small
    return plan


def moment_text(v: dict) -> str:
    m = v["moment"]
    action = "kill" if v["signal"] == "SIGKILL" else "stop"
    if m["kind"] == "fault":
        return f"--fault {action}@{m['version']}:{m['after']}"
    if m["kind"] == "on_failure":
        return f"{v['signal']} at the producer's 'rank {m['of']} failed'"
    if m["kind"] == "with":
        return f"{v['signal']} at rank {m['of']}'s fault"
    line = "receivers joined" if m["after_step"] == 0 else f"step {m['after_step']}:"
    return f"external {v['signal']} {m['delay_s']:.3f} s after '{line}'"


def victim_text(v: dict) -> str:
    t = f"{v['rank']}:{v['role']}:{moment_text(v)}"
    if "restart_after_s" in v:
        t += f", restarted {v['restart_after_s']:.1f} s after"
    return t


def producer_fault_text(pf: dict) -> str:
    m = pf["moment"]
    who = "producer" if pf["rank"] == 0 else f"producer rank {pf['rank']}"
    at = (f"--fault kill@{m['version']}:{m['after']}" if m["kind"] == "fault"
          else f"external SIGKILL {m['delay_s']:.3f} s after 'step {m['after_step']}:'")
    return f"{who} {at}, resumed {pf['resume_after_s']:.1f} s after"


# --- running one trial ---------------------------------------------------------------------------
_STEP_LINE = re.compile(r"^(full checkpoint \(version|step \d+: )")


def unix_of_day(sod: float, ref: float) -> float:
    """A log's seconds-of-day (dcfleet.log_times) as a Unix time near `ref`."""
    t = ref - dcfleet.seconds_of_day(ref) + sod
    if t - ref > 43200:
        t -= 86400
    elif ref - t > 43200:
        t += 86400
    return t


class LogWatch:
    """Lines of the given logs that match a pattern, read again as the files grow (cheap: the
    logs of a trial are a few KiB)."""

    def __init__(self, paths_fn, pattern: str):
        self.paths_fn = paths_fn
        self.rx = re.compile(pattern)

    def first_unix(self, after: float = 0.0) -> Optional[float]:
        ref = time.time()
        best = None
        for path in self.paths_fn():
            for sod in dcfleet.log_times(path, self.rx.pattern):
                t = unix_of_day(sod, ref)
                if t >= after - 0.02 and (best is None or t < best):
                    best = t
        return best


def run_trial(dc: str, plan: dict, hang_s: float, work: Path, peer_s: float, refit_s: float,
              breaks: frozenset = frozenset()) -> dict:
    """One trial. `breaks` breaks the harness or a result on purpose, to see the checks fail:
    no_restart (a killed victim is never relaunched), no_resume (the killed producer is never
    resumed), divergent (one survivor's summary says other bits at the same version)."""
    M = plan.get("producers", 1)
    job_rank = lambda r: r + M - 1  # noqa: E731  a receiver's job rank from its tree rank (1..N)
    mono_to_unix = time.time() - time.monotonic()
    trainer_yaml = None
    files = watch_dir = None
    if plan.get("watch"):
        files, watch_dir = dcfleet.synth_watch(dc, work, plan["params"], 12, plan["trial"] + 1)
        trainer_yaml = f"  kind: watch\n  dir: {watch_dir}\n  steps: 0\n"
    job = dcfleet.JobConfig(receivers=plan["receivers"], topology=plan["topology"], transport=plan["transport"],
                            params=plan["params"], steps=plan["steps"], lr="1e-5", seed=plan["trial"] + 1,
                            chunk_bytes="256KiB", connect="5s", heartbeat=f"{int(peer_s * 250)}ms",
                            peer=f"{int(peer_s * 1000)}ms",
                            refit=f"{int(refit_s)}s", join="60s", producer_loss="30s", log_level=os.environ.get("DC_CHAOS_LOG_LEVEL", "info"),
                            commit=plan.get("commit", "auto"), producers=M, trainer_yaml=trainer_yaml)
    t0 = time.monotonic()
    result = dict(plan)
    result["victims"] = [dict(v) for v in plan["victims"]]
    result["producer_fault"] = dict(plan["producer_fault"]) if plan.get("producer_fault") else None
    pf = result["producer_fault"]
    faults = {}
    for v in result["victims"]:
        v["moment_text"] = moment_text(v)
        if v["moment"]["kind"] == "fault":
            action = "kill" if v["signal"] == "SIGKILL" else "stop"
            faults[job_rank(v["rank"])] = f"{action}@{v['moment']['version']}:{v['moment']['after']}"
    if pf:
        pf["text"] = producer_fault_text(pf)
        if pf["moment"]["kind"] == "fault":
            faults[pf["rank"]] = f"kill@{pf['moment']['version']}:{pf['moment']['after']}"
    hang = None
    with dcfleet.Fleet(dc, work, job) as fleet:
        producer_logs = lambda: [p.log for (r, _), p in fleet.procs.items() if r == 0]  # noqa: E731
        fleet.start(faults)
        deadline = t0 + hang_s

        def producer_lines() -> list:
            with fleet._cv:
                return [ln for (r, _), p in sorted(fleet.procs.items()) if r == 0 for ln in p.lines]

        def line_at(pattern: str) -> Optional[float]:
            rx = re.compile(pattern)
            return next((t for t, text in producer_lines() if rx.search(text)), None)

        # The harness's actions, each once, when its moment comes (polled every 10 ms).
        pending = []  # [ready() -> Optional[monotonic time], do(), name]
        for v in result["victims"]:
            m = v["moment"]
            v["fired"] = False
            sig = signal.SIGKILL if v["signal"] == "SIGKILL" else signal.SIGSTOP

            def fire(v=v, sig=sig):
                if fleet.current[job_rank(v["rank"])].poll() is None:
                    v["signalled_at"] = time.time()
                    fleet.signal(job_rank(v["rank"]), sig)
                    v["fired"] = True
            if m["kind"] == "external":
                pattern = r"receivers joined" if m["after_step"] == 0 else rf"^step {m['after_step']}: "
                pending.append([lambda p=pattern, d=m["delay_s"]: (lambda t: None if t is None else t + d)(line_at(p)),
                                fire, f"signal {v['rank']}"])
            elif m["kind"] == "on_failure":
                watch = LogWatch(producer_logs, rf"producer: rank {m['of']} failed \(")
                pending.append([lambda w=watch: (lambda u: None if u is None else u - mono_to_unix)(w.first_unix()),
                                fire, f"signal {v['rank']} on {m['of']}'s failure"])
            elif m["kind"] == "with":
                watch = LogWatch(lambda of=m["of"]: [fleet.procs[(job_rank(of), 0)].log], r"--fault .* this process now")
                pending.append([lambda w=watch: (lambda u: None if u is None else u - mono_to_unix)(w.first_unix()),
                                fire, f"signal {v['rank']} with {m['of']}"])
            if "restart_after_s" in v:
                def died(v=v):
                    p = fleet.procs.get((job_rank(v["rank"]), 0))
                    if p is None or p.poll() is None:
                        return None
                    v.setdefault("died_at", time.time())
                    return v["died_at"] - mono_to_unix + v["restart_after_s"]

                def relaunch(v=v):
                    if "no_restart" in breaks:
                        return
                    v["restarted_at"] = time.time()
                    fleet.start_receiver(job_rank(v["rank"]))
                pending.append([died, relaunch, f"restart {v['rank']}"])
        if pf:
            pf["fired"] = False
            prank = pf["rank"]
            if pf["moment"]["kind"] == "external":
                def kill_producer():
                    if fleet.current[prank].poll() is None:
                        pf["signalled_at"] = time.time()
                        fleet.signal(prank, signal.SIGKILL)
                pending.append([lambda p=rf"^step {pf['moment']['after_step']}: ", d=pf["moment"]["delay_s"]:
                                (lambda t: None if t is None else t + d)(line_at(p)), kill_producer, "kill producer"])

            def producer_died():
                p = fleet.procs[(prank, 0)]
                if p.poll() is None:
                    return None
                if p.rc != -signal.SIGKILL:  # it ended by itself (the fault never fired): no resume
                    pf["ended_by_itself"] = True
                    return 0.0
                pf.setdefault("died_at", time.time())
                pf["fired"] = True
                if prank == 0 and M == 2:
                    # The coordinator's loss stops its part rank (it says so and exits non-zero);
                    # both resume. A part rank still running 30 s later is killed.
                    other = fleet.procs[(1, 0)]
                    if other.poll() is None and time.time() - pf["died_at"] < 30:
                        return None
                return pf["died_at"] - mono_to_unix + pf["resume_after_s"]

            def resume():
                if pf.get("ended_by_itself") or "no_resume" in breaks:
                    return
                pf["resumed_at"] = time.time()
                if prank == 0 and M == 2:
                    fleet.kill(1)
                    fleet.start_producer(["--resume"], rank=1)
                fleet.start_producer(["--resume"], rank=prank)
            pending.append([producer_died, resume, "resume producer"])

        # The checkpoint directory's pace (restart trials): the next checkpoint 0.3 s after the
        # previous one's version line; SIGTERM (BYE, report, exit 0) once `steps` versions
        # committed and every restarted victim is back in the tree with 2 versions since.
        dropped = 0
        term_sent = False
        max_drops = 40
        last_progress = (time.monotonic(), None)
        while True:
            now = time.monotonic()
            for item in list(pending):
                ready = item[0]()
                if ready is not None and now >= ready:
                    item[1]()
                    pending.remove(item)
            if watch_dir is not None and not term_sent:
                lines = [(t, text) for t, text in producer_lines() if _STEP_LINE.search(text)]
                if len(lines) == dropped + 1 and now - lines[-1][0] >= 0.3:
                    done = dropped >= plan["steps"] or dropped >= max_drops
                    for v in result["victims"]:
                        if "restart_after_s" not in v or dropped >= max_drops:
                            continue
                        p0 = fleet.procs.get((job_rank(v["rank"]), 0))
                        if p0 is not None and p0.poll() is not None and "restarted_at" not in v:
                            done = False  # dead, not yet relaunched
                        elif "restarted_at" in v:
                            back = LogWatch(producer_logs, rf"producer: rank {v['rank']} is back in the tree") \
                                .first_unix(v["restarted_at"])
                            if back is None or sum(1 for t, _ in lines if t + mono_to_unix > back) < 2:
                                done = False
                    if done:
                        fleet.signal(0, signal.SIGTERM)
                        term_sent = True
                    else:
                        dropped += 1
                        k = dropped
                        src = files[(k - 1) % (len(files) - 1) + 1]
                        shutil.copy(src, watch_dir / f"ckpt-{k}.safetensors.tmp")
                        (watch_dir / f"ckpt-{k}.safetensors.tmp").rename(watch_dir / f"ckpt-{k}.safetensors")
            # The end: the coordinator (rank 0) exited and no resume is still to come.
            resume_pending = any(item[2] == "resume producer" for item in pending)
            if fleet.current[0].poll() is not None and not resume_pending:
                break
            # Hang: no new producer line or log byte (every producer rank) for 2 x timeouts.refit.
            marker = (len(producer_lines()),
                      sum(p.log.stat().st_size for (r, _), p in fleet.procs.items() if r < M and p.log.exists()))
            if marker != last_progress[1]:
                last_progress = (now, marker)
            elif now - last_progress[0] > 2 * refit_s:
                hang = "no progress"
                break
            if now > deadline:
                hang = "trial deadline"
                break
            time.sleep(0.01)
        rc0 = fleet.producer.poll()
        if hang is None and rc0 is None:
            hang = "producer"
        frozen = set()
        for v in result["victims"]:
            if v["moment"]["kind"] == "fault" and not v.get("fired"):
                text = fleet.procs[(job_rank(v["rank"]), 0)].log.read_text(errors="replace")
                v["fired"] = "--fault" in text and "this process now" in text
            if v.get("fired") and v["signal"] == "SIGSTOP":
                frozen.add(v["rank"])
        fired = {v["rank"] for v in result["victims"] if v.get("fired")}
        restarted = {v["rank"] for v in result["victims"] if "restarted_at" in v}
        survivors = [r for r in range(1, plan["receivers"] + 1) if r not in fired or r in restarted]
        # Survivors follow the producer's BYE (or its loss, within producer_loss).
        rest_deadline = time.monotonic() + (40 if hang is None else 0)
        codes = {}
        for r in range(1, plan["receivers"] + 1):
            p = fleet.current[job_rank(r)]
            if r in frozen and r not in restarted:
                codes[r] = p.poll()
                continue
            codes[r] = p.wait(max(0.0, rest_deadline - time.monotonic()))
            if codes[r] is None and hang is None and r in survivors:
                hang = f"rank {r}"
        for prank in range(1, M):
            fleet.current[prank].wait(max(0.0, rest_deadline - time.monotonic()))
        fleet.kill_all()
        codes = {r: fleet.current[job_rank(r)].rc for r in codes}
        result["exit_codes"] = {str(r): c for r, c in [(f"p{p}", fleet.current[p].rc) for p in range(M)]
                                + sorted(codes.items())}
        result["hang"] = hang is not None
        result["hang_what"] = hang
        report = fleet.report()
        all_logs = [p.log for p in fleet.procs.values()]
        result["bind_failed"] = any("Address already in use" in path.read_text(errors="replace")
                                    for path in all_logs if path.exists())
        if watch_dir is not None:
            result["steps"] = dropped
        # Fault times (Unix): the harness's signal, or the victim's own --fault line.
        ref = time.time()
        for v in result["victims"]:
            at = v.get("signalled_at")
            if at is None and v.get("fired"):
                own = dcfleet.log_times(fleet.procs[(job_rank(v["rank"]), 0)].log, r"--fault .* this process now")
                at = unix_of_day(own[0], ref) if own else None
            v["fault_at"] = at
        commits = [unix_of_day(t, ref) for path in producer_logs() for t in dcfleet.log_times(path, r"committed in")]
        for v in result["victims"]:
            v["after_last_commit"] = bool(v.get("fired") and v["fault_at"] is not None and commits
                                          and v["fault_at"] > max(commits))
        # Detection: from the fault to the producer's verdict (the report's FailedMember
        # detected_at_unix; the producer's 'rank R failed' line when the report has none).
        failed_at = {}
        if report:
            for e in dcfleet.entries(report):
                for mbr in e.get("failed_members", []):
                    failed_at.setdefault(mbr["rank"], []).append(mbr.get("detected_at_unix"))
        for v in result["victims"]:
            if not v.get("fired") or v["fault_at"] is None:
                continue
            # (the logs' clock has milliseconds: a verdict up to 20 ms "before" the fault line is its own)
            cands = [t for t in failed_at.get(v["rank"], []) if t is not None and t >= v["fault_at"] - 0.02]
            if not cands:
                t = LogWatch(producer_logs, rf"producer: rank {v['rank']} failed \(").first_unix(v["fault_at"])
                cands = [t] if t is not None else []
            if cands:
                v["detection_seconds"] = round(min(cands) - v["fault_at"], 3)
            if "restarted_at" in v:
                back = LogWatch(producer_logs, rf"producer: rank {v['rank']} is back in the tree") \
                    .first_unix(v["restarted_at"])
                v["rejoin_seconds"] = None if back is None else round(back - v["restarted_at"], 3)
        if pf and pf.get("fired"):
            if pf.get("signalled_at") is None:
                # Its own stdout line, stamped as it was read (dcfleet reads every producer rank's).
                own = [t for t, text in fleet.procs[(pf["rank"], 0)].lines
                       if "--fault" in text and "this process now" in text]
                pf["fault_at"] = own[0] + mono_to_unix if own else pf.get("died_at")
            else:
                pf["fault_at"] = pf["signalled_at"]
            # Detection: the receivers' 'lost the producer' (M = 1, or the coordinator) or the
            # coordinator's 'rank 1 lost' (a part rank).
            if pf["rank"] == 0:
                lost = LogWatch(lambda: [p.log for (r, _), p in fleet.procs.items() if r >= M],
                                r"lost the producer|lost the coordinator").first_unix(pf["fault_at"])
            else:
                lost = LogWatch(producer_logs, r"producer group: rank 1 lost").first_unix(pf["fault_at"])
            pf["detection_seconds"] = None if lost is None else round(lost - pf["fault_at"], 3)
            again = [unix_of_day(t, ref) for (r, i), p in fleet.procs.items() if r == 0 and i > 0
                     for t in dcfleet.log_times(p.log, r"committed in")]
            if pf["rank"] != 0:
                again = [c for c in commits if c > pf["fault_at"]]
            pf["recovered_seconds"] = round(min(again) - pf["fault_at"], 3) if again else None
        classes = {"exact": [], "divergent": [], "stale": [], "failed": []}
        key = "sha256" if report and "sha256" in report else "digest"
        result["aborted_exit"] = []
        for r in survivors:
            s = fleet.summary(job_rank(r))
            if "divergent" in breaks and r == survivors[-1] and s is not None:
                s = dict(s, sha256="0" * 64, digest="0" * 16)
            # A receiver that saw a version aborted exits 1 saying so ("N versions aborted"),
            # whatever it holds in the end: a legitimate exit when it holds the last version.
            rc_ok = codes[r] == 0 or (codes[r] == 1 and s is not None and s.get("versions_aborted", 0) > 0)
            if codes[r] == 1 and rc_ok:
                result["aborted_exit"].append(r)
            if report is None or s is None:
                classes["failed"].append(r)
            elif s["version"] == report["version"] and s[key] == report[key]:
                classes["exact" if rc_ok else "failed"].append(r)
            elif s["version"] == report["version"]:
                classes["divergent"].append(r)
            else:
                classes["stale" if rc_ok else "failed"].append(r)
        result["survivors"] = len(survivors)
        result["survivors_exact"] = len(classes["exact"])
        result["restarted_exact"] = sorted(set(classes["exact"]) & restarted)
        result["restarted"] = sorted(restarted)
        result["divergent_survivors"] = classes["divergent"]
        result["stale_survivors"] = classes["stale"]
        result["failed_survivors"] = classes["failed"]
        result["producer_ok"] = bool(report and report.get("ok") and fleet.producer.rc == 0
                                     and all(fleet.current[p].rc == 0 for p in range(1, M)))
        result["versions_expected"] = result["steps"] + 1
        result["versions_aborted"] = sum(len(dcfleet.log_times(path, r"version \d+ aborted"))
                                         for path in producer_logs())
        result["faulted"] = []
        if report:
            ents = dcfleet.entries(report)
            result["versions_committed"] = report["version"] if all(e.get("committed") for e in ents) else \
                sum(1 for e in ents if e.get("committed"))
            clean = [e["refit_seconds"] for e in ents[2:] if not e.get("failed_members") and e.get("committed")]
            clean_ref = statistics.median(clean) if clean else None
            result["clean_refit_seconds_median"] = clean_ref
            fault_at = {v["rank"]: v.get("fault_at") for v in result["victims"] if v.get("fired")}
            for e in ents:
                if not e.get("failed_members"):
                    continue
                # The detection inside this version: for each failed member, from the later of its
                # fault and the version's start to its verdict (a freeze may begin before the
                # version it is detected in); two faults at two moments (two, second_in_repair) are
                # two detections one after the other: their union is the time spent detecting.
                start = e.get("started_at_unix")
                windows = []
                for mbr in e["failed_members"]:
                    at = fault_at.get(mbr["rank"])
                    if at is not None and mbr.get("detected_at_unix") is not None:
                        begin = max(at, start or at)
                        windows.append((begin, max(begin, mbr["detected_at_unix"])))
                item = {"version": e["version"], "committed": e["committed"],
                        "failed": [{"rank": m["rank"], "cause": m["cause"],
                                    "detection_bound_seconds": round(m["detection_seconds"], 3),
                                    "fault_at_unix": fault_at.get(m["rank"]),
                                    "detected_at_unix": m.get("detected_at_unix")}
                                   for m in e["failed_members"]],
                        "refit_seconds": round(e["refit_seconds"], 4),
                        "detection_in_version_seconds": round(union_seconds(windows), 3) if windows else None,
                        "started_at_unix": start,
                        "repair_seconds": round(e.get("repair_seconds", 0.0), 4),
                        "resent_chunks": e.get("resent_chunks", 0)}
                if e["version"] > 2 and clean_ref and windows and len(windows) == len(e["failed_members"]):
                    item["overhead_ratio"] = round((e["refit_seconds"] - union_seconds(windows)) / clean_ref, 3)
                    # What the fault added beyond its detection and the version itself, seconds.
                    item["excess_seconds"] = round(e["refit_seconds"] - union_seconds(windows) - clean_ref, 4)
                result["faulted"].append(item)
            named = {m["rank"] for e in ents for m in e.get("failed_members", [])}
            late = {v["rank"] for v in result["victims"] if v.get("after_last_commit")}
            result["unreported_victims"] = sorted(fired - named - late)
            result["failed_non_victims"] = sorted(named - fired)
        else:
            result["versions_committed"] = 0
            result["unreported_victims"] = sorted(fired)
            result["failed_non_victims"] = []
    result["wall_seconds"] = round(time.monotonic() - t0, 2)
    result["loadavg_1min"] = os.getloadavg()[0]
    # A victim planned to come back that died must be back and exact (a harness that never
    # relaunched it would otherwise leave a clean trial with one survivor fewer).
    result["restarts_ok"] = all(v["rank"] in result.get("restarted_exact", []) for v in result["victims"]
                                if "restart_after_s" in v and v.get("died_at") is not None)
    result["clean"] = (not result["hang"] and result["producer_ok"] and not result["divergent_survivors"]
                       and not result["stale_survivors"] and not result["failed_survivors"]
                       and result["restarts_ok"]
                       and result["versions_committed"] == result["versions_expected"])
    why = [("hang: " + str(result["hang_what"])) if result["hang"] else None,
           None if result["producer_ok"] else "producer not ok",
           f"divergent survivor {result['divergent_survivors']}" if result["divergent_survivors"] else None,
           f"stale survivor {result['stale_survivors']}" if result["stale_survivors"] else None,
           f"failed survivor {result['failed_survivors']}" if result["failed_survivors"] else None,
           None if result["restarts_ok"] else "restarted victim not back exact",
           None if result["versions_committed"] == result["versions_expected"] else
           f"committed {result['versions_committed']}/{result['versions_expected']}"]
    result["why"] = [w for w in why if w]
    return result


# --- summary -------------------------------------------------------------------------------------
def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def detections(r: dict, signal_name: str) -> list:
    return [v["detection_seconds"] for v in r["victims"]
            if v.get("detection_seconds") is not None and v["signal"] == signal_name]


def summarize(results: list) -> str:
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
    planned = sum(len(r["victims"]) for r in results)
    late = sum(1 for r in results for v in r["victims"] if v.get("after_last_commit"))
    unreported = sum(len(r.get("unreported_victims", [])) for r in results)
    restarted = sum(len(r.get("restarted", [])) for r in results)
    restarted_exact = sum(len(r.get("restarted_exact", [])) for r in results)
    pfs = [r["producer_fault"] for r in results if r.get("producer_fault")]
    lines = ["| trials | clean | versions committed | survivors exact | divergent survivors | stale / failed survivors "
             "| hangs | producer not ok | receiver victims fired / planned (after the last commit; unreported) "
             "| restarted victims exact | producer kills fired / planned |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             f"| {n} | {sum(r['clean'] for r in results)} | {committed}/{expected} | {exact}/{survivors} | **{divergent}** "
             f"| {stale} / {failed} | **{hangs}** | {producer_failed} | {fired}/{planned} ({late}; {unreported}) "
             f"| {restarted_exact}/{restarted} | {sum(1 for p in pfs if p.get('fired'))}/{len(pfs)} |", ""]

    def stat(xs, fmt="{:.2f}"):
        return "-" if not xs else f"{fmt.format(statistics.median(xs))} / {fmt.format(pct(xs, 0.99))}"

    lines.append("Per transport and fault kind. ratio: a faulted version's refit minus the detection inside it "
                 "(the union over its failed members of the window from the later of the fault and the "
                 "version's start to the producer's verdict), over the "
                 "trial's median clean delta (versions after the first delta only); median / p99. Detection: from "
                 "the fault (harness signal or the victim's --fault line) to the verdict (FailedMember "
                 "detected_at_unix), median / p99, s. Producer kinds: detection = the receivers' 'lost the "
                 "producer' (or the coordinator's 'rank 1 lost'); back = from the kill to the first commit of the "
                 "resumed group. excess: the faulted version's refit minus the detection inside it minus the clean median, "
                 "s (median / p99): what the repair itself cost.")
    lines.append("")
    lines.append("| transport | kind | n | clean | ratio | ratio n | excess s | detection kill | detection freeze "
                 "| rejoin (restart) / back (producer) s |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def measured(rs: list, key: str) -> list:
        return [f[key] for r in rs for f in r["faulted"] if f.get(key) is not None]
    for t in TRANSPORTS:
        for k in KINDS + ["all"]:
            rs = [r for r in results if r["transport"] == t and (k == "all" or r.get("kind", "kill") == k)]
            if not rs:
                continue
            if k == "all":
                ratios, excess = measured(rs, "overhead_ratio"), measured(rs, "excess_seconds")
                lines.append(f"| **{t}** | **all** | {len(rs)} | {sum(r['clean'] for r in rs)} | **{stat(ratios)}** "
                             f"| {len(ratios)} | {stat(excess, '{:.3f}')} | | | |")
                continue
            ratios, excess = measured(rs, "overhead_ratio"), measured(rs, "excess_seconds")
            dk = [d for r in rs for d in detections(r, "SIGKILL")]
            ds = [d for r in rs for d in detections(r, "SIGSTOP")]
            if k in ("producer", "group_rank"):
                dk = [r["producer_fault"]["detection_seconds"] for r in rs
                      if r["producer_fault"].get("detection_seconds") is not None]
                extra = [r["producer_fault"]["recovered_seconds"] for r in rs
                         if r["producer_fault"].get("recovered_seconds") is not None]
            else:
                extra = [v["rejoin_seconds"] for r in rs for v in r["victims"] if v.get("rejoin_seconds") is not None]
            lines.append(f"| {t} | {k} | {len(rs)} | {sum(r['clean'] for r in rs)} | {stat(ratios)} | {len(ratios)} "
                         f"| {stat(excess, '{:.3f}')} | {stat(dk, '{:.3f}')} | {stat(ds)} | {stat(extra)} |")
    lines.append("")
    lines.append("| by | trials | clean trials | survivors exact | hangs |")
    lines.append("| --- | --- | --- | --- | --- |")
    for key in ("transport", "topology", "commit", "producers"):
        for value in sorted({r.get(key, 1) for r in results}):
            rs = [r for r in results if r.get(key, 1) == value]
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
            if r.get("producer_fault"):
                vs = (vs + "; " if vs else "") + r["producer_fault"]["text"]
            lines.append(f"- seed {r['seed']} trial {r['trial']} ({r.get('kind')}, {r['topology']}, {r['transport']}, "
                         f"{r['receivers']} receivers, M={r.get('producers', 1)}): {vs}: exit codes {r['exit_codes']}, "
                         f"committed {r['versions_committed']}/{r['versions_expected']}, hang {r['hang_what']}, "
                         f"divergent {r['divergent_survivors']}, stale {r['stale_survivors']}, failed "
                         f"{r['failed_survivors']}; logs {r.get('kept', '-')}")
    return "\n".join(lines)


def svg_plot(results: list) -> str:
    """A strip plot (standard library only): each faulted version's ratio, one column per
    transport and kind, the median as a bar; dashed lines at 1.3 and 2 (the issue's goals)."""
    cols = [(t, k) for t in TRANSPORTS for k in KINDS
            if any(f.get("overhead_ratio") is not None for r in results
                   if r["transport"] == t and r.get("kind") == k for f in r["faulted"])]
    data = {c: [f["overhead_ratio"] for r in results if (r["transport"], r.get("kind")) == c
                for f in r["faulted"] if f.get("overhead_ratio") is not None] for c in cols}
    top = max([3.0] + [min(10.0, x) for xs in data.values() for x in xs])
    w, h, left, bottom, topm = max(400, 60 + 46 * len(cols)), 360, 50, 110, 20
    ph = h - bottom - topm

    def y(v):
        return topm + ph * (1 - min(v, top) / top)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="14">faulted version time over the clean median, detection removed '
           f'(n={sum(len(v) for v in data.values())})</text>']
    for g in range(0, int(top) + 1):
        out.append(f'<line x1="{left}" x2="{w - 10}" y1="{y(g):.1f}" y2="{y(g):.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{y(g) + 4:.1f}" text-anchor="end">{g}</text>')
    for goal, colour in ((1.3, "#2a2"), (2.0, "#c22")):
        out.append(f'<line x1="{left}" x2="{w - 10}" y1="{y(goal):.1f}" y2="{y(goal):.1f}" stroke="{colour}" '
                   f'stroke-dasharray="4 3"/>')
    rng = random.Random(0)
    colours = {"tcp": "#1f77b4", "ucx": "#ff7f0e", "ofi+tcp": "#2ca02c"}
    for i, c in enumerate(cols):
        cx = left + 30 + 46 * i
        for v in data[c]:
            out.append(f'<circle cx="{cx + rng.uniform(-12, 12):.1f}" cy="{y(v):.1f}" r="2.5" '
                       f'fill="{colours[c[0]]}" fill-opacity="0.6"/>')
        med = statistics.median(data[c])
        out.append(f'<line x1="{cx - 16}" x2="{cx + 16}" y1="{y(med):.1f}" y2="{y(med):.1f}" stroke="black" '
                   f'stroke-width="2"/>')
        out.append(f'<text transform="translate({cx + 4},{h - bottom + 8}) rotate(60)">{c[0]} {c[1]} '
                   f'({len(data[c])})</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--deltacast", default=None)
    parser.add_argument("--out", default=None, help="JSON lines (default bench/recovery/results/chaos-seed<S>.jsonl)")
    parser.add_argument("--hang", type=float, default=300.0, help="seconds before a trial is cut off as a hang "
                        "(a hang is also: no producer progress for 2 x timeouts.refit)")
    parser.add_argument("--refit", type=float, default=60.0, help="timeouts.refit in seconds")
    parser.add_argument("--peer", type=float, default=5.0,
                        help="timeouts.peer in seconds (heartbeat: a quarter of it); 2 s gives ofi+tcp false "
                             "'silent' failures on a loaded 2-core machine")
    parser.add_argument("--keep", default=None, help="where to keep failing trials' logs")
    parser.add_argument("--only", default=None, help="comma-separated trial numbers to run")
    parser.add_argument("--kinds", default=None, help="comma-separated fault kinds: run only the trials of these")
    parser.add_argument("--small", action="store_true",
                        help="the ctest form: 2-4M parameters, 3-4 steps, 5-6 receivers, kind and transport cycling "
                             "with the trial number; exit 1 when any trial is not clean")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any trial is not clean")
    parser.add_argument("--break", dest="breaks", default="", help="break the harness on purpose to see a check "
                        "fail: no_restart, no_resume, divergent (comma-separated)")
    parser.add_argument("--keep-all", action="store_true", help="keep every trial's logs, clean or not")
    parser.add_argument("--plan", action="store_true", help="print the trials' plans and exit")
    parser.add_argument("--summarize", metavar="JSONL", help="print the summary of an earlier run's results and exit "
                        "(and write its SVG beside it)")
    args = parser.parse_args()
    if args.summarize:
        results = [json.loads(line) for line in open(args.summarize) if line.strip()]
        for r in results:  # lines from before the fault kinds: kill / stop / two by their victims
            if "kind" not in r:
                r["kind"] = "two" if len(r["victims"]) == 2 else (
                    "kill" if r["victims"][0]["signal"] == "SIGKILL" else "stop")
        print(summarize(results))
        Path(args.summarize).with_suffix(".svg").write_text(svg_plot(results))
        return 0
    trials = [int(x) for x in args.only.split(",")] if args.only else list(range(args.trials))
    plans = [plan_trial(args.seed, t, args.small) for t in trials]
    if args.kinds:
        plans = [p for p in plans if p["kind"] in args.kinds.split(",")]
    if args.plan:
        for p in plans:
            print(json.dumps(p))
        return 0
    dc = dcfleet.find_deltacast(args.deltacast)
    results_dir = HERE / "results"
    out = Path(args.out) if args.out else results_dir / f"chaos-seed{args.seed}.jsonl"
    keep = Path(args.keep) if args.keep else results_dir / f"failed-seed{args.seed}"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    started = time.monotonic()
    print(f"chaos: {len(plans)} trials, seed {args.seed}, {dc}, results to {out}", flush=True)
    with open(out, "w" if args.small else "a") as sink:
        for plan in plans:
            t = plan["trial"]
            for attempt in range(3):
                work = Path(tempfile.mkdtemp(prefix=f"dc-chaos-s{args.seed}-t{t}."))
                r = run_trial(dc, plan, args.hang, work, args.peer, args.refit,
                              frozenset(b for b in args.breaks.split(",") if b))
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
                shutil.copytree(work, dest, ignore=shutil.ignore_patterns("secret", "made", "watch"))
                r["kept"] = str(dest)
            shutil.rmtree(work, ignore_errors=True)
            sink.write(json.dumps(r) + "\n")
            sink.flush()
            results.append(r)
            vs = ", ".join(victim_text(v) + ("" if v.get("fired") else "(not fired)") for v in r["victims"])
            if r.get("producer_fault"):
                vs = (vs + ", " if vs else "") + r["producer_fault"]["text"] + (
                    "" if r["producer_fault"].get("fired") else "(not fired)")
            print(f"trial {t:3d} {r['kind']:16s} {r['topology']:13s} {r['transport']:7s} n={r['receivers']} "
                  f"M={r['producers']} [{vs}] -> {'ok' if r['clean'] else 'NOT CLEAN (' + '; '.join(r['why']) + ')'} exact {r['survivors_exact']}/"
                  f"{r['survivors']} committed {r['versions_committed']}/{r['versions_expected']} hang={r['hang']} "
                  f"({r['wall_seconds']:.1f} s)", flush=True)
    table = summarize(results)
    print()
    print(table)
    print(f"\n{len(results)} trials in {time.monotonic() - started:.0f} s")
    out.with_suffix(".md").write_text(table + "\n")
    out.with_suffix(".svg").write_text(svg_plot(results))
    if args.small or args.strict:
        # Every kind must also have been exercised: at least one trial of it whose faults all fired.
        exercised = {r["kind"] for r in results if all(v.get("fired") for v in r["victims"])
                     and (not r.get("producer_fault") or r["producer_fault"].get("fired"))}
        missing = sorted({r["kind"] for r in results} - exercised)
        if missing:
            print(f"chaos: no trial of {missing} had every planned fault fire")
        unclean = [r["trial"] for r in results if not r["clean"]]
        if unclean:
            print(f"chaos: trials {unclean} were not clean")
        return 0 if not unclean and not missing else 1
    bad = sum(1 for r in results if r["hang"] or r["divergent_survivors"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
