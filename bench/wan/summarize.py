#!/usr/bin/env python3
"""Tables for bench/wan/run_cross_region.sh (docs/performance.md, "Refit against a full
checkpoint" and "Round trips per version").

    python3 bench/wan/summarize.py [--rtt bench/wan/results/rtt.jsonl] [--table bench/wan/results/table.jsonl]

Every figure is a range over every refit step of every run: min-median-max, never the best alone.
full = the producer's bootstrap (report full.seconds); refit = steps[].refit_seconds (encode, send,
apply and verify at every receiver, joint commit); speedup = the run's full / the step's refit.
Lower bound of a refit = payload bytes x 8 / uplink + 1 measured RTT (the least any protocol needs:
the bytes must cross the uplink and the producer must hear back once); of a full send = checkpoint
bytes x 8 / uplink.
"""
import argparse
import json
import os
import statistics

ROOT = os.path.dirname(os.path.abspath(__file__))

# Published figures (issue 14; shared/CONTEXT.md). Checkpoint bytes, full-send seconds, and refit
# seconds by change rate.
PUBLISHED = [
    ("relay tree, 120B BF16 (issue 14)", 247.2e9, 750.0, {0.03: 22.6, 0.05: 41.6}),
    ("NeMo RL design doc, ZeroMQ tree", 247.2e9, 750.0, {0.03: 24.1, 0.05: 25.8}),
    ("NeMo RL design doc, S3", 247.2e9, 750.0, {0.03: 20.2, 0.05: 33.8}),
    ("1T BF16 (issue 14)", 2.0e12, 87.5 * 60, {0.03: 150.0}),
]


def rate_bits(text):
    t = text.lower()
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if t.endswith(suffix):
            return float(t[: -len(suffix)]) * mult
    return 0.0


def rng(values, fmt="{:.3f}"):
    if not values:
        return "-"
    v = sorted(values)
    if len(v) == 1:
        return fmt.format(v[0])
    return "-".join(fmt.format(x) for x in (v[0], statistics.median(v), v[-1]))


def load(path):
    if not path or not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def steps_of(line):
    """(step entry, run) pairs with the derived figures."""
    rep = line["report"]
    uplink = rate_bits(line["uplink"])
    rtt_s = line["rtt"].get("median_ms", 2 * line["delay_ms"]) / 1e3
    out = []
    for s in rep["steps"]:
        wire = s["payload_bytes"] * 8 / uplink if uplink else 0.0
        out.append({
            "changed": s["changed_fraction"],
            "payload": s["payload_bytes"],
            "bytes_per_change": s["payload_bytes"] / max(1, s["changes"]),
            "refit": s["refit_seconds"],
            "speedup": rep["full"]["seconds"] / s["refit_seconds"],
            "lower": wire + rtt_s,
            "wire": wire,
            "rtt": rtt_s,
            "exact": s["committed"] and s["verified_receivers"] == s["receivers"],
            "receivers": s["receivers"],
        })
    return out


def full_of(line):
    rep = line["report"]
    uplink = rate_bits(line["uplink"])
    floor = rep["checkpoint_bytes"] * 8 / uplink if uplink else 0.0
    return rep["full"]["seconds"], floor


def rtt_tables(lines):
    """One round-trip table per commit mode (lines before the mode existed are `producer`)."""
    modes = sorted({l.get("commit", "producer") for l in lines})
    for mode in modes:
        rtt_table([l for l in lines if l.get("commit", "producer") == mode], mode)


def rtt_table(lines, mode="producer"):
    ok = [l for l in lines if l.get("report")]
    failed = len(lines) - len(ok)
    first = (ok or lines)[0]
    print(f"#### (a) Round trips, commit: {mode}: {first['receivers']} receivers, {first['topology']}, "
          f"{first['params']} params, lr {first['lr']:g}, {first['uplink']} uplink\n")
    print("| one-way delay | measured RTT ms (min-median-max) | runs | refit steps | changed | payload MB "
          "| full s | full/floor | refit s | full/refit | lower bound s | refit/lower bound | extra RTTs vs 0 ms | exact |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base = None
    for delay in sorted({l["delay_ms"] for l in ok}):
        runs = [l for l in ok if l["delay_ms"] == delay]
        st = [s for l in runs for s in steps_of(l)]
        refits = [s["refit"] for s in st]
        if delay == 0:
            base = statistics.median(refits)
        rtts = [l["rtt"]["median_ms"] for l in runs if "median_ms" in l["rtt"]]
        extra = "-"
        if base is not None and delay > 0 and rtts:
            rtt_s = statistics.median(rtts) / 1e3
            extra = rng([(r - base) / rtt_s for r in refits], "{:.2f}")
        fulls = [full_of(l) for l in runs]
        exact = sum(s["exact"] for s in st)
        print(f"| {delay:g} ms | {rng(rtts, '{:.1f}')} | {len(runs)} | {len(st)} | "
              f"{rng([100 * s['changed'] for s in st], '{:.2f}')}% | {rng([s['payload'] / 1e6 for s in st], '{:.2f}')} | "
              f"{rng([f for f, _ in fulls], '{:.2f}')} | {rng([f / fl for f, fl in fulls], '{:.3f}')} | "
              f"{rng(refits)} | {rng([s['speedup'] for s in st], '{:.0f}x')} | {rng([s['lower'] for s in st])} | "
              f"{rng([s['refit'] / s['lower'] for s in st], '{:.2f}')} | {extra} | {exact}/{len(st)} steps |")
    if failed:
        print(f"\n{failed} run(s) failed (no report); see the JSON lines with rc != 0.")
    print()
    # Paired by round (runs of one round are minutes apart, so they share the machine's load):
    # median refit per run, and the extra round trips against the same round's 0 ms run.
    delays = sorted({l["delay_ms"] for l in ok})
    print("| round | " + " | ".join(f"{d:g} ms: refit s (load)" for d in delays) + " | extra RTTs per version |")
    print("| --- | " + " | ".join("---" for _ in delays) + " | --- |")
    for rnd in sorted({l["round"] for l in ok}):
        cells, med = [], {}
        for d in delays:
            runs = [l for l in ok if l["round"] == rnd and l["delay_ms"] == d]
            if not runs:
                cells.append("-")
                continue
            med[d] = statistics.median(s["refit"] for s in steps_of(runs[0]))
            cells.append(f"{med[d]:.3f} ({runs[0]['load_before']:.1f})")
        extra = []
        for d in delays:
            runs = [l for l in ok if l["round"] == rnd and l["delay_ms"] == d]
            if d > 0 and 0 in med and d in med and "median_ms" in runs[0]["rtt"]:
                extra.append(f"{d:g} ms: {(med[d] - med[0]) / (runs[0]['rtt']['median_ms'] / 1e3):.2f}")
        print(f"| {rnd} | " + " | ".join(cells) + " | " + ", ".join(extra) + " |")
    print()


def cross_table(lines):
    ok = [l for l in lines if l.get("report")]
    failed = len(lines) - len(ok)
    if not ok:
        return {}
    params = ok[0]["report"]["params"]
    ckpt = ok[0]["report"]["checkpoint_bytes"]
    print(f"#### (b) Cross-region table: producer + {ok[0]['receivers']} receivers, {ok[0]['uplink']} uplink with "
          f"{ok[0]['delay_ms']:g} ms one-way delay, inner {ok[0]['inner']}, {params / 1e6:.0f}M params "
          f"({ckpt / 1e6:.0f} MB)\n")
    print("| lr | topology | runs | refit steps | changed | payload MB | B/change | full s | full/floor | refit s "
          "| full/refit | refit/full | lower bound s | refit/lower bound | exact |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    summary = {}
    for lr in sorted({l["lr"] for l in ok}):
        for topo in ("chain", "double_binary", "binary"):
            runs = [l for l in ok if l["lr"] == lr and l["topology"] == topo]
            if not runs:
                continue
            st = [s for l in runs for s in steps_of(l)]
            fulls = [full_of(l) for l in runs]
            exact = sum(s["exact"] for s in st)
            print(f"| {lr:g} | {topo} | {len(runs)} | {len(st)} | {rng([100 * s['changed'] for s in st], '{:.2f}')}% | "
                  f"{rng([s['payload'] / 1e6 for s in st], '{:.2f}')} | {rng([s['bytes_per_change'] for s in st], '{:.2f}')} | "
                  f"{rng([f for f, _ in fulls], '{:.2f}')} | {rng([f / fl for f, fl in fulls], '{:.3f}')} | "
                  f"{rng([s['refit'] for s in st])} | {rng([s['speedup'] for s in st], '{:.0f}x')} | "
                  f"{rng([s['refit'] / f for l in runs for s, f in ((x, l['report']['full']['seconds']) for x in steps_of(l))], '{:.4f}')} | "
                  f"{rng([s['lower'] for s in st])} | {rng([s['refit'] / s['lower'] for s in st], '{:.2f}')} | "
                  f"{exact}/{len(st)} steps |")
            summary[(lr, topo)] = {
                "changed": statistics.median(s["changed"] for s in st),
                "bytes_per_change": statistics.median(s["bytes_per_change"] for s in st),
                "refit_over_full": [s["refit"] / full_of(l)[0] for l in runs for s in steps_of(l)],
                "refit_over_lower": [s["refit"] / s["lower"] for s in st],
            }
    if failed:
        print(f"\n{failed} run(s) failed (no report); see the JSON lines with rc != 0.")
    print()
    return summary


def side_by_side(summary, uplink_bits=100e6):
    """Ratios only: refit/full and refit/lower bound, ours against the published figures."""
    if not summary:
        return
    print("#### Side by side with the published figures (ratios, not absolute times)\n")
    print("Published lower bound: payload at our measured bytes per change (the published payloads are not "
          "given) over the link rate implied by the published full send (full at 1.0x its floor), plus 0.1 s "
          "of round trips (2 x 50 ms, an assumption).\n")
    print("| system | change | refit s | full s | refit/full | full/refit | refit/lower bound |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ours = {}
    for (lr, topo), s in summary.items():
        ours.setdefault(round(s["changed"] * 100), []).append((topo, s))
    for name, ckpt, full, refits in PUBLISHED:
        link = ckpt / full  # bytes per second
        for rate, refit in sorted(refits.items()):
            near = ours.get(round(rate * 100))
            bpc = statistics.median(x["bytes_per_change"] for _, x in near) if near else 0.86
            params = ckpt / 2
            lower = params * rate * bpc / link + 0.1
            print(f"| {name} | {rate * 100:.0f}% | {refit:g} | {full:g} | {refit / full:.4f} | {full / refit:.0f}x | "
                  f"{refit / lower:.1f} |")
    for pct in sorted(ours):
        for topo, s in ours[pct]:
            print(f"| deltacast here ({topo}) | {s['changed'] * 100:.2f}% | | | {rng(s['refit_over_full'], '{:.4f}')} | "
                  f"{rng([1 / x for x in s['refit_over_full']], '{:.0f}x')} | {rng(s['refit_over_lower'], '{:.2f}')} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rtt", default=os.path.join(ROOT, "results", "rtt.jsonl"))
    ap.add_argument("--table", default=os.path.join(ROOT, "results", "table.jsonl"))
    a = ap.parse_args()
    rtt = load(a.rtt)
    if rtt:
        rtt_tables(rtt)
    table = load(a.table)
    if table:
        side_by_side(cross_table(table))


if __name__ == "__main__":
    main()
