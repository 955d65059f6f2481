// The control plane at fleet scale on the real state machines (tests/fleet/fleet_sim.h), small
// enough for a test: bounds that the design promises and that a wrong Membership or VersionRound
// would break. Large N is the bench (dc_fleet_sim; docs/reliability.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "tests/fleet/fleet_sim.h"

namespace deltacast::fleet_sim {
namespace {

struct Case {
  uint32_t members;
  tree::TopologyKind kind;
  int producers;
  uint32_t clusters;
};

class FleetSim : public ::testing::TestWithParam<Case> {};

// Every version commits on every member live at its end; the sampled members' own views equal the
// producer's forest after every EPOCH; a clean version costs 3 control messages per member (ACK,
// COMMIT, ACTIVE); a failure moves only the orphans of the dead member (at most its children in
// every tree, plus cluster entries); the trees stay O(log N) deep through failures and rejoins;
// a repair ends within a few RTTs of its detection, whatever N; the producer's state is O(N).
TEST_P(FleetSim, BoundsHoldThroughFailuresAndRejoins) {
  const Case c = GetParam();
  Options o;
  o.members = c.members;
  o.kind = c.kind;
  o.producers = c.producers;
  o.clusters = c.clusters;
  o.versions = 12;
  o.failures = 8;
  o.seed = 7 + c.members;
  const Report r = run(o);
  ASSERT_EQ(r.versions.size(), o.versions);
  for (const auto& v : r.versions) {
    EXPECT_TRUE(v.committed) << "version " << v.version;
    // Every member verified it but those lost before the decision (one lost after it was counted).
    EXPECT_LE(v.verified, v.live) << "version " << v.version;
    EXPECT_GE(v.verified + v.lost, v.live) << "version " << v.version;
    if (!v.faulted) {
      // ACK, COMMIT, ACTIVE per member; a group's coordinator adds 2 per extra rank.
      EXPECT_EQ(v.control_messages, 3ull * v.live + 2ull * (c.producers - 1)) << "version " << v.version;
    }
  }
  EXPECT_EQ(r.failures.size(), o.failures);
  EXPECT_GT(r.copies_checked, 0u);
  EXPECT_EQ(r.copies_diverged, 0u);
  const int trees = (c.kind == tree::TopologyKind::double_binary ? 2 : 1) * c.producers;
  const uint32_t fan_out = c.kind == tree::TopologyKind::chain ? 1 : 2;
  for (const auto& f : r.failures) {
    EXPECT_LE(f.moves, static_cast<uint32_t>(trees) * (fan_out + c.clusters)) << "rank " << f.rank;
    const double detect = f.frozen ? o.peer_rtts : 0.5;
    EXPECT_GE(f.detect_rtts, detect - 1e-9);
    EXPECT_LE(f.repair_rtts, detect + 4.0) << "rank " << f.rank;  // EPOCH, JOIN+RESUME, data, READY
    // Every live member hears the EPOCH once (FENCED to the victim besides).
    EXPECT_GE(f.epoch_messages, static_cast<uint64_t>(c.members) - uint64_t{2} * o.failures);
    EXPECT_LE(f.epoch_messages, static_cast<uint64_t>(c.members) + 1 + uint64_t{2} * f.orphaned);
  }
  if (c.kind != tree::TopologyKind::chain) {
    // Each cluster's tree is O(log(N/C)) deep, and the clusters form a tree of the same kind whose
    // entries hang below leaves of their parent cluster (tree/topology.h: the egress is a member
    // that otherwise only receives): levels of clusters x a cluster's depth.
    const double cluster_levels = std::floor(std::log2(static_cast<double>(c.clusters))) + 1;
    const double local = 2 * std::log2(static_cast<double>(c.members) / c.clusters) + 2;
    EXPECT_LE(r.max_depth_epoch0, cluster_levels * local);
    EXPECT_LE(r.max_depth, cluster_levels * local + 4) << "trees grew deep through repairs";
  }
  EXPECT_GT(r.producer_bytes_per_member, 0);
  EXPECT_LT(r.producer_bytes_per_member, 200.0 * trees);
}

std::string case_name(const ::testing::TestParamInfo<Case>& param) {
  const Case& c = param.param;
  const char* kind = c.kind == tree::TopologyKind::binary  ? "binary"
                     : c.kind == tree::TopologyKind::chain ? "chain"
                                                           : "double_binary";
  return std::to_string(c.members) + "_" + kind + "_m" + std::to_string(c.producers) + "_c" +
         std::to_string(c.clusters);
}

INSTANTIATE_TEST_SUITE_P(Fleets, FleetSim,
                         ::testing::Values(Case{100, tree::TopologyKind::binary, 1, 1},
                                           Case{1000, tree::TopologyKind::double_binary, 1, 1},
                                           Case{1000, tree::TopologyKind::double_binary, 3, 4},
                                           Case{200, tree::TopologyKind::chain, 1, 2},
                                           Case{2000, tree::TopologyKind::binary, 2, 8}),
                         case_name);

// The same seed gives the same run: a failure the bench finds can be replayed.
TEST(FleetSimReplay, TheSameSeedGivesTheSameRun) {
  Options o;
  o.members = 300;
  o.failures = 5;
  o.versions = 8;
  o.seed = 11;
  const Report a = run(o), b = run(o);
  ASSERT_EQ(a.failures.size(), b.failures.size());
  for (size_t i = 0; i < a.failures.size(); ++i) {
    EXPECT_EQ(a.failures[i].rank, b.failures[i].rank);
    EXPECT_EQ(a.failures[i].moves, b.failures[i].moves);
  }
  EXPECT_EQ(a.epochs, b.epochs);
}

}  // namespace
}  // namespace deltacast::fleet_sim
