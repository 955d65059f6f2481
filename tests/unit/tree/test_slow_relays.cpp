// find_slow_relays (tree/producer/slow_relays.h): which relays the producer demotes after a
// committed version, from its members' verification times.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tree/membership.h"
#include "tree/producer/slow_relays.h"

namespace deltacast::tree {
namespace {

using Times = std::map<uint32_t, double>;  // rank -> ms

// One committed version: each member's verification after the sealing (as the producer sees its
// ACK arrive) and its receive time (ACK's receive_us: first data message to verification).
struct Version {
  Times after;
  Times receive;
};

// A binary tree over 6 receivers (one cluster): 1 is the root, 2 and 3 its children, 4 and 5
// rank 2's, 6 rank 3's.
Membership binary6() {
  Membership m(TopologyKind::binary, std::vector<std::string>(6, "rack"));
  EXPECT_EQ(m.trees(), 1);
  EXPECT_EQ(m.children(1, 0), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(m.children(2, 0), (std::vector<uint32_t>{4, 5}));
  EXPECT_EQ(m.children(3, 0), (std::vector<uint32_t>{6}));
  return m;
}

// Rank 2's egress slow: it verifies on time (here its ACK did not queue), its subtree (4, 5)
// 700 ms after the sealing.
Version slow_interior() {
  return {{{1, 20}, {2, 40}, {3, 45}, {4, 700}, {5, 720}, {6, 60}},
          {{1, 20}, {2, 35}, {3, 40}, {4, 690}, {5, 710}, {6, 50}}};
}
// Rank 1's egress slow (the root of the one tree): everyone but it late, so the fleet's first
// quartile is late too, and its own ACK queued behind what it forwards (600 ms), while it
// received the version in 20 ms.
Version slow_root() {
  return {{{1, 600}, {2, 700}, {3, 710}, {4, 730}, {5, 740}, {6, 735}},
          {{1, 20}, {2, 690}, {3, 700}, {4, 700}, {5, 705}, {6, 700}}};
}
// A healthy tree bound by its links: a relay's two children share its egress, so they take about
// twice as long as it to receive the version.
Version healthy() {
  return {{{1, 100}, {2, 200}, {3, 190}, {4, 400}, {5, 410}, {6, 300}},
          {{1, 100}, {2, 200}, {3, 190}, {4, 390}, {5, 400}, {6, 200}}};
}

std::vector<uint32_t> ranks(const std::vector<SlowRelay>& relays) {
  std::vector<uint32_t> out;
  out.reserve(relays.size());
  for (const auto& r : relays) out.push_back(r.rank);
  return out;
}

// Feeds `versions` in order; returns the ranks demoted after each.
std::vector<std::vector<uint32_t>> run(const Membership& m, const std::vector<Version>& versions,
                                       std::map<uint32_t, uint32_t>& history) {
  std::vector<std::vector<uint32_t>> out;
  out.reserve(versions.size());
  uint64_t v = 2;
  for (const auto& x : versions) out.push_back(ranks(find_slow_relays(m, x.after, x.receive, v++, history)));
  return out;
}

// Both times the same (a relay whose ACK did not queue).
Version alike(const Times& t) { return Version{t, t}; }

TEST(SlowRelays, ASlowInteriorRelayIsDemotedOnItsThirdSlowVersion) {
  const auto m = binary6();
  std::map<uint32_t, uint32_t> history;
  const auto demoted = run(m, {slow_interior(), slow_interior(), slow_interior()}, history);
  EXPECT_EQ(demoted, (std::vector<std::vector<uint32_t>>{{}, {}, {2}}));
  EXPECT_EQ(history.count(2), 0u) << "a demoted relay's window is forgotten";
}

TEST(SlowRelays, OneQuickVersionDoesNotResetTheWindow) {
  const auto m = binary6();
  std::map<uint32_t, uint32_t> history;
  // slow, quick, slow, slow: 3 of the last 5.
  const auto demoted = run(m, {slow_interior(), healthy(), slow_interior(), slow_interior()}, history);
  EXPECT_EQ(demoted, (std::vector<std::vector<uint32_t>>{{}, {}, {}, {2}}));
  // slow, then five quick ones: the window empties and the relay is forgotten (after four the
  // slow one is still among the last five).
  history.clear();
  run(m, {slow_interior(), healthy(), healthy(), healthy(), healthy()}, history);
  EXPECT_EQ(history.count(2), 1u);
  run(m, {healthy()}, history);
  EXPECT_TRUE(history.empty());
  // Two slow versions five apart never make three in a window.
  history.clear();
  const auto sparse = run(m,
                          {slow_interior(), healthy(), healthy(), healthy(), slow_interior(), healthy(), healthy(),
                           healthy(), slow_interior()},
                          history);
  for (const auto& d : sparse) EXPECT_TRUE(d.empty());
}

TEST(SlowRelays, TheSlowRootOfASingleTreeIsDemoted) {
  const auto m = binary6();
  // Against the fleet's pace nobody is late here (its first quartile is a late member), and the
  // root's own ACK came as late as its children's: only their receive times against its own show
  // it.
  const auto pace = fleet_pace(slow_root().after);
  ASSERT_TRUE(pace);
  EXPECT_GT(pace->late, 740.0);
  std::map<uint32_t, uint32_t> history;
  const auto demoted = run(m, {slow_root(), slow_root(), slow_root()}, history);
  EXPECT_EQ(demoted, (std::vector<std::vector<uint32_t>>{{}, {}, {1}}));
}

TEST(SlowRelays, AHealthyTreeLosesNobody) {
  const auto m = binary6();
  std::map<uint32_t, uint32_t> history;
  for (const auto& d : run(m, std::vector<Version>(10, healthy()), history)) EXPECT_TRUE(d.empty());
  // Tiny versions on a loaded machine: children 150 ms behind a parent that verified at once.
  const auto jittery = alike({{1, 2}, {2, 150}, {3, 160}, {4, 170}, {5, 180}, {6, 175}});
  for (const auto& d : run(m, std::vector<Version>(10, jittery), history)) EXPECT_TRUE(d.empty());
  // A producer behind a slow uplink: every member, the root too, takes the link's time.
  const auto uplink = alike({{1, 900}, {2, 950}, {3, 940}, {4, 1000}, {5, 990}, {6, 980}});
  for (const auto& d : run(m, std::vector<Version>(10, uplink), history)) EXPECT_TRUE(d.empty());
  EXPECT_TRUE(history.empty());
}

TEST(SlowRelays, OnlyTheTopOfALateSubtreeAndNeverAReceiverAlone) {
  const auto m = binary6();
  std::map<uint32_t, uint32_t> history;
  // A slow leaf (its own ingress): nobody to demote.
  const auto slow_leaf = alike({{1, 20}, {2, 40}, {3, 45}, {4, 50}, {5, 900}, {6, 60}});
  for (const auto& d : run(m, std::vector<Version>(5, slow_leaf), history)) EXPECT_TRUE(d.empty());
  // One late child of a relay on time (rank 3's only child): its ingress or its parent's egress,
  // which one is not known; left in place.
  const auto one_child = alike({{1, 20}, {2, 40}, {3, 45}, {4, 50}, {5, 55}, {6, 900}});
  for (const auto& d : run(m, std::vector<Version>(5, one_child), history)) EXPECT_TRUE(d.empty());
  // The same child behind a relay late itself (its ingress slow as well): the relay.
  const auto late_relay = alike({{1, 20}, {2, 40}, {3, 800}, {4, 50}, {5, 55}, {6, 900}});
  EXPECT_EQ(run(m, std::vector<Version>(3, late_relay), history).back(), (std::vector<uint32_t>{3}));
  // A slow root: its subtree (2 and everyone below) is late, but only the root is demoted.
  history.clear();
  EXPECT_EQ(run(m, std::vector<Version>(3, slow_root()), history).back(), (std::vector<uint32_t>{1}));
}

TEST(SlowRelays, AVersionWithFewMembersVerifiedSaysNothing) {
  const auto m = binary6();
  std::map<uint32_t, uint32_t> history;
  run(m, {slow_interior(), slow_interior()}, history);
  const auto before = history;
  const Times three = {{1, 20}, {2, 40}, {3, 45}};
  EXPECT_TRUE(find_slow_relays(m, three, three, 9, history).empty());
  EXPECT_EQ(history, before);
  // Members that did not verify at all count as later than anyone.
  const Times unverified = {{1, 20}, {2, 40}, {3, 45}, {6, 60}};
  EXPECT_EQ(ranks(find_slow_relays(m, unverified, unverified, 10, history)), (std::vector<uint32_t>{2}));
}

}  // namespace
}  // namespace deltacast::tree
