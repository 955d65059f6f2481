"""A placed receiver's memory in a real run (issue 33; docs/performance.md, "A placed receiver's
memory"): `deltacast run` with the synthetic trainer (PARAMS, STEPS deltas) and 3 receiver
processes on 127.0.0.1: one whole, and TP ranks 0 and T-1 of T (`--placement`, files from
`deltacast placement tp --params`). Each reports its peak RSS (VmHWM: the kernel's high-water mark)
in its --summary; every run must end with every step verified on every receiver. Prints per
round each receiver's peak, the bytes its buffers hold, and peak - buffers (deltacast's own:
frames in flight, retained frames, threads), then the ranges over rounds.

    /usr/bin/python3 bench/tree/placed_memory.py [--params 200M] [--tp 8] [--steps 3] [--rounds 2]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "recovery"))
import dcfleet  # noqa: E402


def buffer_bytes(dc: str, placement: Path, params: str) -> int:
    """The bytes a placement's buffers hold (padding included), from `placement check`."""
    out = subprocess.run([dc, "placement", "check", str(placement), "--params", params], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "bytes" in line and "buffers" in line:
            words = line.replace(",", " ").split()
            for i, w in enumerate(words):
                if w == "bytes" and i > 0 and words[i - 1].isdigit():
                    return int(words[i - 1])
    raise SystemExit(f"cannot read the buffers' size from: {out}")


def one_run(dc: str, work: Path, params: str, tp: int, steps: int) -> dict:
    placements = {}
    for rank, tp_rank in ((2, 0), (3, tp - 1)):
        placements[rank] = work / f"p{rank}.yaml"
        subprocess.run([dc, "placement", "tp", "--params", params, "--rank", str(tp_rank), "--size", str(tp), "-o",
                        str(placements[rank])], check=True)
    job = dcfleet.JobConfig(receivers=3, params=params, steps=steps, chunk_bytes="4MiB", join="120s", refit="5m")
    with dcfleet.Fleet(dc, work / "job", job) as fleet:
        fleet.start_receiver(1)
        for rank, path in placements.items():
            fleet.start_receiver(rank, extra=["--placement", str(path)])
        fleet.start_producer()
        if fleet.wait_producer(900) != 0:
            raise SystemExit("the producer failed:\n" + fleet.tail(0, 20))
        codes = fleet.wait_receivers(120)
        if any(c != 0 for c in codes.values()):
            raise SystemExit(f"receivers exited {codes}:\n" + "".join(fleet.tail(r, 10) for r in (1, 2, 3)))
        report = fleet.report() or {}
        versions = report.get("versions", report.get("steps", []))
        out = {}
        for rank in (1, 2, 3):
            s = fleet.summary(rank)
            if s is None or s["version"] != steps + 1:
                raise SystemExit(f"rank {rank} ended at {s and s['version']}, not {steps + 1}")
            held = buffer_bytes(dc, placements[rank], params) if rank in placements else None
            out[rank] = {"peak": s["peak_rss_bytes"], "held": held}
        out["versions"] = len(versions)
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="200M")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--deltacast", default=str(ROOT / "build" / "tools" / "deltacast"))
    a = ap.parse_args()
    rows = []
    for rnd in range(1, a.rounds + 1):
        with tempfile.TemporaryDirectory(prefix="dc-placed-mem.") as tmp:
            r = one_run(a.deltacast, Path(tmp), a.params, a.tp, a.steps)
        whole_bytes = None
        for rank, label in ((1, "whole"), (2, f"TP 0/{a.tp}"), (3, f"TP {a.tp - 1}/{a.tp}")):
            peak = r[rank]["peak"]
            held = r[rank]["held"]
            rows.append((rnd, label, peak, held))
            print(json.dumps({"round": rnd, "receiver": label, "peak_rss_mb": round(peak / 1e6, 1),
                              "buffers_mb": None if held is None else round(held / 1e6, 1)}), flush=True)
    print(f"\n{a.params}, TP {a.tp}, {a.steps} steps, {a.rounds} rounds: peak RSS, MB")
    for label in ("whole", f"TP 0/{a.tp}", f"TP {a.tp - 1}/{a.tp}"):
        peaks = [p for _, l, p, _ in rows if l == label]
        held = [h for _, l, _, h in rows if l == label and h is not None]
        line = f"  {label:>10}: peak {min(peaks) / 1e6:.1f}-{max(peaks) / 1e6:.1f}"
        if held:
            over = [p - h for _, l, p, h in rows if l == label]
            line += f", buffers {held[0] / 1e6:.1f}, peak - buffers {min(over) / 1e6:.1f}-{max(over) / 1e6:.1f}"
        print(line)


if __name__ == "__main__":
    main()
