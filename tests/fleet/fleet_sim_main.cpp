// dc_fleet_sim: the control plane of 1,000-10,000 members on the real state machines
// (fleet_sim.h), one JSON line per configuration on stdout. docs/reliability.md, "Control plane
// at 10,000 members", has the command and the current figures.
//
//   dc_fleet_sim --members 1000,10000 --producers 1,3 [--kind double_binary] [--clusters 1]
//                [--versions 30] [--failures 20] [--seed 1]
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "tests/fleet/fleet_sim.h"
#include "util/error.h"

namespace {

int run_main(int argc, char** argv) {
  using namespace deltacast;
  CLI::App app{"dc_fleet_sim: the control plane at fleet scale, simulated on the real state machines"};
  std::vector<uint32_t> members{1000, 10000};
  std::vector<int> producers{1, 2, 3};
  std::string kind = "double_binary";
  fleet_sim::Options o;
  o.versions = 30;
  o.failures = 20;
  app.add_option("--members", members, "fleet sizes")->delimiter(',');
  app.add_option("--producers", producers, "producer group sizes M")->delimiter(',');
  app.add_option("--kind", kind, "binary | double_binary | chain")
      ->check(CLI::IsMember({"binary", "double_binary", "chain"}));
  app.add_option("--clusters", o.clusters, "cluster labels, in contiguous rank blocks");
  app.add_option("--versions", o.versions, "version rounds");
  app.add_option("--failures", o.failures, "members killed or frozen at random moments");
  app.add_option("--freeze-share", o.freeze_share, "of the failures, frozen (detected after --peer-rtts)");
  app.add_option("--rejoin-pct", o.rejoin_share_pct, "of the failed members, percent that come back");
  app.add_option("--peer-rtts", o.peer_rtts, "timeouts.peer in RTTs");
  app.add_option("--check-members", o.check_members, "members that keep and compare their own view");
  app.add_option("--seed", o.seed, "random seed");
  CLI11_PARSE(app, argc, argv);
  o.kind = kind == "binary"  ? tree::TopologyKind::binary
           : kind == "chain" ? tree::TopologyKind::chain
                             : tree::TopologyKind::double_binary;
  try {
    for (uint32_t n : members)
      for (int m : producers) {
        fleet_sim::Options run = o;
        run.members = n;
        run.producers = m;
        std::printf("%s\n", fleet_sim::to_json(fleet_sim::run(run)).c_str());
        std::fflush(stdout);
      }
  } catch (const Error& e) {
    std::fprintf(stderr, "dc_fleet_sim: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dc_fleet_sim: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "dc_fleet_sim: an unknown error\n");
  }
  return 1;
}
