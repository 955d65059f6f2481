#pragma once
// Rank 0 of `deltacast run`: the producer. It takes versions from the synthetic trainer or from a
// real trainer's checkpoint directory (trainer.kind synth | watch, tools/run/version_source.h),
// sends the first as the full checkpoint (bootstrap) and then one delta per version through the
// tree, prints a progress line per version and writes a JSON report.
//
// After every decided version (the bootstrap included), before its COMMIT goes out, it writes its
// state file, <output.dir>/producer-state.json (docs/config.md): a producer lost at any moment
// after that resumes at that version. With RunOptions::resume it restarts from that file: the
// trainer is re-simulated to the state's step (watch: the state's checkpoint is opened), its bits
// are checked against the state's digest, and the version chain goes on with the members that kept
// the committed version (docs/protocol.md, "Producer loss").
#include "config/config.h"
#include "tools/run/run_support.h"
#include "tree/launch_env.h"

namespace deltacast::tools {

// Runs the producer to the end of the trainer's steps (or SIGTERM, with trainer.kind watch).
// Throws Error(verify_failed) when a version was not verified and committed by every member live
// at its end, and what the tree, the transport or the version source throw.
void run_producer(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o);

}  // namespace deltacast::tools
