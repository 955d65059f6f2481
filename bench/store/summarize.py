"""Tables from bench/store/run_store_wan.sh's JSON lines (docs/performance.md, "Object storage
across a WAN (issue 34)").

    summarize.py RESULT.jsonl [--since 'YYYY-MM-DD HH:MM:SS']

Per mode: the time from the producer's step to the version at every member (versions >= 2), as
min-max over rounds of each round's median, and min-med-max over every version; the same against
the wire floor and against the same round's tree-only median; bytes across the inter-cluster link
and bytes radosgw sent per version against the payload. Then where a store version's time goes
(the gateway that committed last, medians per round) and the goals of issue 34.
One set of tables per link layout (`links` in the lines: shared, one link for both clusters, the
default of older lines; split, one link per cluster): with split, "link bytes" are summed over both
links, towards the clusters + from them, and the floors are those of a link per cluster (notes
below the table).
Standard library only.
"""

import argparse
import json
import statistics as st
from collections import defaultdict

ORDER = ["tree", "store", "hybrid"]
CLUSTERS = {"tree": 1, "store": 8, "hybrid": 2}


def rng(xs, fmt="{:.3f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else fmt.format(lo) + "-" + fmt.format(hi)


def mmm(xs, fmt="{:.3f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return "-".join(fmt.format(x) for x in (min(xs), st.median(xs), max(xs)))


SPLIT_NOTES = """Floors with a link per cluster (LINKS=split; P payload, R one link's rate, RTT one link's,
RTT_x east <-> west, both links): tree (producer_cluster `trainer`): the producer feeds each tree's
root in one cluster, the other cluster's entry hangs below a member of the first (double_binary:
tree 0 rooted in east, tree 1 in west), so each link carries the whole payload towards its cluster
(half from the producer, half forwarded by the other cluster) and the forwarded half starts one
link's round trip later: max(P/R + RTT/2, P/(2R) + RTT/2 + RTT_x/2); one tree (binary, chain):
P/R + RTT/2 + RTT_x/2. hybrid: each gateway pulls over its own link, both at once: P/R + 1 RTT (the poll that finds an
inline version brings it). store: each link carries its cluster's members' downloads: (N/2) x P/R
+ 1 RTT. Link bytes /
payload: summed over both links, towards the clusters + from them (the tree's east <-> west
forward goes up one link and down the other; ACKs are in the counts too)."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("result")
    p.add_argument("--since", default="")
    a = p.parse_args()
    runs = [json.loads(l) for l in open(a.result) if l.strip()]
    runs = [r for r in runs if r.get("bench") == "store_wan" and r["time"] >= a.since]
    if not runs:
        print("no runs")
        return
    layouts = sorted({r.get("links") or "shared" for r in runs}, key=["shared", "split"].index)
    for i, links in enumerate(layouts):
        if len(layouts) > 1:
            print(("\n" if i else "") + f"## links: {links}\n")
        summarize([r for r in runs if (r.get("links") or "shared") == links], links)


def summarize(runs: list, links: str) -> None:
    split = links == "split"
    by = defaultdict(dict)  # mode -> round -> run
    for r in runs:
        by[r["mode"]][r["round"]] = r
    rounds = sorted({r["round"] for r in runs})
    bad = [f"{r['mode']} r{r['round']}" for r in runs if not (r["ok"] and r["bit_exact"])]
    first = runs[0]
    tree_topology = (by.get("tree", {}).get(rounds[0]) or {}).get("topology")
    cross = (f", east <-> west {rng([r.get('rtt_cross_ms') for r in runs], '{:.1f}')} ms" if split else "")
    print(f"{len(runs)} runs, {len(rounds)} rounds, {first['time']} .. {runs[-1]['time']}; "
          f"{first['receivers']} receivers, {first['params']} params, {first['steps']} steps; "
          f"{'one link per cluster' if split else 'one link for both clusters'}: "
          f"uplink {first['uplink']} + {first['delay_ms']:g} ms one way "
          f"(RTT {rng([r['rtt_ms'] for r in runs], '{:.1f}')} "
          f"ms{cross}), inner {first['inner']}; tree topology {tree_topology}; store poll "
          f"{first.get('poll') or runs[-1].get('poll')}, radosgw tcp_nodelay {runs[-1].get('rgw_tcp_nodelay')}; "
          f"load {rng([float(r['load'][0]) for r in runs], '{:.1f}')}; failed or not bit-exact: {bad or 'none'}")
    vs = lambda r: [v for v in r["versions"] if v.get("complete")]
    med = lambda r, k: st.median([v[k] for v in vs(r)]) if vs(r) else None
    tree_med = {rd: med(r, "seconds") for rd, r in by.get("tree", {}).items()}
    print()
    link_col = "link bytes / payload, both links: towards + from the clusters" if split else "link bytes / payload"
    print("| mode | payload MiB | time to every member, s: per-round medians (all versions min-med-max) | floor s | "
          f"time / floor | / tree-only (per round) | {link_col} | store bytes / (payload x clusters) | "
          "version 1 at every member, s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode in ORDER:
        rs = [by[mode][rd] for rd in rounds if rd in by.get(mode, {}) and vs(by[mode][rd])]  # failed runs: listed above
        if not rs:
            continue
        allv = [v for r in rs for v in vs(r)]
        per_round = [med(r, "seconds") for r in rs]
        ratio_tree = [med(r, "seconds") / tree_med[r["round"]] for r in rs if tree_med.get(r["round"])]
        floors = [v["floor_seconds"] for v in allv]
        store = [v["store_get_bytes"] / (v["payload_bytes"] * CLUSTERS[mode]) for v in allv
                 if v.get("store_get_bytes") is not None]
        link = rng([v["boundary_tx_bytes"] / v["payload_bytes"] for v in allv], "{:.2f}")
        if split:
            link += " + " + rng([v["boundary_rx_bytes"] / v["payload_bytes"] for v in allv], "{:.2f}")
        print(f"| {mode} | {rng([v['payload_bytes'] / 2**20 for v in allv], '{:.2f}')} | {rng(per_round)} "
              f"({mmm([v['seconds'] for v in allv])}) | {rng(floors)} | "
              f"{rng([st.median([v['seconds'] / v['floor_seconds'] for v in vs(r)]) for r in rs], '{:.2f}')} | "
              f"{rng(ratio_tree, '{:.2f}') if mode != 'tree' else '1'} | "
              f"{link} | "
              f"{rng(store, '{:.3f}')} | {rng([r.get('bootstrap_seconds') for r in rs], '{:.1f}')} |")
    if split:
        print()
        print(SPLIT_NOTES)
        per = [(v["version"], r["mode"], r["round"], v["per_link"], v["payload_bytes"]) for r in runs for v in vs(r)
               if v.get("per_link")]
        if per:
            print()
            print("Per link, bytes / payload towards the cluster + from it, medians over versions:")
            for mode in ORDER:
                xs = [(pl, pay) for _, m, _, pl, pay in per if m == mode]
                if xs:
                    print(f"- {mode}: " + "; ".join(
                        f"{name} {st.median([pl[name]['tx'] / pay for pl, pay in xs]):.2f} + "
                        f"{st.median([pl[name]['rx'] / pay for pl, pay in xs]):.2f}" for name in sorted(xs[0][0])))
    if tree_med:
        print()
        print("Baseline (tree-only) spread: per-round medians "
              + ", ".join(f"{tree_med[rd]:.3f}" for rd in sorted(tree_med))
              + " s; all versions " + mmm([v["seconds"] for r in by.get("tree", {}).values() for v in vs(r)]) + " s")
    for mode in ("store", "hybrid"):
        rs = [by[mode][rd] for rd in rounds if rd in by.get(mode, {})]
        bks = [[v["breakdown"] for v in vs(r) if v.get("breakdown")] for r in rs]
        if not any(bks):
            continue
        if any(x < -0.001 for bk in bks for b in bk for x in b.values() if isinstance(x, float)):
            # Runs analysed by a store_wan.py that looked for the version in latest.json only.
            print()
            print(f"{mode}: no breakdown (these runs were analysed before store_wan.py knew the one-request poll)")
            continue
        print()
        print(f"{mode}: where the time of a version goes (the gateway that committed last), s: per-round medians")
        print()
        keys = ["encode", "upload", "wait_for_poll", "requests_to_frames", "download_apply", "cluster_forward", "total"]
        print("| " + " | ".join(keys) + " |")
        print("|" + " --- |" * len(keys))
        print("| " + " | ".join(rng([st.median([b[k] for b in bk]) for bk in bks if bk]) for k in keys) + " |")
    hy = [by["hybrid"][rd] for rd in rounds if rd in by.get("hybrid", {})]
    if hy:
        print()
        ratio = [med(r, "seconds") / tree_med[r["round"]] for r in hy if tree_med.get(r["round"])]
        sb = [v["store_get_bytes"] / (v["payload_bytes"] * 2) for r in hy for v in vs(r)]
        sw = [v["store_get_bytes_window"] / (v["payload_bytes"] * 2) for r in hy for v in vs(r)]
        if ratio:
            print(f"Goal hybrid time <= 1.15x tree-only: {rng(ratio, '{:.2f}')}x per round "
                  f"({'met' if max(ratio) <= 1.15 else 'MISSED'})")
        print(f"Goal bytes out of the store per version <= 1.05 x payload x 2: the version's objects "
              f"{rng(sb, '{:.3f}')}x, every GET while it was current (polls included) {rng(sw, '{:.3f}')}x "
              f"({'met' if sb and max(sw) <= 1.05 else 'MISSED'})")


if __name__ == "__main__":
    main()
