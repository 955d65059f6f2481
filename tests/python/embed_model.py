"""The model and the bit-level helpers shared by test_embed.py (the trainer) and embed_server.py.

A small torch model in bfloat16 (three Linear layers with odd sizes) plus an F32, an F16, a
one-element BF16 and a U8 tensor: about 1.7 MB. Everything is compared by the SHA-256 of the
tensors' bytes, never by value (NaN != NaN, -0.0 == 0.0 would hide a wrong bit).
"""

import hashlib

import torch

# The manifest: (name, safetensors dtype, shape), in checkpoint order.
MANIFEST = [
    ("model.0.weight", "BF16", (1024, 513)),
    ("model.0.bias", "BF16", (1024,)),
    ("model.2.weight", "BF16", (263, 1024)),
    ("model.2.bias", "BF16", (263,)),
    ("model.3.weight", "BF16", (7, 263)),
    ("model.3.bias", "BF16", (7,)),
    ("norm.f32", "F32", (1001,)),
    ("proj.f16", "F16", (37, 41)),
    ("scale.bf16", "BF16", (1,)),
    ("table.u8", "U8", (4099,)),
]


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(513, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 263),
                               torch.nn.Linear(263, 7)).to(torch.bfloat16)


def extra_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "norm.f32": torch.randn(1001, generator=g),
        "proj.f16": torch.randn(37, 41, generator=g).half(),
        "scale.bf16": torch.randn(1, generator=g).bfloat16(),
        "table.u8": torch.randint(0, 256, (4099,), generator=g, dtype=torch.uint8),
    }


def trainer_tensors(seed=7):
    """The trainer's weights: name -> tensor, in MANIFEST order."""
    torch.manual_seed(seed)
    model = make_model()
    tensors = {f"model.{name}": p.detach() for name, p in model.named_parameters()}
    tensors.update(extra_tensors(seed))
    return tensors


def server_tensors():
    """A server's weights, zero-filled (version 0): its model's own Parameters (requires_grad and
    all) and the extra tensors; returns (model, name -> tensor)."""
    model = make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    tensors = {f"model.{name}": p for name, p in model.named_parameters()}
    tensors.update({name: torch.zeros_like(t) for name, t in extra_tensors(0).items()})
    return model, tensors


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def int_view(t):
    """The tensor's bits as integers of the same size (a view: writes go to the tensor)."""
    return t.detach().view(_INT_OF_SIZE[t.element_size()]).reshape(-1)


def tensor_bytes(t):
    return int_view(t).numpy().tobytes()


def sha(t):
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def hashes(tensors):
    return {name: sha(t) for name, t in tensors.items()}


def snapshot(tensors):
    return {name: int_view(t).clone() for name, t in tensors.items()}


def count_changed(before, tensors):
    """Elements whose bits differ from `before` (a snapshot)."""
    return sum(int((before[name] != int_view(t)).sum()) for name, t in tensors.items())


def perturb(tensors, fraction, generator):
    """Changes `fraction` of each tensor's elements (at least one) by 1..3 units in the last place
    of their bit pattern (integer arithmetic on the bits, so every chosen element changes)."""
    for t in tensors.values():
        bits = int_view(t)
        k = max(1, int(round(fraction * bits.numel())))
        index = torch.randperm(bits.numel(), generator=generator)[:k]
        delta = torch.randint(1, 4, (k,), generator=generator).to(bits.dtype)
        bits[index] = bits[index] + delta


def _signed(value, bits):
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


# NaNs (quiet, negative with a payload, signalling), +inf, -inf, -0.0, the smallest subnormal, the
# largest negative subnormal.
SPECIAL_BITS = {
    "BF16": [0x7FC0, 0xFFC1, 0x7F81, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x807F],
    "F16": [0x7E00, 0xFE01, 0x7C01, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x83FF],
    "F32": [0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x807FFFFF],
}


def write_special(tensors):
    """Writes SPECIAL_BITS into elements spread over every floating-point tensor."""
    for name, dtype, _ in MANIFEST:
        if dtype not in SPECIAL_BITS:
            continue
        bits = int_view(tensors[name])
        width = 8 * tensors[name].element_size()
        values = torch.tensor([_signed(v, width) for v in SPECIAL_BITS[dtype]], dtype=bits.dtype)
        n = bits.numel()
        index = torch.tensor([(i * 7919 + 3) % n for i in range(len(values))])
        bits[index] = values  # a 1-element tensor ends with the last value
