// Membership: epoch-0 forests, exhaustive repair after every set of up to three deaths, random
// remove/reparent/add sequences mirrored into a member's copy (from_welcome + apply), and the
// refusal of broken updates.
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "tree/membership.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

const TopologyKind kKinds[] = {TopologyKind::binary, TopologyKind::double_binary, TopologyKind::chain};
constexpr int kMaxMembers = 12;

std::string joined(const std::vector<std::string>& problems) {
  std::string out;
  for (const auto& p : problems) out += p + "\n";
  return out;
}

struct Labeling {
  std::string name;
  std::vector<std::string> labels;
};

// One cluster; first half / second half; three clusters interleaved (a b a c b c ...); one
// cluster per member.
std::vector<Labeling> labelings(int n) {
  std::vector<Labeling> out(4);
  out[0].name = "one";
  out[1].name = "halves";
  out[2].name = "interleaved";
  out[3].name = "singletons";
  const char* pattern[] = {"a", "b", "a", "c", "b", "c"};
  for (int i = 0; i < n; ++i) {
    out[0].labels.push_back("a");
    out[1].labels.push_back(i < n / 2 ? "a" : "b");
    out[2].labels.push_back(pattern[i % 6]);
    out[3].labels.push_back("s" + std::to_string(i));
  }
  return out;
}

int cap(TopologyKind kind) { return kind == TopologyKind::chain ? 1 : 2; }

// The whole observable state: parents and child lists of every tree.
struct Snapshot {
  uint64_t epoch = 0;
  std::vector<uint32_t> live;
  std::vector<std::vector<std::optional<uint32_t>>> parent;  // [tree][rank]
  std::vector<std::vector<std::vector<uint32_t>>> children;  // [tree][rank], [0] = producer
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const Membership& m) {
  Snapshot s;
  s.epoch = m.epoch();
  s.live = m.live_ranks();
  s.parent.resize(m.trees());
  s.children.resize(m.trees());
  for (int t = 0; t < m.trees(); ++t) {
    for (uint32_t r = 0; r <= m.size(); ++r) {
      s.parent[t].push_back(r == 0 ? std::nullopt : m.parent(r, t));
      s.children[t].push_back(m.children(r, t));
    }
  }
  return s;
}

std::vector<TreeEdge> sorted(std::vector<TreeEdge> edges) {
  std::sort(edges.begin(), edges.end(), [](const TreeEdge& a, const TreeEdge& b) {
    return std::tie(a.tree, a.rank, a.parent) < std::tie(b.tree, b.rank, b.parent);
  });
  return edges;
}

std::string describe(const Membership& m) {
  std::string out = std::string(topology_kind_name(m.kind())) + " n=" + std::to_string(m.size()) + " epoch " +
                    std::to_string(m.epoch()) + "\n";
  for (int t = 0; t < m.trees(); ++t) {
    out += " tree " + std::to_string(t) + ":";
    for (uint32_t r = 0; r <= m.size(); ++r) {
      if (r != 0 && !m.live(r)) continue;
      out += " " + std::to_string(r) + (r == 0 ? "" : m.cluster(r)) + "->{";
      for (uint32_t c : m.children(r, t)) out += std::to_string(c) + ",";
      out += "}";
    }
    out += "\n";
  }
  return out;
}

std::vector<Member> members_of(const Membership& m) {
  std::vector<Member> out{Member{0, "producer", "", true}};
  for (uint32_t r = 1; r <= m.size(); ++r) out.push_back(Member{r, "url" + std::to_string(r), m.cluster(r), m.live(r)});
  return out;
}

bool contains(const std::vector<uint32_t>& list, uint32_t x) {
  return std::find(list.begin(), list.end(), x) != list.end();
}

// Removes `dead` and checks every promise of remove(); returns the moves.
std::vector<TreeEdge> check_remove(Membership& m, const std::vector<uint32_t>& dead) {
  const Snapshot before = snapshot(m);
  std::set<uint32_t> leaving;
  for (uint32_t r : dead) {
    if (m.live(r)) leaving.insert(r);
  }
  const auto moves = m.remove(dead);
  const std::string where = describe(m);
  if (leaving.empty()) {
    EXPECT_TRUE(moves.empty());
    EXPECT_EQ(snapshot(m), before) << "removing members that are not live changed something";
    return moves;
  }
  EXPECT_EQ(m.epoch(), before.epoch + 1);
  const auto problems = forest_problems(m);
  EXPECT_TRUE(problems.empty()) << where << joined(problems);
  std::vector<TreeEdge> changed;
  for (int t = 0; t < m.trees(); ++t) {
    for (uint32_t r : m.live_ranks()) {
      const uint32_t old_parent = *before.parent[t][r];
      const bool orphan = leaving.count(old_parent) > 0;
      if (orphan) {
        changed.push_back(TreeEdge{r, static_cast<uint32_t>(t), *m.parent(r, t)});
        continue;
      }
      EXPECT_EQ(m.parent(r, t), old_parent) << "non-orphan " << r << " moved in tree " << t << "\n" << where;
    }
    // Every member keeps its live children, in order, and only gains orphans after them.
    for (uint32_t r = 0; r <= m.size(); ++r) {
      if (r != 0 && !m.live(r)) continue;
      std::vector<uint32_t> kept;
      for (uint32_t c : before.children[t][r]) {
        if (!leaving.count(c)) kept.push_back(c);
      }
      const auto& now = m.children(r, t);
      EXPECT_GE(now.size(), kept.size()) << where;
      if (now.size() < kept.size()) continue;
      EXPECT_TRUE(std::equal(kept.begin(), kept.end(), now.begin())) << "children of " << r << " changed\n" << where;
      for (size_t i = kept.size(); i < now.size(); ++i) {
        EXPECT_TRUE(leaving.count(*before.parent[t][now[i]])) << now[i] << " is not an orphan\n" << where;
      }
    }
    for (uint32_t d : leaving) {
      EXPECT_FALSE(m.live(d));
      EXPECT_FALSE(m.parent(d, t).has_value());
      EXPECT_TRUE(m.children(d, t).empty());
      for (uint32_t r = 0; r <= m.size(); ++r) EXPECT_FALSE(contains(m.children(r, t), d)) << where;
    }
    // With the root gone, the root stays in its cluster while that cluster has a live member.
    const uint32_t old_root = before.children[t][0].front();
    if (leaving.count(old_root)) {
      bool cluster_live = false;
      for (uint32_t r : m.live_ranks()) cluster_live |= m.cluster(r) == m.cluster(old_root);
      if (cluster_live) {
        EXPECT_EQ(m.cluster(*m.root(t)), m.cluster(old_root)) << "old root " << old_root << "\n" << where;
      }
    }
  }
  for (const TreeEdge& e : m.forest()) EXPECT_FALSE(leaving.count(e.rank) || leaving.count(e.parent));
  EXPECT_EQ(sorted(moves), sorted(changed)) << where;
  return moves;
}

std::vector<uint32_t> subtree(const Membership& m, uint32_t top, int tree) {
  std::vector<uint32_t> out{top};
  for (size_t i = 0; i < out.size(); ++i) {
    for (uint32_t c : m.children(out[i], tree)) out.push_back(c);
  }
  return out;
}

// Whether `rank` could move in `tree` to a parent other than its current one without breaking
// a rule: outside its own subtree, in its cluster with a free in-cluster slot (or, for a cluster
// entry, any member outside its cluster).
bool other_candidate_exists(const Membership& m, uint32_t rank, int tree) {
  const uint32_t p = *m.parent(rank, tree);
  const bool entry = p == kProducerRank || m.cluster(p) != m.cluster(rank);
  const auto below = subtree(m, rank, tree);
  for (uint32_t x : m.live_ranks()) {
    if (x == p || contains(below, x)) continue;
    if (entry && m.cluster(x) != m.cluster(rank)) return true;
    if (!entry && m.cluster(x) == m.cluster(rank)) {
      int in_cluster = 0;
      for (uint32_t c : m.children(x, tree)) in_cluster += m.cluster(c) == m.cluster(x);
      if (in_cluster < cap(m.kind())) return true;
    }
  }
  return false;
}

std::vector<TreeEdge> check_reparent(Membership& m, uint32_t rank, int tree) {
  const Snapshot before = snapshot(m);
  const uint32_t old_parent = *m.parent(rank, tree);
  const bool other = other_candidate_exists(m, rank, tree);
  const auto moves = m.reparent(rank, tree);
  const std::string where = describe(m);
  EXPECT_EQ(m.epoch(), before.epoch + 1);
  const auto problems = forest_problems(m);
  EXPECT_TRUE(problems.empty()) << where << joined(problems);
  EXPECT_EQ(moves, (std::vector<TreeEdge>{TreeEdge{rank, static_cast<uint32_t>(tree), *m.parent(rank, tree)}}));
  if (other) {
    EXPECT_NE(*m.parent(rank, tree), old_parent) << "reparent " << rank << " tree " << tree << "\n" << where;
  }
  for (int t = 0; t < m.trees(); ++t) {
    for (uint32_t r : m.live_ranks()) {
      if (r != rank || t != tree) {
        EXPECT_EQ(m.parent(r, t), before.parent[t][r]) << r << " moved\n" << where;
      }
    }
  }
  return moves;
}

std::vector<TreeEdge> check_add(Membership& m, uint32_t rank) {
  const Snapshot before = snapshot(m);
  bool cluster_live = false;
  for (uint32_t r : m.live_ranks()) cluster_live |= m.cluster(r) == m.cluster(rank);
  const auto moves = m.add(rank);
  const std::string where = describe(m);
  EXPECT_EQ(m.epoch(), before.epoch + 1);
  EXPECT_TRUE(m.live(rank));
  const auto problems = forest_problems(m);
  EXPECT_TRUE(problems.empty()) << where << joined(problems);
  EXPECT_EQ(moves.size(), static_cast<size_t>(m.trees()));
  for (int t = 0; t < m.trees(); ++t) {
    EXPECT_EQ(moves.at(t), (TreeEdge{rank, static_cast<uint32_t>(t), *m.parent(rank, t)}));
    EXPECT_TRUE(m.children(rank, t).empty()) << "added " << rank << " is not a leaf\n" << where;
    const uint32_t p = *m.parent(rank, t);
    if (cluster_live) {
      EXPECT_TRUE(p != kProducerRank && m.cluster(p) == m.cluster(rank)) << where;
    }
    for (uint32_t r : before.live) EXPECT_EQ(m.parent(r, t), before.parent[t][r]) << r << " moved\n" << where;
  }
  return moves;
}

void expect_same(const Membership& a, const Membership& b, const std::string& where) {
  EXPECT_EQ(a.epoch(), b.epoch()) << where;
  EXPECT_EQ(a.forest(), b.forest()) << where;
  EXPECT_EQ(a.live_ranks(), b.live_ranks()) << where;
  for (int t = 0; t < a.trees(); ++t) {
    for (uint32_t r = 0; r <= a.size(); ++r) {
      auto x = a.children(r, t);
      auto y = b.children(r, t);
      std::sort(x.begin(), x.end());
      std::sort(y.begin(), y.end());
      EXPECT_EQ(x, y) << where << " children of " << r;
    }
  }
}

// ----- epoch 0 ---------------------------------------------------------------------------------

TEST(MembershipEpochZero, MatchesTopologyAndIsValid) {
  for (TopologyKind kind : kKinds) {
    for (int n = 1; n <= 64; ++n) {
      for (const Labeling& l : labelings(n)) {
        const Membership m(kind, l.labels);
        const Topology topo(kind, l.labels);
        ASSERT_EQ(m.epoch(), 0u);
        ASSERT_EQ(m.size(), static_cast<uint32_t>(n));
        ASSERT_EQ(m.trees(), topo.trees());
        const auto problems = forest_problems(m);
        ASSERT_TRUE(problems.empty()) << topology_kind_name(kind) << " n=" << n << " " << l.name << "\n"
                                      << joined(problems);
        for (int t = 0; t < m.trees(); ++t) {
          ASSERT_EQ(*m.root(t), static_cast<uint32_t>(topo.root(t) + 1));
          for (int i = 0; i < n; ++i) {
            const uint32_t r = i + 1;
            const int p = topo.parent(i, t);
            ASSERT_EQ(*m.parent(r, t), p == kProducer ? kProducerRank : static_cast<uint32_t>(p + 1));
            std::vector<uint32_t> want;
            for (int c : topo.children(i, t)) want.push_back(c + 1);
            ASSERT_EQ(m.children(r, t), want);
            ASSERT_EQ(m.cluster(r), l.labels[i]);
          }
        }
      }
    }
  }
}

// The topology's own cluster layouts (blocks and round-robin, up to 17 clusters): every rule of
// forest_problems holds at epoch 0, in-cluster fan-out and one entry per cluster included.
TEST(MembershipEpochZero, TopologyClusterLayoutsAreValidForests) {
  size_t cases = 0;
  for (TopologyKind kind : kKinds) {
    for (int n = 1; n <= 300; n += (n < 40 ? 1 : 13)) {
      for (int clusters : {1, 2, 3, 5, 8, 17}) {
        if (clusters > n) continue;
        for (bool round_robin : {false, true}) {
          std::vector<std::string> labels;
          for (int r = 0; r < n; ++r)
            labels.push_back("c" + std::to_string(round_robin ? r % clusters : r * clusters / n));
          const Membership m(kind, labels);
          const auto problems = forest_problems(m);
          ASSERT_TRUE(problems.empty()) << topology_kind_name(kind) << " n=" << n << " k=" << clusters << "\n"
                                        << joined(problems);
          ++cases;
        }
      }
    }
  }
  std::printf("epoch-0 cluster layouts checked: %zu\n", cases);
}

TEST(MembershipEpochZero, AProducerInAMembersClusterStaysValidThroughRepairs) {
  for (TopologyKind kind : kKinds) {
    for (int n : {2, 5, 9, 16}) {
      std::vector<std::string> labels;
      for (int r = 0; r < n; ++r) labels.push_back(r < n / 2 ? "trainer" : "rollout");
      Membership m(kind, labels, "trainer");
      ASSERT_TRUE(forest_problems(m).empty()) << joined(forest_problems(m));
      for (int t = 0; t < m.trees(); ++t) EXPECT_EQ(m.cluster(*m.root(t)), "trainer") << t;
      // The roots die: the forest is repaired and stays valid; then they rejoin.
      std::vector<uint32_t> roots;
      for (int t = 0; t < m.trees(); ++t) roots.push_back(*m.root(t));
      m.remove(roots);
      ASSERT_TRUE(forest_problems(m).empty()) << describe(m) << joined(forest_problems(m));
      for (uint32_t r : roots) {
        if (!m.live(r)) m.add(r);
        ASSERT_TRUE(forest_problems(m).empty()) << describe(m) << joined(forest_problems(m));
      }
    }
  }
}

TEST(MembershipEpochZero, Accessors) {
  const Membership m(TopologyKind::double_binary, {"x", "y", "x"});
  EXPECT_EQ(m.kind(), TopologyKind::double_binary);
  EXPECT_EQ(m.trees(), 2);
  EXPECT_EQ(m.live_ranks(), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_FALSE(m.live(0));
  EXPECT_FALSE(m.live(4));
  EXPECT_EQ(m.cluster(2), "y");
  EXPECT_THROW(m.cluster(0), Error);
  EXPECT_THROW(m.cluster(4), Error);
  EXPECT_THROW(m.parent(1, 2), Error);
  EXPECT_FALSE(m.parent(7, 0).has_value());
  EXPECT_EQ(m.depth(*m.root(0), 0), 0);
  EXPECT_EQ(m.forest().size(), 6u);
  EXPECT_THROW(Membership(TopologyKind::binary, {}), Error);
}

// ----- hand-checked repairs --------------------------------------------------------------------

TEST(MembershipRepair, BinaryOrphansGoUnderTheAncestorThenTheShallowestFreeSlot) {
  // 1 -> {2, 3}, 2 -> {4, 5}, 3 -> {6, 7}. Without 2: 4 under 1 (the nearest live ancestor has
  // room), then 5 under 4 (1 is full; 4 is the shallowest with a free slot).
  Membership m(TopologyKind::binary, std::vector<std::string>(7, "a"));
  const uint32_t dead[] = {2};
  EXPECT_EQ(m.remove(dead), (std::vector<TreeEdge>{{4, 0, 1}, {5, 0, 4}}));
  EXPECT_EQ(m.children(1, 0), (std::vector<uint32_t>{3, 4}));
  EXPECT_EQ(m.children(4, 0), (std::vector<uint32_t>{5}));
  EXPECT_EQ(m.epoch(), 1u);
}

TEST(MembershipRepair, DoubleBinaryOrphansPreferTheAncestorThenLeavesOfTheOtherTree) {
  // n = 8, tree 0: 1 -> 5 -> {3, 7}, 3 -> {2, 4}, 7 -> {6, 8}; tree 1: 8 -> 4 -> {6, 2},
  // 6 -> {7, 5}, 2 -> {3, 1}. Without 3 (a leaf in tree 1): 2 goes under 5 (the nearest live
  // ancestor, with room), then 4 under 1 (the shallowest with room, a leaf in tree 1), not 7
  // (interior in tree 1).
  Membership m(TopologyKind::double_binary, std::vector<std::string>(8, "a"));
  ASSERT_EQ(m.children(3, 0), (std::vector<uint32_t>{2, 4}));
  ASSERT_TRUE(m.children(3, 1).empty());
  const uint32_t dead[] = {3};
  EXPECT_EQ(m.remove(dead), (std::vector<TreeEdge>{{2, 0, 5}, {4, 0, 1}}));
}

TEST(MembershipRepair, ClusterEntryMovesToTheNearestLiveAncestor) {
  // chain a,b,a,b: 1 -> 3 -> 2 -> 4 (cluster a: 1, 3; b: 2, 4).
  Membership m(TopologyKind::chain, {"a", "b", "a", "b"});
  ASSERT_EQ(m.children(3, 0), (std::vector<uint32_t>{2}));
  const uint32_t egress[] = {3};
  EXPECT_EQ(m.remove(egress), (std::vector<TreeEdge>{{2, 0, 1}}));
  Membership n(TopologyKind::chain, {"a", "b", "a", "b"});
  const uint32_t root[] = {1};
  EXPECT_EQ(n.remove(root), (std::vector<TreeEdge>{{3, 0, kProducerRank}}));
  EXPECT_EQ(*n.root(0), 3u);
  // The whole of cluster a gone: b's entry becomes the root.
  const uint32_t rest[] = {3};
  EXPECT_EQ(n.remove(rest), (std::vector<TreeEdge>{{2, 0, kProducerRank}}));
}

TEST(MembershipRepair, RootDeathKeepsTheRootInItsCluster) {
  for (TopologyKind kind : kKinds) {
    for (int n = 2; n <= kMaxMembers; ++n) {
      for (const Labeling& l : labelings(n)) {
        const Membership base(kind, l.labels);
        for (int t = 0; t < base.trees(); ++t) {
          Membership m = base;
          const uint32_t root = *m.root(t);
          const uint32_t dead[] = {root};
          m.remove(dead);
          const auto problems = forest_problems(m);
          ASSERT_TRUE(problems.empty()) << describe(m) << joined(problems);
          bool cluster_live = false;
          for (uint32_t r : m.live_ranks()) cluster_live |= m.cluster(r) == m.cluster(root);
          if (cluster_live) {
            ASSERT_EQ(m.cluster(*m.root(t)), m.cluster(root)) << describe(m);
            // The new root was one of the old root's children.
            ASSERT_TRUE(contains(base.children(root, t), *m.root(t))) << describe(m);
          }
        }
      }
    }
  }
}

// ----- exhaustive removals ---------------------------------------------------------------------

TEST(MembershipExhaustive, EverySingleDoubleAndTripleDeath) {
  size_t cases = 0;
  for (TopologyKind kind : kKinds) {
    for (int n = 1; n <= kMaxMembers; ++n) {
      for (const Labeling& l : labelings(n)) {
        const Membership base(kind, l.labels);
        const auto run = [&](const std::vector<uint32_t>& dead) {
          Membership m = base;
          SCOPED_TRACE(std::string(topology_kind_name(kind)) + " n=" + std::to_string(n) + " " + l.name + " dead " +
                       std::to_string(dead[0]) + (dead.size() > 1 ? "," + std::to_string(dead[1]) : "") +
                       (dead.size() > 2 ? "," + std::to_string(dead[2]) : ""));
          check_remove(m, dead);
          ++cases;
        };
        for (uint32_t a = 1; a <= static_cast<uint32_t>(n); ++a) {
          run({a});
          for (uint32_t b = a + 1; b <= static_cast<uint32_t>(n); ++b) {
            run({a, b});
            for (uint32_t c = b + 1; c <= static_cast<uint32_t>(n); ++c) run({a, b, c});
          }
        }
        if (HasFailure()) return;
      }
    }
  }
  std::printf("exhaustive removals checked: %zu\n", cases);
}

// After every single death, every live member's edge in every tree fails in turn.
TEST(MembershipExhaustive, ReparentAvoidsTheOldParentWhenAnotherCandidateExists) {
  size_t cases = 0;
  size_t moved_away = 0;
  for (TopologyKind kind : kKinds) {
    for (int n = 1; n <= kMaxMembers; ++n) {
      for (const Labeling& l : labelings(n)) {
        const Membership base(kind, l.labels);
        for (uint32_t dead = 0; dead <= static_cast<uint32_t>(n); ++dead) {
          Membership after = base;
          const uint32_t gone[] = {dead};
          if (dead != 0) after.remove(gone);
          for (int t = 0; t < after.trees(); ++t) {
            for (uint32_t r : after.live_ranks()) {
              Membership m = after;
              SCOPED_TRACE(std::string(topology_kind_name(kind)) + " n=" + std::to_string(n) + " " + l.name + " dead " +
                           std::to_string(dead) + " reparent " + std::to_string(r) + " tree " + std::to_string(t));
              const uint32_t old_parent = *m.parent(r, t);
              check_reparent(m, r, t);
              moved_away += *m.parent(r, t) != old_parent;
              ++cases;
            }
          }
          if (HasFailure()) return;
        }
      }
    }
  }
  EXPECT_GT(moved_away, cases / 4);
  std::printf("reparent cases checked: %zu (%zu moved to another parent)\n", cases, moved_away);
}

TEST(MembershipRepair, ReparentOfTheOnlyPlaceStays) {
  // A chain's one cluster has its only free slot at the tail, inside the moved member's subtree:
  // the member goes back under the same parent, and the epoch still advances.
  Membership m(TopologyKind::chain, std::vector<std::string>(4, "a"));
  EXPECT_EQ(m.reparent(3, 0), (std::vector<TreeEdge>{{3, 0, 2}}));
  EXPECT_EQ(m.epoch(), 1u);
  // A root has nowhere else to go either.
  EXPECT_EQ(m.reparent(1, 0), (std::vector<TreeEdge>{{1, 0, kProducerRank}}));
  // Binary 1 -> {2, 3}, 2 -> {4, 5}: 5 leaves 2 for the shallowest free slot, 3 (1 is full).
  Membership b(TopologyKind::binary, std::vector<std::string>(5, "a"));
  EXPECT_EQ(b.reparent(5, 0), (std::vector<TreeEdge>{{5, 0, 3}}));
  EXPECT_THROW(b.reparent(9, 0), Error);
  EXPECT_THROW(b.reparent(1, 1), Error);
}

// ----- add -------------------------------------------------------------------------------------

TEST(MembershipAdd, RejoinIsALeafEverywhereAndMovesNobody) {
  size_t cases = 0;
  for (TopologyKind kind : kKinds) {
    for (int n = 1; n <= kMaxMembers; ++n) {
      for (const Labeling& l : labelings(n)) {
        const Membership base(kind, l.labels);
        for (uint32_t a = 1; a <= static_cast<uint32_t>(n); ++a) {
          for (uint32_t b = a; b <= static_cast<uint32_t>(n); ++b) {
            Membership m = base;
            const uint32_t dead[] = {a, b};
            m.remove(dead);
            SCOPED_TRACE(std::string(topology_kind_name(kind)) + " n=" + std::to_string(n) + " " + l.name + " dead " +
                         std::to_string(a) + "," + std::to_string(b));
            check_add(m, a);
            if (b != a) check_add(m, b);
            EXPECT_THROW(m.add(a), Error);
            ++cases;
          }
        }
        if (HasFailure()) return;
      }
    }
  }
  const Membership m(TopologyKind::binary, {"a", "b"});
  EXPECT_THROW(Membership(m).add(0), Error);
  EXPECT_THROW(Membership(m).add(3), Error);
  std::printf("add cases checked: %zu\n", cases);
}

TEST(MembershipAdd, IntoAnEmptyMembershipBecomesTheRoot) {
  Membership m(TopologyKind::double_binary, {"a", "b", "c"});
  const uint32_t all[] = {1, 2, 3};
  m.remove(all);
  EXPECT_TRUE(m.live_ranks().empty());
  EXPECT_FALSE(m.root(0).has_value());
  EXPECT_TRUE(forest_problems(m).empty());
  EXPECT_EQ(m.add(2), (std::vector<TreeEdge>{{2, 0, kProducerRank}, {2, 1, kProducerRank}}));
  // A member of a new cluster becomes that cluster's entry.
  const auto moves = m.add(3);
  EXPECT_EQ(moves, (std::vector<TreeEdge>{{3, 0, 2}, {3, 1, 2}}));
  EXPECT_TRUE(forest_problems(m).empty());
}

// ----- random sequences, mirrored into a member's copy ------------------------------------------

struct Sequence {
  TopologyKind kind;
  Labeling labeling;
  unsigned seed;
  int producers = 1;  // a producer group's ranks: producers x tree_count(kind) trees
};

// Runs 50 random steps on `producer`, mirroring each into `copy` by apply(); checks both.
// `log` receives the forest after every step (for the determinism test).
void run_sequence(const Sequence& s, std::vector<std::vector<TreeEdge>>* log) {
  Membership producer(s.kind, s.labeling.labels, "", s.producers);
  ASSERT_EQ(producer.trees(), s.producers * tree_count(s.kind));
  Membership copy =
      Membership::from_welcome(s.kind, producer.epoch(), members_of(producer), producer.forest(), s.producers);
  expect_same(producer, copy, "welcome");
  std::mt19937 rng(s.seed);
  const uint32_t n = producer.size();
  auto pick = [&](const std::vector<uint32_t>& from) { return from[rng() % from.size()]; };
  for (int step = 0; step < 50; ++step) {
    const auto live = producer.live_ranks();
    std::vector<uint32_t> gone;
    for (uint32_t r = 1; r <= n; ++r) {
      if (!producer.live(r)) gone.push_back(r);
    }
    int op = static_cast<int>(rng() % 3);
    if (op == 2 && gone.empty()) op = 0;
    if (op != 2 && live.empty()) op = 2;
    SCOPED_TRACE("seed " + std::to_string(s.seed) + " step " + std::to_string(step) + " op " + std::to_string(op));
    const uint64_t epoch = producer.epoch();
    if (op == 0) {
      // One or two ranks, either possibly not live (then ignored).
      std::vector<uint32_t> dead{1 + static_cast<uint32_t>(rng() % n)};
      if (rng() % 2) dead.push_back(1 + static_cast<uint32_t>(rng() % n));
      std::vector<DeadMember> dead_members;
      for (uint32_t r : dead) {
        bool seen = false;
        for (const auto& d : dead_members) seen |= d.rank == r;
        if (producer.live(r) && !seen) dead_members.push_back(DeadMember{r, FailureCause::silent});
      }
      const auto moves = check_remove(producer, dead);
      if (producer.epoch() != epoch) copy.apply(producer.epoch(), dead_members, {}, moves);
    } else if (op == 1) {
      const uint32_t r = pick(live);
      const int t = static_cast<int>(rng() % producer.trees());
      const auto moves = check_reparent(producer, r, t);
      copy.apply(producer.epoch(), {}, {}, moves);
    } else {
      const uint32_t r = pick(gone);
      const auto moves = check_add(producer, r);
      const Member joined{r, "url", producer.cluster(r), true};
      copy.apply(producer.epoch(), std::span<const DeadMember>{}, std::span<const Member>(&joined, 1), moves);
    }
    expect_same(producer, copy, "after step");
    // A copy welcomed now agrees too.
    expect_same(
        producer,
        Membership::from_welcome(s.kind, producer.epoch(), members_of(producer), producer.forest(), s.producers),
        "late welcome");
    if (log) log->push_back(producer.forest());
    if (::testing::Test::HasFailure()) return;
  }
}

std::vector<Sequence> sequences() {
  std::vector<Sequence> out;
  for (TopologyKind kind : kKinds) {
    for (int n : {5, 9, 12}) {
      for (const Labeling& l : labelings(n)) {
        for (unsigned seed = 1; seed <= 8; ++seed)
          out.push_back(Sequence{kind, l, seed * 7919u + static_cast<unsigned>(n)});
      }
    }
  }
  return out;
}

TEST(MembershipSequence, RandomRemoveReparentAddMirroredByApply) {
  size_t runs = 0;
  for (const Sequence& s : sequences()) {
    SCOPED_TRACE(std::string(topology_kind_name(s.kind)) + " " + s.labeling.name +
                 " n=" + std::to_string(s.labeling.labels.size()));
    run_sequence(s, nullptr);
    if (HasFailure()) return;
    ++runs;
  }
  std::printf("random sequences checked: %zu x 50 steps\n", runs);
}

// A producer group's forest (M ranks, each with its own rotated trees): random deaths, edge
// failures and rejoins keep every tree valid, and a member's copy follows by apply().
TEST(MembershipGroup, RandomSequencesOverAGroupsForestStayValidAndMirrored) {
  size_t runs = 0;
  for (int producers : {2, 3, 5}) {
    for (Sequence s : sequences()) {
      if (s.seed % 2 != 0) continue;
      s.producers = producers;
      SCOPED_TRACE(std::string(topology_kind_name(s.kind)) + " " + s.labeling.name + " M=" + std::to_string(producers) +
                   " n=" + std::to_string(s.labeling.labels.size()));
      run_sequence(s, nullptr);
      if (HasFailure()) return;
      ++runs;
    }
  }
  EXPECT_GT(runs, 50u);
  // A WELCOME's forest names trees of the group: one beyond it is refused.
  const Membership m(TopologyKind::binary, {"", "", ""}, "", 2);
  auto forest = m.forest();
  EXPECT_THROW(Membership::from_welcome(TopologyKind::binary, 0, members_of(m), forest, 1), Error);
  EXPECT_THROW(Membership::from_welcome(TopologyKind::binary, 0, members_of(m), forest, 0), Error);
  EXPECT_NO_THROW(Membership::from_welcome(TopologyKind::binary, 0, members_of(m), forest, 2));
}

// A member finds its parent's URL: a member's from the members list; a root's, the producer rank
// that feeds that tree (the WELCOME's producer_urls), or members' rank 0 with one producer.
TEST(MembershipGroup, ARootJoinsTheProducerRankOfItsTree) {
  const std::vector<Member> members{{0, "tcp://coordinator:1", "", true},
                                    {1, "tcp://m1:1", "", true},
                                    {2, "tcp://m2:1", "", true},
                                    {3, "tcp://m3:1", "", true}};
  const std::vector<std::string> urls{"tcp://coordinator:1", "tcp://rank1:1", "tcp://rank2:1"};
  const Membership group(TopologyKind::double_binary, {"", "", ""}, "", 3);
  ASSERT_EQ(group.trees(), 6);
  EXPECT_EQ(group.producers(), 3);
  for (int t = 0; t < group.trees(); ++t) {
    EXPECT_EQ(group.producer_of(t), static_cast<uint32_t>(t / 2));
    const uint32_t root = group.children(kProducerRank, t).front();
    EXPECT_EQ(group.parent(root, t), kProducerRank);
    EXPECT_EQ(parent_url(members, urls, group, t, kProducerRank), urls[static_cast<size_t>(t / 2)]) << "tree " << t;
    for (uint32_t r = 1; r <= 3; ++r) {
      const auto p = group.parent(r, t);
      if (p && *p != kProducerRank) {
        EXPECT_EQ(parent_url(members, urls, group, t, *p), members[*p].url);
      }
    }
  }
  // One producer: rank 0's URL from the members list.
  const Membership single(TopologyKind::binary, {"", "", ""});
  EXPECT_EQ(single.producers(), 1);
  EXPECT_EQ(single.producer_of(0), 0u);
  EXPECT_EQ(parent_url(members, {}, single, 0, kProducerRank), "tcp://coordinator:1");
  // A group that lists fewer URLs than it has ranks, or an unknown member: not found.
  try {
    parent_url(members, {"tcp://coordinator:1"}, group, 5, kProducerRank);
    ADD_FAILURE() << "tree 5's producer rank 2 has no URL";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_NE(std::string(e.what()).find("producer rank 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parent_url(members, urls, group, 0, 9), Error);
}

// A producer rank back at another data URL: the roots of its trees (and only those) are the
// moves, parents unchanged, at a new epoch; members applying them keep the same forest.
TEST(MembershipGroup, ReconnectRootsNamesTheRootsOfOneRanksTrees) {
  Membership group(TopologyKind::double_binary, {"", "", "", "", "", ""}, "", 3);
  Membership mirror =
      Membership::from_welcome(TopologyKind::double_binary, group.epoch(), members_of(group), group.forest(), 3);
  const auto forest = group.forest();
  const uint64_t epoch = group.epoch();
  const auto moves = group.reconnect_roots(1);
  EXPECT_EQ(group.epoch(), epoch + 1);
  ASSERT_EQ(moves.size(), 2u);  // rank 1 feeds trees 2 and 3
  for (const auto& m : moves) {
    EXPECT_EQ(group.producer_of(static_cast<int>(m.tree)), 1u);
    EXPECT_EQ(m.parent, kProducerRank);
    EXPECT_EQ(group.root(static_cast<int>(m.tree)), m.rank);
  }
  EXPECT_EQ(group.forest(), forest);
  mirror.apply(group.epoch(), {}, {}, moves);
  EXPECT_EQ(mirror.forest(), forest);
  EXPECT_EQ(mirror.epoch(), group.epoch());
  EXPECT_THROW(group.reconnect_roots(3), Error);
}

TEST(MembershipSequence, Deterministic) {
  for (const Sequence& s : sequences()) {
    std::vector<std::vector<TreeEdge>> a;
    std::vector<std::vector<TreeEdge>> b;
    run_sequence(s, &a);
    run_sequence(s, &b);
    ASSERT_EQ(a, b);
  }
  // Same inputs, separately built: same forests and the same child order.
  Membership x(TopologyKind::double_binary, {"a", "b", "a", "c", "b", "c", "a", "a"});
  Membership y(TopologyKind::double_binary, {"a", "b", "a", "c", "b", "c", "a", "a"});
  const uint32_t dead[] = {1, 7};
  EXPECT_EQ(x.remove(dead), y.remove(dead));
  EXPECT_EQ(x.reparent(3, 1), y.reparent(3, 1));
  EXPECT_EQ(x.add(7), y.add(7));
  EXPECT_EQ(snapshot(x), snapshot(y));
}

// ----- refused updates -------------------------------------------------------------------------

void expect_refused(Membership& m, uint64_t epoch, std::vector<DeadMember> dead, std::vector<Member> joined,
                    std::vector<TreeEdge> moves, const std::string& what) {
  const Snapshot before = snapshot(m);
  try {
    m.apply(epoch, dead, joined, moves);
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_frame) << what;
  }
  EXPECT_EQ(snapshot(m), before) << what << ": changed by a refused update";
}

TEST(MembershipApply, RefusesBrokenUpdatesAndStaysUnchanged) {
  for (TopologyKind kind : kKinds) {
    Membership producer(kind, {"a", "a", "a", "b", "b", "b", "a"});
    Membership m = Membership::from_welcome(kind, 0, members_of(producer), producer.forest());
    const uint64_t next = 1;
    // Find a member with a grandchild, for a cycle.
    uint32_t top = 0;
    uint32_t below = 0;
    for (uint32_t r : m.live_ranks()) {
      for (uint32_t c : m.children(r, 0)) {
        if (!m.children(c, 0).empty() && top == 0) {
          top = c;
          below = m.children(c, 0).front();
        }
      }
    }
    ASSERT_NE(top, 0u);
    expect_refused(m, next, {}, {}, {{top, 0, below}}, "cycle");
    expect_refused(m, 0, {}, {}, {}, "old epoch");
    expect_refused(m, next, {}, {}, {{1, 5, 0}}, "no such tree");
    expect_refused(m, next, {}, {}, {{*m.root(0), 0, 99}}, "parent out of range");
    expect_refused(m, next, {}, {}, {{42, 0, 1}}, "rank out of range");
    expect_refused(m, next, {}, {{3, "", "a", true}}, {}, "joined already live");
    // Dead without moves leaves orphans under a dead parent (or no root at all).
    const uint32_t victim = *m.root(0);
    expect_refused(m, next, {{victim, FailureCause::silent}}, {}, {}, "orphans left under a dead member");
    // A correct removal is accepted; then a move under the dead member is not.
    const uint32_t dead[] = {victim};
    const auto moves = producer.remove(dead);
    const DeadMember gone{victim, FailureCause::left};
    m.apply(producer.epoch(), std::span<const DeadMember>(&gone, 1), {}, moves);
    expect_same(producer, m, "after removal");
    uint32_t leaf = 0;
    for (uint32_t r : m.live_ranks()) {
      if (m.children(r, 0).empty()) leaf = r;
    }
    const uint64_t after = m.epoch() + 1;
    expect_refused(m, after, {}, {}, {{leaf, 0, victim}}, "dead parent");
    expect_refused(m, after, {{victim, FailureCause::silent}}, {}, {}, "dead member again");
    expect_refused(m, after, {}, {}, {{victim, 0, 1}}, "move of a dead member");
    {
      // A rejoin with its edges is accepted only with the rank's own cluster label.
      Membership rejoined = producer;
      const auto edges = rejoined.add(victim);
      expect_refused(m, rejoined.epoch(), {}, {{victim, "", m.cluster(victim) + "x", true}}, edges,
                     "joined with another cluster");
      Membership ok = m;
      const Member back{victim, "", m.cluster(victim), true};
      ok.apply(rejoined.epoch(), {}, std::span<const Member>(&back, 1), edges);
      expect_same(rejoined, ok, "rejoin");
    }
    expect_refused(m, after, {}, {{victim, "", m.cluster(victim), true}}, {}, "joined without edges");
    expect_refused(m, after, {}, {}, {{leaf, 0, leaf}}, "self parent");
    expect_refused(m, after, {}, {}, {{leaf, 0, *m.parent(leaf, 0)}, {leaf, 0, *m.parent(leaf, 0)}},
                   "move listed twice");
    // A leaf moved into another cluster makes a second entry; under a full member, too many children.
    for (uint32_t r : m.live_ranks()) {
      const uint32_t p = *m.parent(leaf, 0);
      const bool leaf_is_entry = p == kProducerRank || m.cluster(p) != m.cluster(leaf);
      if (!leaf_is_entry && m.cluster(r) != m.cluster(leaf)) {
        expect_refused(m, after, {}, {}, {{leaf, 0, r}}, "second cluster entry");
        break;
      }
    }
    for (uint32_t r : m.live_ranks()) {
      int in_cluster = 0;
      for (uint32_t c : m.children(r, 0)) in_cluster += m.cluster(c) == m.cluster(r);
      if (in_cluster == cap(kind) && m.cluster(leaf) == m.cluster(r) && leaf != r &&
          !contains(m.children(r, 0), leaf)) {
        expect_refused(m, after, {}, {}, {{leaf, 0, r}}, "fan-out over the cap");
        break;
      }
    }
  }
}

TEST(MembershipApply, WelcomeRefusesBrokenForests) {
  const Membership m(TopologyKind::binary, {"a", "a", "b", "b"});
  const auto members = members_of(m);
  const auto forest = m.forest();
  auto refused = [&](const std::vector<Member>& ms, const std::vector<TreeEdge>& f, const std::string& what) {
    try {
      Membership::from_welcome(TopologyKind::binary, 3, ms, f);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == Errc::corrupt_frame || e.code() == Errc::invalid_argument) << what;
    }
  };
  EXPECT_EQ(Membership::from_welcome(TopologyKind::binary, 3, members, forest).epoch(), 3u);
  auto missing = forest;
  missing.pop_back();
  refused(members, missing, "missing edge");
  auto twice = forest;
  twice.push_back(forest.back());
  refused(members, twice, "edge listed twice");
  auto two_roots = forest;
  for (auto& e : two_roots) {
    if (e.parent != kProducerRank) {
      e.parent = kProducerRank;
      break;
    }
  }
  refused(members, two_roots, "two roots");
  auto gap = members;
  gap.back().rank = 9;
  refused(gap, forest, "rank out of range");
  auto dup = members;
  dup.back().rank = 1;
  refused(dup, forest, "rank listed twice");
  auto dead = members;
  dead[2].live = false;
  refused(dead, forest, "edge of a member that is not live");
  refused({}, {}, "no members");
  // The wrong kind: a binary forest has one tree, double_binary needs two.
  EXPECT_THROW(Membership::from_welcome(TopologyKind::double_binary, 3, members, forest), Error);
}

}  // namespace
}  // namespace deltacast::tree
