#pragma once
// Ranks 1..N of `deltacast run`: a receiver holding the weights in buffers this process owns. It
// joins the producer (from version 0, or from the version <output.checkpoint_dir>/latest holds, by
// replaying deltas), applies and relays every version, and with output.checkpoint_dir writes each
// committed version to disk (tools/run/checkpoint_output.h). Members that fail around it are
// repaired by the tree.
#include "config/config.h"
#include "tools/run/run_support.h"
#include "tree/launch_env.h"

namespace deltacast::tools {

// Runs the receiver until the producer says BYE (or is lost for good). Writes RunOptions::
// summary_path (rank, version, SHA-256 of the weights, counts). Throws Error(verify_failed) when a
// version aborted here or nothing was ever committed, and what the tree or transport throw.
void run_receiver(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o);

}  // namespace deltacast::tools
