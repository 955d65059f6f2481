"""The producer group's half of bench/model/cost_model.py (issue 32 part 3): the runs of
`measure --matrix group` (M = 1, 2, 4 producer ranks, each on its own capped uplink) read against
the aggregate wire floor, M = 2 and 4 against M = 1 in the same round, the ranks' peak RSS, the
model with M as a term checked on them (every group run is held out: the constants come from a fit
on single-producer runs), and the 1T projection over M boundary links.

Pure Python; reads runs documents, starts nothing.
"""
import statistics

import fit_lib
import project_lib

SIM_BYTES_PER_PARAM = 14  # the demo's trainer simulator: FP32 master + two FP32 moments + the BF16 copy


def group_key(r):
    """A group configuration: (uplink label, nominal rate, producers M)."""
    return (r["uplink_label"], r["rate"], r["producers"])


def rows(doc):
    """Steady steps (step >= 2) of the group runs, each with its floor (payload / (M x uplink))."""
    out = []
    for r in fit_lib.steps_of_runs(doc):
        if r["role"] != "group":
            continue
        out.append(dict(r, floor=r["payload"] / (r["producers"] * r["uplink"])))
    return out


# The split of the group runs for the one constant fitted on them (t_rank): trained on the runs
# at TRAIN_UPLINK (CPU-bound here: where a rank's cost shows), checked on the others (held out).
TRAIN_UPLINK = "100Mbit/s"


def is_group_train(r):
    return r["uplink_label"] == TRAIN_UPLINK


def predict(constants, r, t_rank=0.0):
    """Predicted refit seconds of a group step: form A of fit_lib with the wire over M links, plus
    t_rank seconds of CPU per producer rank beyond the first (the group's round trips, M - 1 more
    processes and connections on the shared cores). Returns (total, bound)."""
    p = fit_lib.predict_row(constants, r)
    cpu = p["diff"] + p["apply"] + t_rank * (r["producers"] - 1)
    return max(p["wire"], cpu) + p["fill"] + p["commit"], ("wire" if p["wire"] >= cpu else "cpu")


def config_errors(rs, constants, t_rank):
    """{group key: predicted / measured - 1} (medians over each configuration's steady steps)."""
    g = {}
    for r in rs:
        g.setdefault(group_key(r), []).append(r)
    return {k: statistics.median(predict(constants, r, t_rank)[0] for r in v) /
            statistics.median(r["refit"] for r in v) - 1 for k, v in g.items()}


def fit_rank_overhead(doc, constants):
    """t_rank (seconds, a 1 ms grid over 0-0.5 s) minimising the squared relative errors of the
    training configurations (is_group_train); every other constant is the single-producer fit's."""
    train = [r for r in rows(doc) if is_group_train(r)]
    if not train:
        return 0.0
    return min((sum(e * e for e in config_errors(train, constants, t / 1000).values()), t / 1000)
               for t in range(0, 501))[1]


def run_medians(rs):
    """{run index: (round, median refit of its steady steps)}."""
    by_run = {}
    for r in rs:
        by_run.setdefault(r["run"], []).append(r)
    return {i: (v[0]["round"], statistics.median(x["refit"] for x in v)) for i, v in by_run.items()}


def table(doc, constants, t_rank=0.0):
    """Per group configuration: measured refit (min-med-max over steady steps), its floor, refit /
    floor (per-run medians: min-max), the model's prediction and error, the speedup over M = 1 in
    the same rounds (per round: M=1 median / this median), and the ranks' peak RSS. A list of dicts
    ordered by uplink, rate and M."""
    rs = rows(doc)
    groups = {}
    for r in rs:
        groups.setdefault(group_key(r), []).append(r)
    out = []
    for key in sorted(groups, key=lambda k: (-fit_lib.rate_bytes_per_s(k[0]), k[1], k[2])):
        g = groups[key]
        refits = [r["refit"] for r in g]
        ratios = sorted(statistics.median(x["refit"] / x["floor"] for x in g if x["run"] == i)
                        for i in {r["run"] for r in g})
        pred = statistics.median(fit_lib.predict_row(constants, r)["total"] for r in g)
        pred_m = statistics.median(predict(constants, r, t_rank)[0] for r in g)
        terms = {t: statistics.median(fit_lib.predict_row(constants, r)[t] for r in g)
                 for t in ("diff", "wire", "apply", "fill", "commit")}
        mine = run_medians(g)
        base = run_medians(groups.get((key[0], key[1], 1), []))
        base_by_round = {rnd: med for rnd, med in base.values()}
        speedups = sorted(base_by_round[rnd] / med for rnd, med in mine.values() if rnd in base_by_round)
        every_rss = [v for i in mine for v in doc["runs"][i].get("rank_rss", {}).values()]  # every rank of every run
        rss = [max(doc["runs"][i]["rank_rss"].values()) for i in mine if doc["runs"][i].get("rank_rss")]
        out.append(dict(uplink=key[0], rate=key[1], producers=key[2], rounds=len(mine), steps=len(g),
                        measured_min=min(refits), measured_median=statistics.median(refits), measured_max=max(refits),
                        floor=statistics.median(r["floor"] for r in g), over_floor=ratios,
                        payload=statistics.median(r["payload"] for r in g), predicted=pred,
                        error=pred / statistics.median(refits) - 1, terms=terms, predicted_m=pred_m,
                        error_m=pred_m / statistics.median(refits) - 1, held_out=not is_group_train(g[0]),
                        bound_m=predict(constants, g[len(g) // 2], t_rank)[1], speedup_by_round=speedups,
                        rank_rss_max=max(rss) if rss else 0, rank_rss_min=min(every_rss) if every_rss else 0,
                        # what a rank holds beyond the simulated trainer, against its part of the
                        # checkpoint: peak RSS - trainer bytes as the ranks report them; runs of an
                        # older binary, whose every rank simulated the whole model (14 bytes a
                        # parameter, sim/trainer_simulator.h), from their sampled RSS
                        ours_max=beyond_trainer(doc, mine, rss, g[0]["params"]),
                        part_bytes=g[0]["E"] / key[2], checkpoint_bytes=g[0]["E"]))
    return out


def beyond_trainer(doc, runs, rss, params):
    """The largest rank's bytes beyond its simulated trainer over `runs` (see table())."""
    reported = [v for i in runs for v in doc["runs"][i].get("rank_beyond_trainer", {}).values()]
    if reported:
        return max(reported)
    rank0 = [doc["runs"][i]["report"] for i in runs if "trainer_bytes" in (doc["runs"][i].get("report") or {})]
    if rank0:  # measured before rank_beyond_trainer was recorded: rank 0's own report
        return max(r["peak_rss_bytes"] - r["trainer_bytes"] for r in rank0)
    return (max(rss) - SIM_BYTES_PER_PARAM * params) if rss else 0


def print_table(t, markdown=False):
    """Prints table() as text, or as a Markdown table."""
    head = ("uplink per rank", "change", "M", "rounds", "refit s (min-med-max)", "floor s", "refit / floor (runs)",
            "speedup over M = 1 (rounds)", "predicted s (wire / M)", "error", "predicted s (+ t_rank)", "error",
            "set", "bound", "peak RSS per rank MB",
            "largest rank's RSS beyond the simulator MB (part MB)")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head))
    else:
        print("  ".join(head))
    for v in t:
        sp = "-" if v["producers"] == 1 else (f"{v['speedup_by_round'][0]:.2f}-{v['speedup_by_round'][-1]:.2f}"
                                             if v["speedup_by_round"] else "n/a")
        cells = (v["uplink"], f"{v['rate']:.0%}", str(v["producers"]), str(v["rounds"]),
                 f"{v['measured_min']:.3f}-{v['measured_median']:.3f}-{v['measured_max']:.3f}", f"{v['floor']:.3f}",
                 f"{v['over_floor'][0]:.2f}-{v['over_floor'][-1]:.2f}", sp, f"{v['predicted']:.3f}",
                 f"{v['error']:+.1%}", f"{v['predicted_m']:.3f}", f"{v['error_m']:+.1%}",
                 "held out" if v["held_out"] else "fit", v["bound_m"], f"{v['rank_rss_min'] / 1e6:.0f}-{v['rank_rss_max'] / 1e6:.0f}",
                 f"{v['ours_max'] / 1e6:.0f} ({v['part_bytes'] / 1e6:.0f})")
        print(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))


def projection(fit, a, ranks=(1, 8, 32, 64), rates=(0.01, 0.03), params=1e12):
    """1T (by default) at each rate over M producer ranks, each with its own boundary link of the
    published rate (paths = M), the producer's diff spread over max(M, a's producer_ranks) hosts.
    A list of project_lib.project_one dicts with 'producers' and 'bound' (the largest stage)."""
    out = []
    for rate in rates:
        for m in ranks:
            b = dict(a, paths=m, producer_ranks=max(m, a["producer_ranks"]))
            p = project_lib.project_one(fit, params, rate, b)
            stages = {k: p[k] for k in ("diff", "wire", "apply", "fanout")}
            p.update(producers=m, bound=max(stages, key=stages.get))
            out.append(p)
    return out
