"""Tests of the Python binding (python/deltacast) over libdeltacast.so.

    DELTACAST_LIB=build/capi/libdeltacast.so PYTHONPATH=python /usr/bin/python3 -m unittest -v tests/python/test_embed.py
    /usr/bin/python3 tests/python/test_embed.py TestRelayTree        # one class (as ctest runs them)

TestBinding      no network: options, errors, closed handles, buffer checks, where the library is found
TestNumpy        numpy only: uint16 arrays as BF16 end to end (one producer, one receiver, in process)
TestAttach       torch: what attach/start/refit refuse, with nothing written (in process)
TestGate         torch: a gated and an ungated receiver in process: versions queue untouched until
                 apply(), a dry run never queues; reattach() moves a tensor to new memory
TestRelayTree    torch: a trainer (this process) and 3 server processes (embed_server.py) on
                 127.0.0.1, a binary tree: versions with ~1% changes, special values, new tensor
                 objects, a dry run that rolls back, a version with no change; every server checked
                 bit-exact (SHA-256 of the bytes) with unchanged data pointers, and its events.
TestProducerGroup torch: a producer group of two Producer handles (group_rank 0 and 1, each refit
                 on its own thread, each sending its part down its own trees) and 3 servers:
                 versions bit-exact on every server, a rank without its coordinator refused.
Tests that need torch skip (saying "torch is not installed") only when it cannot be imported.
"""

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

import numpy as np

try:
    import torch
except ImportError:
    torch = None

import deltacast
from deltacast import _api, _lib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
NO_TORCH = "torch is not installed (apt-get install python3-torch)"
LOOPBACK = "tcp://127.0.0.1:0"

if torch is not None:
    import embed_model


class _Starter:
    """Runs producer.start() on a thread (it waits for the receivers this process runs)."""

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


def _drain(receiver):
    events = []
    while (event := receiver.poll_event()) is not None:
        events.append(event)
    return events


class TestBinding(unittest.TestCase):
    def assertError(self, status_name, fn, *args, **kwargs):
        with self.assertRaises(deltacast.Error) as caught:
            fn(*args, **kwargs)
        e = caught.exception
        self.assertEqual(e.status_name, status_name, str(e))
        self.assertEqual(e.status, deltacast.STATUS[status_name])
        self.assertTrue(e.message)
        return e

    def test_library_version_and_tables(self):
        self.assertEqual(deltacast.library_version().split(".")[0], str(_lib.EXPECTED_MAJOR))
        self.assertEqual(deltacast.DTYPE_CODES["BF16"], 10)
        self.assertEqual(deltacast.DTYPE_CODES["F8_E5M2"], 14)
        for name, value in deltacast.STATUS.items():
            self.assertEqual(_api.LIB.dc_status_name(value).decode(), name)

    def test_options_flatten(self):
        flat = _api._flatten_options({"timeouts": {"peer": "5s", "join": 2.5}, "retain_versions": 4,
                                      "config": "a.yaml", "skipped": None, "verbose": False})
        self.assertEqual(flat, [("config", "a.yaml"), ("timeouts.peer", "5s"), ("timeouts.join", "2500ms"),
                                ("retain_versions", "4"), ("verbose", "false")])
        # A held digest (Receiver.digest is an int) goes as 0x-prefixed hex, which the C API reads.
        self.assertEqual(_api._flatten_options({"held_version": 3, "held_digest": 255}),
                         [("held_version", "3"), ("held_digest", "0x00000000000000ff")])
        with self.assertRaises(deltacast.Error):
            _api._flatten_options({"listen": ["a"]})

    def test_bad_option_names_the_key(self):
        e = self.assertError("DC_ERR_CONFIG", deltacast.Receiver, producer="tcp://127.0.0.1:1", rank=1,
                             no_such_key=3)
        self.assertIn("no_such_key", e.message)
        e = self.assertError("DC_ERR_CONFIG", deltacast.Receiver, timeouts={"peer": "soon"})
        self.assertIn("timeouts.peer", e.message)

    def test_join_unreachable_producer_fails_in_time(self):
        with deltacast.Receiver(producer="tcp://127.0.0.1:1", rank=1, timeouts={"connect": "200ms"}) as r:
            began = time.monotonic()
            with self.assertRaises(deltacast.Error) as caught:
                r.join(timeout=1)
            self.assertIn(caught.exception.status_name, ("DC_ERR_TIMEOUT", "DC_ERR_CONNECTION"))
            self.assertLess(time.monotonic() - began, 20)

    def test_calls_in_the_wrong_state(self):
        r = deltacast.Receiver(producer="tcp://127.0.0.1:1", rank=1)
        self.assertError("DC_ERR_STATE", r.start)
        self.assertError("DC_ERR_STATE", r.wait_version, 1, timeout=0.1)
        self.assertError("DC_ERR_STATE", r.attach, {"w": np.zeros(4, np.float32)})
        self.assertIsNone(r.poll_event())
        self.assertEqual((r.version, r.digest), (0, 0))
        r.close()
        r.close()  # idempotent
        self.assertTrue(r.closed)
        self.assertError("DC_ERR_STATE", lambda: r.version)
        with deltacast.Receiver() as r2:
            pass
        self.assertTrue(r2.closed)

    def test_producer_checks(self):
        w = np.zeros((3, 5), np.float32)
        self.assertError("DC_ERR_INVALID_ARGUMENT", deltacast.Producer, {"w": np.zeros(3, np.complex64)}, receivers=1)
        self.assertError("DC_ERR_INVALID_ARGUMENT", deltacast.Producer, {"w": w.T}, receivers=1)  # not contiguous
        self.assertError("DC_ERR_INVALID_ARGUMENT", deltacast.Producer, {"w": w}, receivers=1,
                         dtypes={"w": "BF16"})  # 2-byte dtype over 4-byte elements
        self.assertError("DC_ERR_INVALID_ARGUMENT", deltacast.Producer, {"w": [1.0, 2.0]}, receivers=1)
        self.assertError("DC_ERR_INVALID_ARGUMENT", deltacast.Producer, {"w": w.astype(">f4")}, receivers=1)
        self.assertError("DC_ERR_NOT_FOUND", deltacast.Producer, {"w": w}, receivers=1, dtypes={"x": "BF16"})
        self.assertError("DC_ERR_CONFIG", deltacast.Producer, {"w": w})  # receivers not set (it listens at once)
        read_only = np.zeros(8, np.float32)
        read_only.flags.writeable = False  # fine for a producer: deltacast only reads it
        with deltacast.Producer({"w": w, "r": read_only}, receivers=1, listen=LOOPBACK) as p:
            self.assertRegex(p.url, r"^tcp://127\.0\.0\.1:[1-9][0-9]*$")
            self.assertEqual(p.manifest, [("w", "F32", (3, 5)), ("r", "F32", (8,))])
            self.assertEqual(p.version, 0)
            self.assertError("DC_ERR_STATE", p.refit)
            self.assertError("DC_ERR_INVALID_ARGUMENT", p.refit, {"w": np.zeros((5, 3), np.float32)})
            self.assertError("DC_ERR_INVALID_ARGUMENT", p.refit, {"w": np.zeros((3, 5), np.float16)})
            self.assertError("DC_ERR_NOT_FOUND", p.refit, {"x": w})
        self.assertError("DC_ERR_STATE", lambda: p.version)

    def test_search_plan(self):
        with tempfile.TemporaryDirectory() as prefix:
            package = os.path.join(prefix, "lib", "python3", "dist-packages", "deltacast")
            os.makedirs(package)
            os.makedirs(os.path.join(prefix, "lib", "x86_64-linux-gnu"))
            for name in ("lib/x86_64-linux-gnu/libdeltacast.so.0.2", "lib/libdeltacast.so.0.2.0",
                         "lib/libdeltacast.so"):
                open(os.path.join(prefix, name), "w").close()
            plan = _lib.search_plan(package, environ={})
            self.assertEqual(plan[0][1], [os.path.join(prefix, "lib", n) for n in (
                "libdeltacast.so", "libdeltacast.so.0.2.0", "x86_64-linux-gnu/libdeltacast.so.0.2")])
            self.assertEqual(plan[1][1], [])  # no source tree there
            self.assertEqual(_lib.search_plan(package, environ={"DELTACAST_LIB": "/x/y.so"}),
                             [("$DELTACAST_LIB=/x/y.so", ["/x/y.so"])])

    def _python(self, code, env):
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)

    def test_installed_prefix_and_missing_library(self):
        env = {k: v for k, v in os.environ.items() if k not in ("DELTACAST_LIB", "PYTHONPATH")}
        with tempfile.TemporaryDirectory() as prefix:
            site = os.path.join(prefix, "lib", "python3", "dist-packages")
            shutil.copytree(os.path.dirname(deltacast.__file__), os.path.join(site, "deltacast"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            code = "import deltacast; print(deltacast.LIBRARY_PATH)"
            # No library under the prefix: the message says where it looked.
            run = self._python(code, dict(env, PYTHONPATH=site))
            self.assertNotEqual(run.returncode, 0)
            self.assertIn("LibraryNotFoundError", run.stderr)
            self.assertIn(os.path.join(prefix, "lib"), run.stderr)
            # The library in P/lib/<multiarch>/ (a copy, as an install would put it) is found.
            os.makedirs(os.path.join(prefix, "lib", "x86_64-linux-gnu"))
            installed = os.path.join(prefix, "lib", "x86_64-linux-gnu", "libdeltacast.so.0")
            shutil.copy(_api.LIBRARY_PATH, installed)
            # The shim without its core (deltacast/libdeltacast_core.so.X.Y.Z beside it): a clear
            # error naming the path it tried.
            run = self._python(code, dict(env, PYTHONPATH=site))
            self.assertNotEqual(run.returncode, 0)
            self.assertIn("LibraryNotFoundError", run.stderr)
            core_dir = os.path.join(os.path.dirname(os.path.realpath(_api.LIBRARY_PATH)), "deltacast")
            (core_name,) = os.listdir(core_dir)
            self.assertIn(os.path.join(prefix, "lib", "x86_64-linux-gnu", "deltacast", core_name), run.stderr)
            os.makedirs(os.path.join(prefix, "lib", "x86_64-linux-gnu", "deltacast"))
            shutil.copy(os.path.join(core_dir, core_name),
                        os.path.join(prefix, "lib", "x86_64-linux-gnu", "deltacast", core_name))
            run = self._python(code, dict(env, PYTHONPATH=site))
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stdout.strip(), installed)
        run = self._python("import deltacast", dict(env, DELTACAST_LIB="/nonexistent/libdeltacast.so",
                                                    PYTHONPATH=os.path.dirname(os.path.dirname(deltacast.__file__))))
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("/nonexistent/libdeltacast.so", run.stderr)

    def test_import_without_torch(self):
        code = ("import sys; sys.modules['torch'] = None; import deltacast; import numpy as np; "
                "p = deltacast.Producer({'w': np.zeros(4, np.float32)}, receivers=1, listen='tcp://127.0.0.1:0'); "
                "print(p.url); p.close()")
        run = self._python(code, dict(os.environ))
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertTrue(run.stdout.startswith("tcp://127.0.0.1:"))


class TestNumpy(unittest.TestCase):
    def test_uint16_as_bf16_end_to_end(self):
        rng = np.random.default_rng(11)
        w = rng.integers(0, 1 << 16, size=(129, 65), dtype=np.uint16)  # any bits: NaNs, infs, subnormals
        f = rng.standard_normal(333).astype(np.float32)
        producer = deltacast.Producer({"w": w, "f": f}, receivers=1, listen=LOOPBACK, dtypes={"w": "BF16"},
                                      chunk_bytes="8KiB", log_level="warn")
        with producer as p:
            self.assertEqual(p.manifest, [("w", "BF16", (129, 65)), ("f", "F32", (333,))])
            starter = _Starter(p)
            with deltacast.Receiver(producer=p.url, rank=1, listen=LOOPBACK) as r:
                self.assertEqual(r.join(timeout=30), [("w", "BF16", (129, 65)), ("f", "F32", (333,))])
                rw, rf = np.zeros_like(w), np.zeros_like(f)
                addresses = (rw.ctypes.data, rf.ctypes.data)
                with self.assertRaises(deltacast.Error) as caught:  # uint16 without dtypes: U16, not BF16
                    r.attach({"w": rw})
                self.assertIn(caught.exception.status_name, ("DC_ERR_INVALID_ARGUMENT", "DC_ERR_UNSUPPORTED"))
                r.attach({"w": rw, "f": rf}, dtypes={"w": "BF16"})
                from_callback, called = [], threading.Event()

                def close_from_callback(event):  # refused: it runs on the thread close() joins
                    try:
                        r.close()
                    except deltacast.Error as exc:
                        from_callback.append((event.kind, exc.status_name))
                    called.set()

                r.on_event(close_from_callback)
                r.start()
                self.assertTrue(starter.result()["committed"])
                self.assertEqual(r.wait_version(1, timeout=30), 1)
                self.assertEqual(rw.tobytes(), w.tobytes())
                self.assertEqual(rf.tobytes(), f.tobytes())
                self.assertTrue(called.wait(10))  # the callback runs just after the event is queued
                self.assertEqual(from_callback[0], ("committed", "DC_ERR_STATE"))
                self.assertFalse(r.closed)

                # Version 2: a new array object for w, 1% of it changed; f not given (unchanged).
                w2 = w.copy()
                index = rng.choice(w2.size, w2.size // 100, replace=False)
                w2.reshape(-1)[index] ^= rng.integers(1, 1 << 16, size=index.size, dtype=np.uint16)
                report = p.refit({"w": w2})
                self.assertTrue(report["committed"], report)
                self.assertEqual((report["version"], report["changes"]), (2, index.size))
                self.assertEqual(r.wait_version(2, timeout=30), 2)
                self.assertEqual(rw.tobytes(), w2.tobytes())
                self.assertEqual(rf.tobytes(), f.tobytes())

                # Version 3: f (the array given at construction) changed in place (sign flips:
                # every one changes bits), w2 given again read-only (a producer only reads).
                f[::10] = -f[::10]
                w2.flags.writeable = False
                report = p.refit({"w": w2})
                self.assertTrue(report["committed"], report)
                self.assertEqual((report["version"], report["changes"]), (3, f[::10].size))
                self.assertEqual(r.wait_version(3, timeout=30), 3)
                self.assertEqual(rf.tobytes(), f.tobytes())
                self.assertEqual(rw.tobytes(), w2.tobytes())

                # Version 4: refit() without arguments sends what the registered arrays hold now.
                f[1] = np.float32(np.inf)
                report = p.refit()
                self.assertEqual((report["version"], report["committed"], report["changes"]), (4, True, 1))
                self.assertEqual(r.wait_version(4, timeout=30), 4)
                self.assertEqual(rf.tobytes(), f.tobytes())
                self.assertEqual((rw.ctypes.data, rf.ctypes.data), addresses)
                self.assertEqual(p.version, 4)
                self.assertEqual(p.report, report)

                events = _drain(r)
                self.assertEqual([(e.kind, e.version, e.status_name) for e in events],
                                 [("committed", v, "DC_OK") for v in (1, 2, 3, 4)])

                # close() from another thread ends a wait without a bound: DC_ERR_CANCELLED.
                outcome = []

                def wait_forever():
                    try:
                        r.wait_version(99, timeout=None)
                    except deltacast.Error as exc:
                        outcome.append(exc.status_name)

                waiter = threading.Thread(target=wait_forever)
                waiter.start()
                time.sleep(0.3)
                r.close()
                waiter.join(10)
                self.assertFalse(waiter.is_alive())
                self.assertEqual(outcome, ["DC_ERR_CANCELLED"])
                self.assertEqual(rf.tobytes(), f.tobytes())  # the last committed version stays


@unittest.skipIf(torch is None, NO_TORCH)
class TestAttach(unittest.TestCase):
    def assertRefused(self, status_name, receiver, tensors, untouched=()):
        """attach(tensors) raises Error(status_name) and writes nothing into `untouched`."""
        before = [embed_model.tensor_bytes(t) for t in untouched]
        with self.assertRaises(deltacast.Error) as caught:
            receiver.attach(tensors)
        self.assertEqual(caught.exception.status_name, status_name, str(caught.exception))
        self.assertEqual([embed_model.tensor_bytes(t) for t in untouched], before)
        return caught.exception

    def test_refusals_then_refit(self):
        g = torch.Generator().manual_seed(5)
        tensors = {"w": torch.randn(64, 33, generator=g).bfloat16(), "b": torch.randn(17, generator=g),
                   "h": torch.randn(5, 7, generator=g).half()}
        with deltacast.Producer(tensors, receivers=1, listen=LOOPBACK, log_level="warn") as p:
            starter = _Starter(p)
            with deltacast.Receiver(producer=p.url, rank=1, listen=LOOPBACK) as r:
                self.assertEqual(r.join(timeout=30), [("w", "BF16", (64, 33)), ("b", "F32", (17,)),
                                                      ("h", "F16", (5, 7))])

                def pattern(shape, dtype):  # a buffer holding 0x5A bytes, to see any write
                    t = torch.empty(shape, dtype=dtype)
                    embed_model.int_view(t).view(torch.uint8).fill_(0x5A)
                    return t

                wrong_dtype = pattern((64, 33), torch.float16)
                e = self.assertRefused("DC_ERR_INVALID_ARGUMENT", r, {"w": wrong_dtype}, [wrong_dtype])
                self.assertIn("BF16", e.message)
                wrong_shape = pattern((33, 64), torch.bfloat16)
                self.assertRefused("DC_ERR_INVALID_ARGUMENT", r, {"w": wrong_shape}, [wrong_shape])
                wrong_size = pattern((64, 34), torch.bfloat16)
                self.assertRefused("DC_ERR_INVALID_ARGUMENT", r, {"w": wrong_size}, [wrong_size])
                self.assertRefused("DC_ERR_NOT_FOUND", r, {"nope": torch.zeros(3)})
                self.assertRefused("DC_ERR_INVALID_ARGUMENT", r, {"b": torch.zeros(17, dtype=torch.int32)})
                transposed = pattern((33, 64), torch.bfloat16).t()
                e = self.assertRefused("DC_ERR_INVALID_ARGUMENT", r, {"w": transposed}, [transposed])
                self.assertIn("contiguous", e.message)
                read_only = np.zeros(17, np.float32)
                read_only.flags.writeable = False
                e = self.assertRefused("DC_ERR_INVALID_ARGUMENT", r, {"b": read_only})
                self.assertIn("read-only", e.message)
                if torch.cuda.is_available():
                    e = self.assertRefused("DC_ERR_UNSUPPORTED", r, {"b": torch.zeros(17, device="cuda")})
                    self.assertIn("CUDA", e.message)

                # A bad buffer anywhere in the dict: nothing of it is attached.
                mine = {"w": torch.zeros(64, 33, dtype=torch.bfloat16), "b": torch.zeros(17),
                        "h": torch.zeros(5, 7, dtype=torch.float16)}
                self.assertRefused("DC_ERR_INVALID_ARGUMENT", r, {"w": mine["w"], "b": read_only})
                r.attach({"w": mine["w"], "h": mine["h"]})
                with self.assertRaises(deltacast.Error) as caught:  # b is missing
                    r.start()
                self.assertEqual(caught.exception.status_name, "DC_ERR_STATE")
                self.assertIn("'b'", caught.exception.message)
                r.attach({"b": mine["b"]})
                r.start()
                self.assertRefused("DC_ERR_STATE", r, {"b": mine["b"]})  # attach after start
                with self.assertRaises(deltacast.Error) as caught:
                    r.on_event(lambda event: None)
                self.assertEqual(caught.exception.status_name, "DC_ERR_STATE")
                self.assertTrue(starter.result()["committed"])
                r.wait_version(1, timeout=30)
                self.assertEqual(embed_model.hashes(mine), embed_model.hashes(tensors))

                before = embed_model.snapshot(tensors)
                embed_model.perturb(tensors, 0.05, g)
                report = p.refit(tensors)
                self.assertEqual(report["changes"], embed_model.count_changed(before, tensors))
                self.assertEqual(r.wait_version(2, timeout=30), 2)
                self.assertEqual(embed_model.hashes(mine), embed_model.hashes(tensors))
                self.assertEqual([(e.kind, e.version) for e in _drain(r)], [("committed", 1), ("committed", 2)])

                p.close()  # BYE: the receiver ends; waiting for a later version says so
                with self.assertRaises(deltacast.Error) as caught:
                    r.wait_version(3, timeout=30)
                self.assertEqual(caught.exception.status_name, "DC_ERR_STATE")
                events, deadline = [], time.monotonic() + 10
                while not events and time.monotonic() < deadline:  # queued just after the state
                    events = _drain(r)
                    time.sleep(0.01)
                self.assertEqual([(e.kind, e.version) for e in events], [("ended", 2)])
                self.assertEqual(r.version, 2)

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "no CUDA device")
    def test_cuda_memory_refused(self):
        with self.assertRaises(deltacast.Error) as caught:
            deltacast.Producer({"w": torch.zeros(8, device="cuda", dtype=torch.bfloat16)}, receivers=1)
        self.assertEqual(caught.exception.status_name, "DC_ERR_UNSUPPORTED")
        self.assertIn("CUDA", caught.exception.message)


@unittest.skipIf(torch is None, NO_TORCH)
class TestGate(unittest.TestCase):
    """gated=True: versions commit without touching the server's tensors; apply() writes them in
    order at the server's safe point. reattach() moves a tensor to new memory."""

    def test_gated_apply_and_reattach(self):
        trainer = embed_model.trainer_tensors(3)
        g = torch.Generator().manual_seed(5)
        with deltacast.Producer(trainer, receivers=2, listen=LOOPBACK, chunk_bytes="64KiB",
                                log_level="warn") as p:
            starter = _Starter(p)
            with deltacast.Receiver(producer=p.url, rank=1, listen=LOOPBACK, gated=True) as gated, \
                    deltacast.Receiver(producer=p.url, rank=2, listen=LOOPBACK) as plain:
                joiners = [threading.Thread(target=r.join, kwargs={"timeout": 30}) for r in (gated, plain)]
                for j in joiners:  # WELCOME comes once every receiver said HELLO
                    j.start()
                for j in joiners:
                    j.join(40)
                servers = []
                for r in (gated, plain):
                    _, tensors = embed_model.server_tensors()
                    r.attach(tensors)
                    r.start()
                    servers.append(tensors)
                self.assertTrue(starter.result()["committed"])
                for r in (gated, plain):
                    self.assertEqual(r.wait_version(1, timeout=30), 1)
                self.assertEqual(embed_model.hashes(servers[0]), embed_model.hashes(trainer))  # never gated
                v1 = embed_model.hashes(trainer)
                pointers = {name: t.data_ptr() for name, t in servers[0].items()}
                self.assertEqual((gated.pending(), gated.applied_version), ([], 1))

                for version in (2, 3):
                    embed_model.perturb(trainer, 0.01, g)
                    self.assertTrue(p.refit(trainer)["committed"])
                    self.assertEqual(gated.wait_version(version, timeout=30), version)
                    self.assertEqual(plain.wait_version(version, timeout=30), version)
                    self.assertEqual(embed_model.hashes(servers[0]), v1, "a gated server was written before apply()")
                    self.assertEqual(embed_model.hashes(servers[1]), embed_model.hashes(trainer))
                self.assertEqual((gated.pending(), gated.applied_version, gated.version), ([2, 3], 1, 3))
                self.assertEqual(plain.pending(), [])

                # A dry run never reaches the queue.
                tried = {name: t.clone() for name, t in trainer.items()}
                embed_model.perturb(tried, 0.01, g)
                self.assertFalse(p.refit(tried, dry_run=True)["committed"])
                self.assertEqual(gated.pending(), [2, 3])

                self.assertEqual(gated.apply(), 3)
                self.assertEqual(embed_model.hashes(servers[0]), embed_model.hashes(trainer))
                self.assertEqual({name: t.data_ptr() for name, t in servers[0].items()}, pointers)
                self.assertEqual((gated.pending(), gated.applied_version), ([], 3))
                self.assertEqual(plain.apply(), 3)  # ungated: nothing to do

                # reattach: the plain server moves one tensor; refits land in the new memory.
                name = "model.0.weight"
                old = servers[1][name]
                moved = old.clone()
                wrong = old.clone()
                embed_model.int_view(wrong)[0] += 1
                with self.assertRaises(deltacast.Error) as caught:
                    plain.reattach(name, wrong)
                self.assertEqual(caught.exception.status_name, "DC_ERR_INVALID_ARGUMENT")
                with self.assertRaises(deltacast.Error) as caught:
                    plain.reattach(name, old.float())
                self.assertEqual(caught.exception.status_name, "DC_ERR_INVALID_ARGUMENT")
                plain.reattach(name, moved)
                before = embed_model.tensor_bytes(old)
                embed_model.perturb(trainer, 0.01, g)
                self.assertTrue(p.refit(trainer)["committed"])
                self.assertEqual(plain.wait_version(4, timeout=30), 4)
                self.assertEqual(embed_model.tensor_bytes(old), before, "the old tensor was written after reattach")
                self.assertEqual(embed_model.sha(moved), embed_model.sha(trainer[name]))
                self.assertEqual(gated.wait_version(4, timeout=30), 4)
                self.assertEqual(gated.apply(), 4)
                self.assertEqual(embed_model.hashes(servers[0]), embed_model.hashes(trainer))


class _Server:
    """One embed_server.py process; its stdout lines arrive through a queue."""

    def __init__(self, url, rank):
        self.rank = rank
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "embed_server.py"), url, str(rank)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.lines = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line)

    def reply(self, timeout=90):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"server {self.rank}: no answer within {timeout} s; stderr:\n"
                                 f"{''.join(self.stderr[-30:])}") from None
        message = json.loads(line)
        if "error" in message:
            raise AssertionError(f"server {self.rank} failed:\n{message['error']}\nstderr:\n"
                                 f"{''.join(self.stderr[-30:])}")
        return message

    def request(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


@unittest.skipIf(torch is None, NO_TORCH)
class TestRelayTree(unittest.TestCase):
    RECEIVERS = 3

    def setUp(self):
        self.servers = []
        self.events = {}  # rank -> {"polled": [...], "callback": [...]}: every event each server answered

    def tearDown(self):
        for server in self.servers:
            server.kill()

    def ask_all(self, command):
        for server in self.servers:
            server.request(command)
        answers = [server.reply() for server in self.servers]
        for server, answer in zip(self.servers, answers):
            seen = self.events.setdefault(server.rank, {"polled": [], "callback": []})
            for source in seen:
                seen[source] += [(e[0], e[1], e[3]) for e in answer[source]]
        return answers

    def check_servers(self, command, version, expected_hashes):
        answers = self.ask_all(command)
        for server, answer in zip(self.servers, answers):
            where = f"server {server.rank} at version {version}"
            self.assertEqual(answer["version"], version, where)
            wrong = [name for name, h in expected_hashes.items() if answer["hashes"][name] != h]
            self.assertEqual(wrong, [], f"{where}: tensors whose bits differ from the trainer's")
            self.assertTrue(answer["pointers_unchanged"], f"{where}: a tensor's data_ptr changed")
        self.assertEqual(len({a["digest"] for a in answers}), 1, "the servers' digests differ")
        return answers

    def test_refits_bit_exact_through_tree(self):
        g = torch.Generator().manual_seed(3)
        tensors = embed_model.trainer_tensors()
        producer = deltacast.Producer(tensors, receivers=self.RECEIVERS, listen=LOOPBACK, topology="binary",
                                      chunk_bytes="256KiB", retain_versions=4, log_level="warn")
        with producer as p:
            self.assertEqual(p.manifest, embed_model.MANIFEST)
            self.servers = [_Server(p.url, rank) for rank in range(1, self.RECEIVERS + 1)]
            report = p.start(timeout=90)
            self.assertTrue(report["committed"], report)
            self.assertEqual((report["version"], report["verified_receivers"]), (1, self.RECEIVERS))
            for server in self.servers:
                manifest = [(n, d, tuple(s)) for n, d, s in server.reply()["manifest"]]
                self.assertEqual(manifest, embed_model.MANIFEST)
            self.check_servers("check 1", 1, embed_model.hashes(tensors))
            committed = [1]
            base = embed_model.snapshot(tensors)  # the last committed version's bits

            def refit_and_check(dry_run=False):
                nonlocal base
                report = p.refit(tensors, dry_run=dry_run)
                self.assertEqual(report["committed"], not dry_run, report)
                self.assertEqual(report["changes"], embed_model.count_changed(base, tensors), report)
                self.assertEqual(report["verified_receivers"], self.RECEIVERS, report)
                if not dry_run:
                    base = embed_model.snapshot(tensors)
                    committed.append(report["version"])
                    self.assertEqual(p.version, report["version"])
                    self.check_servers(f"check {report['version']}", report["version"], embed_model.hashes(tensors))
                return report

            # ~1% of the elements change.
            embed_model.perturb(tensors, 0.01, g)
            report = refit_and_check()
            self.assertEqual(report["version"], 2)
            self.assertLess(report["changed_fraction"], 0.03)
            self.assertLess(report["payload_bytes"], report["checkpoint_bytes"] / 10)

            # New tensor objects (new addresses), NaNs, infinities, -0.0 and subnormals, and ~1%.
            tensors = {name: t.clone() for name, t in tensors.items()}
            embed_model.perturb(tensors, 0.01, g)
            embed_model.write_special(tensors)
            refit_and_check()

            # A dry run: delivered and verified, then aborted; every server rolls back to the
            # previous bits, keeps its version, and is told (rolled_back).
            last_hashes, last_version = embed_model.hashes(tensors), p.version
            embed_model.perturb(tensors, 0.01, g)
            dry = refit_and_check(dry_run=True)
            self.assertEqual(p.version, last_version)
            self.check_servers("rolled_back", last_version, last_hashes)

            # The next version carries the dry run's changes and ~1% more.
            embed_model.perturb(tensors, 0.01, g)
            refit_and_check()

            # A version where nothing changed.
            report = refit_and_check()
            self.assertEqual((report["changes"], report["changed_fraction"]), (0, 0))

            p.close()  # BYE
            self.ask_all("end")
            for server in self.servers:
                self.assertEqual(server.proc.wait(timeout=30), 0, f"server {server.rank} exit status")

        # Events, from poll_event and from the callback alike: "committed" once per committed
        # version, the dry run's "rolled_back", and "ended" after the producer's BYE.
        expected = [("committed", v, "DC_OK") for v in committed[:3]] + \
                   [("rolled_back", dry["version"], "DC_ERR_ABORTED")] + \
                   [("committed", v, "DC_OK") for v in committed[3:]] + [("ended", committed[-1], "DC_OK")]
        for rank, seen in self.events.items():
            for source, events in seen.items():
                self.assertEqual(events, expected, f"server {rank}: events from {source}")


@unittest.skipIf(torch is None, NO_TORCH)
class TestProducerGroup(unittest.TestCase):
    RECEIVERS = 3
    setUp = TestRelayTree.setUp
    tearDown = TestRelayTree.tearDown
    ask_all = TestRelayTree.ask_all
    check_servers = TestRelayTree.check_servers

    def refit_ranks(self, version, ranks):
        """Refits every rank ({name: (producer, tensors)}) at once, each on its own thread, as the
        trainer's ranks would; checks each returned `version` committed. Returns {name: report}."""
        results = {}

        def refit(name, producer, given):
            results[name] = producer.refit(given)

        threads = [threading.Thread(target=refit, args=(n, q, t)) for n, (q, t) in ranks.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(set(results), set(ranks), "a rank's refit did not return")
        for name, report in results.items():
            self.assertTrue(report["committed"], (name, report))
            self.assertEqual(report["version"], version, (name, report))
        return results

    def test_two_producer_handles_bit_exact(self):
        g = torch.Generator().manual_seed(11)
        tensors = embed_model.trainer_tensors()
        common = dict(listen=LOOPBACK, topology="binary", chunk_bytes="256KiB", log_level="warn")
        coordinator = deltacast.Producer(tensors, receivers=self.RECEIVERS, group_rank=0, group_size=2, **common)
        with coordinator as p0:
            with deltacast.Producer(tensors, group_rank=1, group_size=2, coordinator=p0.url, **common) as p1:
                self.servers = [_Server(p0.url, rank) for rank in range(1, self.RECEIVERS + 1)]
                starters = [_Starter(p1), _Starter(p0)]
                reports = [s.result() for s in starters]
                for report in reports:
                    self.assertTrue(report["committed"], report)
                    self.assertEqual(report["version"], 1, report)
                for server in self.servers:
                    server.reply()  # its manifest
                self.check_servers("check 1", 1, embed_model.hashes(tensors))
                for version in (2, 3):
                    embed_model.perturb(tensors, 0.01, g)
                    if version == 3:
                        embed_model.write_special(tensors)
                    results = self.refit_ranks(version, {"p1": (p1, tensors), "p0": (p0, tensors)})
                    self.assertEqual(results["p0"]["verified_receivers"], self.RECEIVERS)
                    self.assertEqual((p0.version, p1.version), (version, version))
                    self.check_servers(f"check {version}", version, embed_model.hashes(tensors))

    def test_ranks_hold_only_their_parts(self):
        """The trainer's own layout (group_parts): rank 0 holds the first half of model.0.weight and
        every other tensor from the first, rank 1 the rest; each gives a TensorSpec for what it does
        not hold, and refits with its own tensors only. Every server ends bit-exact."""
        g = torch.Generator().manual_seed(12)
        tensors = embed_model.trainer_tensors()
        names = [n for n in tensors if n != "model.0.weight"]
        cut = tensors["model.0.weight"].numel() // 2
        parts = [[("model.0.weight", 0, cut)] + names[0::2],
                 [("model.0.weight", cut, tensors["model.0.weight"].numel())] + names[1::2]]
        held = [set(names[0::2]) | {"model.0.weight"}, set(names[1::2]) | {"model.0.weight"}]

        def view(rank):  # what rank holds: its tensors, and a TensorSpec for the others
            return {n: (t if n in held[rank] else
                        deltacast.TensorSpec(n, deltacast._buffers.as_buffer(n, t).dtype, tuple(t.shape)))
                    for n, t in tensors.items()}

        common = dict(listen=LOOPBACK, topology="binary", chunk_bytes="256KiB", log_level="warn", group_size=2,
                      group_parts=parts)
        with deltacast.Producer(view(0), receivers=self.RECEIVERS, group_rank=0, **common) as p0:
            with deltacast.Producer(view(1), group_rank=1, coordinator=p0.url, **common) as p1:
                self.servers = [_Server(p0.url, rank) for rank in range(1, self.RECEIVERS + 1)]
                starters = [_Starter(p1), _Starter(p0)]
                for report in [s.result() for s in starters]:
                    self.assertTrue(report["committed"], report)
                for server in self.servers:
                    server.reply()
                self.check_servers("check 1", 1, embed_model.hashes(tensors))
                for version in (2, 3):
                    embed_model.perturb(tensors, 0.02, g)
                    self.refit_ranks(version, {"p1": (p1, {k: tensors[k] for k in held[1]}),
                                               "p0": (p0, {k: tensors[k] for k in held[0]})})
                    self.check_servers(f"check {version}", version, embed_model.hashes(tensors))

    def test_overlapping_parts_are_refused_naming_the_ranks(self):
        tensors = embed_model.trainer_tensors()
        names = list(tensors)
        parts = [names, [names[0]]]  # names[0] claimed by both
        with self.assertRaises(deltacast.Error) as caught:
            deltacast.Producer(tensors, receivers=1, group_rank=0, group_size=2, group_parts=parts, listen=LOOPBACK)
        self.assertIn("ranks 0 and 1", str(caught.exception))
        with self.assertRaises(deltacast.Error) as caught:
            deltacast.Producer(tensors, receivers=1, group_rank=0, group_size=2, group_parts=[names, ["nope"]],
                               listen=LOOPBACK)
        self.assertIn("'nope'", str(caught.exception))
        for text, words in (("[not json", "not JSON"), ('[["a"]]', "one entry per rank (2)")):
            with self.assertRaises(deltacast.Error) as caught:
                deltacast.Producer(tensors, receivers=1, group_rank=0, group_size=2, group_parts=text, listen=LOOPBACK)
            self.assertIn(words, str(caught.exception))

    def test_a_rank_needs_its_coordinator(self):
        tensors = embed_model.trainer_tensors()
        with self.assertRaises(deltacast.Error) as caught:
            deltacast.Producer(tensors, group_rank=1, group_size=2, listen=LOOPBACK)
        self.assertIn("coordinator", str(caught.exception))


if __name__ == "__main__":
    unittest.main()

