"""Projection half of bench/model/cost_model.py: the fitted model carried to 30B, 120B and 1T BF16
models over the published 1T link, with explicit assumptions for what this machine cannot measure
(parallelism of the producer and of the receivers, the RTT, the number of inter-cluster paths)."""
import math

# The published link: a full 1T BF16 checkpoint (2 TB) takes 87.5 min between the two regions.
LINK_BYTES_PER_S = 2e12 / (87.5 * 60)          # 381 MB/s = 3.05 Gbit/s per path
MODELS = (("30B", 30e9), ("120B", 123.6e9), ("1T", 1e12))   # 120B: the published 247.2 GB
RATES = (0.01, 0.03, 0.05)
# Published comparison points: (label, params, change rate, refit seconds).
PUBLISHED = (("relay tree 120B (issue 14)", 123.6e9, 0.03, 22.6),
             ("relay tree 120B (issue 14)", 123.6e9, 0.05, 41.6),
             ("NeMo RL ZeroMQ tree", 123.6e9, 0.03, 24.1),
             ("NeMo RL S3", 123.6e9, 0.03, 20.2),
             ("1T (issue 14)", 1e12, 0.03, 150.0))
PUBLISHED_FULL = (("120B full (published)", 123.6e9, 750.0), ("1T full (published)", 1e12, 87.5 * 60))

DEFAULTS = dict(
    paths=1,                 # K parallel inter-cluster paths (parallel trees, docs/producer-group.md)
    producer_ranks=64,       # P producer shards (trainer hosts), each diffing its slice
    producer_threads=8,      # threads per shard
    receiver_threads=64,     # threads applying one replica's changes (e.g. 8 hosts x 8), pipelined or not
    receivers=64,            # replicas in the rollout cluster (only the tree depth depends on it)
    rtt_s=0.100,             # cross-region RTT
    inner_bytes_per_s=100e9 / 8,   # links inside the rollout cluster: 100 Gbit/s
    chunk_bytes=4 << 20,     # checkpoint bytes per chunk (the demo's 4 MiB)
    bytes_per_change=None,   # None: the measured median per rate; a number: a scenario
)


def bytes_per_change_for(fit, rate, override=None):
    """Bytes per changed element at a nominal rate: the override, else the measured median of the
    nearest measured rate (fit['bytes_per_change'])."""
    if override:
        return override
    bpc = fit["bytes_per_change"]
    key = min(bpc, key=lambda k: abs(float(k) - rate))
    return bpc[key]["median"]


def project_one(fit, params, rate, a):
    """Terms of one projected refit (seconds) for `params` BF16 elements at change `rate` under the
    assumptions a (DEFAULTS overridden). Returns a dict of terms, totals and the payload."""
    c = fit["constants"]
    E = 2.0 * params
    C = params * rate
    bpc = bytes_per_change_for(fit, rate, a["bytes_per_change"])
    payload = C * bpc
    # thread-seconds measured here (the demo's encode_seconds sums its encoder threads), spread
    # over P x T producer threads (a sharded producer: an assumption, docs/producer-group.md).
    diff = (E * c["t_scan_s_per_byte"] + C * c["t_change_s"]) / (a["producer_ranks"] * a["producer_threads"])
    wire = payload / (LINK_BYTES_PER_S * a["paths"])
    depth = int(math.floor(math.log2(a["receivers"]))) + 1
    chunk_payload = a["chunk_bytes"] / 2 * rate * bpc
    fill = depth * (c["t_hop_s"] + chunk_payload / a["inner_bytes_per_s"])
    # receiver CPU: the fitted thread-seconds of one receiver (the share term s removed: a replica
    # has its hosts to itself), spread over the replica's receiver_threads.
    apply = (C * c["t_apply_c_s"] + C * c["t_apply_rc_s"] + E * c["t_scan_rc_s_per_byte"]) / a["receiver_threads"]
    # The commit: a cross-region deployment runs `commit: auto`, which delegates the decision when
    # the producer sits in a cluster of its own (docs/config.md), so the main total uses the
    # delegated commit's fitted k (bench/wan/results/rtt-commit.jsonl); the producer's commit
    # (k_rtt, bench/wan/results/rtt.jsonl) and the delegated commit's design value (k = 1: the
    # wire plus one round trip, docs/protocol.md) are printed beside it.
    k_d = c.get("k_rtt_delegated", 1.0)
    commit_d = c["c0_s"] + k_d * a["rtt_s"]
    commit_p = c["c0_s"] + c["k_rtt"] * a["rtt_s"]
    commit_1 = c["c0_s"] + 1.0 * a["rtt_s"]
    # Fan-out inside the rollout cluster: every receiver takes in the whole payload, and an interior
    # member of a binary tree sends each chunk it receives to two children (with M trees whose
    # interiors rotate, a member's average egress is about one payload; 2 is the worst member).
    # (deltacast probe measures this share instead: its members' relaying in the transfer term.)
    fanout = 2.0 * payload / a["inner_bytes_per_s"]
    # Pipelined (the measured form): the producer diffs, the wire carries and the receivers apply
    # chunk by chunk; in a deployment the three stages run on different hosts, so the slowest one
    # sets the pace. `serial` adds them instead: the bound if nothing overlapped.
    base = max(diff, wire, apply, fanout) + fill
    serial = diff + wire + apply + fill
    return dict(params=params, rate=rate, bytes_per_change=bpc, payload_bytes=payload, diff=diff, wire=wire,
                fanout=fanout, fill=fill, apply=apply, k_delegated=k_d, commit_d=commit_d, commit_p=commit_p, commit_1=commit_1,
                total_d=base + commit_d, total_p=base + commit_p, total_1=base + commit_1,
                serial_d=serial + commit_d, full=E / LINK_BYTES_PER_S, depth=depth)


def project_table(fit, a):
    """The 9 rows (3 sizes x 3 rates) under assumptions a."""
    return [dict(project_one(fit, p, r, a), model=name) for name, p in MODELS for r in RATES]


def scenarios_1t(fit, a):
    """What a 1T refit at 3% needs to be under 60 s: totals (delegated commit, fitted k; producer
    commit; k = 1) over K paths x bytes per change (the measured one and lower scenarios). Returns a
    list of dicts."""
    out = []
    measured = bytes_per_change_for(fit, 0.03)
    for bpc in (measured, 0.60, 0.50):
        for k in (1, 2, 3, 4):
            b = dict(a, paths=k, bytes_per_change=bpc)
            p = project_one(fit, 1e12, 0.03, b)
            out.append(dict(paths=k, bytes_per_change=bpc, measured_bpc=bpc == measured, wire=p["wire"],
                            total_d=p["total_d"], total_p=p["total_p"], total_1=p["total_1"]))
    return out


def svg_plot(fit, a, path):
    """Write a log-log SVG: projected refit seconds vs model size at 1/3/5% (delegated commit with its
    fitted k: solid; the producer's commit: dashed), the full checkpoint over the link, and the
    published points."""
    W, H, L, R, T, B = 780, 480, 70, 210, 30, 50
    xmin, xmax, ymin, ymax = 1e10, 2e12, 1.0, 1e4

    def X(v):
        return L + (math.log10(v) - math.log10(xmin)) / (math.log10(xmax) - math.log10(xmin)) * (W - L - R)

    def Y(v):
        return H - B - (math.log10(v) - math.log10(ymin)) / (math.log10(ymax) - math.log10(ymin)) * (H - T - B)

    colors = {0.01: "#1b9e77", 0.03: "#d95f02", 0.05: "#7570b3"}
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>']
    for e in range(10, 13):
        for m in (1, 2, 5):
            v = m * 10 ** e
            if xmin <= v <= xmax:
                s.append(f'<line x1="{X(v):.1f}" y1="{T}" x2="{X(v):.1f}" y2="{H-B}" stroke="#ddd"/>')
                lab = f"{v/1e9:g}B" if v < 1e12 else f"{v/1e12:g}T"
                s.append(f'<text x="{X(v):.1f}" y="{H-B+16}" text-anchor="middle">{lab}</text>')
    for e in range(0, 5):
        v = 10 ** e
        s.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W-R}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{L-6}" y="{Y(v)+4:.1f}" text-anchor="end">{v:g}</text>')
    s.append(f'<line x1="{L}" y1="{Y(60):.1f}" x2="{W-R}" y2="{Y(60):.1f}" stroke="red" stroke-dasharray="2,3"/>')
    s.append(f'<text x="{L+4}" y="{Y(60)-4:.1f}" fill="red">60 s target</text>')
    s.append(f'<rect x="{L}" y="{T}" width="{W-L-R}" height="{H-T-B}" fill="none" stroke="black"/>')
    s.append(f'<text x="{(L+W-R)/2}" y="{H-12}" text-anchor="middle">model size (BF16 parameters)</text>')
    s.append(f'<text x="16" y="{(T+H-B)/2}" transform="rotate(-90 16 {(T+H-B)/2})" text-anchor="middle">refit seconds</text>')
    sizes = [10 ** (10 + i * 0.1) for i in range(24)]
    sizes = [v for v in sizes if v <= xmax]
    full = " ".join(f"{X(v):.1f},{Y(2*v/LINK_BYTES_PER_S):.1f}" for v in sizes)
    s.append(f'<polyline points="{full}" fill="none" stroke="black" stroke-width="1.5"/>')
    for rate, col in colors.items():
        for key, dash in (("total_d", ""), ("total_p", ' stroke-dasharray="6,4"')):
            pts = " ".join(f"{X(v):.1f},{Y(project_one(fit, v, rate, a)[key]):.1f}" for v in sizes)
            s.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="2"{dash}/>')
    # what it takes: 3% over K = 2 paths (parallel trees), delegated commit
    two = dict(a, paths=2 * a["paths"])
    pts = " ".join(f"{X(v):.1f},{Y(project_one(fit, v, 0.03, two)['total_d']):.1f}" for v in sizes)
    s.append(f'<polyline points="{pts}" fill="none" stroke="{colors[0.03]}" stroke-width="1.5" stroke-dasharray="1,3"/>')
    for label, p, rate, sec in PUBLISHED:
        col = colors[rate]
        if label.startswith("NeMo"):
            s.append(f'<rect x="{X(p)-5:.1f}" y="{Y(sec)-5:.1f}" width="10" height="10" fill="none" stroke="{col}" stroke-width="2"/>')
        else:
            s.append(f'<circle cx="{X(p):.1f}" cy="{Y(sec):.1f}" r="5" fill="{col}" stroke="black"/>')
    for label, p, sec in PUBLISHED_FULL:
        s.append(f'<circle cx="{X(p):.1f}" cy="{Y(sec):.1f}" r="5" fill="black"/>')
    lx, ly = W - R + 10, T + 10
    k_d = fit["constants"].get("k_rtt_delegated", 1.0)
    legend = [("line", "black", "", "full checkpoint, link"), ("line", colors[0.01], "", "ours 1%"),
              ("line", colors[0.03], "", "ours 3%"), ("line", colors[0.05], "", "ours 5%"),
              ("line", "gray", "", f"solid: delegated, k = {k_d:.2f}"),
              ("line", "gray", "6,4", f"dashed: producer, k = {fit['constants']['k_rtt']:.2f}"),
              ("line", colors[0.03], "1,3", f"3%, {2 * a['paths']} paths, delegated"), ("dot", colors[0.03], "", "published relay tree"),
              ("box", colors[0.03], "", "NeMo RL (ZeroMQ, S3)"), ("dot", "black", "", "published full")]
    for i, (kind, col, dash, text) in enumerate(legend):
        y = ly + i * 20
        if kind == "line":
            da = f' stroke-dasharray="{dash}"' if dash else ""
            s.append(f'<line x1="{lx}" y1="{y}" x2="{lx+24}" y2="{y}" stroke="{col}" stroke-width="2"{da}/>')
        elif kind == "dot":
            s.append(f'<circle cx="{lx+12}" cy="{y}" r="5" fill="{col}" stroke="black"/>')
        else:
            s.append(f'<rect x="{lx+7}" y="{y-5}" width="10" height="10" fill="none" stroke="{col}" stroke-width="2"/>')
        s.append(f'<text x="{lx+30}" y="{y+4}">{text}</text>')
    note = (f"K={a['paths']} path(s) of {LINK_BYTES_PER_S*8/1e9:.2f} Gbit/s, RTT {a['rtt_s']*1e3:g} ms, "
            f"producer {a['producer_ranks']}x{a['producer_threads']} threads, receiver {a['receiver_threads']} threads")
    s.append(f'<text x="{L}" y="{T-10}">{note}</text>')
    s.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(s) + "\n")
