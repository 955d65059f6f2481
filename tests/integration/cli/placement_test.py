"""`deltacast placement`: a TP worker's placement written, checked and its shard cut, bit for bit.

    placement_test.py PATH/TO/deltacast

A 2M-parameter checkpoint from `deltacast synth`; for T = 2 and 4 and every rank:
  1. `placement tp` writes the rank's placement (YAML) and `placement check --extract` cuts the
     rank's buffers from the checkpoint into a .safetensors file;
  2. every buffer equals, bit for bit, what is computed here with numpy from the checkpoint's
     tensors, vLLM's way (independently of the C++ mapping): q/k/v and gate/up split by rows
     and concatenated, o_proj and down_proj split by columns, the vocabulary padded to a multiple
     of 64 and split evenly by rows (padding zero), norms whole; the ranks' shares add up;
  3. the same placement given as JSON (what Python's json.dumps of {buffer: [(tensor, dim, start,
     stop)]} writes) cuts the same bytes;
  4. bad input exits 1 with a clear message and writes nothing: a slice out of range (naming the
     buffer and part), malformed YAML (naming line and column), an unknown tensor, --extract
     without a checkpoint, a missing file.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

DC = sys.argv[1]


def run(*args, ok=True):
    p = subprocess.run([DC, *args], capture_output=True, text=True, timeout=120)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "BF16", t
        lo, hi = t["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], dtype=np.uint16).reshape(t["shape"])
    return out


def expected_shard(model, rank, size, pad=64):
    """vLLM's TP sharding of a Llama-like checkpoint, written out with numpy."""
    out = {}
    for name, w in model.items():
        if name.endswith("q_proj.weight"):
            base = name[: -len("q_proj.weight")]
            parts = [model[base + p + "_proj.weight"] for p in "qkv"]
            out[base + "qkv_proj.weight"] = np.concatenate([np.array_split(p, size, 0)[rank] for p in parts], 0)
        elif name.endswith("gate_proj.weight"):
            base = name[: -len("gate_proj.weight")]
            parts = [model[base + p + "_proj.weight"] for p in ("gate", "up")]
            out[base + "gate_up_proj.weight"] = np.concatenate([np.array_split(p, size, 0)[rank] for p in parts], 0)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            assert w.shape[1] % size == 0
            out[name] = w[:, rank * w.shape[1] // size:(rank + 1) * w.shape[1] // size]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            vocab = w.shape[0]
            per = -(-(-(-vocab // pad) * pad) // size)  # padded to a multiple of pad, split evenly
            buf = np.zeros((per, w.shape[1]), dtype=w.dtype)
            lo, hi = rank * per, min((rank + 1) * per, vocab)
            if hi > lo:
                buf[: hi - lo] = w[lo:hi]
                out[name] = buf
        elif name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            continue
        else:
            out[name] = w
    return out


def python_placement(model, rank, size, pad=64):
    """The same sharding as a Python placement dict: row ranges as np.array_split cuts them."""
    def rows(n):
        cuts = np.cumsum([0] + [len(x) for x in np.array_split(np.arange(n), size)])
        return int(cuts[rank]), int(cuts[rank + 1])

    out = {}
    for name, w in model.items():
        if name.endswith("q_proj.weight"):
            base = name[: -len("q_proj.weight")]
            out[base + "qkv_proj.weight"] = [(base + p + "_proj.weight", 0, *rows(model[base + p + "_proj.weight"].shape[0]))
                                             for p in "qkv"]
        elif name.endswith("gate_proj.weight"):
            base = name[: -len("gate_proj.weight")]
            out[base + "gate_up_proj.weight"] = [(base + p + "_proj.weight", 0, *rows(model[base + p + "_proj.weight"].shape[0]))
                                                 for p in ("gate", "up")]
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            n = w.shape[1] // size
            out[name] = [(name, 1, rank * n, (rank + 1) * n)]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            vocab = w.shape[0]
            per = -(-(-(-vocab // pad) * pad) // size)
            lo, hi = rank * per, min((rank + 1) * per, vocab)
            if hi > lo:
                out[name] = {"parts": [(name, 0, lo, hi)], "shape": [per, w.shape[1]]}
        elif not name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            out[name] = [(name, 0, 0, w.shape[0])]
    return out


def check_equal(got, want, what):
    if sorted(got) != sorted(want):
        sys.exit(f"FAIL: {what}: buffers {sorted(set(got) ^ set(want))} differ between the shard and numpy")
    for name in want:
        if got[name].shape != want[name].shape or got[name].tobytes() != want[name].tobytes():
            sys.exit(f"FAIL: {what}: buffer {name} differs from numpy's ({got[name].shape} vs {want[name].shape})")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        run("synth", "--out", f"{tmp}/ck", "--params", "2M", "--steps", "0", "--seed", "3")
        ck = f"{tmp}/ck/step-0000.safetensors"
        model = read_safetensors(ck)
        # The synthetic vocabulary (960) is a multiple of 64: at T = 4 it is padded to 1000, so the
        # last rank's vocabulary buffers hold 40 rows of padding.
        for size, pad in ((2, 64), (4, 1000)):
            held = 0
            for rank in range(size):
                yaml_path, shard = f"{tmp}/tp{rank}of{size}.yaml", f"{tmp}/tp{rank}of{size}.safetensors"
                run("placement", "tp", "--checkpoint", ck, "--rank", str(rank), "--size", str(size),
                    "--vocab-pad", str(pad), "-o", yaml_path)
                out = run("placement", "check", yaml_path, "--checkpoint", ck, "--extract", shard).stdout
                if "OK:" not in out:
                    sys.exit(f"FAIL: check said {out}")
                got = read_safetensors(shard)
                want = expected_shard(model, rank, size, pad)
                check_equal(got, want, f"TP {rank}/{size}")
                if size == 4 and rank == 3:
                    vocab = model["lm_head.weight"].shape[0]
                    if want["lm_head.weight"].shape[0] != 250 or vocab != 960:
                        sys.exit(f"FAIL: the padded case is not exercised (vocabulary {vocab})")
                held += sum(v.size for k, v in got.items() if "norm" not in k and "embed" not in k and "lm_head" not in k)
            whole = sum(v.size for k, v in model.items() if "norm" not in k and "embed" not in k and "lm_head" not in k)
            if held != whole:
                sys.exit(f"FAIL: TP {size}: the ranks hold {held} elements of the layers, the model {whole}")
        # The placement a Python host writes ({buffer: [(tensor, dim, start, stop)]}, padded
        # buffers with their shape), dumped as JSON: the same bytes.
        with open(f"{tmp}/p.json", "w") as f:
            json.dump(python_placement(model, 1, 2), f)
        run("placement", "check", f"{tmp}/p.json", "--checkpoint", ck, "--extract", f"{tmp}/json.safetensors")
        check_equal(read_safetensors(f"{tmp}/json.safetensors"), expected_shard(model, 1, 2), "JSON placement")

        # Bad input: exit 1, a clear message, nothing written.
        def refused(text, needle, *extra):
            path = f"{tmp}/bad.yaml"
            with open(path, "w") as f:
                f.write(text)
            target = f"{tmp}/bad.safetensors"
            r = run("placement", "check", path, *(extra or ("--checkpoint", ck)), "--extract", target, ok=False)
            if r.returncode != 1 or needle not in r.stderr or os.path.exists(target):
                sys.exit(f"FAIL: {text!r}: exit {r.returncode}, stderr {r.stderr!r} (wanted {needle!r})")

        refused("w: [[model.norm.weight, 0, 0, 100000]]\n", "buffer 'w' part 0")
        refused("w:\n  - [model.norm.weight, 0, 0, 4\n", "bad.yaml:3:")
        refused("w: [[model.nope.weight, 0, 0, 4]]\n", "model.nope.weight")
        refused("w: [[model.norm.weight, 0, 0, 4]]\n", "--extract needs --checkpoint", "--params", "2M")
        r = run("placement", "check", f"{tmp}/missing.yaml", "--checkpoint", ck, ok=False)
        if r.returncode != 1 or "missing.yaml" not in r.stderr:
            sys.exit(f"FAIL: a missing placement file: exit {r.returncode}, {r.stderr!r}")
    print("placement_test: OK")


if __name__ == "__main__":
    main()
