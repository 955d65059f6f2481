"""deltacast for Python: bit-exact delta refit of model weights, embedded in a trainer or a server.

A pure-Python binding (ctypes, standard library only) over the C API of libdeltacast.so
(include/deltacast/deltacast.h; life cycle and threading rules in docs/embedding.md). torch and
numpy are optional: tensors of either are accepted, and neither is imported by the binding.

Trainer:

    import deltacast
    p = deltacast.Producer(dict(model.state_dict()), receivers=3, listen="tcp://0.0.0.0:29500")
    print(p.url)                    # the rendezvous URL with its real port
    p.start(timeout=120)            # waits for every receiver, sends version 1
    for step in ...:
        optimizer.step()
        report = p.refit(dict(model.state_dict()))   # dict: version, committed, changed_fraction, ...
    p.close()

Server:

    r = deltacast.Receiver(producer=url, rank=1, listen="tcp://0.0.0.0:0")
    manifest = r.join(timeout=120)  # [(name, dtype, shape)], dtype as "BF16", "F16", "F32", ...
    r.attach(dict(model.state_dict()))   # zero-filled, contiguous, same dtypes and shapes
    r.start()                       # returns at once: deltacast's threads apply refits in place
    r.wait_version(5, timeout=300)
    r.close()

Rules:
  - Zero copies. Tensors are passed to C by address (tensor.data_ptr(), array.ctypes.data): a
    receiver's tensors are written in place, a producer's are read in place at start and at each
    refit. A buffer that cannot be used as it is (not contiguous, read-only where deltacast writes,
    an unnamed element type, an unsupported device) is refused with Error before any C call.
    Every registered tensor stays referenced by its Producer/Receiver (C borrows the memory) until
    close(), or for a producer until a refit points its name at another tensor.
  - dtypes: torch bfloat16, float16, float32, uint8, int8 and float8_e4m3fn/e5m2 are what the
    codec handles today; bool, int16/32/64, uint16/32/64 and float64 map to their safetensors names
    and are refused by the library (DC_ERR_UNSUPPORTED) until the codec handles them. numpy
    arrays map the same way; numpy has no bfloat16, so pass a uint16 array with
    dtypes={name: "BF16"}. CUDA tensors are passed with their device (the library answers
    DC_ERR_UNSUPPORTED until its CUDA apply path exists).
  - Errors: every failure raises deltacast.Error with .status (int), .status_name
    ("DC_ERR_TIMEOUT", ...) and .message (dc_last_error(), or the binding's own reason). An aborted
    refit is not an error: Producer.refit returns its report with committed False.
  - The GIL: the library is loaded with ctypes.CDLL, which releases the GIL during every C call, so
    blocking calls (join, start, refit, wait_version) let other Python threads run, and event
    callbacks run on deltacast's threads, taking the GIL for their duration. wait_version waits in
    short slices, so Ctrl-C and close() from another thread interrupt it; join, start and refit
    return when their own bounds say.
  - A Producer listens from construction on (p.url is known at once, from any thread); its calls
    run one at a time. A Receiver's calls may come from any threads at once.
  - Handles: close() (also __exit__, __del__, and at interpreter exit) frees the C handle once;
    it waits for calls in flight on other threads. A closed object raises Error(DC_ERR_STATE).
  - Options are the YAML keys of docs/config.md, as keywords (chunk_bytes="4MiB", retain_versions=4)
    or options={...}; a nested dict gives dotted keys (timeouts={"peer": "5s"} is "timeouts.peer");
    bools become true/false, a bare number under timeouts.* is seconds.
  - The library: $DELTACAST_LIB, else the installed prefix's lib/ (and lib/<multiarch>/), else the
    source tree's build/capi/libdeltacast.so, else ctypes.util.find_library("deltacast"); its major
    version must be the binding's (deltacast._lib.EXPECTED_MAJOR). `import deltacast` raises
    ImportError (LibraryNotFoundError) saying where it looked when none is found.

Placements (a TP worker holding only its shard; docs/embedding.md): deltacast.placement builds
them (llama_tp_placement); the receiver's attach(..., placement=) comes with the tree's support.

Not here yet: gated apply (a receiver that holds a verified version until the server applies it:
Receiver(gated=True), pending(), apply()) and reattach (a server that reallocated a tensor) come
when the C API offers them.
"""

from ._errors import STATUS, Error
from ._lib import LibraryNotFoundError
from ._api import (
    DTYPE_CODES,
    LIBRARY_PATH,
    Event,
    Producer,
    Receiver,
    TensorSpec,
    library_version,
)

__version__ = library_version()

__all__ = [
    "DTYPE_CODES",
    "Error",
    "Event",
    "LIBRARY_PATH",
    "LibraryNotFoundError",
    "Producer",
    "Receiver",
    "STATUS",
    "TensorSpec",
    "library_version",
]
