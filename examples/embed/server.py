"""An inference "server" that embeds a deltacast receiver (the Python binding) and serves refits
into its own model's parameters, in place.

    server.py --workdir DIR --rank R [--gated]

It reads the producer's URL from DIR/url (written by trainer.py), joins as rank R, builds the same
architecture as the trainer (demo_model.py) with zeroed parameters, attaches those parameters
(param.data: the model's own memory; deltacast keeps no copy of it) and starts. Then it
"generates": a forward pass on a fixed input per step. Between steps, at a safe point:

--gated (the apply gate): versions are verified and committed without touching the parameters,
    so a forward pass never sees a refit in flight. At each safe point the server calls
    receiver.apply(), which writes every committed version queued since the last one, and compares
    the SHA-256 of the parameters' raw bits with the trainer's for the version they now hold
    (DIR/hashes.json). A dry run's rollback never touched them: they still hold what they held.
    The trainer does not wait for servers; a server that applies rarely may skip versions (it
    writes them all, in order, and checks the last).
ungated (the trainer's --pause): refits are written while they flow, so the trainer's handshake
    keeps them out of forward passes: the server takes the receiver's events (committed V: the
    parameters hold V, check them; rolled_back V: they hold the committed version again, restored
    from the undo log, check them) and writes DIR/ack.r<R>.<tag> after each check; the trainer
    sends the next version only then (as pause_generation does for vLLM).

Exit status 0 when every version checked (gated: each one applied, always the last; ungated:
every committed version) and every dry run's rollback were bit-exact, and the parameters never
moved.
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
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for the trainer")
    parser.add_argument("--gated", action="store_true", help="apply refits at safe points (the apply gate)")
    return parser.parse_args()


def wait_for(what, read, timeout):
    """Polls read() until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while (value := read()) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout} s")
        time.sleep(0.02)
    return value


class Server:
    def __init__(self, args):
        self.args = args
        self.hashes_path = os.path.join(args.workdir, "hashes.json")
        self.verified = []      # committed versions checked bit-exact
        self.rolled_back = []   # aborted versions after which the bits were checked
        self.generation_steps = 0

    def log(self, text):
        print(f"server {self.args.rank}: {text}", flush=True)

    def ack(self, tag):
        open(os.path.join(self.args.workdir, f"ack.r{self.args.rank}.{tag}"), "w").close()

    def trainer_hash(self, version):
        """The trainer's SHA-256 of `version` (it writes it right after its refit returns, which
        may be a moment after this server saw the commit)."""
        def read():
            hashes = demo_model.read_json(self.hashes_path)
            return None if hashes is None else hashes["versions"].get(str(version))
        return wait_for(f"trainer hash of version {version}", read, self.args.timeout)

    def check(self, version, params):
        mine, theirs = demo_model.bits_sha256(params), self.trainer_hash(version)
        if mine != theirs:
            raise RuntimeError(f"version {version}: sha256 {mine[:16]}.. differs from the trainer's {theirs[:16]}..")
        return mine

    def run(self):
        args = self.args
        url = wait_for("rendezvous URL in DIR/url",
                       lambda: open(os.path.join(args.workdir, "url")).read() if os.path.exists(
                           os.path.join(args.workdir, "url")) else None, args.timeout)
        # Options are the YAML keys of docs/config.md; a bare number under timeouts.* is seconds.
        receiver = deltacast.Receiver(producer=url, rank=args.rank, listen="tcp://127.0.0.1:0", gated=args.gated,
                                      timeouts={"peer": 5, "producer_loss": 5})
        with receiver:
            manifest = receiver.join(timeout=args.timeout)  # [TensorSpec(name, dtype, shape)]

            # The server's own model, as its loader would allocate it. Version 0 is all zeros.
            model = demo_model.build_model()
            params = demo_model.parameters(model)
            with torch.no_grad():
                for p in params.values():
                    p.zero_()
            expected = [(name, "BF16", tuple(p.shape)) for name, p in params.items()]
            if [tuple(spec) for spec in manifest] != expected:
                raise RuntimeError(f"the trainer's manifest is not this model's: {manifest}")
            receiver.attach(params)  # borrowed: refits land in these tensors, in place
            pointers = {name: p.data_ptr() for name, p in params.items()}
            receiver.start()          # returns at once; deltacast's threads do the rest
            self.log(f"joined {url} as rank {args.rank}: {len(manifest)} tensors attached, serving")

            x = torch.randn(8, 512, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            ended = False
            while not ended:
                # One generation step (a real server decodes a batch here).
                with torch.no_grad():
                    y = model(x)
                self.generation_steps += 1

                # A safe point: no forward pass is running. Take what happened since the last one.
                while (event := receiver.poll_event()) is not None:
                    if args.gated and event.kind == "committed":
                        continue  # nothing was written: apply_and_check() below writes and checks it
                    if event.kind == "committed":
                        if receiver.version != event.version:
                            raise RuntimeError(f"version {event.version} committed, but {receiver.version} "
                                               f"is current: a refit was not held back by the handshake")
                        digest = self.check(event.version, params)
                        self.verified.append(event.version)
                        with torch.no_grad():
                            y = model(x)
                        self.log(f"version {event.version} bit-exact (sha256 {digest[:16]}..), "
                                 f"output sum {y.float().sum().item():.4f}")
                        self.ack(f"v{event.version}")
                    elif event.kind == "rolled_back":
                        # Ungated: restored from the undo log; gated: it never reached the parameters.
                        held = receiver.applied_version
                        digest = self.check(held, params)
                        self.rolled_back.append(event.version)
                        self.log(f"version {event.version} rolled back: the parameters hold version {held}, "
                                 f"bit-exact (sha256 {digest[:16]}..)")
                        self.ack(f"dry{event.version}")
                    elif event.kind == "ended":
                        ended = True
                    else:  # "failed": the receiver stopped with an error
                        raise deltacast.Error(event.status_name, event.message, event.status)

                if args.gated:
                    self.apply_and_check(receiver, params, model, x)
                if not ended:
                    # Idle until the next version or 50 ms (a busy server would just keep generating).
                    try:
                        receiver.wait_version(receiver.version + 1, timeout=0.05)
                    except deltacast.Error as e:
                        if e.status_name != "DC_ERR_TIMEOUT":
                            time.sleep(0.01)  # it ended or failed: the next poll_event says which

            moved = [name for name, p in params.items() if p.data_ptr() != pointers[name]]
            if moved:
                raise RuntimeError(f"parameters moved: {moved}")
        # leaving `with receiver`: close() (the producer already said BYE)

        hashes = demo_model.read_json(self.hashes_path) or {}
        committed = sorted(int(v) for v in hashes.get("versions", {}))
        dry_runs = [d["version"] for d in hashes.get("dry_runs", [])]
        if hashes.get("final") is None or committed != list(range(1, hashes["final"] + 1)):
            raise RuntimeError(f"the trainer did not finish (hashes.json: {hashes})")
        checked_all = set(self.verified) <= set(committed) and self.verified[-1:] == committed[-1:] \
            if args.gated else sorted(self.verified) == committed
        if not checked_all or sorted(self.rolled_back) != sorted(dry_runs):
            raise RuntimeError(f"verified versions {self.verified} and rollbacks {self.rolled_back}; "
                               f"the trainer committed {committed} and dry-ran {dry_runs}")
        what = f"applied {len(self.verified)} times at safe points, each bit-exact" if args.gated else "bit-exact"
        self.log(f"OK: versions {committed[0]}..{committed[-1]} {what}, {len(dry_runs)} rollback(s) "
                 f"bit-exact, {self.generation_steps} generation steps, parameters never moved")

    def apply_and_check(self, receiver, params, model, x):
        """Gated: writes the queued versions into the parameters (no forward pass runs now) and
        checks the version they hold against the trainer's hash."""
        queued = receiver.pending()
        held = receiver.apply()
        if queued and held != queued[-1]:
            raise RuntimeError(f"apply() wrote up to {held}, but {queued} were pending")
        if held == 0 or held in self.verified:
            return
        digest = self.check(held, params)
        self.verified.append(held)
        with torch.no_grad():
            y = model(x)
        self.log(f"applied {queued or [held]}: the parameters hold version {held}, bit-exact "
                 f"(sha256 {digest[:16]}..), output sum {y.float().sum().item():.4f}")


def main():
    args = parse_args()
    server = Server(args)
    try:
        server.run()
    except (deltacast.Error, RuntimeError) as e:
        print(f"server {args.rank}: FAILED: {e}", file=sys.stderr, flush=True)
        with open(os.path.join(args.workdir, f"failed.r{args.rank}"), "w") as f:
            f.write(str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
