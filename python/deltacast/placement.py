"""Placements (docs/placement.md, docs/embedding.md "Placements for an engine"): which slices of
which checkpoint tensors each of a worker's buffers holds, in the form the placement files take
(config/placement_file.h) and Python writes: {buffer: [(tensor, dim, start, stop), ...]}, or
{buffer: {"parts": [...], "shape": [...]}} for a padded buffer. json.dump of it is a placement
file `deltacast placement check` reads.

llama_tp_placement is codec::llama_tp_placement (codec/tp_placement.h) in Python: the same buffers,
in the same order, with the same parts (tests/python/test_placement.py checks that the two cut a
checkpoint into identical shards). Pure Python: nothing here calls the library.
"""

__all__ = ["llama_tp_placement"]


def _even(shapes, name, dim, rank, size):
    shape = shapes.get(name)
    if shape is None:
        raise ValueError(f"tp placement: the checkpoint has no tensor '{name}'")
    if dim >= len(shape) or shape[dim] % size != 0:
        raise ValueError(f"tp placement: tensor '{name}' dim {dim} does not split {size} ways")
    per = shape[dim] // size
    return (name, dim, rank * per, (rank + 1) * per)


def llama_tp_placement(manifest, rank, size, vocab_pad=64):
    """The placement of TP rank `rank` of `size` of a Llama-style model, as vLLM and SGLang shard it.

    manifest: [(name, dtype, shape)] in the checkpoint's order (what Receiver.join returns), or
    [(name, shape)]. Returns {buffer: parts} in that order:
      - q/k/v fuse into `*.self_attn.qkv_proj.weight` and gate/up into `*.mlp.gate_up_proj.weight`,
        each part this rank's rows (dim 0);
      - `*.self_attn.o_proj.weight` and `*.mlp.down_proj.weight`: this rank's columns (dim 1);
      - `model.embed_tokens.weight` and `lm_head.weight`: this rank's vocabulary rows, the
        vocabulary padded to a multiple of `vocab_pad` and split evenly ({"parts", "shape"}: the
        padded buffer); a rank whose rows are all padding has no such buffer;
      - every other tensor whole (a 0-d tensor is not held).
    Raises ValueError for a rank that is not a worker, a missing fused partner, or a split
    dimension `size` does not divide. Key/value heads fewer than `size` (replicated by vLLM) are
    not expressed: write those parts yourself (docs/embedding.md).
    """
    if size <= 0 or not 0 <= rank < size or vocab_pad <= 0:
        raise ValueError(f"tp placement: rank {rank} of {size} (vocab pad {vocab_pad}) is not a worker")
    entries = [(e[0], tuple(int(d) for d in e[-1])) for e in manifest]
    shapes = dict(entries)
    out = {}
    for name, shape in entries:
        if name.endswith("self_attn.q_proj.weight"):
            p = name[: -len("q_proj.weight")]
            out[p + "qkv_proj.weight"] = [_even(shapes, p + x + "_proj.weight", 0, rank, size) for x in "qkv"]
        elif name.endswith("mlp.gate_proj.weight"):
            p = name[: -len("gate_proj.weight")]
            out[p + "gate_up_proj.weight"] = [_even(shapes, p + x + "_proj.weight", 0, rank, size) for x in ("gate", "up")]
        elif name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            out[name] = [_even(shapes, name, 1, rank, size)]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            if len(shape) != 2:
                raise ValueError(f"tp placement: '{name}' is not a matrix")
            padded = -(-shape[0] // vocab_pad) * vocab_pad
            per = -(-padded // size)
            begin = rank * per
            if begin >= shape[0]:
                continue  # all padding
            out[name] = {"parts": [(name, 0, begin, min(shape[0], begin + per))], "shape": [per, shape[1]]}
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")):
            continue  # fused above
        elif shape:
            out[name] = [(name, 0, 0, shape[0])]
    return out
