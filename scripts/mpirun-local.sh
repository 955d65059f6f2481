#!/usr/bin/env bash
# mpirun pinned to loopback for single-machine runs: Open MPI otherwise picks eth0 for both its
# out-of-band channel and the TCP BTL. Oversubscribes (2 cores, 9 ranks) and allows root.
#   scripts/mpirun-local.sh -np 9 build/tools/deltacast ...
# Extra mpirun options pass through; DELTACAST_MPI_BTL overrides the BTL list (default self,tcp:
# the same path ranks on different hosts would take; "self,vader,tcp" adds shared memory).
set -euo pipefail
exec mpirun --allow-run-as-root --oversubscribe \
  --mca btl "${DELTACAST_MPI_BTL:-self,tcp}" \
  --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo \
  "$@"
