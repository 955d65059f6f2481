"""The tiny Llama-like model of the tensor-parallel engine example (trainer.py, worker.py) and of
tests/python/test_tp_engine.py.

The trainer holds the full checkpoint under Hugging Face Llama names (make_checkpoint). A worker
never sees it whole: it holds the buffers a vLLM tensor-parallel worker holds (q/k/v fused into
qkv_proj and gate/up into gate_up_proj, split by rows; o_proj/down_proj split by columns; the
vocabulary padded to a multiple of 64 and split by rows; norms whole), in the layout
deltacast.placement.llama_tp_placement describes, and runs its share of a forward pass over them
(forward_shard).

Everything here is plain torch: the bits are compared through int16 views, never by value (NaN !=
NaN and -0.0 == 0.0 would hide a wrong bit).
"""

import torch

VOCAB = 1000          # padded to 1024 by the workers (VOCAB_PAD)
VOCAB_PAD = 64
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 8             # HEAD_DIM 16; as many key/value heads (q, k, v are all HIDDEN x HIDDEN)
HEAD_DIM = HIDDEN // HEADS
EPS = 1e-5


def layer_names(i):
    p = f"model.layers.{i}."
    return {
        "q": p + "self_attn.q_proj.weight", "k": p + "self_attn.k_proj.weight",
        "v": p + "self_attn.v_proj.weight", "o": p + "self_attn.o_proj.weight",
        "gate": p + "mlp.gate_proj.weight", "up": p + "mlp.up_proj.weight", "down": p + "mlp.down_proj.weight",
        "input_norm": p + "input_layernorm.weight", "post_norm": p + "post_attention_layernorm.weight",
    }


def checkpoint_shapes():
    """name -> shape, in the order Hugging Face's LlamaForCausalLM.named_parameters() gives them."""
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        n = layer_names(i)
        shapes.update({n["q"]: (HIDDEN, HIDDEN), n["k"]: (HIDDEN, HIDDEN), n["v"]: (HIDDEN, HIDDEN),
                       n["o"]: (HIDDEN, HIDDEN), n["gate"]: (INTERMEDIATE, HIDDEN),
                       n["up"]: (INTERMEDIATE, HIDDEN), n["down"]: (HIDDEN, INTERMEDIATE),
                       n["input_norm"]: (HIDDEN,), n["post_norm"]: (HIDDEN,)})
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    return shapes


def make_checkpoint(seed=0):
    """The trainer's full checkpoint: name -> bfloat16 tensor (about 1.2 MB)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in checkpoint_shapes().items():
        if len(shape) == 1:  # a norm's weight: around 1
            out[name] = (1 + 0.1 * torch.randn(shape, generator=g)).to(torch.bfloat16)
        else:
            out[name] = (0.05 * torch.randn(shape, generator=g)).to(torch.bfloat16)
    return out


def bits(t):
    """The tensor's bits as int16, flat (a view: writes go to the tensor)."""
    return t.view(torch.int16).reshape(-1)


def held_mask(name, shape, tp_rank, tp_size, vocab_pad=VOCAB_PAD):
    """Which elements of checkpoint tensor `name` TP rank `tp_rank` of `tp_size` holds (a bool
    tensor of `shape`), from the vLLM layout itself (not from deltacast.placement)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    if len(shape) == 1:
        mask[:] = True  # norms: every rank holds them whole
    elif name.endswith(("o_proj.weight", "down_proj.weight")):
        per = shape[1] // tp_size
        mask[:, tp_rank * per:(tp_rank + 1) * per] = True
    elif name in ("model.embed_tokens.weight", "lm_head.weight"):
        per = -(-(-(-shape[0] // vocab_pad) * vocab_pad) // tp_size)  # ceil(padded / size)
        mask[tp_rank * per:min(shape[0], (tp_rank + 1) * per)] = True
    else:  # q, k, v, gate, up
        per = shape[0] // tp_size
        mask[tp_rank * per:(tp_rank + 1) * per] = True
    return mask


def train_step(ckpt, generator, fraction=0.01, avoid=None):
    """A fake optimizer step, in place: about `fraction` of each tensor's elements (at least one)
    get new bits (old + N(0, 0.01); where that rounds to the same bits, the last bit flips, so
    every chosen element changes). avoid=(tp_rank, tp_size): choose only elements that worker
    does NOT hold, so its shard is unchanged (tensors it holds whole, the norms, are left alone).
    Returns the number of elements changed."""
    changed = 0
    for name, t in ckpt.items():
        flat = bits(t)
        if avoid is None:
            candidates = torch.arange(flat.numel())
        else:
            candidates = (~held_mask(name, tuple(t.shape), *avoid)).reshape(-1).nonzero().reshape(-1)
        if candidates.numel() == 0:
            continue
        k = max(1, int(round(fraction * candidates.numel())))
        index = candidates[torch.randperm(candidates.numel(), generator=generator)[:k]]
        values = t.reshape(-1)[index]
        new = (values.float() + 0.01 * torch.randn(k, generator=generator)).to(torch.bfloat16).view(torch.int16)
        old = flat[index]
        new = torch.where(new == old, old ^ 1, new)
        flat[index] = new
        changed += k
    return changed


# NaNs (quiet, negative with a payload, signalling), +inf, -inf, -0.0, the smallest subnormal, a
# negative subnormal: int16 patterns of bfloat16.
SPECIAL_BITS = [0x7FC0, 0xFFC1, 0x7F81, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x807F]


def write_special(ckpt, generator, per_tensor=64):
    """Writes SPECIAL_BITS at `per_tensor` random elements of every tensor (so every worker's
    shard of every 2-D tensor gets some). Returns nothing; use a bit snapshot to count changes."""
    values = torch.tensor([v - 0x10000 if v >= 0x8000 else v for v in SPECIAL_BITS], dtype=torch.int16)
    for t in ckpt.values():
        flat = bits(t)
        index = torch.randperm(flat.numel(), generator=generator)[:per_tensor]
        flat[index] = values[torch.arange(index.numel()) % values.numel()]


def shard_for(ckpt, tp_rank, tp_size, vocab_pad=VOCAB_PAD):
    """What a vLLM weight loader would load into TP rank `tp_rank`'s buffers from the full
    checkpoint (buffer name -> tensor; padding rows zero). trainer.py compares the workers with it."""
    out = {}
    for name, t in ckpt.items():
        if name.endswith("q_proj.weight"):
            p = name[:-len("q_proj.weight")]
            out[p + "qkv_proj.weight"] = torch.cat([_rows(ckpt[p + x + "_proj.weight"], tp_rank, tp_size)
                                                    for x in "qkv"])
        elif name.endswith("gate_proj.weight"):
            p = name[:-len("gate_proj.weight")]
            out[p + "gate_up_proj.weight"] = torch.cat([_rows(ckpt[p + x + "_proj.weight"], tp_rank, tp_size)
                                                        for x in ("gate", "up")])
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            per = t.shape[1] // tp_size
            out[name] = t[:, tp_rank * per:(tp_rank + 1) * per].clone()
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            per = -(-(-(-t.shape[0] // vocab_pad) * vocab_pad) // tp_size)
            begin, end = tp_rank * per, min(t.shape[0], (tp_rank + 1) * per)
            if begin < end:
                buf = torch.zeros(per, t.shape[1], dtype=t.dtype)
                buf[:end - begin] = t[begin:end]
                out[name] = buf
        elif not name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            out[name] = t.clone()
    return out


def _rows(t, tp_rank, tp_size):
    per = t.shape[0] // tp_size
    return t[tp_rank * per:(tp_rank + 1) * per]


# ---- a worker's forward pass over its own buffers -------------------------------------------------

def _rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()


def forward_shard(buffers, tokens, tp_rank, tp_size):
    """One generation step of TP rank `tp_rank` over its own buffers (read only): the vocabulary-
    parallel embedding of its rows, per layer column-parallel q/k/v and gate/up on its rows and
    row-parallel o_proj/down_proj on its columns, then its slice of the logits. Where vLLM
    all-reduces the row-parallel partial sums across the T workers, this worker just uses its own
    (the example runs no collective); the point is that every buffer is read between refits.
    Returns the logits of the last position for this rank's vocabulary rows (float32)."""
    embed = buffers["model.embed_tokens.weight"].float()
    per_vocab = embed.shape[0]
    local = tokens - tp_rank * per_vocab
    inside = (local >= 0) & (local < per_vocab)
    x = embed[local.clamp(0, per_vocab - 1)] * inside.unsqueeze(-1)        # masked lookup (then all-reduce)
    heads = HEADS // tp_size
    width = heads * HEAD_DIM
    seq = tokens.shape[0]
    causal = torch.full((seq, seq), float("-inf")).triu(1)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = _rms_norm(x, buffers[p + "input_layernorm.weight"])
        qkv = h @ buffers[p + "self_attn.qkv_proj.weight"].float().t()      # column-parallel
        q, k, v = (qkv[:, j * width:(j + 1) * width].reshape(seq, heads, HEAD_DIM).transpose(0, 1)
                   for j in range(3))
        attn = torch.softmax(q @ k.transpose(1, 2) / HEAD_DIM ** 0.5 + causal, dim=-1) @ v
        attn = attn.transpose(0, 1).reshape(seq, width)
        x = x + attn @ buffers[p + "self_attn.o_proj.weight"].float().t()   # row-parallel partial sum
        h = _rms_norm(x, buffers[p + "post_attention_layernorm.weight"])
        gate_up = h @ buffers[p + "mlp.gate_up_proj.weight"].float().t()    # column-parallel
        half = gate_up.shape[1] // 2
        act = torch.nn.functional.silu(gate_up[:, :half]) * gate_up[:, half:]
        x = x + act @ buffers[p + "mlp.down_proj.weight"].float().t()       # row-parallel partial sum
    h = _rms_norm(x[-1:], buffers["model.norm.weight"])
    return (h @ buffers["lm_head.weight"].float().t())[0]                   # this rank's logits
