"""deltacast.placement.llama_tp_placement against the C++ helper (codec::llama_tp_placement).

    DELTACAST_CLI=build/tools/deltacast python3 test_placement.py -v

For TP ranks of T = 2 (vocabulary pad 64) and T = 4 (pad 1000: the last rank's vocabulary buffers
hold padding rows), the Python placement dumped as JSON and the C++ one written by `deltacast
placement tp` each cut a `deltacast synth` checkpoint (`placement check --extract`): the two
shards are the same file, byte for byte (same buffers, order, shapes and bits). Bad arguments
raise ValueError naming the problem.
"""
import json
import os
import struct
import subprocess
import tempfile
import unittest

from deltacast.placement import llama_tp_placement

CLI = os.environ.get("DELTACAST_CLI", "build/tools/deltacast")


def run(*args):
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr}")
    return p.stdout


def manifest_of(path):
    """[(name, dtype, shape)] sorted by name, as the checkpoint's manifest (and Receiver.join) has it."""
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sorted((n, t["dtype"], t["shape"]) for n, t in header.items() if n != "__metadata__")


class LlamaTpPlacement(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        run("synth", "--out", f"{cls.tmp.name}/ck", "--params", "2M", "--steps", "0", "--seed", "7")
        cls.ck = f"{cls.tmp.name}/ck/step-0000.safetensors"
        cls.manifest = manifest_of(cls.ck)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_cuts_the_same_shards_as_the_cpp_helper(self):
        d = self.tmp.name
        padded = 0
        for size, pad in ((2, 64), (4, 1000)):
            for rank in range(size):
                with self.subTest(rank=rank, size=size):
                    placement = llama_tp_placement(self.manifest, rank, size, vocab_pad=pad)
                    padded += any(isinstance(v, dict) and v["shape"][0] > v["parts"][0][3] - v["parts"][0][2]
                                  for v in placement.values())
                    with open(f"{d}/py.json", "w") as f:
                        json.dump(placement, f)
                    run("placement", "check", f"{d}/py.json", "--checkpoint", self.ck, "--extract", f"{d}/py.st")
                    run("placement", "tp", "--checkpoint", self.ck, "--rank", str(rank), "--size", str(size),
                        "--vocab-pad", str(pad), "-o", f"{d}/cc.yaml")
                    run("placement", "check", f"{d}/cc.yaml", "--checkpoint", self.ck, "--extract", f"{d}/cc.st")
                    with open(f"{d}/py.st", "rb") as a, open(f"{d}/cc.st", "rb") as b:
                        self.assertEqual(a.read(), b.read(), "the Python and C++ placements cut different shards")
        self.assertGreater(padded, 0, "no rank held a padded vocabulary buffer")

    def test_refuses_what_is_not_a_worker_or_does_not_split(self):
        with self.assertRaisesRegex(ValueError, "rank 2 of 2"):
            llama_tp_placement(self.manifest, 2, 2)
        with self.assertRaisesRegex(ValueError, "does not split 3 ways"):
            llama_tp_placement(self.manifest, 0, 3)
        no_k = [e for e in self.manifest if not e[0].endswith("k_proj.weight")]
        with self.assertRaisesRegex(ValueError, "has no tensor '.*k_proj.weight'"):
            llama_tp_placement(no_k, 0, 2)


if __name__ == "__main__":
    unittest.main()
