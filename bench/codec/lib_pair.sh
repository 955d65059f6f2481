# Sourced by bench/codec/diff_speed.sh and cold_diff.sh: the checkpoint pair both measure, and the
# diff's modes. Needs $dcs (the binaries) set by the caller.

# synth_pair WORK PARAMS: a pair (step 0 -> 1, seed 3) as one file each in WORK/file and as 4
# shards each in WORK/shards, unless already there.
synth_pair() {
  [ -d "$1/file" ] || "${dcs[0]}" synth --out "$1/file" --params "$2" --steps 1 --seed 3 >/dev/null
  [ -d "$1/shards" ] || "${dcs[0]}" synth --out "$1/shards" --params "$2" --steps 1 --seed 3 --shards 4 >/dev/null
}

# pair_paths WORK LAYOUT (file|shards): sets a (the base) and b (the new version).
pair_paths() {
  if [ "$2" = file ]; then a="$1/file/step-0000.safetensors"; b="$1/file/step-0001.safetensors"
  else a="$1/shards/step-0000"; b="$1/shards/step-0001"; fi
}

# mode_args MODE: sets the array extra to the diff's arguments for MODE: pread (the default),
# map (--read map), two-pass (--two-pass). An unknown mode exits 2.
mode_args() {
  case "$1" in
    pread) extra=() ;;
    map) extra=(--read map) ;;
    two-pass) extra=(--two-pass) ;;
    *) echo "unknown diff mode $1 (pread, map, two-pass)" >&2; exit 2 ;;
  esac
}
