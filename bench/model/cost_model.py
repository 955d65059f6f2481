#!/usr/bin/env python3
"""The refit cost model of issue 14 part 3: measure, fit, validate on held-out runs, project to 1T.

    python3 bench/model/cost_model.py measure --out bench/model/runs.json [--rounds 3] [--steps 3]
                                              [--deltacast PATH] [--quick]
    python3 bench/model/cost_model.py measure --append --matrix blind2 [--rounds 5]   (the second blind set)
    python3 bench/model/cost_model.py measure --out F --matrix wide --train-batches 1, then (after fit --freeze)
                                      measure --out F --append --matrix blind3 --rounds 5   (the fourth check)
    python3 bench/model/cost_model.py ingest-wan --runs bench/model/runs.json        (refresh the WAN runs)
    python3 bench/model/cost_model.py fit --runs bench/model/runs.json [--out tools/probe/cost_model_fit.json] [--check]
                                          [--freeze bench/model/fit-frozen.json]
    python3 bench/model/cost_model.py project [--fit tools/probe/cost_model_fit.json] [--svg docs/performance-projection.svg]
                                              [--paths K] [--bytes-per-change B] [--producer-ranks P] ...
    python3 bench/model/cost_model.py all [--deltacast PATH] [--rounds 3]
    python3 bench/model/cost_model.py measure --out bench/model/runs-group.json --matrix group --train-batches 0 --steps 4
    python3 bench/model/cost_model.py group --runs bench/model/runs-group.json --fit bench/model/fit-wide.json [--markdown]
                                          (issue 32 part 3: M producer ranks; the 1T projection over M links)

The model, its terms and the meaning of every constant: docs/performance.md. Pure Python 3 (no
numpy); `measure` needs a built `deltacast` (demo subcommand), `fit` and `project` only the JSON.
"""
import argparse
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import fit_lib  # noqa: E402
import project_lib  # noqa: E402


def find_deltacast(path):
    """The deltacast binary: --deltacast, $DELTACAST, build*/tools/deltacast, or PATH."""
    for p in (path, os.environ.get("DELTACAST"), os.path.join(ROOT, "build", "tools", "deltacast"),
              os.path.join(ROOT, "build-release", "tools", "deltacast"), shutil.which("deltacast")):
        if p and os.access(p, os.X_OK):
            return os.path.abspath(p)
    raise SystemExit("no deltacast binary: pass --deltacast PATH")


def cmd_measure(args):
    """Run the demo matrix (interleaved rounds) and ingest the WAN runs into --out."""
    import measure_lib
    matrix = measure_lib.MATRICES[args.matrix]()
    if args.quick:  # a smoke test: the two smallest configurations
        matrix = [m for m in matrix if m["params"] == "25M" and m["receivers"] == 2]
    if args.only_receivers:  # a batch of one receiver count (e.g. 2, added later with --append)
        matrix = [m for m in matrix if m["receivers"] == args.only_receivers]
    if args.only_heldout:  # the held-out configurations only (6 and 8 receivers), interleaved
        matrix = [m for m in matrix if m["receivers"] >= 6]
    doc = measure_lib.measure(find_deltacast(args.deltacast), args.out, args.rounds, args.steps, ROOT, matrix,
                              append=args.append, train_batches=args.train_batches)
    secs = doc.get("measure_seconds", 0) + sum(doc.get("measure_seconds_by_batch", {}).values())
    print(f"{len(doc['runs'])} runs, {secs:.0f} s of measurement in all -> {args.out}")
    return 0


def cmd_ingest_wan(args):
    """Replace runs.json's wan_runs by the JSON lines of bench/wan/results (rtt, rtt-commit, table),
    saying which sources changed; the demo runs are untouched."""
    import measure_lib
    doc = json.load(open(args.runs))
    old = doc.get("wan_runs", [])
    new = measure_lib.ingest_wan(ROOT)
    for src in sorted({d["source"] for d in old + new}):
        a = [d for d in old if d["source"] == src]
        b = [d for d in new if d["source"] == src]
        print(f"{src}: {len(a)} -> {len(b)} runs{'' if a == b[:len(a)] else ' (stored lines changed!)'}")
    doc["wan_runs"] = new
    tmp = args.runs + ".tmp"
    with open(tmp, "w") as fo:
        json.dump(doc, fo, indent=1)
    os.replace(tmp, args.runs)
    return 0


def cmd_cv(args):
    """Leave-one-group-out cross-validation of the forms A, B and C on the training runs only."""
    import statistics
    doc = json.load(open(args.runs))
    groups = {"size-receivers": lambda r: (r["params_label"], r["receivers"]),
              "receivers": lambda r: r["receivers"]}
    for name, key in groups.items():
        print(f"leave one {name} group out (training runs only):")
        for form in fit_lib.FORMS:
            cv = fit_lib.cross_validate(doc, form, key)
            errs = [e for v in cv.values() for e in v]
            print(f"  form {form}: |error| median {statistics.median(abs(e) for e in errs):.1%}, max "
                  f"{max(abs(e) for e in errs):.0%}, within +-15% {sum(abs(e) <= 0.15 for e in errs)}/{len(errs)}; "
                  + " ".join(f"{'/'.join(map(str, g)) if isinstance(g, tuple) else g}: "
                             + ",".join(f"{e:+.0%}" for e in v) for g, v in cv.items()))
    return 0


def fmt_cfg(c):
    return f"{c['params']:>5} {c['rate']:.0%} R{c['receivers']} {c['uplink']:>10} {c['topology']:<7}"


def md_cfg(c):
    return f"{c['params']} | {c['rate']:.0%} | {c['receivers']} | {c['uplink']} | {c['topology']}"


def print_fit_markdown(f):
    """The training, held-out and WAN cross-check tables in Markdown (docs/performance.md)."""
    print("\n| set | params | change | receivers | uplink | topology | rounds | measured s (min-med-max) | predicted s | error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in f["train"]["rows"]:
        print(f"| train | {md_cfg(t['config'])} | {t['rounds']} | {t['measured_min']:.3f}-{t['measured']:.3f}-{t['measured_max']:.3f} "
              f"| {t['predicted']:.3f} | {t['error']:+.1%} |")
    for v in f["heldout"]:
        print(f"| **held-out** | {md_cfg(v['config'])} | {v['rounds']} | {v['measured_min']:.3f}-{v['measured_median']:.3f}-"
              f"{v['measured_max']:.3f} | {v['predicted']:.3f} | **{v['error']:+.1%}** |")
    for v in f.get("controls", []):
        print(f"| control | {md_cfg(v['config'])} | {v['rounds']} | {v['measured_min']:.3f}-{v['measured_median']:.3f}-"
              f"{v['measured_max']:.3f} | {v['predicted']:.3f} | {v['error']:+.1%} |")
    for w in f.get("wan_check", []):
        print(f"| WAN check | {md_cfg(w['config'])} | {w['rounds']} | {w['measured_min']:.3f}-{w['measured_median']:.3f}-"
              f"{w['measured_max']:.3f} | {w['predicted']:.3f} | {w['error']:+.1%} |")
    print("\n| held-out configuration | batch | diff | wire | fill | apply | commit | per-run errors | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for v in f["heldout"] + f.get("controls", []):
        t = v["terms"]
        print(f"| {md_cfg(v['config']).replace(' | ', ', ')} | {','.join(map(str, v['batches']))} | {t['diff']:.3f} | {t['wire']:.3f} | {t['fill']:.3f} | "
              f"{t['apply']:.3f} | {t['commit']:.4f} | {' '.join(f'{e:+.0%}' for e in v['run_errors'])} | "
              f"{v['load'][0]:.1f}-{v['load'][1]:.1f} |")


def cmd_fit(args):
    """Fit on the training rows, print the constants and the held-out table; --check: exit 1 if
    any held-out configuration is off by more than --tolerance."""
    doc = json.load(open(args.runs))
    f = fit_lib.fit(doc, form=args.form)
    val = fit_lib.validate(doc, f)
    others = {form: fit_lib.fit(doc, form=form) for form in fit_lib.FORMS if form != args.form}
    for form, fo in others.items():
        f[f"model_{form.lower()}_heldout_errors"] = [v["error"] for v in fit_lib.validate(doc, fo)]
        f[f"model_{form.lower()}_train_abs_error_median"] = fo["train"]["abs_error_median"]
    f["heldout"] = val
    f["controls"] = controls(doc, f)
    first = [r for r in fit_lib.steps_of_runs(doc, first_steps=True) if fit_lib.is_heldout(r)]
    f["heldout_first_step_error_median"] = (
        sorted(fit_lib.predict_row(f["constants"], r)["total"] / r["refit"] - 1 for r in first)[len(first) // 2]
        if first else None)
    c = f["constants"]
    print("fitted constants (training rows only: " + f["train"]["rule"] + f"; {f['train']['configurations']} "
          f"configurations, {f['train']['steps']} steps, {f['train']['runs']} runs)")
    print(f"  producer diff  t_scan   {c['t_scan_s_per_byte']*1e9:8.3f} ns/byte   "
          f"(= {1/c['t_scan_s_per_byte']/1e9 if c['t_scan_s_per_byte'] else float('inf'):.2f} GB/s on 2 threads)")
    print(f"                 t_change {c['t_change_s']*1e9:8.2f} ns/changed element; per concurrent receiver (this machine): "
          f"+{c['t_scan_r_s_per_byte']*1e12:.1f} ps/byte, +{c['t_change_r_s']*1e9:.2f} ns/change")
    print(f"  wire           eta      {c['eta']:8.3f}  (full checkpoint / configured uplink; "
          f"{f['eta_range'][0]:.3f}-{f['eta_range'][1]:.3f} over {f['eta_runs']} runs)")
    print(f"  fill           t_hop    {c['t_hop_s']*1e3:8.2f} ms per tree level")
    print(f"  apply          t_apply_c {c['t_apply_c_s']*1e9:7.2f} ns per change; t_apply_rc {c['t_apply_rc_s']*1e9:.2f} ns "
          f"per change per receiver; t_scan_rc {c['t_scan_rc_s_per_byte']*1e12:.3f} ps per byte per receiver (thread-s, "
          + (f"x s = (R+1+L)/({c['cores']}(R+1)) here, L = {c['load_ref']:.2f}: the training runs' median load)"
             if c.get("contention", True) else f"form {c['form']}: no share term, wall time on this machine)"))
    cd, cs = f["commit_fit_delegated"], f["commit_fit_same_session_producer"]
    print(f"  commit         c0       {c['c0_s']*1e3:8.2f} ms per version; producer commit k = {c['k_rtt']:.2f} RTTs "
          f"(per round: {', '.join(f'{x:.2f}' for x in f['commit_fit'].get('per_round_k', []))}; rtt.jsonl)")
    if "k_rtt_delegated" in c:
        print(f"                 delegated commit k = {c['k_rtt_delegated']:.2f} RTTs (+-{cd['k_se']:.2f} s.e.; per round: "
              f"{', '.join(f'{x:.2f}' for x in cd['per_round_k'])}; rtt-commit.jsonl); the producer commit in the same "
              f"rounds: k = {cs['k']:.2f} (+-{cs['k_se']:.2f}; per round {', '.join(f'{x:.2f}' for x in cs['per_round_k'])})")
    print(f"  training fit: |error| median {f['train']['abs_error_median']:.1%}, max {f['train']['abs_error_max']:.1%} "
          f"(per configuration; per step: median {f['train']['step_abs_error_median']:.1%})")
    if args.verbose:
        for t in f["train"]["rows"]:
            print(f"    train {fmt_cfg(t['config'])} measured {t['measured_min']:.3f}-{t['measured']:.3f}-{t['measured_max']:.3f} "
                  f"predicted {t['predicted']:.3f} ({t['bound']}) {t['error']:+.1%}")
    print("bytes per change (steady steps, demo + WAN runs): " + ", ".join(
        f"{float(k):.0%}: {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f}, n={v['n']})" for k, v in f["bytes_per_change"].items()))
    print(f"\nheld-out ({f['heldout_rule']}):")
    print(f"  {'configuration':<38} {'rounds':>6} {'measured s (min-med-max)':>26} {'predicted':>9} {'error':>7}  "
          f"{'diff':>6} {'wire':>6} {'fill':>6} {'apply':>6} {'commit':>6}  per-run errors   load  batches")
    bad = 0
    for v in val:
        t = v["terms"]
        ok = abs(v["error"]) <= args.tolerance
        bad += not ok
        print(f"  {fmt_cfg(v['config']):<38} {v['rounds']:>6} {v['measured_min']:>8.3f}-{v['measured_median']:.3f}-"
              f"{v['measured_max']:.3f} {v['predicted']:>9.3f} {v['error']:>+7.1%}  {t['diff']:6.3f} {t['wire']:6.3f} "
              f"{t['fill']:6.3f} {t['apply']:6.3f} {t['commit']:6.3f}  "
              f"{' '.join(f'{e:+.0%}' for e in v['run_errors'])}   {v['load'][0]:.1f}-{v['load'][1]:.1f}"
              + f"  batch {','.join(map(str, v['batches']))}" + ("" if ok else "  OUTSIDE"))
    for form in others:
        print(f"  (model {form}, the same training runs: held-out errors "
              f"{' '.join(f'{e:+.0%}' for e in f[f'model_{form.lower()}_heldout_errors'])}, training |error| median "
              f"{f[f'model_{form.lower()}_train_abs_error_median']:.1%}: not used)")
    if f["controls"]:
        print("controls (training configurations re-measured in the blind set's rounds, same binary):")
        for v in f["controls"]:
            print(f"  {fmt_cfg(v['config']):<38} {v['rounds']:>6} {v['measured_min']:>8.3f}-{v['measured_median']:.3f}-"
                  f"{v['measured_max']:.3f} {v['predicted']:>9.3f} {v['error']:>+7.1%}  training batches: median "
                  f"{v['train_median']:.3f} ({v['train_rounds']} rounds): new / old {v['new_over_old']:.2f}; "
                  f"encode new / old {v['encode_new_over_old']:.2f}; load {v['load'][0]:.1f}-{v['load'][1]:.1f}")
    if f["heldout_first_step_error_median"] is not None:
        print(f"  (step 1 of each held-out run, never fitted: median error {f['heldout_first_step_error_median']:+.0%}: "
              f"the first delta after the bootstrap is slower)")
    f["wan_check"] = fit_lib.wan_check(doc, f)
    if args.markdown:
        print_fit_markdown(f)
    if f["wan_check"]:
        print("\ncross-check, not fitted and not gating: the WAN table runs (bench/wan/results/table.jsonl: "
              "deltacast run in namespaces, tbf uplink, measured RTT; another binary, another hour):")
        for w in f["wan_check"]:
            print(f"  {fmt_cfg(w['config']):<38} {w['rounds']:>6} {w['measured_min']:>8.3f}-{w['measured_median']:.3f}-"
                  f"{w['measured_max']:.3f} {w['predicted']:>9.3f} {w['error']:>+7.1%}  RTT {w['rtt_ms']:.1f} ms, load {w['load']:.1f}")
    if args.freeze:  # the frozen fit: written once, before the held-out runs are measured
        if os.path.exists(args.freeze):
            raise SystemExit(f"{args.freeze} exists: a frozen fit is not rewritten")
        fz = dict(f, frozen_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  frozen_runs=len(doc["runs"]), frozen_heldout_rows=len(val))
        with open(args.freeze, "w") as fo:
            json.dump(fz, fo, indent=1)
        print(f"frozen: {args.freeze} at {fz['frozen_at']} ({len(doc['runs'])} demo runs, {len(val)} held-out rows)")
    if args.out:
        with open(args.out, "w") as fo:
            json.dump(f, fo, indent=1)
    if not val:
        print("no held-out rows (yet)", file=sys.stderr)
        return 1 if args.check else 0
    if args.check and bad:
        print(f"FAIL: {bad} held-out configuration(s) outside +-{args.tolerance:.0%}", file=sys.stderr)
        return 1
    print(f"held-out: {len(val) - bad}/{len(val)} within +-{args.tolerance:.0%}")
    return 0


def controls(doc, f):
    """The control configurations (re-measured training configurations): the validation rows plus
    their training-batch median, so a shift of the new binary or hour shows."""
    out = fit_lib.validate(doc, f, select=fit_lib.is_control)
    train = {fit_lib.config_key(a): a for a in fit_lib.aggregate(
        [r for r in fit_lib.steps_of_runs(doc) if fit_lib.is_train(r)])}
    for v in out:
        t = train.get(tuple(v["config"][k] for k in ("params", "rate", "receivers", "uplink", "topology")))
        if t:
            v.update(train_median=t["refit"], train_rounds=t["rounds"], new_over_old=v["measured_median"] / t["refit"],
                     encode_new_over_old=v["measured_encode_median"] / t["encode"])
    return [v for v in out if "train_median" in v]


def assumptions(args):
    """The projection's assumptions from the command line (project_lib.DEFAULTS otherwise)."""
    a = dict(project_lib.DEFAULTS)
    a.update(paths=args.paths, producer_ranks=args.producer_ranks, producer_threads=args.producer_threads,
             receiver_threads=args.receiver_threads, receivers=args.receivers, rtt_s=args.rtt_ms / 1e3,
             bytes_per_change=args.bytes_per_change)
    return a


def cmd_project(args):
    """Print the 9-row projection (30B/120B/1T x 1/3/5%), the 1T-at-3% scenarios, write the SVG."""
    f = json.load(open(args.fit))
    a = assumptions(args)
    rows = project_lib.project_table(f, a)
    link = project_lib.LINK_BYTES_PER_S
    print(f"link: {link*8/1e9:.3f} Gbit/s per path (2 TB in 87.5 min), K = {a['paths']} path(s); RTT {a['rtt_s']*1e3:g} ms; "
          f"producer {a['producer_ranks']} ranks x {a['producer_threads']} threads; receiver {a['receiver_threads']} threads; "
          f"{a['receivers']} receivers (binary, depth {rows[0]['depth']})")
    c = f["constants"]
    print(f"{'model':<5} {'change':>6} {'B/chg':>6} {'payload GB':>10} {'diff s':>7} {'wire s':>7} {'fill s':>7} "
          f"{'apply s':>7} {'commit s':>8} {'total s':>8} {'producer':>9} {'k=1':>7} {'serial s':>8} {'full s':>8} {'full/refit':>10}")
    for r in rows:
        print(f"{r['model']:<5} {r['rate']:>6.0%} {r['bytes_per_change']:>6.3f} {r['payload_bytes']/1e9:>10.2f} {r['diff']:>7.2f} "
              f"{r['wire']:>7.2f} {r['fill']:>7.3f} {r['apply']:>7.2f} {r['commit_d']:>8.3f} {r['total_d']:>8.1f} "
              f"{r['total_p']:>9.1f} {r['total_1']:>7.1f} {r['serial_d']:>8.1f} {r['full']:>8.0f} {r['full']/r['total_d']:>9.0f}x")
    print(f"rows: {len(rows)}  (total = max(diff, wire, apply) + fill + commit with the delegated commit (`commit: auto` "
          f"across regions), k = {rows[0]['k_delegated']:.2f} fitted; producer: its commit, k = {c['k_rtt']:.2f}; "
          f"k=1: the delegated commit's design value; serial = the sum, nothing overlapped)")
    print("\n1T at 3%: what it takes to be under 60 s (total with the delegated commit / the producer's / k = 1):")
    for s in project_lib.scenarios_1t(f, a):
        tag = " (measured)" if s["measured_bpc"] else ""
        print(f"  K={s['paths']} paths, {s['bytes_per_change']:.3f} B/change{tag}: wire {s['wire']:6.1f} s, "
              f"total {s['total_d']:6.1f} / {s['total_p']:6.1f} / {s['total_1']:6.1f} s {'<60' if s['total_d'] < 60 else '>=60'}")
    if args.markdown:
        print("\n| model | change | B/change | payload GB | diff s | wire s | fill s | apply s | commit s (delegated) | "
              "total s | total s, producer commit | total s, k = 1 | serial s | full s | full / refit |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['model']} | {r['rate']:.0%} | {r['bytes_per_change']:.3f} | {r['payload_bytes']/1e9:.2f} | {r['diff']:.2f} | "
                  f"{r['wire']:.2f} | {r['fill']:.3f} | {r['apply']:.2f} | {r['commit_d']:.3f} | **{r['total_d']:.1f}** | "
                  f"{r['total_p']:.1f} | {r['total_1']:.1f} | {r['serial_d']:.1f} | {r['full']:.0f} | {r['full']/r['total_d']:.0f}x |")
        print("\n| paths K | bytes per change | wire s | total s (delegated) | total s (producer commit) | total s (k = 1) | under 60 s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for s in project_lib.scenarios_1t(f, a):
            tag = "measured" if s["measured_bpc"] else "scenario"
            print(f"| {s['paths']} | {s['bytes_per_change']:.3f} ({tag}) | {s['wire']:.1f} | {s['total_d']:.1f} | "
                  f"{s['total_p']:.1f} | {s['total_1']:.1f} | {'yes' if s['total_d'] < 60 else '**no**'} |")
    if args.svg:
        project_lib.svg_plot(f, a, args.svg)
        print(f"plot: {args.svg}")
    if args.out:
        with open(args.out, "w") as fo:
            json.dump(dict(assumptions=a, link_bytes_per_s=link, rows=rows, scenarios_1t=project_lib.scenarios_1t(f, a)), fo, indent=1)
    return 0 if len(rows) == 9 else 1


def cmd_group(args):
    """Issue 32 part 3: the group runs against their floor and M = 1, the model with M checked on
    them (held out: constants from --fit), and the 1T projection over M boundary links. --check:
    exit 1 when a configuration's prediction is off by more than --tolerance."""
    import group_lib
    doc = json.load(open(args.runs))
    f = json.load(open(args.fit))
    t_rank = group_lib.fit_rank_overhead(doc, f["constants"])
    t = group_lib.table(doc, f["constants"], t_rank)
    if not t:
        raise SystemExit(f"{args.runs} has no group runs (measure --matrix group)")
    print(f"group runs: {args.runs} ({len(doc['runs'])} runs, {sum(1 for r in doc['runs'] if r.get('report'))} ok); "
          f"model: {args.fit} (form {f['constants'].get('form', '?')}, fitted on single-producer runs only); "
          f"wire = payload / (eta x M x uplink); + t_rank: t_rank x (M - 1) more CPU, t_rank = {t_rank * 1e3:.0f} ms "
          f"fitted on the {group_lib.TRAIN_UPLINK} group runs, the others held out")
    group_lib.print_table(t, args.markdown)
    bad = [v for v in t if v["held_out"] and abs(v["error_m"]) > args.tolerance]
    a = assumptions(args)
    p = group_lib.projection(f, a)
    print(f"\n1T over M producer ranks, each with its own {project_lib.LINK_BYTES_PER_S * 8 / 1e9:.2f} Gbit/s boundary link; "
          f"{a['receivers']} receivers, {a['receiver_threads']} apply threads each, inner links "
          f"{a['inner_bytes_per_s'] * 8 / 1e9:g} Gbit/s, RTT {a['rtt_s'] * 1e3:g} ms, delegated commit:")
    head = ("change", "M", "payload GB", "diff s", "wire s", "fan-out s", "apply s", "total s", "bound", "wire / bound")
    print(("| " + " | ".join(head) + " |\n|" + " --- |" * len(head)) if args.markdown else "  ".join(head))
    for r in p:
        cells = (f"{r['rate']:.0%}", str(r["producers"]), f"{r['payload_bytes'] / 1e9:.2f}", f"{r['diff']:.2f}",
                 f"{r['wire']:.2f}", f"{r['fanout']:.2f}", f"{r['apply']:.2f}", f"{r['total_d']:.1f}", r["bound"],
                 f"{r['wire'] / r[r['bound']]:.2f}")
        print(("| " + " | ".join(cells) + " |") if args.markdown else "  ".join(cells))
    if args.out:
        with open(args.out, "w") as fo:
            json.dump(dict(t_rank_s=t_rank, train_uplink=group_lib.TRAIN_UPLINK, table=t, projection=p,
                           assumptions=a), fo, indent=1)
    if args.check and bad:
        print(f"FAIL: {len(bad)} group configuration(s) outside +-{args.tolerance:.0%}", file=sys.stderr)
        return 1
    held = sum(1 for v in t if v["held_out"])
    print(f"group: {held - len(bad)}/{held} held-out configurations within +-{args.tolerance:.0%} of the model with M "
          f"(+ t_rank); wire / M alone: {sum(1 for v in t if abs(v['error']) <= args.tolerance)}/{len(t)} of all")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", default=os.path.join(HERE, "runs.json"))
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument("--steps", type=int, default=3)
    m.add_argument("--deltacast")
    m.add_argument("--quick", action="store_true")
    m.add_argument("--append", action="store_true", help="add a batch to the runs already in --out")
    m.add_argument("--train-batches", type=int,
                   help="for a new --out: the last batch `fit` trains on (the later ones are held out); "
                        "default: fit_lib.TRAIN_BATCHES (runs.json's split)")
    m.add_argument("--only-receivers", type=int, help="only the configurations with this many receivers")
    m.add_argument("--only-heldout", action="store_true", help="only the former held-out configurations (6, 8 receivers)")
    m.add_argument("--matrix", choices=("default", "blind2", "wide", "blind3", "group", "group_wire"), default="default",
                   help="blind2: the second blind set (120M, ~2%%, 5 and 10 receivers) and its 2 controls; "
                        "wide: the fourth check's training (2-12 receivers); blind3: its blind set and controls; "
                        "group: M = 1, 2, 4 producer ranks (issue 32 part 3); group_wire: M = 1, 2, 4 at 5 Mbit/s "
                        "per rank, where the wire bounds M = 4 here")
    cv = sub.add_parser("cv")
    cv.add_argument("--runs", default=os.path.join(HERE, "runs.json"))
    iw = sub.add_parser("ingest-wan")
    iw.add_argument("--runs", default=os.path.join(HERE, "runs.json"))
    fi = sub.add_parser("fit")
    fi.add_argument("--runs", default=os.path.join(HERE, "runs.json"))
    fi.add_argument("--out")
    fi.add_argument("--check", action="store_true")
    fi.add_argument("--form", choices=fit_lib.FORMS, default="C",
                    help="the model's form (fit_lib): the one `cv` chooses on the training runs; default C")
    fi.add_argument("--verbose", "-v", action="store_true", help="also print every training configuration")
    fi.add_argument("--markdown", action="store_true", help="also print the tables in Markdown")
    fi.add_argument("--tolerance", type=float, default=0.15)
    fi.add_argument("--freeze", help="also write the fit here with the time, once (refuses to overwrite)")
    pr = sub.add_parser("project")
    al = sub.add_parser("all")
    gr = sub.add_parser("group", help="issue 32 part 3: the producer group's runs, the model with M, 1T over M links")
    gr.add_argument("--runs", default=os.path.join(HERE, "runs-group.json"))
    gr.add_argument("--check", action="store_true", help="exit 1 when a held-out configuration is outside --tolerance")
    gr.add_argument("--tolerance", type=float, default=0.15)
    for q in (pr, al, gr):
        q.add_argument("--fit", default=os.path.join(ROOT, "tools", "probe", "cost_model_fit.json"))
        q.add_argument("--svg", default=None)
        q.add_argument("--out")
        q.add_argument("--paths", type=int, default=project_lib.DEFAULTS["paths"])
        q.add_argument("--bytes-per-change", type=float, default=None)
        q.add_argument("--producer-ranks", type=int, default=project_lib.DEFAULTS["producer_ranks"])
        q.add_argument("--producer-threads", type=int, default=project_lib.DEFAULTS["producer_threads"])
        q.add_argument("--receiver-threads", type=int, default=project_lib.DEFAULTS["receiver_threads"])
        q.add_argument("--receivers", type=int, default=project_lib.DEFAULTS["receivers"])
        q.add_argument("--rtt-ms", type=float, default=project_lib.DEFAULTS["rtt_s"] * 1e3)
        q.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    al.add_argument("--runs", default=os.path.join(HERE, "runs.json"))
    al.add_argument("--rounds", type=int, default=3)
    al.add_argument("--steps", type=int, default=3)
    al.add_argument("--deltacast")
    al.add_argument("--tolerance", type=float, default=0.15)
    args = p.parse_args()
    if args.cmd == "measure":
        return cmd_measure(args)
    if args.cmd == "fit":
        return cmd_fit(args)
    if args.cmd == "cv":
        return cmd_cv(args)
    if args.cmd == "ingest-wan":
        return cmd_ingest_wan(args)
    if args.cmd == "project":
        return cmd_project(args)
    if args.cmd == "group":
        return cmd_group(args)
    # all
    args.out_runs, args.quick = args.runs, False
    cmd_measure(argparse.Namespace(out=args.runs, rounds=args.rounds, steps=args.steps, deltacast=args.deltacast,
                                   quick=False, append=False, only_receivers=None, only_heldout=False,
                                   matrix="default"))
    rc = cmd_fit(argparse.Namespace(runs=args.runs, out=args.fit, check=True, tolerance=args.tolerance, verbose=True,
                                       markdown=False, freeze=None))
    rc2 = cmd_project(args)
    return rc or rc2


if __name__ == "__main__":
    sys.exit(main())
