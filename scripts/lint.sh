#!/usr/bin/env bash
# Style and static checks on what a change touches (CI runs it on the commit under test):
#   scripts/lint.sh [FORMAT_BASE [TIDY_BASE]]     (defaults: the commit in .ci/lint-base, HEAD~1)
# 1. clang-format (.clang-format): every line changed since FORMAT_BASE must be formatted
#    (`git clang-format --diff`; lines nobody touched since are left as they are; fix with
#    `git clang-format FORMAT_BASE`). .ci/lint-base names the commit from which this holds.
# 2. clang-tidy (.clang-tidy, warnings are errors): the lines changed since TIDY_BASE in C++
#    sources (clang-tidy-diff over the file-by-file compile commands of build/'s configuration,
#    in build/lint-db: configured, never built; run scripts/build.sh first). Only
#    the last commit by default: clang-tidy costs ~30 s per file here.
# 3. the layering (scripts/check-layers.py): no #include crosses a layer of cmake/layers.txt the
#    wrong way, in the whole tree.
# Exits non-zero with the offending diff or warnings. Needs clang-format and clang-tidy (Debian
# clang-format, clang-tidy; the install script's --test mode installs them).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
base="${1:-$(cat "$root/.ci/lint-base")}"
tidy_base="${2:-HEAD~1}"
build="${DELTACAST_BUILD_DIR:-$root/build}"
for b in "$base" "$tidy_base"; do
  if ! git rev-parse --verify -q "$b^{commit}" >/dev/null; then
    # A shallow checkout lacks the history to compare against: say so, check nothing.
    echo "lint: commit $b is not in this checkout (shallow clone?); nothing to compare, skipped" >&2
    exit 0
  fi
done
status=0
if ! python3 "$root/scripts/check-layers.py"; then
  echo "lint: an include crosses a layer the wrong way (cmake/layers.txt, docs/architecture.md)" >&2
  status=1
fi
format_diff="$(git clang-format --diff --extensions c,h,cpp,cu "$base" -- . ':!tests/fuzz/corpus' 2>&1 || true)"
if [ -n "$format_diff" ] && ! grep -q -e "^no modified files to format" -e "^clang-format did not modify any files" <<<"$format_diff"; then
  echo "lint: lines changed since $base are not clang-formatted (fix: git clang-format $base):" >&2
  echo "$format_diff" >&2
  status=1
else
  echo "lint: clang-format ok (lines changed since $base)"
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  echo "lint: no $build (run scripts/build.sh first); clang-tidy skipped" >&2
  exit 1
fi
# clang-tidy reads each file's own compile command: the build's unity batches hide them, so a
# configure-only copy of its cache without unity batches gives them (nothing is compiled).
lint_db="$build/lint-db"
mkdir -p "$lint_db"
grep -E '^(DELTACAST_[A-Z_]+|CMAKE_BUILD_TYPE):' "$build/CMakeCache.txt" |
  sed -E 's/^([^:]+):([A-Z]+)=(.*)$/set(\1 "\3" CACHE \2 "")/' >"$lint_db/initial-cache.cmake"
cmake -S "$root" -B "$lint_db" -C "$lint_db/initial-cache.cmake" -DCMAKE_UNITY_BUILD=OFF \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
tidy_out="$(git diff -U0 "$tidy_base" -- '*.cpp' ':!tests/fuzz/*' |
  clang-tidy-diff -p1 -path "$lint_db" -quiet -j "$(nproc)" -extra-arg=-Wno-unknown-warning-option 2>&1 || echo "lint: clang-tidy failed")"
if grep -q -e "error:" -e "warning:" -e "lint: clang-tidy failed" <<<"$tidy_out"; then
  echo "lint: clang-tidy found problems in lines changed since $tidy_base:" >&2
  echo "$tidy_out" >&2
  status=1
else
  echo "lint: clang-tidy ok (lines changed since $tidy_base)"
fi
exit $status
