"""deltacast inside a tensor-parallel inference engine (examples/tp_engine): T worker processes,
each holding only its vLLM-style shard, checked bit for bit against shards cut from the trainer's
full checkpoint with torch, independently of deltacast's placement code.

    DELTACAST_LIB=build/capi/libdeltacast.so PYTHONPATH=python /usr/bin/python3 tests/python/test_tp_engine.py -v
    /usr/bin/python3 tests/python/test_tp_engine.py -v TestTP4       # one class (as ctest runs them)

TestTP2, TestTP4  the producer in this process, T receivers each a worker process
                  (examples/tp_engine/worker.py: gated, llama_tp_placement, its own zeroed bf16
                  buffers attached with the placement, apply() between generation steps) on
                  127.0.0.1. Five versions: the bootstrap and four refits (~1% of the elements,
                  NaN/inf/-0.0/subnormal bit patterns, new tensor objects, and two refits that change
                  no element of one worker's slices). Every version commits on all T; after each,
                  every worker's saved buffers equal torch.cat/slice of the full checkpoint on raw
                  bits, padding rows stay zero, a worker whose slices did not change still applies
                  the version with its buffers unchanged, and generation steps run in between.
TestRefused       in process: a placement naming a tensor the checkpoint lacks, a buffer of the
                  wrong shape: deltacast.Error, and the refused buffers are never written.
Tests skip (saying "torch is not installed") only when torch cannot be imported.
"""

import copy
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import torch
except ImportError:
    torch = None

import deltacast
from deltacast.placement import llama_tp_placement

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.environ.get("DELTACAST_TP_ENGINE_DIR") or os.path.join(HERE, "..", "..", "examples", "tp_engine")
NO_TORCH = "torch is not installed (apt-get install python3-torch)"
LOOPBACK = "tcp://127.0.0.1:0"
REPLY_TIMEOUT = 60

if torch is not None:
    sys.path.insert(0, EXAMPLE)
    import model  # the trainer's checkpoint and its fake optimizer steps


# ---- the expected shards: torch on the full checkpoint, not deltacast.placement ---------------------

def expected_shards(ckpt, tp_rank, tp_size, vocab_pad=64):
    """buffer name -> what TP rank `tp_rank` of `tp_size` must hold, cut from the full checkpoint
    as vLLM's loaders cut it, in vLLM's buffer order. Padding rows zero."""
    out = {}

    def rows(t):
        per = t.shape[0] // tp_size
        return t[tp_rank * per:(tp_rank + 1) * per]

    def columns(t):
        per = t.shape[1] // tp_size
        return t[:, tp_rank * per:(tp_rank + 1) * per]

    def vocab(t):
        padded = (t.shape[0] + vocab_pad - 1) // vocab_pad * vocab_pad
        per = (padded + tp_size - 1) // tp_size
        buf = torch.zeros(per, t.shape[1], dtype=t.dtype)
        held = t[tp_rank * per:(tp_rank + 1) * per]
        buf[:held.shape[0]] = held
        return buf

    out["model.embed_tokens.weight"] = vocab(ckpt["model.embed_tokens.weight"])
    for i in range(model.LAYERS):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        out[a + "qkv_proj.weight"] = torch.cat([rows(ckpt[a + "q_proj.weight"]), rows(ckpt[a + "k_proj.weight"]),
                                                rows(ckpt[a + "v_proj.weight"])], dim=0)
        out[a + "o_proj.weight"] = columns(ckpt[a + "o_proj.weight"]).contiguous()
        out[m + "gate_up_proj.weight"] = torch.cat([rows(ckpt[m + "gate_proj.weight"]),
                                                    rows(ckpt[m + "up_proj.weight"])], dim=0)
        out[m + "down_proj.weight"] = columns(ckpt[m + "down_proj.weight"]).contiguous()
        out[p + "input_layernorm.weight"] = ckpt[p + "input_layernorm.weight"].clone()
        out[p + "post_attention_layernorm.weight"] = ckpt[p + "post_attention_layernorm.weight"].clone()
    out["model.norm.weight"] = ckpt["model.norm.weight"].clone()
    out["lm_head.weight"] = vocab(ckpt["lm_head.weight"])
    return out


def padding_rows(tp_rank, tp_size, vocab=1000, vocab_pad=64):
    """(first, end) of the rows of a vocabulary buffer of this rank that no checkpoint row fills."""
    padded = (vocab + vocab_pad - 1) // vocab_pad * vocab_pad
    per = (padded + tp_size - 1) // tp_size
    held = max(0, min(vocab, (tp_rank + 1) * per) - tp_rank * per)
    return held, per


def bits(t):
    return t.view(torch.int16)


def snapshot(ckpt):
    return {name: bits(t).clone() for name, t in ckpt.items()}


def count_changed(before, ckpt):
    return sum(int((before[name] != bits(t)).sum()) for name, t in ckpt.items())


def differing(actual, expected):
    """{buffer: number of elements whose bits differ} (shape mismatches and missing buffers too)."""
    out = {}
    for name, want in expected.items():
        got = actual.get(name)
        if got is None or got.shape != want.shape or got.dtype != want.dtype:
            out[name] = f"{None if got is None else (got.dtype, tuple(got.shape))} != {(want.dtype, tuple(want.shape))}"
        elif not torch.equal(bits(got), bits(want)):
            out[name] = int((bits(got) != bits(want)).sum())
    for name in set(actual) - set(expected):
        out[name] = "not expected"
    return out


class _Worker:
    """One examples/tp_engine/worker.py process; its JSON stdout lines arrive through a queue."""

    def __init__(self, url, rank, tp_size, outdir):
        self.rank, self.tp_rank = rank, rank - 1
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(EXAMPLE, "worker.py"), "--producer", url, "--rank", str(rank),
             "--tp-size", str(tp_size), "--outdir", outdir, "--timeout", "150"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line)

    def reply(self, key, timeout=REPLY_TIMEOUT):
        """The next stdout line (a JSON object), which must hold `key`."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"worker tp{self.tp_rank}: no '{key}' line within {timeout} s; stderr:\n"
                                 f"{''.join(self.stderr[-30:])}") from None
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"worker tp{self.tp_rank}: not JSON: {line!r}") from None
        if "error" in message:
            raise AssertionError(f"worker tp{self.tp_rank} failed:\n{message['error']}\nstderr:\n"
                                 f"{''.join(self.stderr[-30:])}")
        if key not in message:
            raise AssertionError(f"worker tp{self.tp_rank}: expected '{key}', got {message}")
        return message

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


class _TPEngine:
    """The scenario, for TP = T (the subclasses). QUIET: the TP ranks whose slices versions 3 and 4
    leave unchanged."""

    TP = None
    QUIET = ()

    def setUp(self):
        self.workers = []
        self.outdir = tempfile.mkdtemp(prefix=f"deltacast-tp{self.TP}-")

    def tearDown(self):
        for worker in self.workers:
            worker.kill()
        shutil.rmtree(self.outdir, ignore_errors=True)

    def check_version(self, version, ckpt, held, steps, quiet=None):
        """Every worker applied `version`; its saved buffers are the expected shards of `ckpt`
        (quiet: that TP rank's buffers are also unchanged from the previous version, and every
        other rank's changed). Updates held (tp_rank -> buffers) and steps (tp_rank -> count)."""
        for worker in self.workers:
            where = f"TP {self.TP}, worker tp{worker.tp_rank}, version {version}"
            message = worker.reply("applied")
            self.assertEqual(message["applied"], version, where)
            if version > 1:  # gated: exactly this version was pending at the safe point
                self.assertEqual(message["pending"], [version], where)
                self.assertGreater(message["steps"], steps[worker.tp_rank], f"{where}: no generation step ran")
            steps[worker.tp_rank] = message["steps"]
            saved = torch.load(message["path"])
            expected = expected_shards(ckpt, worker.tp_rank, self.TP)
            self.assertEqual(list(saved), list(expected), f"{where}: buffer names/order")
            self.assertEqual(differing(saved, expected), {}, f"{where}: buffers whose bits differ from the "
                                                              f"checkpoint's slices")
            first, end = padding_rows(worker.tp_rank, self.TP)
            for name in ("model.embed_tokens.weight", "lm_head.weight"):
                self.assertTrue(bool((bits(saved[name][first:end]) == 0).all()), f"{where}: padding of {name}")
            previous = held.get(worker.tp_rank)
            if previous is not None:
                changed = {name for name in saved if not torch.equal(bits(saved[name]), bits(previous[name]))}
                if worker.tp_rank == quiet:
                    self.assertEqual(changed, set(), f"{where}: its slices did not change, its buffers did")
                else:
                    self.assertTrue(changed, f"{where}: nothing changed in its buffers")
            held[worker.tp_rank] = saved

    def test_refits_bit_exact_on_every_shard(self):
        began = time.monotonic()
        g = torch.Generator().manual_seed(11 + self.TP)
        ckpt = model.make_checkpoint(seed=self.TP)
        model.write_special(ckpt, g)
        producer = deltacast.Producer(ckpt, receivers=self.TP, listen=LOOPBACK, topology="binary",
                                      timeouts={"peer": 5}, log_level="warn")
        with producer as p:
            self.workers = [_Worker(p.url, rank, self.TP, self.outdir) for rank in range(1, self.TP + 1)]
            report = p.start(timeout=90)
            self.assertTrue(report["committed"], report)
            self.assertEqual((report["version"], report["verified_receivers"]), (1, self.TP), report)
            for worker in self.workers:
                joined = worker.reply("joined")["joined"]
                self.assertEqual((joined["rank"], joined["tp_rank"], joined["tp_size"]),
                                 (worker.rank, worker.tp_rank, self.TP))
                want = expected_shards(ckpt, worker.tp_rank, self.TP)
                self.assertEqual(joined["buffers"], {name: list(t.shape) for name, t in want.items()})
                # The premise of bit-exactness: every shard holds NaNs, infinities, -0.0, subnormals.
                held_bits = set(torch.cat([bits(t).reshape(-1) for t in want.values()]).tolist())
                specials = {v - 0x10000 if v >= 0x8000 else v for v in model.SPECIAL_BITS}
                self.assertEqual(specials - held_bits, set(), f"tp{worker.tp_rank}: special values missing")
            held, steps = {}, {}
            self.check_version(1, ckpt, held, steps)

            base = snapshot(ckpt)  # the last committed version's bits

            def refit(version, quiet=None):
                nonlocal base
                report = p.refit(ckpt)
                self.assertTrue(report["committed"], report)
                self.assertEqual((report["version"], report["verified_receivers"]), (version, self.TP), report)
                self.assertEqual(report["changes"], count_changed(base, ckpt), report)
                base = snapshot(ckpt)
                self.assertGreater(report["changes"], 0, report)
                self.check_version(version, ckpt, held, steps, quiet)

            model.train_step(ckpt, g)                       # ~1% of every tensor
            model.write_special(ckpt, g)                    # and special values elsewhere
            refit(2)
            model.train_step(ckpt, g, avoid=(self.QUIET[0], self.TP))   # none of QUIET[0]'s slices
            refit(3, quiet=self.QUIET[0])
            ckpt = {name: t.clone() for name, t in ckpt.items()}         # new tensor objects
            model.train_step(ckpt, g, avoid=(self.QUIET[1], self.TP))
            refit(4, quiet=self.QUIET[1])
            model.train_step(ckpt, g)
            refit(5)

            p.close()  # BYE: the workers apply what is left, report and exit
            for worker in self.workers:
                done = worker.reply("done")["done"]
                self.assertEqual(done["applied"], [1, 2, 3, 4, 5], f"tp{worker.tp_rank}")
                self.assertTrue(done["pointers_unchanged"], f"tp{worker.tp_rank}: a buffer moved")
                self.assertEqual(worker.proc.wait(timeout=30), 0, f"tp{worker.tp_rank} exit status")
        print(f"\nTP {self.TP}: 5 versions bit-exact on {self.TP} workers in {time.monotonic() - began:.1f} s",
              file=sys.stderr)


@unittest.skipIf(torch is None, NO_TORCH)
class TestTP2(_TPEngine, unittest.TestCase):
    TP = 2
    QUIET = (1, 0)


@unittest.skipIf(torch is None, NO_TORCH)
class TestTP4(_TPEngine, unittest.TestCase):
    TP = 4
    QUIET = (3, 1)


class _Starter:
    """Runs producer.start() on a thread (it waits for the receiver this process runs)."""

    def __init__(self, producer, timeout=60):
        self.report, self.error = None, None
        self._thread = threading.Thread(target=self._run, args=(producer, timeout), daemon=True)
        self._thread.start()

    def _run(self, producer, timeout):
        try:
            self.report = producer.start(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 (re-raised by result())
            self.error = exc

    def result(self, timeout=90):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError("producer.start() did not return")
        if self.error is not None:
            raise self.error
        return self.report


@unittest.skipIf(torch is None, NO_TORCH)
class TestRefused(unittest.TestCase):
    """attach(buffers, placement=) refusals, in process (TP rank 1 of 2): deltacast.Error, and the
    refused buffers are never written, not even by the bootstrap and a refit that follow."""

    QKV = "model.layers.0.self_attn.qkv_proj.weight"

    @staticmethod
    def sentinel(shape):
        t = torch.empty(shape, dtype=torch.bfloat16)
        bits(t).fill_(0x5A5A)
        return t

    def assertSentinel(self, buffers, what):
        written = [name for name, t in buffers.items() if not bool((bits(t) == 0x5A5A).all())]
        self.assertEqual(written, [], f"{what}: buffers written")

    def refuse(self, receiver, buffers, placement, status_name, *words):
        with self.assertRaises(deltacast.Error) as caught:
            receiver.attach(buffers, placement=placement)
        e = caught.exception
        self.assertEqual(e.status_name, status_name, str(e))
        for word in words:
            self.assertIn(word, e.message)
        self.assertSentinel(buffers, f"refused ({e.message})")
        return e

    def session(self, refusals):
        """A producer and one gated receiver at TP rank 1 of 2: `refusals(receiver, placement,
        shapes)` returns the refused buffers; then the right buffers are attached with the same
        placement and two versions land in them, never in the refused ones."""
        g = torch.Generator().manual_seed(5)
        ckpt = model.make_checkpoint(seed=5)
        model.write_special(ckpt, g)
        with deltacast.Producer(ckpt, receivers=1, listen=LOOPBACK, log_level="warn") as p:
            starter = _Starter(p)
            with deltacast.Receiver(producer=p.url, rank=1, listen=LOOPBACK, gated=True, log_level="warn") as r:
                manifest = r.join(timeout=30)
                placement = llama_tp_placement(manifest, 1, 2)
                shapes = {name: list(t.shape) for name, t in expected_shards(ckpt, 1, 2).items()}
                refused = refusals(r, placement, shapes)
                good = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in shapes.items()}
                r.attach(good, placement=placement)
                r.start()
                self.assertTrue(starter.result()["committed"])
                self.assertEqual(r.wait_version(1, timeout=30), 1)
                self.assertEqual(differing(good, expected_shards(ckpt, 1, 2)), {})
                model.train_step(ckpt, g)
                self.assertTrue(p.refit(ckpt)["committed"])
                self.assertEqual(r.wait_version(2, timeout=30), 2)
                self.assertEqual(r.apply(), 2)
                self.assertEqual(differing(good, expected_shards(ckpt, 1, 2)), {})
                p.close()  # BYE before the receiver leaves
                for i, buffers in enumerate(refused):
                    self.assertSentinel(buffers, f"refused set {i} after two versions")

    def test_unknown_tensor(self):
        def refusals(r, placement, shapes):
            bad = copy.deepcopy(placement)
            q, _, v = bad[self.QKV]
            bad[self.QKV] = [q, ("model.layers.0.self_attn.x_proj.weight", 0, 64, 128), v]
            buffers = {name: self.sentinel(shape) for name, shape in shapes.items()}
            self.refuse(r, buffers, bad, "DC_ERR_INVALID_ARGUMENT", self.QKV, "x_proj")
            # A slice past the tensor's end is refused the same way.
            bad = copy.deepcopy(placement)
            o = "model.layers.1.self_attn.o_proj.weight"
            bad[o] = [(o, 1, 64, 129)]
            self.refuse(r, buffers, bad, "DC_ERR_INVALID_ARGUMENT", o)
            return [buffers]
        self.session(refusals)

    def test_wrong_shape_buffer_is_refused(self):
        # Refused, and nothing written; the receiver is then closed without starting (attaching
        # again with the placement is refused today: test_retry_after_wrong_shape_buffer).
        ckpt = model.make_checkpoint(seed=5)
        with deltacast.Producer(ckpt, receivers=1, listen=LOOPBACK, log_level="warn") as p:
            starter = _Starter(p, timeout=5)
            with deltacast.Receiver(producer=p.url, rank=1, listen=LOOPBACK, gated=True, log_level="warn") as r:
                placement = llama_tp_placement(r.join(timeout=30), 1, 2)
                shapes = {name: list(t.shape) for name, t in expected_shards(ckpt, 1, 2).items()}
                buffers = {name: self.sentinel(shape) for name, shape in shapes.items()}
                buffers[self.QKV] = self.sentinel([shapes[self.QKV][0] + 3, shapes[self.QKV][1]])
                self.refuse(r, buffers, placement, "DC_ERR_INVALID_ARGUMENT", self.QKV)
            with self.assertRaises(deltacast.Error):  # its only receiver left before starting
                starter.result()
            self.assertSentinel(buffers, "after close")

    def test_retry_after_wrong_shape_buffer(self):
        def refusals(r, placement, shapes):
            wrong = {name: self.sentinel(shape) for name, shape in shapes.items()}
            wrong["lm_head.weight"] = self.sentinel([488, 128])
            self.refuse(r, wrong, placement, "DC_ERR_INVALID_ARGUMENT", "lm_head.weight")
            return [wrong]
        self.session(refusals)


if __name__ == "__main__":
    unittest.main()
