#pragma once
// The control plane of `deltacast probe` (docs/probe.md). Rank 0 coordinates: members connect a
// control connection to it (within join_timeout), then it asks them, one figure at a time, to
// stream flows or send pings over their data connections (tools/probe/link.h) and collects
// the figures; rank 0 measures its own flows in-process. Finally it tells every member "done".
//
// Control messages are small JSON texts. Coordinator -> member: {"op":"flows","id","to":[...],"ms"},
// {"op":"ping","id","to","reps"}, {"op":"alive","id"}, {"op":"done","clusters"}, {"op":"refused","reason"}
// (a member that connects after the join window). Member -> coordinator: {"kind":"control","rank"}
// once, then one answer per command, carrying its id.
//
// Failure is normal: members that never connect are "unreachable"; a member whose control
// connection fails, or that does not answer a command within its bound, is "lost" (its remaining
// figures are skipped with an entry in `failed`); a flow or ping that fails leaves its cell empty
// with an entry in `failed`. Every wait is bounded by the settings below.
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/probe/analysis.h"
#include "tools/probe/link.h"
#include "transport/transport.h"

namespace deltacast::tools {

struct ProbeSettings {
  std::chrono::milliseconds flow_time{300};
  std::chrono::milliseconds join_timeout{30'000};
  int latency_reps = 20;
  uint64_t seed = 1;  // the pair sample of jobs above kAllPairsMaxMembers members
  // A quick probe (`run` with `clusters: auto` and no probe_file): quick_pairs() instead of
  // sample_pairs(), no concurrent flows. Enough to find the clusters, O(N) flows.
  bool quick = false;
};

struct ProbeFailure {
  int from = 0;
  int to = 0;
  std::string error;
};

struct Measurements {
  int ranks = 0;
  RankMatrix bandwidth_gbit;     // N x N
  RankMatrix latency_us;         // N x N
  std::vector<int> present;      // ranks that joined, ascending (0 first)
  std::vector<int> unreachable;  // members that never joined
  std::vector<int> lost;         // members lost during the probe
  std::vector<ProbeFailure> failed;
  nlohmann::json shared_links = nlohmann::json::array();
  std::vector<std::vector<int>> clusters;  // find_clusters() over the present ranks (sent with "done")
  double seconds = 0;                      // wall time of the whole probe
};

// Rank 0: listens on link.urls[0], waits up to settings.join_timeout for the members
// (link.urls.size() - 1 of them), measures latency, bandwidth and concurrent flows as
// docs/probe.md describes, and tells every member it is done. Throws what Transport::listen throws;
// member failures are reported in the result, never thrown.
Measurements coordinate_probe(transport::Transport& transport, const LinkOptions& link, const ProbeSettings& settings);

// A member (link.rank >= 1): listens on its URL, connects to rank 0 (retrying up to
// settings.join_timeout) and carries out its commands until rank 0 says done; returns the clusters
// rank 0 found (job-rank lists). Throws Error(connection | timeout) when rank 0 cannot be reached or
// disappears, Error(state) when rank 0 refused it.
std::vector<std::vector<int>> serve_probe_member(transport::Transport& transport, const LinkOptions& link,
                                                 const ProbeSettings& settings);

}  // namespace deltacast::tools
