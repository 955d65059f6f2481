#pragma once
// One process's part of a probe of a whole job (docs/probe.md), as `deltacast probe` runs it and as
// `deltacast run` runs its quick probe at start (`clusters: auto` without probe_file): the data
// URLs of the config, the transport of the config (authenticated like `run`), then the coordinator
// on rank 0 or a member elsewhere.
#include <memory>
#include <optional>
#include <vector>

#include "config/config.h"
#include "tools/probe/measure.h"
#include "tree/launch_env.h"

namespace deltacast::tools {

struct JobProbe {
  std::optional<Measurements> measurements;  // rank 0 only
  std::vector<std::vector<int>> clusters;    // every rank: the clusters rank 0 found
};

// Runs this process's part (`env` from tree::detect_job_env for `c`): the probe's ranks are the
// producer (a group's coordinator, rank 0) and the receivers; a producer group's part rank takes
// no part and gets nothing back. Throws what secure start refuses (no secret on exposed
// addresses), and what coordinate_probe / serve_probe_member throw. The transport is closed when
// it returns (its listeners are free).
JobProbe run_job_probe(const config::Config& c, const tree::LaunchEnv& env, const ProbeSettings& settings);

// `run` with `clusters: auto` and no probe_file: a quick probe (O(N) flows of 150 ms, no
// concurrent flows), whose clusters are then applied to `c` (config::apply_probe_clusters) by every
// rank alike (a group's part ranks: nothing; the coordinator's WELCOME carries the forest). Rank 0
// prints one line with what it found.
void quick_probe_clusters(config::Config& c, const tree::LaunchEnv& env);

}  // namespace deltacast::tools
