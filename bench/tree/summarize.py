#!/usr/bin/env python3
"""Medians of the relay-tree benchmark runs (bench/tree/results/*.jsonl, the scripts' default
output; docs/performance.md, "Relay tree") as Markdown tables, plus SVG plots in bench/tree/results/:
netns-scaling*.svg (time / (S/B) vs receivers) and refit-by-uplink.svg (refit speedup over a full
checkpoint vs uplink rate).
Only the standard library: this machine's python has no numpy or matplotlib.
   python3 bench/tree/summarize.py [RESULTS_DIR]"""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

TOPOLOGIES = ["binary", "double_binary", "chain"]
COLOURS = {"binary": "#d62728", "double_binary": "#1f77b4", "chain": "#2ca02c"}


def load(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def median(values):
    return statistics.median(values) if values else float("nan")


def loopback(rows, note=""):
    mpi = [r["seconds"] for r in rows if r["bench"] == "mpi_bcast"]
    if not mpi:
        return
    base = median(mpi)
    size = rows[0]["bytes"] / 2**20
    load = [r["loadavg_1min"] for r in rows if "loadavg_1min" in r]
    print(f"### Loopback TCP, {size:.0f} MiB to 8 receivers (median of {len(mpi)}){note}"
          + (f", load 1min {min(load):.1f}-{max(load):.1f}" if load else "") + "\n")
    print("| sender | seconds (median) | runs | vs MPI_Bcast | bit-exact |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| MPI_Bcast (btl self,tcp) | {base:.3f} | {', '.join(f'{x:.2f}' for x in mpi)} | 1.00x | "
          f"{min(r['exact_receivers'] for r in rows if r['bench'] == 'mpi_bcast')}/8 |")
    for topo in TOPOLOGIES:
        runs = [r for r in rows if r["bench"] == "broadcast" and r["topology"] == topo]
        if runs:
            t = median([r["seconds"] for r in runs])
            print(f"| tree {topo} | {t:.3f} | {', '.join('%.2f' % r['seconds'] for r in runs)} | "
                  f"{t / base:.2f}x | {min(r['bit_exact_receivers'] for r in runs)}/{runs[0]['receivers']} |")
    print()


def netns(rows, svg_path):
    iperf = [r["bits_per_second"] for r in rows if r["bench"] == "iperf3"]
    if iperf:
        print(f"iperf3 over one shaped veth: {median(iperf) / 1e6:.0f} Mbit/s (median of {len(iperf)})\n")
    chain = [r for r in rows if r["bench"] == "iperf3_chain"]
    runs = [r for r in rows if r["bench"] == "broadcast"]
    if chain and runs:
        s_over_b = runs[0]["lower_bound_seconds"]
        print("Machine capacity, no deltacast: N concurrent shaped iperf3 flows dc(i-1) -> dci (the "
              "chain's traffic pattern). Every receiver must take in S, so no N-receiver broadcast "
              "can beat N*S/aggregate here.\n")
        print("| flows N | per-flow Mbit/s | aggregate Gbit/s | N*S/aggregate over S/B |")
        print("| --- | --- | --- | --- |")
        for r in sorted(chain, key=lambda r: r["flows"]):
            bound = r["flows"] * s_over_b * 1e9 / r["aggregate_bps"]
            print(f"| {r['flows']} | {r['flow_median_bps'] / 1e6:.0f} | {r['aggregate_bps'] / 1e9:.2f} | "
                  f"{max(1.0, bound / s_over_b):.2f}x |")
        print()
    if not runs:
        return
    table = defaultdict(list)
    for r in runs:
        table[(r["topology"], r["receivers"])].append(r)
    counts = sorted({r["receivers"] for r in runs})
    size = runs[0]["bytes"] / 2**20
    rate = runs[0]["bytes"] * 8 / runs[0]["lower_bound_seconds"] / 1e9
    rate_text = f"{rate:.0f} Gbit/s" if rate >= 0.995 else f"{rate * 1000:.0f} Mbit/s"
    chunk = runs[0].get("label", "").partition("chunk")[2]
    print(f"### Network namespaces, {rate_text} tbf egress per node, {size:.0f} MiB"
          + (f", {chunk} chunks" if chunk else "")
          + f" (time / (S/B), median; S/B = {runs[0]['lower_bound_seconds']:.3f} s)\n")
    print("| receivers | " + " | ".join(TOPOLOGIES) + " |")
    print("| --- |" + " --- |" * len(TOPOLOGIES))
    series = {t: [] for t in TOPOLOGIES}
    for n in counts:
        cells = []
        for topo in TOPOLOGIES:
            rs = table.get((topo, n), [])
            if not rs:
                cells.append("-")
                continue
            ratio = median([r["over_lower_bound"] for r in rs])
            secs = median([r["seconds"] for r in rs])
            exact = min(r["bit_exact_receivers"] for r in rs)
            series[topo].append((n, ratio))
            cells.append(f"{ratio:.2f}x ({secs:.2f} s, {len(rs)} runs, {exact}/{n} exact)")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
    write_svg(svg_path, series, counts, rate_text)


def svg_axes(box, title, xlabel, xticks, y, ymax, ystep, yfmt):
    """The frame shared by the plots: header, title, axes, x tick labels ((x, text) pairs) and
    horizontal grid lines every ystep up to ymax. box = (width, height, left, bottom, top, right)."""
    width, height, left, bottom, top, right = box
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18">{title}</text>',
           f'<line x1="{left}" y1="{y(0)}" x2="{width - right}" y2="{y(0)}" stroke="black"/>',
           f'<line x1="{left}" y1="{y(0)}" x2="{left}" y2="{top}" stroke="black"/>',
           f'<text x="{(left + width - right) / 2}" y="{height - 10}" text-anchor="middle">{xlabel}</text>']
    for xpos, text in xticks:
        out.append(f'<text x="{xpos:.1f}" y="{height - bottom + 18}" text-anchor="middle">{text}</text>')
    tick = 0
    while tick <= ymax:
        out.append(f'<line x1="{left - 4}" y1="{y(tick):.1f}" x2="{width - right}" y2="{y(tick):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{yfmt.format(tick)}</text>')
        tick += ystep
    return out


def write_svg(path, series, counts, rate_text):
    width, height, left, bottom, top, right = 560, 360, 60, 50, 30, 150
    ymax = max([2.5] + [r for pts in series.values() for _, r in pts]) * 1.1
    xmin, xmax = min(counts), max(counts)
    span = max(1, xmax - xmin)

    def x(n):
        return left + (n - xmin) / span * (width - left - right)

    def y(v):
        return height - bottom - v / ymax * (height - bottom - top)

    out = svg_axes((width, height, left, bottom, top, right),
                   f"Relay-tree broadcast time / (S/B), {rate_text} per node", "receivers",
                   [(x(n), n) for n in counts], y, ymax, 0.5, "{:.1f}")
    out.append(f'<line x1="{left}" y1="{y(1.15):.1f}" x2="{width - right}" y2="{y(1.15):.1f}" '
               f'stroke="gray" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{width - right + 6}" y="{y(1.15) + 4:.1f}" fill="gray">target 1.15</text>')
    for i, (topo, pts) in enumerate(series.items()):
        if not pts:
            continue
        colour = COLOURS[topo]
        path_d = " ".join(f"{'M' if j == 0 else 'L'}{x(n):.1f},{y(v):.1f}" for j, (n, v) in enumerate(pts))
        out.append(f'<path d="{path_d}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for n, v in pts:
            out.append(f'<circle cx="{x(n):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"/>')
        ly = top + 20 + 18 * i
        out.append(f'<line x1="{width - right + 6}" y1="{ly}" x2="{width - right + 26}" y2="{ly}" '
                   f'stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{width - right + 30}" y="{ly + 4}">{topo}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")
    print(f"Plot: {path}\n")


def refit(rows):
    runs = [r for r in rows if r["bench"] == "refit"]
    if not runs:
        return
    label = runs[0].get("label", "")
    uplink = label.rpartition("-")[2] if label.startswith("cross-cluster-") else "1gbit"
    print(f"### Full checkpoint vs delta refit, producer uplink {uplink.replace('gbit', ' Gbit/s')}, "
          f"{runs[0]['params'] / 1e6:.0f}M params, {runs[0]['topology']} "
          f"(medians; step 1 and steps 2+ apart, see text)\n")
    print("| receivers | lr | runs | changed | payload MB | B/change | full s | full/(S/B) | "
          "refit s step 1 | refit s steps 2+ | encode s steps 2+ | speedup steps 2+ | "
          "refit/(payload/B) steps 2+ | exact | load 1min |")
    print("| --- |" + " --- |" * 14)
    for n, lr in sorted({(r["receivers"], r["lr"]) for r in runs}):
        rs = [r for r in runs if r["lr"] == lr and r["receivers"] == n]
        first = [r["steps"][0] for r in rs if r["steps"]]
        later = [s for r in rs for s in r["steps"][1:]]
        print(f"| {n} | {lr:g} | {len(rs)} | "
              f"{100 * median([s['changed_fraction'] for s in first + later]):.2f}% | "
              f"{median([s['payload_bytes'] for s in first + later]) / 1e6:.2f} | "
              f"{median([s['bytes_per_change'] for s in first + later]):.2f} | "
              f"{median([r['full_seconds'] for r in rs]):.2f} | "
              f"{median([r['full_over_lower_bound'] for r in rs]):.2f} | "
              f"{median([s['refit_seconds'] for s in first]):.2f} | "
              f"{median([s['refit_seconds'] for s in later]):.2f} | "
              f"{median([s['encode_seconds'] for s in later]):.2f} | "
              f"{median([s['speedup'] for s in later]):.1f}x | "
              f"{median([s['over_lower_bound'] for s in later]):.0f} | "
              f"{min(r['bit_exact_receivers'] for r in rs)}/{n} | "
              f"{median([r.get('loadavg_1min', float('nan')) for r in rs]):.1f} |")
    print()


def uplink_mbit(label):
    text = label.rpartition("-")[2]
    return round(float(text.replace("gbit", "")) * 1000)


def refit_by_uplink(older, newer, svg_path):
    """Speedup and refit/(payload/B) by uplink rate, every step a sample (the session-3 sweep);
    a (rate, lr) measured in `newer` replaces the same one in `older`."""
    def by_group(rows):
        groups = defaultdict(list)
        for r in rows:
            if r["bench"] == "refit" and r.get("label", "").startswith("cross-cluster-"):
                groups[(uplink_mbit(r["label"]), r["lr"])].extend(r["steps"])
        return groups
    groups = by_group(older)
    groups.update(by_group(newer))
    if not groups:
        return
    print("### Refit vs full checkpoint by uplink rate (every step of every run)\n")
    print("| uplink Mbit/s | lr | steps | changed | speedup min / median / max | refit/(payload/B) median |")
    print("| --- | --- | --- | --- | --- | --- |")
    series = defaultdict(list)
    for (rate, lr), steps in sorted(groups.items()):
        speedups = [s["speedup"] for s in steps]
        print(f"| {rate} | {lr:g} | {len(steps)} | {100 * median([s['changed_fraction'] for s in steps]):.2f}% | "
              f"{min(speedups):.0f} / {median(speedups):.0f} / {max(speedups):.0f} | "
              f"{median([s['over_lower_bound'] for s in steps]):.2f} |")
        series[lr].append((rate, median(speedups)))
    print()
    width, height, left, bottom, top, right = 560, 360, 60, 50, 30, 170
    rates = sorted({rate for pts in series.values() for rate, _ in pts})
    ymax = max([100.0] + [v for pts in series.values() for _, v in pts]) * 1.1

    def x(rate):
        return left + rates.index(rate) / max(1, len(rates) - 1) * (width - left - right)

    def y(v):
        return height - bottom - v / ymax * (height - bottom - top)

    out = svg_axes((width, height, left, bottom, top, right),
                   "Refit speedup over a full checkpoint vs producer uplink (median)", "uplink Mbit/s",
                   [(x(rate), rate) for rate in rates], y, ymax, 50, "{}")
    colours = ["#2ca02c", "#1f77b4", "#d62728", "#9467bd"]
    for i, (lr, pts) in enumerate(sorted(series.items())):
        colour = colours[i % len(colours)]
        target = 80 if i == 0 else 40
        out.append(f'<line x1="{left}" y1="{y(target):.1f}" x2="{width - right}" y2="{y(target):.1f}" '
                   f'stroke="{colour}" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{width - right + 6}" y="{y(target) + 4:.1f}" fill="{colour}">target {target}x</text>')
        pts = sorted(pts)
        path_d = " ".join(f"{'M' if j == 0 else 'L'}{x(r):.1f},{y(v):.1f}" for j, (r, v) in enumerate(pts))
        out.append(f'<path d="{path_d}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for r, v in pts:
            out.append(f'<circle cx="{x(r):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}"/>')
        ly = top + 20 + 18 * i
        out.append(f'<text x="{width - right + 6}" y="{ly}" fill="{colour}">lr {lr:g}</text>')
    out.append("</svg>")
    Path(svg_path).write_text("\n".join(out) + "\n")
    print(f"Plot: {svg_path}\n")


def main():
    results = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results")
    loopback(load(results / "loopback.jsonl"))
    loopback(load(results / "loopback-run1.jsonl"), ", first run, machine loaded (load 8-19)")
    loopback(load(results / "loopback-session2.jsonl"), ", session 2 (format v2 digest, faster apply)")
    netns(load(results / "netns.jsonl"), results / "netns-scaling.svg")
    netns(load(results / "netns-100mbit.jsonl"), results / "netns-scaling-100mbit.svg")
    refit(load(results / "refit.jsonl") + load(results / "refit-1rx.jsonl"))
    refit(load(results / "refit-0.1gbit.jsonl"))
    loopback(load(results / "loopback-session3.jsonl"), ", session 3 (RAW pieces land in place)")
    netns(load(results / "netns-1gbit-session3.jsonl"), results / "netns-scaling-1gbit-session3.svg")
    refit_by_uplink(load(results / "refit-session3.jsonl"), load(results / "refit-session3-codec.jsonl"),
                    results / "refit-by-uplink.svg")


if __name__ == "__main__":
    main()
