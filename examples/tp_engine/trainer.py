"""The tensor-parallel engine demo: a trainer refitting T worker processes that each hold only
their shard (worker.py), on 127.0.0.1.

    trainer.py [--tp 2] [--steps 3] [--seed 0] [--timeout 60]

The trainer (a deltacast.Producer over the full checkpoint of model.py, Hugging Face Llama names)
starts T workers (TP ranks 0..T-1, receiver ranks 1..T), sends version 1 (the full checkpoint;
each worker receives only its slices), then one refit per fake optimizer step (~1% of the
elements change). After each version it reads every worker's saved buffers and compares their
bits with the shard a vLLM loader would cut from the checkpoint (model.shard_for). Exit status 0
when every worker held every version bit for bit.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

import deltacast
import model

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size: the number of workers")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (one refit each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for a worker")
    args = parser.parse_args()
    began = time.monotonic()
    ckpt = model.make_checkpoint(args.seed)
    g = torch.Generator().manual_seed(args.seed)

    with tempfile.TemporaryDirectory(prefix="deltacast-tp-demo-") as outdir, \
            deltacast.Producer(ckpt, receivers=args.tp, listen="tcp://127.0.0.1:0", topology="binary",
                               log_level="warn") as producer:
        workers = [subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), "--producer", producer.url,
                                     "--rank", str(rank), "--tp-size", str(args.tp), "--outdir", outdir],
                                    stdout=subprocess.PIPE, text=True) for rank in range(1, args.tp + 1)]
        try:
            def line(tp_rank, key):
                message = json.loads(workers[tp_rank].stdout.readline() or '{"error": "exited"}')
                if key not in message:
                    raise RuntimeError(f"worker tp{tp_rank}: {message.get('error', message)}")
                return message

            def check(report):
                version = report["version"]
                for tp_rank in range(args.tp):
                    message = line(tp_rank, "applied")
                    held = torch.load(message["path"])
                    want = model.shard_for(ckpt, tp_rank, args.tp)
                    wrong = [name for name in want if not torch.equal(held[name].view(torch.int16),
                                                                      want[name].view(torch.int16))]
                    if message["applied"] != version or list(held) != list(want) or wrong:
                        raise RuntimeError(f"worker tp{tp_rank} applied {message['applied']}, "
                                           f"version {version}: buffers differing {wrong}")
                    print(f"  tp{tp_rank}: applied version {version} after {message['steps']} generation steps, "
                          f"{len(held)} buffers bit-exact, logits sum {message['logits_sum']:.3f}", flush=True)

            print(f"trainer: {len(ckpt)} tensors, {sum(t.numel() for t in ckpt.values())} BF16 elements; "
                  f"{args.tp} TP workers at {producer.url}", flush=True)
            report = producer.start(timeout=args.timeout)
            for tp_rank in range(args.tp):
                joined = line(tp_rank, "joined")["joined"]
                print(f"  tp{tp_rank}: {len(joined['buffers'])} buffers, e.g. qkv_proj "
                      f"{joined['buffers']['model.layers.0.self_attn.qkv_proj.weight']}, "
                      f"lm_head {joined['buffers'].get('lm_head.weight')}", flush=True)
            print(f"trainer: version 1 (the full checkpoint, each worker its shard) committed on "
                  f"{report['verified_receivers']} workers", flush=True)
            check(report)
            for step in range(1, args.steps + 1):
                model.train_step(ckpt, g)
                report = producer.refit(ckpt)
                if not report["committed"] or report["verified_receivers"] != args.tp:
                    raise RuntimeError(f"version {report['version']} did not commit everywhere: {report}")
                print(f"trainer: step {step}: version {report['version']} committed, {report['changes']} elements "
                      f"changed ({100 * report['changed_fraction']:.2f}%), {report['payload_bytes']} payload bytes",
                      flush=True)
                check(report)
            producer.close()  # BYE: the workers report and exit
            for tp_rank, worker in enumerate(workers):
                line(tp_rank, "done")
                if worker.wait(timeout=args.timeout) != 0:
                    raise RuntimeError(f"worker tp{tp_rank} exited with {worker.returncode}")
        except (deltacast.Error, RuntimeError, ValueError) as e:
            print(f"trainer: FAILED: {e}", file=sys.stderr, flush=True)
            return 1
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                worker.wait()
    print(f"trainer: OK in {time.monotonic() - began:.1f} s: {args.tp} workers held versions "
          f"1..{args.steps + 1} bit for bit", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
