#pragma once
// `deltacast demo --offline`: the whole refit loop in one process, without a transport. A
// SIMULATED trainer steps; each step is diffed against the last committed weights, applied into a
// receiver's copy with DeltaApplier, verified (seal digests, full-scan audit, memcmp against the
// trainer) and committed.
#include "tools/demo/tree_demo.h"

namespace deltacast::tools {

// Prints a table (step, changed %, payload bytes, bytes per change, % of checkpoint, encode and
// apply GB/s) and writes options.json_path when set. Throws Error(verify_failed) when a step is
// not bit-exact, other Errors from the codec or file writes.
void run_offline_demo(const DemoOptions& options);

}  // namespace deltacast::tools
