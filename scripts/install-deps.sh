#!/usr/bin/env bash
# Installs the Debian 12 packages deltacast needs, only those missing. Idempotent, non-interactive.
#   install-deps.sh          what building and the demo need
#   install-deps.sh --test   also what the tests need (the Python binding's tests: torch, numpy)
#   install-deps.sh --fuzz   also what scripts/fuzz.sh needs (clang and its libFuzzer runtime)
set -euo pipefail
PKGS=(build-essential cmake pkg-config ccache git
  libfabric-dev libfabric-bin libucx-dev ucx-utils libzstd-dev zstd libboost-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libcli11-dev libspdlog-dev libssl-dev
  nlohmann-json3-dev openmpi-bin libopenmpi-dev iperf3 xdelta3 bsdiff iproute2 ethtool
  slurm-wlm munge procps psmisc)
if [ "${1:-}" = "--test" ]; then
  PKGS+=(python3 python3-numpy python3-torch clang-format clang-tidy)
elif [ "${1:-}" = "--fuzz" ]; then
  PKGS+=(clang libclang-rt-14-dev)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
