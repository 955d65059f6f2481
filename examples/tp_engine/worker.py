"""One tensor-parallel worker of the example engine: a deltacast receiver that holds only its shard.

    worker.py --producer URL --rank R --tp-size T [--outdir DIR] [--timeout S]

Receiver rank R (1..T) is TP rank R-1. The worker joins the producer (gated: refits are verified
and committed without touching its buffers), computes its placement with
deltacast.placement.llama_tp_placement (vLLM's layout: fused qkv_proj and gate_up_proj split by
rows, o_proj and down_proj by columns, the padded vocabulary by rows, norms whole), allocates its
own buffers as an engine's loader would (zeros, bfloat16, the placement's shapes), attaches them
with the placement and starts: deltacast writes the bootstrap into them at once.

Then it serves: a generation step over its buffers (model.forward_shard), and between steps, at
the safe point, receiver.apply() writes every version committed since the last one. After each
applied version it saves its buffers (torch.save, DIR/tp<rank>.v<version>.pt, written atomically)
and prints a JSON line on stdout:
    {"joined": {...}}                              after start: ranks, buffer names and shapes
    {"applied": V, "pending": [...], "path": ..., "steps": N, "logits_sum": ...}
                                                   (the logits of a generation step on version V)
    {"done": {"applied": [...], "steps": N, "pointers_unchanged": bool}}   after the producer's BYE
A failure prints {"error": traceback} and exits 1.
"""

import argparse
import json
import os
import sys
import time
import traceback

import torch

import deltacast
from deltacast.placement import llama_tp_placement

import model


def say(obj):
    print(json.dumps(obj), flush=True)


def buffer_shape(entry, shapes):
    """A placement entry's buffer shape: "shape" for a padded buffer, else the parts side by side
    along their dim."""
    if isinstance(entry, dict):
        return list(entry["shape"])
    tensor, dim, _, _ = entry[0]
    shape = list(shapes[tensor])
    shape[dim] = sum(stop - start for _, _, start, stop in entry)
    return shape


def save_atomically(buffers, path):
    tmp = f"{path}.tmp"
    torch.save(buffers, tmp)
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producer", required=True, help="the producer's URL")
    parser.add_argument("--rank", type=int, required=True, help="receiver rank, 1..T (TP rank = rank - 1)")
    parser.add_argument("--tp-size", type=int, required=True)
    parser.add_argument("--outdir", help="save the buffers of every applied version here")
    parser.add_argument("--timeout", type=float, default=120, help="give up after this many seconds")
    args = parser.parse_args()
    tp_rank, tp_size = args.rank - 1, args.tp_size
    deadline = time.monotonic() + args.timeout

    receiver = deltacast.Receiver(producer=args.producer, rank=args.rank, listen="tcp://127.0.0.1:0", gated=True,
                                  timeouts={"peer": 5, "producer_loss": 5}, log_level="warn")
    with receiver:
        manifest = receiver.join(timeout=args.timeout)             # [TensorSpec(name, dtype, shape)]
        placement = llama_tp_placement(manifest, tp_rank, tp_size)  # {buffer: parts}
        shapes = {spec.name: spec.shape for spec in manifest}
        # The engine's own buffers, as its loader allocates them (version 0: zeros).
        buffers = {name: torch.zeros(buffer_shape(entry, shapes), dtype=torch.bfloat16)
                   for name, entry in placement.items()}
        receiver.attach(buffers, placement=placement)
        pointers = {name: b.data_ptr() for name, b in buffers.items()}
        receiver.start()
        say({"joined": {"rank": args.rank, "tp_rank": tp_rank, "tp_size": tp_size,
                        "buffers": {name: list(b.shape) for name, b in buffers.items()}}})

        tokens = torch.randint(0, model.VOCAB, (16,), generator=torch.Generator().manual_seed(tp_rank))
        applied, steps, held, ended = [], 0, 0, False
        while True:
            # A generation step: reads every buffer (a real engine decodes a batch here).
            with torch.no_grad():
                logits = model.forward_shard(buffers, tokens, tp_rank, tp_size)
            steps += 1

            # The safe point: no forward pass runs. Take the events, then apply what committed.
            while (event := receiver.poll_event()) is not None:
                if event.kind == "ended":
                    ended = True
                elif event.kind == "failed":
                    raise deltacast.Error(event.status_name, event.message, event.status)
            queued = receiver.pending()
            now = receiver.apply()  # writes every pending version into the buffers, in order
            if now != held:
                held = now
                applied.append(held)
                path = None
                if args.outdir:
                    path = os.path.join(args.outdir, f"tp{tp_rank}.v{held}.pt")
                    save_atomically(buffers, path)
                with torch.no_grad():  # the next generation step, on the version just applied
                    logits = model.forward_shard(buffers, tokens, tp_rank, tp_size)
                steps += 1
                say({"applied": held, "pending": queued, "path": path, "steps": steps,
                     "logits_sum": float(logits.double().nansum())})
            if ended:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"still serving after {args.timeout} s (applied {applied})")
            try:  # idle until the next version or 50 ms (a busy engine just keeps generating)
                receiver.wait_version(receiver.version + 1, timeout=0.05)
            except deltacast.Error as e:
                if e.status_name != "DC_ERR_TIMEOUT":
                    time.sleep(0.01)  # it ended or failed: the next poll_event says which

        unchanged = all(b.data_ptr() == pointers[name] for name, b in buffers.items())
        say({"done": {"applied": applied, "steps": steps, "pointers_unchanged": unchanged}})


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # noqa: BLE001 (the parent reads the reason)
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
        sys.exit(1)
