"""Fit half of bench/model/cost_model.py: the refit-time model, its least-squares fit on a
training subset of measured runs, and the held-out validation. Pure Python (no numpy needed).

Model of one refit step (seconds), as measured on this machine:
    refit  = max(wire, diff + apply) + fill + commit
    diff   = (E * (t_scan + R * t_scan_r) + C * (t_change + R * t_change_r)) / threads
                                                   producer: scan E checkpoint bytes, encode C changes;
                                                   thread-seconds (the demo's encode_seconds is summed
                                                   over its `threads` encoder threads); the R terms:
                                                   the encoder shares the cores with R receivers
                                                   applying at the same time (this machine only)
    wire   = payload_bytes / (eta * uplink)         payload over the bottleneck (the producer's uplink)
    apply  = (C * t_apply_c + R * (C * t_apply_rc + E * t_scan_rc)) * s
                                                   CPU per change that does not grow with R, and the R
                                                   receivers' CPU (apply, relay, verify), in
                                                   thread-seconds, stretched by s = the share of the
                                                   cores they get:
    s      = (n + L) / (cores * n), n = R + M        n processes of ours and L other runnable threads
                                                   share `cores` cores fairly (Linux CFS); model C
                                                   (the default): L = load_ref, the median load
                                                   average of the training runs (measured, one
                                                   constant); model B: L = the run's own load average
    fill   = depth * t_hop                          pipeline fill: one per-hop constant per tree level
    commit = c0 + k * RTT                           per-version constant + k round trips
The max(): the producer encodes chunk i+1 while chunk i is on the wire (tree/producer/refit.cpp, send_all)
and receivers apply chunk by chunk, so the wire and the CPU stages overlap; on this 2-core machine
the producer's and the receivers' CPU work compete, hence their sum. E = checkpoint bytes, C =
changed elements, R = receivers, depth = hops from the producer to the deepest receiver (chain:
R, binary/double_binary: floor(log2 R) + 1). Without s (form "A") the receivers' CPU is wall time
that grows linearly with R. Forms (docs/performance.md, "Cost model"):
    A: no share term; encode with the R terms          (the first form; failed the 8-receiver check;
                                                       chosen again by cross-validation over the fourth
                                                       check's 2-12 receivers: runs-wide.json, fit --form A)
    B: s with each run's own load average; encode with the R terms t_scan_r, t_change_r
                                                       (the form of the first blind check: -17%, -21%)
    C: s with one background load load_ref (the training runs' median); encode = E t_scan + C t_change
                                                       (chosen on the training runs only, by
                                                       leave-one-group-out cross-validation, before
                                                       the second blind set was measured)
"""
import itertools
import math
import re
import statistics

DEMO_THREADS = 2  # deltacast demo --threads (default): encoder threads of the producer
CORES = 2         # cores of the machine the runs were measured on (runs.json host.cpus)


def config_key(r):
    """A configuration: (params label, nominal rate, receivers, uplink label, topology)."""
    return (r["params_label"], r["rate"], r["receivers"], r["uplink_label"], r["topology"])


def rate_bytes_per_s(text):
    """'100Mbit/s', '100mbit', '1Gbit/s' -> bytes per second (float); 0 for '0'/'none'."""
    t = text.lower().replace("/s", "").replace("bps", "bit")
    m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", t)
    if not m:
        return 0.0
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def depth_of(topology, receivers):
    """Hops from the producer to the deepest receiver: chain R; binary trees floor(log2 R)+1."""
    if topology == "chain":
        return receivers
    return int(math.floor(math.log2(receivers))) + 1


RATES = (0.01, 0.02, 0.03, 0.04, 0.05)  # nominal change rates (0.02, 0.04: blind sets only)

# The training / held-out split is by batch: every run measured up to and including batch
# TRAIN_BATCHES (2026-12-02 06:20-07:17 UTC) is training; the fit was then frozen
# (bench/model/fit-frozen.json) and the runs of later batches are held out (role "blind") or
# controls (role "control": training configurations re-measured in the same rounds as the blind set,
# with the same binary, to see whether the new binary or the hour shifts the timings).
# A runs file that says otherwise ("train_batches", written by `measure --train-batches` when it
# creates the file) keeps its own split: bench/model/runs-quiet.json's training is batch 1.
TRAIN_BATCHES = 5


def train_batches(doc):
    """The last training batch of a runs document (its "train_batches", else TRAIN_BATCHES)."""
    return doc.get("train_batches", TRAIN_BATCHES)
FORMS = ("A", "B", "C")


def nominal_rate(fraction):
    """The nominal change rate (0.01, 0.02, 0.03 or 0.05) nearest a measured changed fraction."""
    return min(RATES, key=lambda r: abs(r - fraction))


def steps_of_runs(doc, first_steps=False):
    """Flatten runs.json's demo runs into per-step rows (dicts with every input of the model and the
    measured times). Steady-state steps only (step >= 2) unless first_steps: step 1 of a run is the
    first delta after the bootstrap and is slower (docs/performance.md, "Refit against a full
    checkpoint"); it is reported apart, never fitted."""
    rows = []
    last_train = train_batches(doc)
    for i, run in enumerate(doc["runs"]):
        rep = run.get("report")
        if not rep:
            continue
        cfg = run["config"]
        uplink = rate_bytes_per_s(cfg["uplink"])
        for s in rep["steps"]:
            if (s["step"] == 1) != first_steps or not s["committed"]:
                continue
            rows.append(dict(
                run=i, round=run["round"], batch=run.get("batch", 1), role=cfg.get("role", "train"),
                train=run.get("batch", 1) <= last_train,
                params=rep["params"], params_label=cfg["params"],
                rate=nominal_rate(s["changed_fraction"]), changed_fraction=s["changed_fraction"],
                receivers=s["receivers"], topology=cfg["topology"], uplink_label=cfg["uplink"],
                uplink=uplink, depth=depth_of(cfg["topology"], s["receivers"]),
                E=s["checkpoint_bytes"], C=s["changes"], payload=s["payload_bytes"], chunks=s["chunks"],
                encode=s["encode_seconds"], refit=s["refit_seconds"], full=rep["full"]["seconds"],
                load=0.5 * (run["load_before"] + run["load_after"]), step=s["step"], rtt=0.0,
                producers=cfg.get("producers", 1)))
    return rows


def aggregate(rows):
    """Per-configuration rows: the median over its rounds' steady steps of every measured quantity
    (refit, encode, changes, payload), so one loaded round does not pull the fit. Returns a list
    of rows (same keys; plus n = steps pooled, rounds, refit_min, refit_max)."""
    groups = {}
    for r in rows:
        groups.setdefault(config_key(r), []).append(r)
    out = []
    for key, rs in sorted(groups.items()):
        a = dict(rs[0])
        for q in ("refit", "encode", "C", "payload", "changed_fraction", "load"):
            a[q] = statistics.median(r[q] for r in rs)
        a.update(n=len(rs), rounds=len({r["run"] for r in rs}), refit_min=min(r["refit"] for r in rs),
                 refit_max=max(r["refit"] for r in rs), runs=sorted({r["run"] for r in rs}))
        out.append(a)
    return out


def wan_rows(doc, label="table"):
    """Steady steps (step >= 2) of the WAN runs (bench/wan/results/<label>.jsonl, ingested by
    `measure`) as model rows: `deltacast run` in network namespaces, tbf-shaped uplink, a real RTT
    (the measured median before the run)."""
    rows = []
    for i, d in enumerate(doc.get("wan_runs", [])):
        rep = d.get("report")
        if d.get("label") != label or not rep:
            continue
        for s in rep["steps"]:
            if s["step"] < 2 or not s["committed"]:
                continue
            rows.append(dict(
                run=f"wan{i}", round=d["round"], params=rep["params"], params_label=d["params"],
                rate=nominal_rate(s["changed_fraction"]), changed_fraction=s["changed_fraction"],
                receivers=s["receivers"], topology=d["topology"], uplink_label=d["uplink"],
                uplink=rate_bytes_per_s(d["uplink"]), depth=depth_of(d["topology"], s["receivers"]),
                E=s["checkpoint_bytes"], C=s["changes"], payload=s["payload_bytes"], chunks=s["chunks"],
                encode=s["encode_seconds"], refit=s["refit_seconds"], full=rep["full"]["seconds"],
                load=0.5 * (d["load_before"] + d["load_after"]), step=s["step"], rtt=d["rtt"]["median_ms"] / 1e3))
    return rows


def wan_check(doc, f):
    """Informational cross-check (never fitted, never gating): the model with the measured RTT
    against the WAN table runs (100M, 8 receivers, 25 ms one way). Returns rows per configuration."""
    out = []
    for a in aggregate(wan_rows(doc)):
        p = predict_row(f["constants"], a)
        out.append(dict(config=dict(zip(("params", "rate", "receivers", "uplink", "topology"), config_key(a))),
                        rtt_ms=a["rtt"] * 1e3, measured_median=a["refit"], measured_min=a["refit_min"],
                        measured_max=a["refit_max"], predicted=p["total"], error=p["total"] / a["refit"] - 1,
                        rounds=a["rounds"], load=a["load"]))
    return out


def is_train(row):
    """Training subset: every run of batches 1-TRAIN_BATCHES (25M-200M, ~1/3/5%, 2/4/6/8 receivers;
    the former held-out 6- and 8-receiver configurations included)."""
    return row.get("train", True)


def is_heldout(row):
    """Held-out subset: the blind set measured after the freeze (a batch after the training ones,
    role blind; runs.json: 120M, ~2%, 5 and 10 receivers; runs-wide.json: 80M/120M, ~2/4%, 6 and 10;
    no size, rate or receiver count of it is in the training runs)."""
    return not row.get("train", True) and row.get("role") == "blind"


def is_control(row):
    """Controls: training configurations re-measured after the freeze, in the blind set's rounds."""
    return not row.get("train", True) and row.get("role") == "control"


def solve(a, b):
    """Solve the square linear system a x = b (Gaussian elimination, partial pivoting); None if
    singular."""
    n = len(b)
    m = [list(a[i]) + [b[i]] for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-300:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def nnls(x, y, w):
    """Weighted non-negative least squares by exhaustive active sets (few features): minimise
    sum_i (w_i (x_i . beta - y_i))^2 subject to beta >= 0. Columns are scaled internally.
    Returns beta (list)."""
    nf = len(x[0])
    scale = [max(abs(r[j]) for r in x) or 1.0 for j in range(nf)]
    xs = [[r[j] / scale[j] for j in range(nf)] for r in x]
    best, best_cost = [0.0] * nf, sum((wi * yi) ** 2 for wi, yi in zip(w, y))
    for k in range(1, nf + 1):
        for subset in itertools.combinations(range(nf), k):
            a = [[sum(w[i] ** 2 * xs[i][p] * xs[i][q] for i in range(len(y))) for q in subset] for p in subset]
            b = [sum(w[i] ** 2 * xs[i][p] * y[i] for i in range(len(y))) for p in subset]
            sol = solve(a, b)
            if sol is None or min(sol) < 0:
                continue
            beta = [0.0] * nf
            for j, v in zip(subset, sol):
                beta[j] = v
            cost = sum((w[i] * (sum(xs[i][j] * beta[j] for j in range(nf)) - y[i])) ** 2 for i in range(len(y)))
            if cost < best_cost - 1e-15:
                best, best_cost = beta, cost
    return [best[j] / scale[j] for j in range(nf)]


def fit_link_efficiency(doc):
    """eta: the fraction of the configured uplink the full checkpoint achieved, median over the
    training runs at the lowest uplink (where the full send is wire-bound, not CPU-bound)."""
    runs = [r for r in doc["runs"] if r.get("report") and r["config"]["receivers"] == 4
            and r.get("batch", 1) <= train_batches(doc) and rate_bytes_per_s(r["config"]["uplink"]) > 0]
    low = min(rate_bytes_per_s(r["config"]["uplink"]) for r in runs)
    ratios = [r["report"]["checkpoint_bytes"] / low / r["report"]["full"]["seconds"]
              for r in runs if rate_bytes_per_s(r["config"]["uplink"]) == low]
    return statistics.median(ratios), (min(ratios), max(ratios)), len(ratios)


def fit_commit_round_trips(doc, source="bench/wan/results/rtt.jsonl", commit="producer"):
    """k: extra seconds per second of RTT, from the WAN runs of `source` (one-way delay 0/25/50 ms,
    same setup otherwise) with commit mode `commit` (runs recorded before the mode existed are
    `producer`). OLS of each run's median steady refit on its measured median RTT; also the
    per-round slopes (spread) and the slope's standard error. Returns dict."""
    pts, by_round = [], {}
    for d in doc.get("wan_runs", []):
        if (d.get("label") != "rtt" or not d.get("report") or d.get("source", source) != source
                or d.get("commit", "producer") != commit):
            continue
        steady = [s["refit_seconds"] for s in d["report"]["steps"] if s["step"] >= 2]
        rtt = d["rtt"]["median_ms"] / 1e3
        pts.append((rtt, statistics.median(steady)))
        by_round.setdefault(d["round"], []).append((rtt, statistics.median(steady)))
    if len(pts) < 2:
        return dict(k=2.3, source="assumed (no WAN runs)", points=0)

    def ols(p):
        mx = sum(a for a, _ in p) / len(p)
        my = sum(b for _, b in p) / len(p)
        sxx = sum((a - mx) ** 2 for a, _ in p)
        return sum((a - mx) * (b - my) for a, b in p) / sxx, my - mx * sum((a - mx) * (b - my) for a, b in p) / sxx

    k, a0 = ols(pts)
    slopes = [ols(p)[0] for _, p in sorted(by_round.items()) if len(p) >= 2]
    mx = sum(a for a, _ in pts) / len(pts)
    sxx = sum((a - mx) ** 2 for a, _ in pts)
    ssr = sum((b - a0 - k * a) ** 2 for a, b in pts)
    se = math.sqrt(ssr / (len(pts) - 2) / sxx) if len(pts) > 2 else None
    return dict(k=k, k_se=se, intercept_s=a0, points=len(pts), per_round_k=slopes, commit=commit,
                source=f"{source} (commit: {commit}; steps >= 2, median per run; OLS on measured RTT)")


def stretch(c, row):
    """s: how much longer CPU work takes than on a core of its own, for row's receivers on this
    machine: (n + L) / (cores * n) with n = R + M (M producer ranks, 1 without a group) and L = the background load: load_ref (form C) or
    the run's own load average (form B); 1 when the fit has no contention term (form A)."""
    if not c.get("contention", True):
        return 1.0
    n = row["receivers"] + row.get("producers", 1)
    load = c["load_ref"] if c.get("form", "B") == "C" else row["load"]
    return (n + load) / (c.get("cores", CORES) * n)


def apply_features(row, s):
    """The three apply features (C, R*C, R*E), each stretched by s."""
    return [row["C"] * s, row["receivers"] * row["C"] * s, row["receivers"] * row["E"] * s]


def encode_features(row):
    """The producer's encode features: E, C, R*E, R*C."""
    return [row["E"], row["C"], row["receivers"] * row["E"], row["receivers"] * row["C"]]


def encode_thread_seconds(c, row):
    """Predicted encode thread-seconds of a row (what the demo reports as encode_seconds)."""
    return sum(k * x for k, x in zip((c["t_scan_s_per_byte"], c["t_change_s"], c.get("t_scan_r_s_per_byte", 0.0),
                                      c.get("t_change_r_s", 0.0)), encode_features(row)))


def predict_row(c, row, rtt=None):
    """Predicted refit seconds of a row (dict of terms and 'total') from the fitted constants c."""
    diff = encode_thread_seconds(c, row) / DEMO_THREADS
    # M producer ranks (a producer group): each sends its part on its own capped uplink at once,
    # so the payload crosses M links (the parts are balanced by bytes: docs/producer-group.md).
    wire = row["payload"] / (c["eta"] * row.get("producers", 1) * row["uplink"]) if row["uplink"] else 0.0
    fill = row["depth"] * c["t_hop_s"]
    f = apply_features(row, stretch(c, row))
    apply = f[0] * c["t_apply_c_s"] + f[1] * c["t_apply_rc_s"] + f[2] * c["t_scan_rc_s_per_byte"]
    commit = c["c0_s"] + c["k_rtt"] * (row["rtt"] if rtt is None else rtt)
    return dict(diff=diff, wire=wire, fill=fill, apply=apply, commit=commit,
                bound="wire" if wire >= diff + apply else "cpu",
                total=max(wire, diff + apply) + fill + commit)


def fit_rest(train, c, iterations=20):
    """Fit t_apply_c, t_apply_rc, t_scan_rc, t_hop and c0 (non-negative, weighted by 1/refit) given the
    producer's diff and the wire: each row is wire-bound or CPU-bound (the max()), assigned from the
    current constants and refitted until the assignment is stable. Returns the updated c."""
    c = dict(c, t_apply_c_s=0.0, t_apply_rc_s=0.0, t_scan_rc_s_per_byte=0.0, t_hop_s=0.0, c0_s=0.0, k_rtt=0.0)
    cpu_bound = [r["payload"] / (c["eta"] * r["uplink"]) < 0.5 * r["refit"] for r in train]
    for _ in range(iterations):
        x, y = [], []
        for r, cb in zip(train, cpu_bound):
            wire = r["payload"] / (c["eta"] * r["uplink"])
            diff = encode_thread_seconds(c, r) / DEMO_THREADS
            if cb:
                x.append(apply_features(r, stretch(c, r)) + [r["depth"], 1.0])
                y.append(r["refit"] - diff)
            else:
                x.append([0.0, 0.0, 0.0, r["depth"], 1.0])
                y.append(r["refit"] - wire)
        beta = nnls(x, y, [1 / r["refit"] for r in train])
        c.update(t_apply_c_s=beta[0], t_apply_rc_s=beta[1], t_scan_rc_s_per_byte=beta[2], t_hop_s=beta[3], c0_s=beta[4])
        new = [predict_row(c, r)["bound"] == "cpu" for r in train]
        if new == cpu_bound:
            break
        cpu_bound = new
    return c


def bytes_per_change(rows, wan_runs):
    """Bytes per changed element by nominal change rate: min/median/max over every steady step of
    the training demo runs and the WAN table runs (lr tuned for 1/3/5%; the rtt runs, at ~1.4%, are left
    out). Returns {rate: dict}."""
    vals = {}
    for r in rows:
        vals.setdefault(r["rate"], []).append(r["payload"] / r["C"])
    for d in wan_runs:
        if d.get("label") != "table":
            continue
        for s in (d.get("report") or {}).get("steps", []):
            if s["step"] >= 2:
                vals.setdefault(nominal_rate(s["changed_fraction"]), []).append(s["payload_bytes"] / s["changes"])
    return {str(k): dict(min=min(v), median=statistics.median(v), max=max(v), n=len(v))
            for k, v in sorted(vals.items())}


def describe(rows):
    """What a set of step rows spans, e.g. "25M-200M params, ~1/3/5%, 2/4/8 receivers" (sizes as
    labelled, nominal rates, receiver counts); "none" for no rows."""
    if not rows:
        return "none"
    sizes = sorted({r["params_label"] for r in rows}, key=lambda p: rate_bytes_per_s(p + "bit/s"))
    rates = "/".join(f"{x * 100:g}" for x in sorted({r["rate"] for r in rows}))
    receivers = "/".join(str(x) for x in sorted({r["receivers"] for r in rows}))
    span = sizes[0] if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    return f"{span} params ({len(sizes)} sizes), ~{rates}%, {receivers} receivers"


def fit(doc, form="C", train_filter=None):
    """Fit every constant on the training rows only, in one of FORMS: "C" (the default: share term
    with the training runs' median load, encode without R terms), "B" (share term with each run's
    load, encode with R terms: the previous form), "A" (no share term). Returns the fit document
    (constants with units, the training residuals, bytes per change, the split's rule).
    train_filter: a further filter on the training rows (cross_validate leaves groups out with it)."""
    assert form in FORMS
    rows = steps_of_runs(doc)
    train_steps = [r for r in rows if is_train(r) and (train_filter is None or train_filter(r))]
    train = aggregate(train_steps)
    if len(train) < 6:
        raise SystemExit(f"only {len(train)} training configurations: measure more")
    # 1. producer diff: the demo reports the producer's encode thread-seconds per step.
    feats = [encode_features(r) if form != "C" else encode_features(r)[:2] for r in train]
    enc = nnls(feats, [r["encode"] for r in train], [1 / r["encode"] for r in train]) + [0.0, 0.0]
    eta, eta_range, eta_n = fit_link_efficiency(doc)
    train_runs = {}
    for r in train_steps:
        train_runs[r["run"]] = r["load"]
    c = dict(t_scan_s_per_byte=enc[0], t_change_s=enc[1], t_scan_r_s_per_byte=enc[2], t_change_r_s=enc[3],
             eta=eta, contention=form != "A", form=form,
             load_ref=statistics.median(train_runs.values()),
             cores=(doc.get("host") or {}).get("cpus", CORES))
    # 2. the receivers' CPU, the fill and the per-version constant, through the max().
    c = fit_rest(train, c)
    commit = fit_commit_round_trips(doc)
    c["k_rtt"] = commit["k"]
    delegated = fit_commit_round_trips(doc, "bench/wan/results/rtt-commit.jsonl", "delegated")
    same_session = fit_commit_round_trips(doc, "bench/wan/results/rtt-commit.jsonl", "producer")
    if delegated.get("points", 0) >= 2:
        c["k_rtt_delegated"] = delegated["k"]
    errs = [predict_row(c, r)["total"] / r["refit"] - 1 for r in train]
    step_errs = [predict_row(c, r)["total"] / r["refit"] - 1 for r in train_steps]
    return dict(
        constants=c,
        units=dict(t_scan_s_per_byte="thread-s per checkpoint byte (producer encode, this machine)",
                   t_change_s="thread-s per changed element (producer encode)",
                   t_scan_r_s_per_byte="thread-s per checkpoint byte per concurrent receiver (encode, sharing the cores)",
                   t_change_r_s="thread-s per changed element per concurrent receiver (encode, sharing the cores)",
                   eta="achieved / configured uplink (full checkpoint, lowest uplink)",
                   t_hop_s="s per tree level (pipeline fill)",
                   t_apply_c_s="thread-s per changed element, not growing with R (x s)",
                   t_apply_rc_s="thread-s per changed element per receiver (x s)",
                   t_scan_rc_s_per_byte="thread-s per checkpoint byte per receiver (x s)",
                   contention="the share term s = (R + 1 + L) / (cores (R + 1)) is on",
                   form="C: L = load_ref; B: L = the run's load average; A: no share term",
                   load_ref="the median 1-minute load average of the training runs (L of form C)",
                   cores="cores of the measuring machine",
                   c0_s="s per version (loopback commit round trips + fixed costs)",
                   k_rtt="round trips per version, producer commit (s of refit per s of RTT)",
                   k_rtt_delegated="round trips per version, delegated commit (s of refit per s of RTT)"),
        eta_range=eta_range, eta_runs=eta_n, commit_fit=commit, commit_fit_delegated=delegated,
        commit_fit_same_session_producer=same_session,
        train=dict(rule=f"batches 1-{train_batches(doc)} (from {doc.get('started', '?')}): {describe(train_steps)}; "
                        "steps >= 2, median per configuration",
                   configurations=len(train), steps=len(train_steps),
                   runs=len({r["run"] for r in train_steps}),
                   abs_error_median=statistics.median(abs(e) for e in errs),
                   abs_error_max=max(abs(e) for e in errs),
                   step_abs_error_median=statistics.median(abs(e) for e in step_errs),
                   rows=[dict(config=dict(zip(("params", "rate", "receivers", "uplink", "topology"), config_key(r))),
                              measured=r["refit"], measured_min=r["refit_min"], measured_max=r["refit_max"],
                              predicted=predict_row(c, r)["total"], bound=predict_row(c, r)["bound"],
                              error=e, rounds=r["rounds"]) for r, e in zip(train, errs)]),
        heldout_rule=f"batches > {train_batches(doc)}, role blind ({describe([r for r in rows if is_heldout(r)])}), "
                     "steps >= 2 (median over rounds per configuration)",
        bytes_per_change=bytes_per_change(train_steps, doc.get("wan_runs", [])))


def validate(doc, f, rows=None, select=None):
    """Held-out validation: per configuration (median over its rounds' steady steps), predicted vs
    measured, for the rows `select` keeps (is_heldout by default; is_control for the controls).
    Returns a list of dicts per configuration."""
    c = f["constants"]
    rows = [r for r in (rows or steps_of_runs(doc)) if (select or is_heldout)(r)]
    by_cfg, by_run = {}, {}
    for r in rows:
        by_cfg.setdefault(config_key(r), []).append(r)
        by_run.setdefault(r["run"], []).append(r)
    out = []
    for key, rs in sorted(by_cfg.items()):
        pred = statistics.median(predict_row(c, r)["total"] for r in rs)
        meas = [r["refit"] for r in rs]
        terms = {t: statistics.median(predict_row(c, r)[t] for r in rs) for t in ("diff", "wire", "fill", "apply", "commit")}
        run_meds = [statistics.median(x["refit"] for x in by_run[i]) for i in sorted({r["run"] for r in rs})]
        out.append(dict(config=dict(zip(("params", "rate", "receivers", "uplink", "topology"), key)),
                        batches=sorted({r.get("batch", 1) for r in rs}), rounds=len(run_meds), steps=len(rs), measured_median=statistics.median(meas),
                        measured_min=min(meas), measured_max=max(meas), predicted=pred,
                        error=pred / statistics.median(meas) - 1, terms=terms,
                        measured_encode_median=statistics.median(r["encode"] for r in rs),
                        predicted_encode=statistics.median(encode_thread_seconds(c, r) for r in rs),
                        load=[min(r["load"] for r in rs), max(r["load"] for r in rs)],
                        run_errors=[pred / m - 1 for m in run_meds]))
    return out


def cross_validate(doc, form, group=lambda r: (r["params_label"], r["receivers"])):
    """Leave-one-group-out cross-validation on the training rows only (how form C was chosen, before
    the second blind set was measured): each group (by default a (size, receivers) pair: 25M/2,
    25M/4, 50M/2, 50M/4, 100M/8, 150M/6, 200M/8) is left out in turn, the rest fitted, and the
    group's configurations predicted. Returns {group: [error per configuration]}."""
    rows = [r for r in steps_of_runs(doc) if is_train(r)]
    out = {}
    for g in sorted({group(r) for r in rows}):
        try:
            f = fit(doc, form, train_filter=lambda r, g=g: group(r) != g)
        except SystemExit:
            continue
        out[g] = [predict_row(f["constants"], a)["total"] / a["refit"] - 1
                  for a in aggregate([r for r in rows if group(r) == g])]
    return out
