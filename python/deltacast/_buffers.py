"""What the C API needs from a torch.Tensor or numpy.ndarray, read without copying it.

Rules:
  - Neither torch nor numpy is imported here: a torch tensor can only be passed by a program that
    imported torch, so the modules are looked up in sys.modules.
  - The memory is passed by address (tensor.data_ptr(), array.ctypes.data). Nothing is copied,
    converted or made contiguous: a buffer deltacast cannot use as it is is refused, with
    DC_ERR_INVALID_ARGUMENT (not C-contiguous, read-only where deltacast writes, big-endian, a
    conjugate or negative view, a sparse layout, an element type with no safetensors name) or
    DC_ERR_UNSUPPORTED (a device other than the CPU and CUDA).
  - `dtype` overrides the element type by its safetensors name when the element sizes agree:
    numpy has no bfloat16, so a uint16 array with dtype "BF16" holds BF16 bits.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from ._errors import Error

DEVICE_HOST = 0
DEVICE_CUDA = 1

# safetensors name -> bytes per element (the dc_dtype enum's order is in _api.DTYPE_CODES).
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8,
    "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
}

# torch dtype attribute -> safetensors name (attributes this torch lacks are skipped).
_TORCH_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "int32": "I32",
    "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16", "bfloat16": "BF16",
    "float32": "F32", "float64": "F64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}

# numpy dtype.name -> safetensors name ("bfloat16", "float8_*": ml_dtypes' extension types).
_NUMPY_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "int32": "I32",
    "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16", "bfloat16": "BF16",
    "float32": "F32", "float64": "F64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


@dataclass(frozen=True)
class Buffer:
    """One tensor's memory as the C API takes it. `owner` is the caller's object: whoever passes
    `address` to C keeps `owner` referenced for as long as C borrows the memory."""

    name: str
    dtype: str  # safetensors spelling
    shape: Tuple[int, ...]
    address: int
    nbytes: int
    device: int
    device_id: int
    owner: Any


def _invalid(name, why):
    return Error("DC_ERR_INVALID_ARGUMENT", f"tensor '{name}': {why}")


def _torch_dtype_name(torch, dtype):
    for attribute, safetensors in _TORCH_DTYPES.items():
        if getattr(torch, attribute, None) is dtype:
            return safetensors
    return None


def _from_torch(torch, name, tensor):
    if tensor.layout is not torch.strided:
        raise _invalid(name, f"layout {tensor.layout} is not supported (a dense, strided tensor is)")
    if not tensor.is_contiguous():
        raise _invalid(name, "is not contiguous; deltacast reads and writes the caller's memory in place and "
                             "never copies it (pass a contiguous tensor, e.g. .contiguous() once, and keep it)")
    if (hasattr(tensor, "is_conj") and tensor.is_conj()) or (hasattr(tensor, "is_neg") and tensor.is_neg()):
        raise _invalid(name, "is a lazy conjugate/negative view whose memory does not hold its values "
                             "(call .resolve_conj()/.resolve_neg() first)")
    device = tensor.device
    if device.type == "cpu":
        dev, dev_id = DEVICE_HOST, 0
    elif device.type == "cuda":
        dev, dev_id = DEVICE_CUDA, device.index if device.index is not None else 0
    else:
        raise Error("DC_ERR_UNSUPPORTED", f"tensor '{name}': device '{device}' is not supported (cpu or cuda)")
    dtype = _torch_dtype_name(torch, tensor.dtype)
    nbytes = tensor.numel() * tensor.element_size()
    return dtype, tuple(int(d) for d in tensor.shape), int(tensor.data_ptr()), nbytes, dev, dev_id, \
        tensor.element_size()


def _from_numpy(name, array, writable):
    if not array.flags.c_contiguous:
        raise _invalid(name, "is not C-contiguous; deltacast reads and writes the caller's memory in place and "
                             "never copies it (pass numpy.ascontiguousarray(...) once, and keep it)")
    if writable and not array.flags.writeable:
        raise _invalid(name, "is read-only (flags.writeable is False); deltacast writes refits into it")
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder != "little"):
        raise _invalid(name, "is big-endian; safetensors bytes are little-endian")
    dtype = _NUMPY_DTYPES.get(array.dtype.name) if array.dtype.fields is None else None
    return dtype, tuple(int(d) for d in array.shape), int(array.ctypes.data), int(array.nbytes), DEVICE_HOST, 0, \
        array.dtype.itemsize


def as_buffer(name: str, obj: Any, dtype: Optional[str] = None, writable: bool = False) -> Buffer:
    """The Buffer of `obj` (a torch.Tensor or numpy.ndarray) for tensor `name`.

    writable: deltacast will write into it (a receiver), so a read-only array is refused."""
    if not isinstance(name, str):
        raise Error("DC_ERR_INVALID_ARGUMENT", f"tensor names are str, not {type(name).__name__} ({name!r})")
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    if torch is not None and isinstance(obj, torch.Tensor):
        own, shape, address, nbytes, device, device_id, itemsize = _from_torch(torch, name, obj)
        kind = f"torch {obj.dtype}"
    elif numpy is not None and isinstance(obj, numpy.ndarray):
        own, shape, address, nbytes, device, device_id, itemsize = _from_numpy(name, obj, writable)
        kind = f"numpy {obj.dtype}"
    else:
        raise _invalid(name, f"a {type(obj).__module__}.{type(obj).__qualname__} is neither a torch.Tensor "
                             f"nor a numpy.ndarray")
    if dtype is not None:
        if dtype not in DTYPE_SIZES:
            raise _invalid(name, f"unknown dtype '{dtype}' (safetensors spellings: {', '.join(DTYPE_SIZES)})")
        if DTYPE_SIZES[dtype] != itemsize:
            raise _invalid(name, f"dtype {dtype} has {DTYPE_SIZES[dtype]}-byte elements; the {kind} buffer "
                                 f"has {itemsize}-byte ones")
        own = dtype
    if own is None:
        raise _invalid(name, f"element type {kind} has no safetensors name; pass dtypes={{'{name}': ...}} "
                             f"naming what its bits hold")
    if address == 0 and nbytes > 0:
        raise _invalid(name, "has no memory (data pointer is NULL)")
    return Buffer(name, own, shape, address, nbytes, device, device_id, obj)


def items(tensors):
    """(name, tensor) pairs of a mapping (in its order) or of an iterable of pairs."""
    if tensors is None:
        return []
    pairs = list(tensors.items()) if hasattr(tensors, "items") else list(tensors)
    seen = set()
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise Error("DC_ERR_INVALID_ARGUMENT", "tensors must be a dict name -> tensor or (name, tensor) pairs")
        if pair[0] in seen:
            raise Error("DC_ERR_INVALID_ARGUMENT", f"tensor '{pair[0]}' is given twice")
        seen.add(pair[0])
    return pairs
