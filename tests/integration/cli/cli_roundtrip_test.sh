#!/usr/bin/env bash
# Offline CLI round trip on a small SIMULATED model:
#   synth -> diff -> apply (--out and --in-place) -> verify bit-exact; chained versions;
#   the same with Hugging Face sharded directories, and deltas across file and shard layouts;
#   corrupted / truncated / wrong-base deltas fail with a non-zero exit and leave the target
#   byte-identical (sha256 before/after); inspect --json and diff --json parse; demo --offline.
set -euo pipefail
DC=${1:?usage: cli_roundtrip_test.sh PATH/TO/deltacast}
WORK=$(mktemp -d /tmp/dc-cli-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

fail() { echo "FAIL: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
# expect_failure NAME EXPECTED_ERRC CMD...: the command must exit non-zero and name EXPECTED_ERRC.
expect_failure() {
  local name=$1 errc=$2; shift 2
  if "$@" >out.txt 2>err.txt; then fail "$name: succeeded but should fail"; fi
  grep -q "$errc" err.txt || fail "$name: expected '$errc' in: $(cat err.txt)"
  echo "ok: $name fails with $errc"
}

"$DC" synth --out ck --params 2M --steps 2 --seed 5 >/dev/null
for s in 0 1 2; do [ -f "ck/step-000$s.safetensors" ] || fail "synth did not write step $s"; done

# Plain diff/apply/verify.
"$DC" diff --base ck/step-0000.safetensors --new ck/step-0001.safetensors --out d01.dcx >/dev/null
"$DC" apply --target ck/step-0000.safetensors --delta d01.dcx --out r1.safetensors >/dev/null
"$DC" verify r1.safetensors ck/step-0001.safetensors >/dev/null || fail "apply --out is not bit-exact"
if "$DC" verify ck/step-0000.safetensors ck/step-0001.safetensors >/dev/null; then fail "verify missed a difference"; fi
echo "ok: diff + apply --out is bit-exact"

# Chained version 1 -> 2, with --json and an overwrite regex.
"$DC" diff --base ck/step-0001.safetensors --new ck/step-0002.safetensors --out d12.dcx --base-version 1 \
  --overwrite 'layernorm|lm_head' --json --chunk-bytes 65536 --threads 2 >diff.json
python3 - diff.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["new_version"] == 2 and d["overwrite_tensors"] > 0, d
assert 0.003 < d["changed_fraction"] < 0.03, d["changed_fraction"]
assert d["frame_bytes"] > 0 and d["bytes_per_change"] > 0, d
PY
"$DC" apply --target r1.safetensors --delta d12.dcx --out r2.safetensors >/dev/null
"$DC" verify r2.safetensors ck/step-0002.safetensors >/dev/null || fail "chained apply is not bit-exact"
echo "ok: chained apply with overwrite tensors is bit-exact"

# In place.
cp ck/step-0000.safetensors inplace.safetensors
"$DC" apply --target inplace.safetensors --delta d01.dcx --in-place >/dev/null
"$DC" verify inplace.safetensors ck/step-0001.safetensors >/dev/null || fail "apply --in-place is not bit-exact"
echo "ok: apply --in-place is bit-exact"

# inspect --json parses and agrees with the file.
"$DC" inspect --json d01.dcx >inspect.json
python3 - inspect.json d01.dcx <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
assert d["bytes"] == os.path.getsize(sys.argv[2])
assert sum(f["bytes"] for f in d["frames"]) == d["bytes"]
assert d["frames"][-1]["kind"] == "seal" and d["base_version"] == 0 and d["new_version"] == 1
assert all("segments" in f for f in d["frames"][:-1])
PY
"$DC" inspect d01.dcx >/dev/null
echo "ok: inspect"

# Broken deltas: the target must stay byte-identical, --out must not appear.
python3 - d01.dcx <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
flipped = bytearray(data); flipped[len(data) // 2] ^= 0x10
open("flipped.dcx", "wb").write(flipped)
open("truncated.dcx", "wb").write(data[: len(data) - 5])
open("empty.dcx", "wb").write(b"")
PY
cp ck/step-0000.safetensors target.safetensors
before=$(sha target.safetensors)
for delta in flipped truncated empty; do
  expect_failure "$delta delta (--out)" corrupt_frame \
    "$DC" apply --target target.safetensors --delta $delta.dcx --out never.safetensors
  expect_failure "$delta delta (--in-place)" corrupt_frame \
    "$DC" apply --target target.safetensors --delta $delta.dcx --in-place
  [ "$(sha target.safetensors)" = "$before" ] || fail "$delta delta modified the target"
  [ ! -e never.safetensors ] || fail "$delta delta produced an output file"
done

# Frames that each parse but do not add up: version 0 -> 1 chunks of d01 sealed with the seal of a
# 0 -> 1 delta towards step 2. Applying succeeds frame by frame and fails at verification, so
# --in-place must roll back.
"$DC" diff --base ck/step-0000.safetensors --new ck/step-0002.safetensors --out d02.dcx >/dev/null
"$DC" inspect --json d01.dcx >i01.json
"$DC" inspect --json d02.dcx >i02.json
python3 - <<'PY'
import json
def frames(dcx, info):
    data, out, at = open(dcx, "rb").read(), [], 0
    for f in json.load(open(info))["frames"]:
        out.append((f["kind"], data[at:at + f["bytes"]])); at += f["bytes"]
    return out
chunks = [b for k, b in frames("d01.dcx", "i01.json") if k == "chunk"]
seal = [b for k, b in frames("d02.dcx", "i02.json") if k == "seal"]
assert len(chunks) == len([1 for k, _ in frames("d02.dcx", "i02.json") if k == "chunk"])
open("mixed.dcx", "wb").write(b"".join(chunks + seal))
PY
expect_failure "mismatched seal (--out)" verify_failed \
  "$DC" apply --target target.safetensors --delta mixed.dcx --out never.safetensors
expect_failure "mismatched seal (--in-place, rolled back)" verify_failed \
  "$DC" apply --target target.safetensors --delta mixed.dcx --in-place
[ "$(sha target.safetensors)" = "$before" ] || fail "the in-place rollback did not restore the target"
[ ! -e never.safetensors ] || fail "a failed apply produced an output file"

# Wrong base: d12 expects version 1's bits.
expect_failure "wrong base (--out)" version_mismatch \
  "$DC" apply --target target.safetensors --delta d12.dcx --out never.safetensors
expect_failure "wrong base (--in-place)" version_mismatch \
  "$DC" apply --target target.safetensors --delta d12.dcx --in-place
[ "$(sha target.safetensors)" = "$before" ] || fail "wrong-base delta modified the target"
# A safetensors file is not a delta, and a delta is not a safetensors file.
expect_failure "checkpoint given as delta" corrupt_frame \
  "$DC" apply --target target.safetensors --delta ck/step-0001.safetensors --out never.safetensors
expect_failure "delta given as checkpoint" "not a safetensors file" \
  "$DC" apply --target d01.dcx --delta d01.dcx --out never.safetensors
expect_failure "missing target" io "$DC" apply --target absent.safetensors --delta d01.dcx --out never.safetensors
[ "$(sha target.safetensors)" = "$before" ] || fail "the target changed"
echo "ok: the target is untouched after every failure"

# The whole loop in memory.
# Sharded directories (Hugging Face layout) in every command, and across layouts: the same model
# as 3 shards (synth --shards, same seed) and as single files.
"$DC" synth --out sh --params 2M --steps 1 --seed 5 --shards 3 >/dev/null
[ -f sh/step-0000/model.safetensors.index.json ] || fail "synth --shards wrote no index"
[ "$(ls sh/step-0000/*.safetensors | wc -l)" = 3 ] || fail "synth --shards did not write 3 shards"
"$DC" verify sh/step-0000 ck/step-0000.safetensors >/dev/null || fail "verify: shards and file differ"
"$DC" diff --base sh/step-0000 --new sh/step-0001 --out dsh.dcx >/dev/null
cmp -s dsh.dcx d01.dcx || fail "the delta from shards differs from the delta from files"
# --read map (through the mappings) and --two-pass give the bytes of the default (pread pieces).
"$DC" diff --base sh/step-0000 --new sh/step-0001 --out dsh-map.dcx --read map >/dev/null
cmp -s dsh-map.dcx d01.dcx || fail "diff --read map wrote other frames than the default pread diff"
"$DC" diff --base ck/step-0000.safetensors --new ck/step-0001.safetensors --out d01-2p.dcx --two-pass >/dev/null
cmp -s d01-2p.dcx d01.dcx || fail "diff --two-pass wrote other frames than the default pread diff"
if "$DC" diff --base sh/step-0000 --new sh/step-0001 --out x.dcx --read mmap >/dev/null 2>&1; then
  fail "diff --read mmap (not a mode) was accepted"
fi
# diff --baseline (bench/codec/diff_speed.sh): the same frames as a plain diff, every round timed
# (a read of the shards through fresh mappings, mapped pages and pread), and --rounds needs it.
"$DC" diff --base sh/step-0000 --new sh/step-0001 --out dsh-baseline.dcx --baseline --rounds 2 --json >baseline.json
cmp -s dsh-baseline.dcx d01.dcx || fail "diff --baseline wrote other frames than a plain diff"
python3 - baseline.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["rounds"]) == 2, d
for r in d["rounds"]:
    assert all(r[k] > 0 for k in ("read_fresh", "diff_fresh", "read_mapped", "diff_mapped", "read_pread")), r
# Every ratio is recomputed from the per-round times: its median (2 rounds: the mean of the two)
# and its range.
import statistics
for k, diff, read in (("diff_over_read", "diff_fresh", "read_fresh"),
                      ("diff_over_read_mapped", "diff_mapped", "read_mapped"),
                      ("diff_over_read_pread", "diff_fresh", "read_pread")):
    ratios = [r[diff] / r[read] for r in d["rounds"]]
    assert abs(d[k] - statistics.median(ratios)) < 1e-9, (k, d[k], ratios)
    assert d[k + "_range"] == [min(ratios), max(ratios)], (k, d[k + "_range"], ratios)
assert d["read_seconds"] == statistics.median(r["read_fresh"] for r in d["rounds"]), d
assert d["encode_seconds"] == statistics.median(r["diff_fresh"] for r in d["rounds"]), d
PY
if "$DC" diff --base sh/step-0000 --new sh/step-0001 --out x.dcx --rounds 2 >/dev/null 2>&1; then
  fail "diff --rounds without --baseline was accepted"
fi
"$DC" apply --target ck/step-0000.safetensors --delta dsh.dcx --out from-shards.safetensors >/dev/null
"$DC" verify from-shards.safetensors sh/step-0001 >/dev/null || fail "a delta from shards applied to a file is not exact"
"$DC" apply --target sh/step-0000 --delta d01.dcx --out sh-out >/dev/null
"$DC" verify sh-out sh/step-0001 >/dev/null || fail "a delta from files applied to shards is not exact"
(cd sh/step-0000 && ls) >layout.before
(cd sh-out && ls) >layout.after
cmp -s layout.before layout.after || fail "apply --out DIR changed the shard layout: $(cat layout.after)"
python3 - sh/step-0000 sh-out <<'PY'
import json, sys
a = json.load(open(sys.argv[1] + "/model.safetensors.index.json"))["weight_map"]
b = json.load(open(sys.argv[2] + "/model.safetensors.index.json"))["weight_map"]
assert a == b, "the tensors per shard changed"
PY
cp -r sh/step-0000 sh-inplace
"$DC" apply --target sh-inplace --delta d01.dcx --in-place >/dev/null
"$DC" verify sh-inplace sh/step-0001 >/dev/null || fail "apply --in-place into shards is not exact"
"$DC" inspect --json sh/step-0000 >inspect-sh.json
python3 - inspect-sh.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["sharded"] and len(d["files"]) == 3 and d["tensors"] == len(d["tensor_list"]), d
names = [t["name"] for t in d["tensor_list"]]
assert names == sorted(names), "canonical order is by name"
PY
if "$DC" verify sh/step-0000 sh/step-0001 >verify.txt; then fail "verify missed a difference between shard dirs"; fi
grep -q "first at element" verify.txt || fail "verify does not name where tensors differ: $(cat verify.txt)"
# A broken index: a missing shard is named, and nothing is written.
cp -r sh/step-0000 broken
rm broken/model-00002-of-00003.safetensors
expect_failure "missing shard" "model-00002-of-00003.safetensors" \
  "$DC" apply --target broken --delta d01.dcx --out never-dir
[ ! -e never-dir ] || fail "a refused apply created its output"
echo "ok: sharded directories in diff, apply (--out, --in-place), verify and inspect, across layouts"

"$DC" demo --offline --params 2M --steps 2 --json demo.json >/dev/null
python3 - demo.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["steps"]) == 2 and all(s["bit_exact"] for s in d["steps"]), d
PY
echo "ok: demo --offline"
echo "PASS"
