#include "tools/probe/job.h"

#include <cstdio>
#include <string>

#include "transport/transport.h"
#include "tree/config_options.h"
#include "tree/secure_start.h"
#include "util/error.h"

namespace deltacast::tools {

JobProbe run_job_probe(const config::Config& c, const tree::LaunchEnv& env, const ProbeSettings& settings) {
  const auto members = config::member_list(c);
  if (env.is_part_rank()) return {};  // rank 0 probes the producer side
  LinkOptions link;
  // The probe's ranks: 0 the producer (a group's coordinator), i >= 1 receiver i - 1.
  link.rank = env.is_producer() ? 0 : env.member_rank() + 1;
  link.urls.push_back(env.require_rendezvous());
  for (const auto& m : members) link.urls.push_back(m.url);
  link.connect_timeout = c.timeouts.connect;
  link.peer_timeout = c.timeouts.peer;
  auto transport =
      transport::make_transport(c.transport, env.is_producer() ? tree::producer_transport_options(c)
                                                               : tree::member_transport_options(c, env.member_rank()));
  const std::string who = env.is_producer() ? "the producer" : "rank " + std::to_string(env.rank);
  // As `run`: a process whose addresses other machines reach must authenticate its peers.
  std::vector<std::string> own{link.urls[static_cast<size_t>(link.rank)]};
  if (!env.is_producer()) own.push_back(link.urls[0]);
  tree::require_authenticated(*transport, own, c.allow_insecure, who);
  JobProbe out;
  if (!env.is_producer()) {
    out.clusters = serve_probe_member(*transport, link, settings);
    return out;
  }
  out.measurements = coordinate_probe(*transport, link, settings);
  out.clusters = out.measurements->clusters;
  return out;
}

void quick_probe_clusters(config::Config& c, const tree::LaunchEnv& env) {
  // A group's part rank takes no part: the coordinator's WELCOME tells it the forest, clusters
  // included.
  if (env.is_part_rank()) return;
  ProbeSettings settings;
  settings.quick = true;
  settings.flow_time = std::chrono::milliseconds(150);
  settings.latency_reps = 5;
  settings.join_timeout = c.timeouts.join;
  const JobProbe probe = run_job_probe(c, env, settings);
  config::apply_probe_clusters(c, probe.clusters, "the quick probe");
  if (env.is_producer()) {
    std::string text;
    for (const auto& cluster : probe.clusters) {
      text += " {";
      for (size_t i = 0; i < cluster.size(); ++i) {
        if (i) text += ',';
        text += std::to_string(cluster[i]);
      }
      text += "}";
    }
    const auto& m = *probe.measurements;
    std::printf("producer: clusters from a quick probe (%.1f s, %zu of %d ranks reached):%s\n", m.seconds,
                m.present.size(), m.ranks, text.c_str());
  }
}

}  // namespace deltacast::tools
