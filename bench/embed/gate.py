"""The apply gate's cost, measured against baselines in the same run (docs/embedding.md).

    DELTACAST_LIB=build/capi/libdeltacast.so PYTHONPATH=python /usr/bin/python3 bench/embed/gate.py \
        [--mib 256] [--rounds 5] [--refits 4] [--fraction 0.01]

One producer and one receiver in this process over tcp on 127.0.0.1, a BF16 model of --mib MiB
(numpy uint16), --refits refits per round changing --fraction of the elements. Each round runs
the same refits twice, ungated then gated (alternating which goes first), each on a fresh
producer/receiver pair, and measures:
  refit_s      the producer's refit_seconds (delivered, verified by the receiver, committed)
  apply_s      gated only: the server's apply() of the version just committed (writing it)
  memcpy_s     a memcpy of the whole model (np.copyto), the baseline of apply_s
Prints one JSON line per round and a summary: per-round medians, the gated/ungated refit ratio
and apply_s / memcpy_s, as ranges over the rounds.
"""

import argparse
import json
import statistics
import threading
import time

import numpy as np

import deltacast


def session(weights, gated, refits, fraction, rng):
    """Bootstrap then `refits` refits; returns (refit seconds, apply seconds) per refit."""
    model = {"w": weights.copy()}
    refit_s, apply_s = [], []
    with deltacast.Producer(model, receivers=1, listen="tcp://127.0.0.1:0", dtypes={"w": "BF16"},
                            log_level="error") as p:
        started = {}
        starter = threading.Thread(target=lambda: started.update(p.start(timeout=120)))
        starter.start()
        with deltacast.Receiver(producer=p.url, rank=1, listen="tcp://127.0.0.1:0", gated=gated,
                                log_level="error") as r:
            r.join(timeout=60)
            mine = np.zeros_like(weights)
            r.attach({"w": mine}, dtypes={"w": "BF16"})
            r.start()
            starter.join()
            r.wait_version(1, timeout=120)
            flat = model["w"].reshape(-1)
            for _ in range(refits):
                index = rng.choice(flat.size, int(flat.size * fraction), replace=False)
                flat[index] ^= np.uint16(1)
                report = p.refit(model)
                assert report["committed"], report
                refit_s.append(report["refit_seconds"])
                r.wait_version(report["version"], timeout=60)
                if gated:
                    t0 = time.perf_counter()
                    r.apply()
                    apply_s.append(time.perf_counter() - t0)
            assert mine.tobytes() == model["w"].tobytes(), "the receiver's bits differ"
    return refit_s, apply_s


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--refits", type=int, default=4)
    parser.add_argument("--fraction", type=float, default=0.01)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    n = args.mib * (1 << 20) // 2
    weights = (rng.standard_normal(n, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).reshape(-1, 1024)
    scratch = np.empty_like(weights)
    rows = []
    for round_ in range(args.rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        result = {"round": round_}
        for gated in order:
            refit_s, apply_s = session(weights, gated, args.refits, args.fraction, rng)
            key = "gated" if gated else "ungated"
            result[f"{key}_refit_s"] = statistics.median(refit_s)
            if gated:
                result["apply_s"] = statistics.median(apply_s)
        copies = []
        for _ in range(5):
            t0 = time.perf_counter()
            np.copyto(scratch, weights)
            copies.append(time.perf_counter() - t0)
        result["memcpy_s"] = statistics.median(copies)
        result["refit_ratio"] = result["gated_refit_s"] / result["ungated_refit_s"]
        result["apply_over_memcpy"] = result["apply_s"] / result["memcpy_s"]
        rows.append(result)
        print(json.dumps(result), flush=True)

    def span(key, fmt="{:.3f}"):
        values = [r[key] for r in rows]
        return f"{fmt.format(min(values))}-{fmt.format(max(values))} (median {fmt.format(statistics.median(values))})"

    print(f"model {args.mib} MiB BF16, {args.fraction:.1%} changed per refit, {args.rounds} rounds x {args.refits} refits")
    print(f"refit ungated   s: {span('ungated_refit_s')}")
    print(f"refit gated     s: {span('gated_refit_s')}")
    print(f"gated/ungated    : {span('refit_ratio', '{:.2f}')}")
    print(f"apply (gated)   s: {span('apply_s', '{:.4f}')}")
    print(f"memcpy of model s: {span('memcpy_s', '{:.4f}')}")
    print(f"apply / memcpy   : {span('apply_over_memcpy', '{:.3f}')}")


if __name__ == "__main__":
    main()
