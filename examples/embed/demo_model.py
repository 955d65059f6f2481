"""The model of the embedding demo (trainer.py, server.py) and the bit-level hash both sides print.

The trainer and every server build the same architecture from this file, so their parameters
have the same names, dtypes and shapes: the manifest the trainer's Producer announces is what a
server attaches its own parameters against.

Weights are compared by the SHA-256 of their raw bytes, never by value: NaN != NaN and
-0.0 == 0.0 would hide a wrong bit.
"""

import hashlib
import json
import os

import torch

HIDDEN = 1024


def build_model(dtype=torch.bfloat16):
    """A few layers (about 1.8M parameters; 3.5 MiB in bfloat16)."""
    return torch.nn.Sequential(
        torch.nn.Linear(512, HIDDEN), torch.nn.LayerNorm(HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.LayerNorm(HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, 256),
    ).to(dtype)


def parameters(model):
    """name -> the parameter's own tensor (param.data: same memory, no autograd), in order."""
    return {name: p.data for name, p in model.named_parameters()}


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw_bytes(tensor):
    """The tensor's bits as bytes (through an integer view of the same element size)."""
    return tensor.detach().view(_INT_OF_SIZE[tensor.element_size()]).reshape(-1).numpy().tobytes()


def bits_sha256(tensors):
    """One SHA-256 over every tensor's name and raw bytes, in the given order."""
    h = hashlib.sha256()
    for name, t in tensors.items():
        h.update(name.encode() + b"\0")
        h.update(raw_bytes(t))
    return h.hexdigest()


def write_json_atomically(path, obj):
    """Readers see the old file or the new one, never a part (tmp + rename in one directory)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
