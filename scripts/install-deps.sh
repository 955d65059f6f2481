#!/usr/bin/env bash
# Installs the Debian 12 packages deltacast needs, only those missing. Idempotent, non-interactive.
#   install-deps.sh          what building the library and the CLI needs (the demo: scripts/demo.sh),
#                            libcurl included (the object-storage client, docs/object-storage.md)
#   install-deps.sh --test   also what the tests and benchmarks build with and start: GoogleTest and
#                            Google Benchmark, Open MPI, Slurm + munge, iperf3, Python with torch
#                            and numpy, the baselines (xdelta3, bsdiff, zstd), the fabric tools,
#                            clang-format and clang-tidy (scripts/lint.sh), and the S3 server of the
#                            object-storage tests: Ceph's mon, OSD and RADOS Gateway, uuidgen, curl
#                            (scripts/s3-server.sh)
#   install-deps.sh --fuzz   also what scripts/fuzz.sh needs (clang and its libFuzzer runtime; with
#                            --test, as fuzz.sh builds the fuzz targets in a test build)
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config ccache
  libfabric-dev libucx-dev libzstd-dev libboost-dev libyaml-cpp-dev libxxhash-dev libcli11-dev libspdlog-dev
  libssl-dev nlohmann-json3-dev libcurl4-openssl-dev libpugixml-dev)
for flag in "$@"; do
  case "$flag" in
    --test)
      PKGS+=(git libgtest-dev libgmock-dev libbenchmark-dev libfabric-bin ucx-utils zstd openmpi-bin libopenmpi-dev
        iperf3 xdelta3 bsdiff iproute2 ethtool slurm-wlm munge procps psmisc
        python3 python3-numpy python3-torch clang-format clang-tidy
        ceph-mon ceph-osd radosgw uuid-runtime curl) ;;
    --fuzz) PKGS+=(clang libclang-rt-14-dev) ;;
    *) echo "install-deps.sh: unknown option '$flag' (--test, --fuzz)" >&2; exit 2 ;;
  esac
done
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
