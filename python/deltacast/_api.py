"""Producer and Receiver over the C API (the rules are in the package docstring, deltacast/__init__.py)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import datetime
import json
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import _buffers, _lib
from ._errors import STATUS, Error, status_name

LIB, LIBRARY_PATH = _lib.load()

# dc_dtype: safetensors name -> enum value, read from the library itself.
DTYPE_CODES = {LIB.dc_dtype_name(code).decode(): code for code in range(len(_buffers.DTYPE_SIZES))}
if set(DTYPE_CODES) != set(_buffers.DTYPE_SIZES):  # pragma: no cover (a library from another header)
    raise _lib.LibraryNotFoundError(f"deltacast: {LIBRARY_PATH} names its dtypes {sorted(DTYPE_CODES)}; "
                                    f"this binding expects {sorted(_buffers.DTYPE_SIZES)}")
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}

EVENT_KINDS = {1: "committed", 2: "rolled_back", 3: "failed", 4: "ended"}

# How long one dc_receiver_wait_version call may block: waits are made of such slices so that
# Ctrl-C (KeyboardInterrupt) and close() from another thread are seen within this time.
_WAIT_SLICE_S = 0.2

# Set on a deltacast thread while it runs a Python event callback (closing from there would make
# the thread join itself).
_callback_thread = threading.local()


def library_version() -> str:
    """The loaded libdeltacast's "MAJOR.MINOR.PATCH"."""
    return LIB.dc_version_string().decode()


def _last_error(status: int, call: str) -> Error:
    """The Error of `status`, with dc_last_error() (call it on the failing thread, right after)."""
    text = LIB.dc_last_error()
    message = text.decode("utf-8", "replace") if text else f"{call} failed"
    name = status_name(status)
    if name == "DC_UNKNOWN_STATUS":
        name = LIB.dc_status_name(status).decode()
    return Error(name, message, status)


def _check(status: int, call: str) -> int:
    if status < 0:
        raise _last_error(status, call)
    return status


def _timeout_ms(timeout: Optional[float], none_means: int) -> int:
    if timeout is None:
        return none_means
    if timeout < 0:
        return -1
    return max(1, int(round(timeout * 1000)))


# ---- options ----------------------------------------------------------------------------------

def _option_text(key: str, value: Any) -> str:
    if key == "held_digest" and isinstance(value, int) and not isinstance(value, bool):
        return f"0x{value:016x}"  # Receiver.digest is an int; the C API reads 0x-prefixed hex
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.timedelta):
        return f"{int(round(value.total_seconds() * 1000))}ms"
    if isinstance(value, (int, float)) and key.startswith("timeouts."):
        return f"{int(round(value * 1000))}ms"  # a bare number of seconds
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if key == "group_parts" and isinstance(value, (list, tuple)):
        # One list per rank of tensor names or (name, first, end) element ranges (deltacast.h).
        return json.dumps([[list(item) if isinstance(item, tuple) else item for item in part] for part in value])
    raise Error("DC_ERR_INVALID_ARGUMENT", f"option '{key}': a {type(value).__name__} value cannot be passed "
                                           f"(str, int, float, bool, timedelta or a path)")


def _flatten_options(options: Mapping, prefix: str = "") -> List[Tuple[str, str]]:
    """[(dotted key, text)]: nested dicts become dotted keys, None values are skipped, and "config"
    comes first (a YAML file replaces what was set before it; the DELTACAST_* environment is
    applied by the library at create and over a config file, as the CLI does)."""
    flat = []
    for key, value in options.items():
        if value is None:
            continue
        dotted = prefix + str(key)
        if isinstance(value, Mapping):
            flat += _flatten_options(value, dotted + ".")
        else:
            flat.append((dotted, _option_text(dotted, value)))
    if not prefix:
        flat.sort(key=lambda kv: 0 if kv[0] == "config" else 1)
    return flat


def _merge_options(named: Dict[str, Any], options: Optional[Mapping], more: Dict[str, Any]) -> Dict[str, Any]:
    merged: Dict[str, Any] = {}
    for source in (options or {}), named, more:
        for key, value in source.items():
            if value is not None:
                merged[key] = value
    return merged


def _shape_array(shape: Tuple[int, ...]):
    return (ctypes.c_int64 * max(1, len(shape)))(*shape)


# ---- handles ----------------------------------------------------------------------------------

class _Handle:
    """An owned C handle. Calls borrow it with use(); close() refuses new calls, waits for the ones
    in flight (a free under a running call would be a use-after-free) and frees it once.

    serialized: calls take the handle one at a time (the producer: one host thread drives it);
    otherwise any number at once (the receiver's calls are thread-safe, except free)."""

    def __init__(self, what: str, address: int, free, serialized: bool):
        self._what = what
        self._address = address
        self._free = free
        self._serialized = serialized
        self._cv = threading.Condition(threading.RLock())
        self._busy = 0

    @property
    def closed(self) -> bool:
        return self._address is None

    @contextlib.contextmanager
    def use(self):
        with self._cv:
            if self._serialized:
                while self._busy and self._address is not None:
                    self._cv.wait()
            if self._address is None:
                raise Error("DC_ERR_STATE", f"the {self._what} is closed")
            self._busy += 1
            address = self._address
        try:
            yield address
        finally:
            with self._cv:
                self._busy -= 1
                self._cv.notify_all()

    def close(self):
        with self._cv:
            if self._address is None:
                return
            address, self._address = self._address, None
            while self._busy:
                self._cv.wait()
        self._free(address)


_live = weakref.WeakSet()


@atexit.register
def _close_all_at_exit():
    """Stops deltacast's threads before the interpreter finalizes (a callback into a finalizing
    interpreter would crash): producers first (they say BYE), then receivers."""
    for obj in sorted(list(_live), key=lambda o: not isinstance(o, Producer)):
        try:
            obj.close()
        except Exception:  # noqa: BLE001 (exiting anyway)
            pass


def _close_from_finalizer(handle: Optional[_Handle], borrowed: Tuple[Any, ...]):
    """__del__'s close. `borrowed`: what C uses until the handle is freed (tensors, callbacks)."""
    if handle is None or handle.closed:
        return
    if getattr(_callback_thread, "active", False):
        # The last reference died inside an event callback, on deltacast's thread, which the free
        # must join: free on another thread, which keeps what C borrows alive until then.
        def close_later():
            handle.close()
            del borrowed[:]
        borrowed = list(borrowed)
        threading.Thread(target=close_later, name="deltacast-close", daemon=True).start()
    else:
        handle.close()


# ---- receiver ---------------------------------------------------------------------------------

class TensorSpec(NamedTuple):
    """One manifest entry: name, dtype (safetensors spelling, "BF16"), shape (a tuple)."""
    name: str
    dtype: str
    shape: Tuple[int, ...]


class Event(NamedTuple):
    """A receiver event. kind: "committed" (a version is in the buffers), "rolled_back" (a version
    was aborted: the buffers hold the previous one; version is the aborted one), "failed" (the
    receiver stopped with an error: status, status_name, message say which), "ended" (the producer
    said BYE)."""
    kind: str
    version: int
    status: int
    status_name: str
    message: str


def _event(kind: int, version: int, status: int, message: Optional[bytes]) -> Event:
    return Event(EVENT_KINDS.get(kind, f"unknown({kind})"), int(version), int(status), status_name(status),
                 message.decode("utf-8", "replace") if message else "")


class _HandleOwner:
    """What Receiver and Producer share: `closed`, the context manager, and a finalizer that
    closes the handle while keeping the borrowed buffers alive until it is closed."""

    _handle: Optional[_Handle] = None

    def _borrowed(self) -> Tuple[Any, ...]:
        return ()

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            _close_from_finalizer(self._handle, self._borrowed())
        except Exception:  # noqa: BLE001 (a finalizer must not raise)
            pass


class Receiver(_HandleOwner):
    """A server's end: joins the producer, then deltacast's threads write every committed version
    into the caller's own tensors, in place.

        r = deltacast.Receiver(producer=url, rank=1, listen="tcp://127.0.0.1:0")
        manifest = r.join(timeout=120)      # [TensorSpec(name, dtype, shape)]
        r.attach(tensors)                   # name -> zero-filled writable tensor/array, same dtype/shape
        r.start()
        r.wait_version(2, timeout=300)

    Options: producer, rank (1..N), listen, cluster, secret_file, gated, and any key of
    docs/config.md a receiver uses, as keywords or through options= (a nested dict gives dotted
    keys: timeouts={"peer": "5s"}; a bare number under timeouts.* is seconds).

    held_version=, held_digest= (an int, as `digest` gave it): a restarted server whose tensors
    still hold that committed version rejoins by replaying the deltas after it (docs/embedding.md).

    gated=True is the apply gate: refits are verified and committed without touching the
    tensors; committed versions queue (pending()) until the server calls apply() at a safe point,
    e.g. between generation steps. The bootstrap and catch-up snapshots are written at once.
    """

    def __init__(self, producer: Optional[str] = None, rank: Optional[int] = None, listen: Optional[str] = None,
                 *, cluster: Optional[str] = None, secret_file=None, gated: bool = False,
                 options: Optional[Mapping] = None, **more):
        self._handle: Optional[_Handle] = None
        self._attached: Dict[str, Any] = {}
        self._manifest: Optional[List[TensorSpec]] = None
        self._callbacks: List[Any] = []  # every C thunk ever installed (C may still be running one)
        self._poll_lock = threading.Lock()
        address = ctypes.c_void_p()
        _check(LIB.dc_receiver_create(ctypes.byref(address)), "dc_receiver_create")
        self._handle = _Handle("receiver", address.value, LIB.dc_receiver_free, serialized=False)
        _live.add(self)
        named = {"producer": producer, "rank": rank, "listen": listen, "cluster": cluster,
                 "secret_file": secret_file, "gated": bool(gated)}
        try:
            with self._handle.use() as h:
                for key, text in _flatten_options(_merge_options(named, options, more)):
                    _check(LIB.dc_receiver_set(h, key.encode(), text.encode()), f"dc_receiver_set('{key}')")
        except BaseException:
            self.close()
            raise

    # -- life cycle --

    def join(self, timeout: Optional[float] = 120) -> List[TensorSpec]:
        """Reaches the producer (retrying for `timeout` seconds; None: timeouts.join) and returns
        the manifest. Blocks without holding the GIL."""
        with self._handle_use() as h:
            _check(LIB.dc_receiver_join(h, _timeout_ms(timeout, 0)), "dc_receiver_join")
            self._manifest = self._read_manifest(h)
        return list(self._manifest)

    @staticmethod
    def _read_manifest(h) -> List[TensorSpec]:
        count = ctypes.c_size_t()
        _check(LIB.dc_receiver_tensor_count(h, ctypes.byref(count)), "dc_receiver_tensor_count")
        manifest = []
        for index in range(count.value):
            name, dtype, ndim = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_int()
            _check(LIB.dc_receiver_tensor(h, index, ctypes.byref(name), ctypes.byref(dtype), ctypes.byref(ndim),
                                          None, 0), "dc_receiver_tensor")
            shape = (ctypes.c_int64 * max(1, ndim.value))()
            _check(LIB.dc_receiver_tensor(h, index, None, None, None, shape, ndim.value), "dc_receiver_tensor")
            manifest.append(TensorSpec(name.value.decode(), DTYPE_NAMES.get(dtype.value, str(dtype.value)),
                                       tuple(int(shape[i]) for i in range(ndim.value))))
        return manifest

    @property
    def manifest(self) -> Optional[List[TensorSpec]]:
        """The producer's manifest (after join), in checkpoint order; else None."""
        return None if self._manifest is None else list(self._manifest)

    def attach(self, tensors, dtypes: Optional[Mapping[str, str]] = None, placement: Optional[Mapping] = None) -> None:
        """Registers the caller's tensors (dict name -> torch.Tensor/numpy.ndarray) after join,
        before start: refits are written into them in place, and this Receiver keeps them
        referenced until close(). They must be contiguous, writable, on the CPU, of the manifest's
        dtype (or dtypes={name: "BF16"} for a uint16 array) and shape, and hold zeros at start
        (version 0: the bootstrap fills them). Every buffer is checked before any is attached; if
        the C library then refuses one, the ones before it stay attached.

        placement= (docs/placement.md): the tensors are an engine's own buffers, each holding
        slices of checkpoint tensors: {buffer: [(tensor, dim, start, stop), ...]} (parts side by
        side along dim), or {buffer: {"parts": [...], "shape": [...]}} for a padded buffer, or
        {"stack": True} for experts stacked along a new leading dim; deltacast.placement
        .llama_tp_placement writes it for a vLLM-style tensor-parallel worker. `tensors` are then
        keyed by buffer name, every buffer of the placement given at once. The placement is
        checked against the manifest before anything is attached (deltacast.Error naming the
        buffer and the part); refits write only the elements of each buffer's parts, never its
        padding."""
        dtypes = dict(dtypes or {})
        buffers = [_buffers.as_buffer(name, obj, dtypes.get(name), writable=True)
                   for name, obj in _buffers.items(tensors)]
        with self._handle_use() as h:
            if placement is not None:
                missing = [name for name in dict(placement) if name not in {b.name for b in buffers}]
                if missing:
                    raise Error("DC_ERR_INVALID_ARGUMENT",
                                f"attach: placement buffers without a tensor: {', '.join(missing[:5])}")
                # Installed again on every call: a retry after a refused buffer starts afresh.
                text = json.dumps({str(name): _placement_entry(entry) for name, entry in dict(placement).items()})
                _check(LIB.dc_receiver_place(h, text.encode()), "dc_receiver_place")
            for b in buffers:
                status = LIB.dc_receiver_attach(h, b.name.encode(), DTYPE_CODES[b.dtype], len(b.shape),
                                                _shape_array(b.shape), b.address, b.nbytes, b.device, b.device_id)
                _check(status, f"dc_receiver_attach('{b.name}')")
                self._attached[b.name] = b.owner

    def start(self) -> None:
        """Starts serving and returns at once; every manifest tensor must be attached."""
        with self._handle_use() as h:
            _check(LIB.dc_receiver_start(h), "dc_receiver_start")

    def wait_version(self, version: int, timeout: Optional[float] = 300) -> int:
        """Blocks until the committed version is >= `version` and returns the committed version.
        Raises Error: DC_ERR_TIMEOUT after `timeout` seconds (None: no bound), or the receiver's
        failure (or DC_ERR_STATE when it ended before that version). Interruptible (Ctrl-C)."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, max(0.0, deadline - time.monotonic()))
            try:
                with self._handle_use() as h:
                    status = LIB.dc_receiver_wait_version(h, int(version), int(left * 1000))
                    error = _last_error(status, "dc_receiver_wait_version") if status < 0 else None
            except Error as exc:
                if self.closed:
                    raise Error("DC_ERR_CANCELLED", f"the receiver was closed while waiting for version {version}") \
                        from exc
                raise
            if status == STATUS["DC_OK"]:
                return self.version
            if status != STATUS["DC_ERR_TIMEOUT"]:
                raise error
            if deadline is not None and time.monotonic() >= deadline:
                raise Error("DC_ERR_TIMEOUT", f"version {version} was not committed within {timeout} s "
                                              f"(committed: {self.version})")

    @property
    def version(self) -> int:
        """The committed version (0 before the bootstrap)."""
        return self._version_and_digest()[0]

    @property
    def digest(self) -> int:
        """The committed version's combined digest (a 64-bit int)."""
        return self._version_and_digest()[1]

    def _version_and_digest(self) -> Tuple[int, int]:
        version, digest = ctypes.c_uint64(), ctypes.c_uint64()
        with self._handle_use() as h:
            _check(LIB.dc_receiver_version(h, ctypes.byref(version), ctypes.byref(digest)), "dc_receiver_version")
        return version.value, digest.value

    # -- the apply gate --

    def pending(self) -> List[int]:
        """Committed versions not yet written into the tensors, oldest first (gated=True; always
        [] otherwise)."""
        applied, count = ctypes.c_uint64(), ctypes.c_size_t()
        with self._handle_use() as h:
            _check(LIB.dc_receiver_pending(h, ctypes.byref(applied), ctypes.byref(count)), "dc_receiver_pending")
        return list(range(applied.value + 1, applied.value + 1 + count.value))

    @property
    def applied_version(self) -> int:
        """The version the tensors hold (the committed version unless versions are pending)."""
        applied = ctypes.c_uint64()
        with self._handle_use() as h:
            _check(LIB.dc_receiver_pending(h, ctypes.byref(applied), None), "dc_receiver_pending")
        return applied.value

    def apply(self) -> int:
        """Writes every pending version into the tensors, in order, and returns the version they
        hold. Call it where nothing reads them (a safe point); refits keep flowing meanwhile. It
        cannot fail on data: every version was verified before it committed. Without gated=True
        it does nothing. Runs without the GIL."""
        applied = ctypes.c_uint64()
        with self._handle_use() as h:
            _check(LIB.dc_receiver_apply(h, ctypes.byref(applied)), "dc_receiver_apply")
        return applied.value

    def reattach(self, name: str, tensor, dtype: Optional[str] = None) -> None:
        """The server moved tensor `name` to `tensor` (a new contiguous, writable CPU buffer that
        already holds the same bits, e.g. after re-binding parameters): refits land there from
        now on, and the old one is released. After start and the bootstrap. Refused with nothing
        changed when the bits, dtype or shape differ."""
        b = _buffers.as_buffer(name, tensor, dtype, writable=True)
        spec = {t.name: t for t in (self._manifest or [])}.get(name)
        if spec is not None and (spec.dtype != b.dtype or tuple(spec.shape) != tuple(b.shape)):
            raise Error("DC_ERR_INVALID_ARGUMENT", f"reattach('{name}'): the manifest says {spec.dtype} "
                                                   f"{list(spec.shape)}, the new buffer is {b.dtype} {list(b.shape)}")
        with self._handle_use() as h:
            _check(LIB.dc_receiver_reattach(h, name.encode(), b.address, b.nbytes, b.device, b.device_id),
                   f"dc_receiver_reattach('{name}')")
        self._attached[name] = b.owner

    # -- events --

    def on_event(self, callback: Optional[Callable[[Event], None]]) -> None:
        """Installs callback(event) (None removes it); before start. It runs on a deltacast thread
        (holding the GIL while it runs): keep it short, and do not close() this receiver from it.
        An exception it raises is printed, not propagated. Events are queued for poll_event()
        whether or not a callback is set."""
        if callback is None:
            thunk = None
        else:
            def thunk(_user, kind, version, status, message):
                _callback_thread.active = True
                try:
                    callback(_event(kind, version, status, message))
                except BaseException:  # noqa: BLE001 (nowhere to raise it on deltacast's thread)
                    print("deltacast: exception in an event callback:", file=sys.stderr)
                    traceback.print_exc()
                finally:
                    _callback_thread.active = False
            thunk = _lib.EVENT_CALLBACK(thunk)
        with self._handle_use() as h:
            _check(LIB.dc_receiver_set_event_callback(h, thunk, None), "dc_receiver_set_event_callback")
        if thunk is not None:
            self._callbacks.append(thunk)

    def poll_event(self) -> Optional[Event]:
        """The oldest queued event (the queue keeps the last 1024), or None when there is none."""
        kind, version, status, message = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_int(), ctypes.c_char_p()
        with self._poll_lock, self._handle_use() as h:  # the message lives until the next poll
            result = _check(LIB.dc_receiver_poll_event(h, ctypes.byref(kind), ctypes.byref(version),
                                                       ctypes.byref(status), ctypes.byref(message)),
                            "dc_receiver_poll_event")
            if result == STATUS["DC_PENDING"]:
                return None
            return _event(kind.value, version.value, status.value, message.value)

    # -- closing --

    def _handle_use(self):
        if self._handle is None:
            raise Error("DC_ERR_STATE", "the receiver is closed")
        return self._handle.use()

    def close(self) -> None:
        """Leaves the tree, stops deltacast's threads and frees the handle (idempotent). The
        attached tensors keep the last committed version and are no longer referenced. Waits for
        calls in flight on other threads (a join in progress included)."""
        if getattr(_callback_thread, "active", False):
            raise Error("DC_ERR_STATE", "close() from an event callback (it runs on the thread close() must stop)")
        if self._handle is not None:
            self._handle.close()
        self._attached = {}

    def _borrowed(self) -> Tuple[Any, ...]:
        return (self._attached, self._callbacks)

    def __repr__(self):
        state = "closed" if self.closed else f"version {self.version}"
        return f"<deltacast.Receiver {state}, {len(self._attached)} tensors attached>"


# ---- producer ---------------------------------------------------------------------------------

def _placement_entry(entry):
    """One buffer of a placement as its JSON form: parts as [tensor, dim, start, stop(, at)]."""
    if isinstance(entry, Mapping):
        out = dict(entry)
        out["parts"] = [list(p) if not isinstance(p, Mapping) else dict(p) for p in entry.get("parts", [])]
        return out
    return [list(p) if not isinstance(p, Mapping) else dict(p) for p in entry]


def _placeholder(name: str, spec: "TensorSpec") -> _buffers.Buffer:
    """A manifest entry without data: a producer group's rank that holds none of this tensor (it
    lies outside its part). The library refuses it at start if it is in the rank's part."""
    if spec.name != name:
        raise Error("DC_ERR_INVALID_ARGUMENT", f"tensor '{name}': its TensorSpec is named '{spec.name}'")
    if spec.dtype not in DTYPE_CODES:
        raise Error("DC_ERR_INVALID_ARGUMENT", f"tensor '{name}': unknown dtype '{spec.dtype}'")
    return _buffers.Buffer(name, spec.dtype, tuple(int(d) for d in spec.shape), 0, 0, _buffers.DEVICE_HOST, 0, None)


class Producer(_HandleOwner):
    """A trainer's end: serves `tensors` (dict name -> torch.Tensor/numpy.ndarray, in checkpoint
    order: the manifest) to `receivers` receivers through a relay tree.

        p = deltacast.Producer(tensors, receivers=3, listen="tcp://127.0.0.1:0", topology="binary")
        p.url                        # give it to the receivers
        p.start(timeout=120)         # waits for all of them, sends version 1
        report = p.refit(tensors)    # after each optimizer step
        p.close()

    The producer listens from construction on (p.url is known at once; the receivers may connect
    before start). The tensors are read in place, never copied: at start and at each refit. They stay referenced
    by this Producer until replaced by a refit or until close(). Options: receivers, listen,
    topology, secret_file, chunk_bytes, threads, and any key of docs/config.md a producer uses, as
    keywords or through options= (nested dicts give dotted keys). dtypes={name: "BF16"} names what
    a numpy array's bits hold (uint16 -> BF16); it also applies to that tensor's refits.
    Calls on one Producer run one at a time (from any thread).

    A producer group's rank (docs/producer-group.md): group_rank=, group_size=, coordinator= (rank
    0's url, for ranks 1..M-1), and optionally group_parts= (the trainer's own layout: one list per
    rank of tensor names or (name, first, end) element ranges, the same on every rank). A rank may
    give a deltacast.TensorSpec(name, dtype, shape) instead of a tensor it does not hold: the
    manifest needs every entry, the rank reads only its part's.
    """

    def __init__(self, tensors, *, receivers: Optional[int] = None, listen: Optional[str] = None,
                 topology: Optional[str] = None, secret_file=None, chunk_bytes=None, threads: Optional[int] = None,
                 dtypes: Optional[Mapping[str, str]] = None, options: Optional[Mapping] = None, **more):
        self._handle: Optional[_Handle] = None
        self._data: Dict[str, Any] = {}
        self._specs: Dict[str, _buffers.Buffer] = {}
        self._dtypes = dict(dtypes or {})
        self._report: Optional[dict] = None
        self._url: Optional[str] = None
        buffers = [_placeholder(name, obj) if isinstance(obj, TensorSpec) else
                   _buffers.as_buffer(name, obj, self._dtypes.get(name)) for name, obj in _buffers.items(tensors)]
        unknown = set(self._dtypes) - {b.name for b in buffers}
        if unknown:
            raise Error("DC_ERR_NOT_FOUND", f"dtypes names tensors that are not given: {sorted(unknown)}")
        address = ctypes.c_void_p()
        _check(LIB.dc_producer_create(ctypes.byref(address)), "dc_producer_create")
        self._handle = _Handle("producer", address.value, LIB.dc_producer_free, serialized=True)
        _live.add(self)
        named = {"receivers": receivers, "listen": listen, "topology": topology, "secret_file": secret_file,
                 "chunk_bytes": chunk_bytes, "threads": threads}
        try:
            with self._handle.use() as h:
                for key, text in _flatten_options(_merge_options(named, options, more)):
                    _check(LIB.dc_producer_set(h, key.encode(), text.encode()), f"dc_producer_set('{key}')")
                for b in buffers:
                    status = LIB.dc_producer_add_tensor(h, b.name.encode(), DTYPE_CODES[b.dtype], len(b.shape),
                                                        _shape_array(b.shape), b.address, b.nbytes, b.device,
                                                        b.device_id)
                    _check(status, f"dc_producer_add_tensor('{b.name}')")
                    self._data[b.name] = b.owner
                    self._specs[b.name] = dataclasses.replace(b, address=0, owner=None)  # not the memory
                # Listen now: the URL is then known at once, from any thread, even while start()
                # blocks (receivers that connect early wait for it).
                url = ctypes.c_char_p()
                _check(LIB.dc_producer_url(h, ctypes.byref(url)), "dc_producer_url")
                self._url = url.value.decode()
        except BaseException:
            self.close()
            raise

    @property
    def manifest(self) -> List[TensorSpec]:
        return [TensorSpec(b.name, b.dtype, b.shape) for b in self._specs.values()]

    @property
    def url(self) -> str:
        """The rendezvous URL with its real port (the producer listens from construction on)."""
        return self._url

    def start(self, timeout: Optional[float] = 120) -> dict:
        """Waits up to `timeout` seconds (None: timeouts.join) for every receiver, sends version 1
        (the tensors given to the constructor) and returns its report. Raises Error when it did not
        commit (DC_ERR_ABORTED, with .report). Blocks without holding the GIL."""
        with self._handle_use() as h:
            status = LIB.dc_producer_start(h, _timeout_ms(timeout, 0))
            error = _last_error(status, "dc_producer_start") if status < 0 else None
            report = self._read_report(h) if status in (STATUS["DC_OK"], STATUS["DC_ERR_ABORTED"]) else None
        if error is not None:
            error.report = report
            raise error
        return report

    def refit(self, tensors=None, dry_run: bool = False, dtypes: Optional[Mapping[str, str]] = None) -> dict:
        """Sends the tensors' current data as the next version (only changed elements travel) and
        returns the report (a dict: version, committed, changed_fraction, changes, payload_bytes,
        verified_receivers, refit_seconds, ...). `tensors` (name -> tensor, the manifest's dtypes and
        shapes; may be new objects each time, or a subset: the others keep their last data, which
        may have been changed in place) replaces what each name points at. dry_run: delivered and
        verified, then aborted (the receivers keep the previous version); committed is False.
        An aborted version returns its report with committed False; other failures raise Error.
        Blocks without holding the GIL."""
        merged_dtypes = dict(self._dtypes)
        merged_dtypes.update(dtypes or {})
        buffers = []
        for name, obj in _buffers.items(tensors):
            spec = self._specs.get(name)
            if spec is None:
                raise Error("DC_ERR_NOT_FOUND", f"no tensor '{name}' in the manifest")
            b = _buffers.as_buffer(name, obj, merged_dtypes.get(name))
            if (b.dtype, b.shape) != (spec.dtype, spec.shape):
                raise Error("DC_ERR_INVALID_ARGUMENT", f"tensor '{name}' is {b.dtype} {list(b.shape)}; the manifest "
                                                       f"says {spec.dtype} {list(spec.shape)}")
            if (b.device, b.device_id) != (spec.device, spec.device_id):
                raise Error("DC_ERR_INVALID_ARGUMENT", f"tensor '{name}' moved to another device than it was "
                                                       f"added on")
            buffers.append(b)
        with self._handle_use() as h:
            for b in buffers:
                _check(LIB.dc_producer_set_data(h, b.name.encode(), b.address, b.nbytes),
                       f"dc_producer_set_data('{b.name}')")
                self._data[b.name] = b.owner  # C points at it now
            status = LIB.dc_producer_refit(h, 1 if dry_run else 0)
            error = _last_error(status, "dc_producer_refit") if status < 0 else None
            if status in (STATUS["DC_OK"], STATUS["DC_ERR_ABORTED"]):
                return self._read_report(h)
        raise error

    def _read_report(self, h) -> dict:
        text = ctypes.c_char_p()
        _check(LIB.dc_producer_report(h, ctypes.byref(text)), "dc_producer_report")
        self._report = json.loads(text.value.decode()) if text.value else {}
        return self._report

    @property
    def report(self) -> Optional[dict]:
        """The last start/refit's report (None before start)."""
        return self._report

    @property
    def version(self) -> int:
        """The last committed version."""
        version = ctypes.c_uint64()
        with self._handle_use() as h:
            _check(LIB.dc_producer_version(h, ctypes.byref(version)), "dc_producer_version")
        return version.value

    def _handle_use(self):
        if self._handle is None:
            raise Error("DC_ERR_STATE", "the producer is closed")
        return self._handle.use()

    def close(self) -> None:
        """Says BYE to every receiver (when started), closes and frees (idempotent). Waits for a
        call in flight on another thread (a refit) to return first."""
        if self._handle is not None:
            self._handle.close()
        self._data = {}

    def _borrowed(self) -> Tuple[Any, ...]:
        return (self._data,)

    def __repr__(self):  # without a C call: one would wait for a refit in flight
        state = "closed" if self.closed else self._url
        last = f", last report: version {self._report.get('version')}" if self._report else ""
        return f"<deltacast.Producer {state}, {len(self._specs)} tensors{last}>"
