"""A trainer that refits its model into inference servers through deltacast (the Python binding).

    trainer.py --workdir DIR [--servers 2] [--steps 4] [--dry-run-at 2] [--seed 1]

It owns a small torch model in bfloat16 (demo_model.py) with FP32 master weights, as mixed
precision training keeps them. Each fake optimizer step moves the master weights by a tiny random
amount and casts them into the bfloat16 parameters in place; about 1% of the BF16 elements change,
as between real RL steps. deltacast.Producer reads those parameters in place (no copy) and sends
only the changed elements through a relay tree made of the servers (server.py).

What it writes into DIR, for the servers and for run_demo.sh:
    url           the rendezvous URL (the producer listens from construction on, port 0 picks one)
    hashes.json   {"versions": {"1": sha256, ...}, "dry_runs": [...], "final": V}: the SHA-256 of the
                  raw bits of every committed version, which each server compares with its own

Two ways to keep a refit out of a forward pass:
  gated servers (the default; server.py --gated): a server's receiver verifies and commits each
      version without touching its parameters, and the server applies the queued versions at its
      own safe points. The trainer never waits for the servers.
  --pause (ungated servers): a refit is written into the parameters while it flows, so, as an RL
      orchestrator pauses generation around a weight update (vLLM pause_generation(mode="keep"),
      SGLang's in-place update), this trainer sends the next version only after every server said
      it reached a safe point and checked the last one (the files DIR/ack.r<rank>.<tag>).
"""

import argparse
import os
import sys
import time

import torch

import deltacast
import demo_model


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (one refit each)")
    parser.add_argument("--dry-run-at", type=int, default=2,
                        help="this step is first sent as a dry run (verified everywhere, then rolled back); 0: none")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pause", action="store_true",
                        help="ungated servers: wait for every server's ack before the next version")
    parser.add_argument("--timeout", type=float, default=60, help="seconds for the servers to join / to ack")
    return parser.parse_args()


def fake_optimizer_step(master, params, generator, scale=6.5e-5):
    """Moves each FP32 master weight by a relative N(0, scale) amount and casts the masters into
    the BF16 parameters in place. Only the elements whose rounding changes get new bits: ~1%."""
    for name, m in master.items():
        m.add_(m.abs() * scale * torch.randn(m.shape, generator=generator))
        params[name].copy_(m)  # the parameter keeps its memory: deltacast reads it there


class Trainer:
    def __init__(self, args):
        self.args = args
        self.hashes_path = os.path.join(args.workdir, "hashes.json")
        self.hashes = {"versions": {}, "dry_runs": [], "final": None}

    def log(self, text):
        print(f"trainer: {text}", flush=True)

    def record(self, version, params):
        self.hashes["versions"][str(version)] = demo_model.bits_sha256(params)
        demo_model.write_json_atomically(self.hashes_path, self.hashes)

    def wait_for_servers(self, tag):
        """--pause: waits until every server has checked `tag` at a safe point (or one of them
        failed). Gated servers apply at their own safe points: nothing to wait for."""
        if not self.args.pause:
            return
        deadline = time.monotonic() + self.args.timeout
        missing = list(range(1, self.args.servers + 1))
        while missing:
            for rank in list(missing):
                if os.path.exists(os.path.join(self.args.workdir, f"failed.r{rank}")):
                    raise RuntimeError(f"server {rank} failed (see its log)")
                if os.path.exists(os.path.join(self.args.workdir, f"ack.r{rank}.{tag}")):
                    missing.remove(rank)
            if missing and time.monotonic() > deadline:
                raise RuntimeError(f"servers {missing} did not check {tag} within {self.args.timeout} s")
            time.sleep(0.02)

    def run(self):
        args = self.args
        torch.manual_seed(args.seed)
        model = demo_model.build_model(torch.float32)
        master = {name: p.detach().clone() for name, p in model.named_parameters()}  # FP32 master weights
        model.to(torch.bfloat16)  # the model the servers run: BF16 casts of the masters
        params = demo_model.parameters(model)
        generator = torch.Generator().manual_seed(args.seed)
        n = sum(p.numel() for p in params.values())

        # The manifest is the parameters, in this order; they are borrowed, never copied.
        producer = deltacast.Producer(params, receivers=args.servers, listen="tcp://127.0.0.1:0",
                                      topology="binary", timeouts={"peer": 5})
        with producer:
            with open(os.path.join(args.workdir, "url.tmp"), "w") as f:
                f.write(producer.url)
            os.replace(os.path.join(args.workdir, "url.tmp"), os.path.join(args.workdir, "url"))
            self.log(f"{len(params)} tensors, {n} BF16 elements; waiting for {args.servers} servers at {producer.url}")

            report = producer.start(timeout=args.timeout)  # version 1: the full checkpoint
            self.log(f"version 1 (full checkpoint) committed on {report['verified_receivers']} servers "
                     f"in {report['refit_seconds']:.3f} s")
            self.record(1, params)
            self.wait_for_servers("v1")

            for step in range(1, args.steps + 1):
                fake_optimizer_step(master, params, generator)
                if step == args.dry_run_at:
                    # Delivered and verified on every server, then aborted: they roll back.
                    report = producer.refit(dry_run=True)
                    self.log(f"step {step}: dry run of version {report['version']} ({100 * report['changed_fraction']:.2f}% "
                             f"changed): verified on "
                             f"{report['verified_receivers']}/{report['receivers']} servers, rolled back "
                             f"(committed {report['committed']})")
                    self.hashes["dry_runs"].append({"version": report["version"], "holds": producer.version})
                    demo_model.write_json_atomically(self.hashes_path, self.hashes)
                    self.wait_for_servers(f"dry{report['version']}")
                    # The parameters keep this step's changes: the next refit carries them too.
                    continue
                report = producer.refit()  # the parameters changed in place: nothing to pass
                if not report["committed"]:
                    raise RuntimeError(f"version {report['version']} was aborted: {report}")
                self.log(f"step {step}: version {report['version']} committed, "
                         f"{100 * report['changed_fraction']:.2f}% of elements changed, "
                         f"{report['payload_bytes']} payload bytes "
                         f"({report['payload_bytes'] / report['checkpoint_bytes']:.2%} of the checkpoint), "
                         f"{report['refit_seconds']:.3f} s")
                self.record(report["version"], params)
                self.wait_for_servers(f"v{report['version']}")

            self.hashes["final"] = producer.version
            demo_model.write_json_atomically(self.hashes_path, self.hashes)
            self.log(f"done at version {producer.version}; closing (BYE to the servers)")
        # leaving `with producer`: close() says BYE; the servers' receivers end cleanly


def main():
    args = parse_args()
    try:
        Trainer(args).run()
    except (deltacast.Error, RuntimeError) as e:
        print(f"trainer: FAILED: {e}", file=sys.stderr, flush=True)
        with open(os.path.join(args.workdir, "failed.r0"), "w") as f:
            f.write(str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
