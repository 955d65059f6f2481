// Exhaustive checks of the relay-tree topologies: every kind, every size 1..1024, every rank.
#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tree/topology.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

constexpr int kMaxMembers = 1024;
const TopologyKind kKinds[] = {TopologyKind::binary, TopologyKind::double_binary, TopologyKind::chain};

int floor_log2(int n) { return std::bit_width(static_cast<unsigned>(n)) - 1; }

std::string joined(const std::vector<std::string>& problems) {
  std::string out;
  for (const auto& p : problems) out += p + "\n";
  return out;
}

TEST(TopologyPure, BinaryHeapOrderMatchesPicture) {
  EXPECT_EQ(binary_tree_links(15, 0).parent, kProducer);
  EXPECT_EQ(binary_tree_links(15, 0).children, (std::vector<int>{1, 2}));
  EXPECT_EQ(binary_tree_links(15, 4).parent, 1);
  EXPECT_EQ(binary_tree_links(15, 4).children, (std::vector<int>{9, 10}));
  EXPECT_EQ(binary_tree_links(10, 4).children, (std::vector<int>{9}));
  EXPECT_TRUE(binary_tree_links(15, 7).children.empty());
}

TEST(TopologyPure, DoubleBinaryMatchesPicture) {
  // tree 0 for m = 8: 0 -> 4 -> {2, 6}; 2 -> {1, 3}; 6 -> {5, 7}
  EXPECT_EQ(double_binary_tree_links(8, 0, 0).children, (std::vector<int>{4}));
  EXPECT_EQ(double_binary_tree_links(8, 4, 0).children, (std::vector<int>{2, 6}));
  EXPECT_EQ(double_binary_tree_links(8, 6, 0).children, (std::vector<int>{5, 7}));
  EXPECT_EQ(double_binary_tree_links(8, 7, 0).parent, 6);
  // tree 1 is the mirror: 7 -> 3 -> {5, 1}; 5 -> {6, 4}; 1 -> {2, 0}
  EXPECT_EQ(double_binary_tree_links(8, 7, 1).parent, kProducer);
  EXPECT_EQ(double_binary_tree_links(8, 3, 1).children, (std::vector<int>{5, 1}));
  EXPECT_EQ(double_binary_tree_links(8, 1, 1).children, (std::vector<int>{2, 0}));
  // odd n: the extra member 8 hangs under both roots
  EXPECT_EQ(double_binary_tree_links(9, 8, 0).parent, 0);
  EXPECT_EQ(double_binary_tree_links(9, 8, 1).parent, 7);
  EXPECT_EQ(double_binary_tree_links(9, 0, 0).children, (std::vector<int>{4, 8}));
}

TEST(TopologyPure, ChainLinksNeighbours) {
  EXPECT_EQ(chain_links(5, 0).parent, kProducer);
  EXPECT_EQ(chain_links(5, 2).parent, 1);
  EXPECT_EQ(chain_links(5, 2).children, (std::vector<int>{3}));
  EXPECT_TRUE(chain_links(5, 4).children.empty());
}

TEST(TopologyPure, RejectsBadArguments) {
  EXPECT_THROW(binary_tree_links(4, 4), Error);
  EXPECT_THROW(chain_links(0, 0), Error);
  EXPECT_THROW(double_binary_tree_links(4, -1, 0), Error);
  EXPECT_THROW(double_binary_tree_links(4, 1, 2), Error);
  EXPECT_THROW(Topology(TopologyKind::binary, {}), Error);
  EXPECT_THROW(Topology::single_cluster(TopologyKind::chain, 3).links(3, 0), Error);
  EXPECT_THROW(Topology::single_cluster(TopologyKind::chain, 3).links(0, 1), Error);
}

TEST(TopologyPure, KindNamesRoundTrip) {
  for (TopologyKind kind : kKinds) EXPECT_EQ(parse_topology_kind(topology_kind_name(kind)), kind);
  EXPECT_EQ(parse_topology_kind("double-binary"), TopologyKind::double_binary);
  try {
    parse_topology_kind("ring");
    FAIL() << "ring accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("ring"), std::string::npos);
  }
}

TEST(TopologyPure, ChunksAlternateTreesForDoubleBinary) {
  for (uint64_t c = 0; c < 16; ++c) {
    EXPECT_EQ(tree_for_chunk(TopologyKind::double_binary, c), static_cast<int>(c % 2));
    EXPECT_EQ(tree_for_chunk(TopologyKind::binary, c), 0);
    EXPECT_EQ(tree_for_chunk(TopologyKind::chain, c), 0);
  }
}

// The Topology object with one cluster must equal the pure functions, and be a valid tree.
TEST(TopologyExhaustive, SingleClusterEveryKindEverySize) {
  for (TopologyKind kind : kKinds) {
    for (int n = 1; n <= kMaxMembers; ++n) {
      const Topology topo = Topology::single_cluster(kind, n);
      ASSERT_EQ(topo.trees(), tree_count(kind));
      const auto problems = topology_problems(topo);
      ASSERT_TRUE(problems.empty()) << topology_kind_name(kind) << " n=" << n << "\n" << joined(problems);
      for (int t = 0; t < topo.trees(); ++t) {
        ASSERT_EQ(topo.root(t), tree_root(kind, n, t));
        ASSERT_EQ(cluster_crossings(topo, t), 1);
        for (int r = 0; r < n; ++r) {
          TreeLinks pure = kind == TopologyKind::binary ? binary_tree_links(n, r)
                           : kind == TopologyKind::chain ? chain_links(n, r)
                                                         : double_binary_tree_links(n, r, t);
          ASSERT_EQ(topo.parent(r, t), pure.parent) << "n=" << n << " r=" << r;
          ASSERT_EQ(topo.children(r, t), pure.children) << "n=" << n << " r=" << r;
          ASSERT_LE(topo.children(r, t).size(), kind == TopologyKind::chain ? 1u : 2u);
        }
        const int depth = tree_depth(topo, t);
        switch (kind) {
          case TopologyKind::binary: ASSERT_EQ(depth, floor_log2(n)) << "n=" << n; break;
          case TopologyKind::chain: ASSERT_EQ(depth, n - 1); break;
          case TopologyKind::double_binary: ASSERT_LE(depth, floor_log2(n) + 1) << "n=" << n; break;
        }
      }
    }
  }
}

// NCCL's property: each member is interior in at most one of the two trees and a leaf in the
// other, so no member sends more than it receives (send load <= 1 payload).
TEST(TopologyExhaustive, DoubleBinaryInteriorInAtMostOneTree) {
  for (int n = 1; n <= kMaxMembers; ++n) {
    const Topology topo = Topology::single_cluster(TopologyKind::double_binary, n);
    int leaves_in_both = 0;
    for (int r = 0; r < n; ++r) {
      const bool interior0 = !topo.children(r, 0).empty();
      const bool interior1 = !topo.children(r, 1).empty();
      ASSERT_FALSE(interior0 && interior1) << "n=" << n << " r=" << r;
      leaves_in_both += !interior0 && !interior1;
      ASSERT_LE(send_load(topo, r), 1.0) << "n=" << n << " r=" << r;
    }
    // Even n: every member forwards in exactly one tree; odd n: only the extra member idles.
    if (n >= 2) {
      ASSERT_EQ(leaves_in_both, n % 2) << "n=" << n;
    }
  }
}

TEST(TopologyExhaustive, SendLoadPerKind) {
  for (int n = 1; n <= kMaxMembers; ++n) {
    const Topology binary = Topology::single_cluster(TopologyKind::binary, n);
    const Topology chain = Topology::single_cluster(TopologyKind::chain, n);
    double binary_max = 0;
    for (int r = 0; r < n; ++r) {
      binary_max = std::max(binary_max, send_load(binary, r));
      ASSERT_LE(send_load(chain, r), 1.0);
    }
    // A binary tree makes interior members send every byte twice: the throughput cost.
    ASSERT_EQ(binary_max, n >= 3 ? 2.0 : n - 1.0) << "n=" << n;
  }
}

// Cluster labels c0..c(k-1) assigned round-robin or in blocks; every boundary crossed once.
std::vector<std::string> labels(int n, int clusters, bool round_robin) {
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.push_back("c" + std::to_string(round_robin ? r % clusters : r * clusters / n));
  return out;
}

TEST(TopologyExhaustive, ClustersCrossedOncePerTree) {
  for (TopologyKind kind : kKinds) {
    for (int n = 1; n <= kMaxMembers; n += (n < 64 ? 1 : 7)) {
      for (int clusters : {1, 2, 3, 5, 8, 17}) {
        if (clusters > n) continue;
        for (bool round_robin : {false, true}) {
          const Topology topo(kind, labels(n, clusters, round_robin));
          ASSERT_EQ(topo.cluster_count(), clusters);
          const auto problems = topology_problems(topo);
          ASSERT_TRUE(problems.empty()) << topology_kind_name(kind) << " n=" << n << " k=" << clusters << "\n"
                                        << joined(problems);
          for (int t = 0; t < topo.trees(); ++t) {
            // clusters - 1 member-to-member crossings, plus producer -> first cluster.
            ASSERT_EQ(cluster_crossings(topo, t), clusters) << "n=" << n << " k=" << clusters;
            ASSERT_EQ(topo.cluster_of(topo.root(t)), tree_root(kind, clusters, t));
            for (int k = 0; k < clusters; ++k) {
              // The gateway is the only member of cluster k fed from outside it.
              for (int r : topo.cluster_members(k)) {
                const int p = topo.parent(r, t);
                const bool from_outside = p == kProducer || topo.cluster_of(p) != k;
                ASSERT_EQ(from_outside, r == topo.gateway(k, t)) << "n=" << n << " k=" << k << " r=" << r;
              }
            }
          }
          for (int r = 0; r < n; ++r) {
            const double cap = kind == TopologyKind::binary ? 2.0 : kind == TopologyKind::chain ? 1.0 : 1.5;
            ASSERT_LE(send_load(topo, r), cap) << topology_kind_name(kind) << " n=" << n << " r=" << r;
          }
        }
      }
    }
  }
}

TEST(TopologyExhaustive, AProducerInAMembersClusterRootsEveryTreeThere) {
  for (TopologyKind kind : kKinds) {
    for (int n = 1; n <= 40; ++n) {
      for (int clusters : {1, 2, 3, 5, 8}) {
        if (clusters > n) continue;
        for (bool round_robin : {false, true}) {
          const auto members = labels(n, clusters, round_robin);
          const Topology plain(kind, members);
          for (int home = 0; home < clusters; ++home) {
            const std::string label = plain.cluster_label(home);
            const Topology topo(kind, members, label);
            ASSERT_EQ(topo.producer_cluster(), home);
            const auto problems = topology_problems(topo);
            ASSERT_TRUE(problems.empty())
                << topology_kind_name(kind) << " n=" << n << " k=" << clusters << " home=" << home << "\n"
                << joined(problems);
            for (int t = 0; t < topo.trees(); ++t) {
              // Each boundary once per tree, the producer's edge inside its own cluster.
              ASSERT_EQ(topo.cluster_of(topo.root(t)), home) << "n=" << n << " k=" << clusters << " t=" << t;
              ASSERT_EQ(cluster_crossings(topo, t), clusters - 1) << "n=" << n << " k=" << clusters << " t=" << t;
            }
          }
          // A label no member carries: the producer's own cluster, as without one.
          const Topology elsewhere(kind, members, "trainer-only");
          EXPECT_EQ(elsewhere.producer_cluster(), -1);
          for (int t = 0; t < plain.trees(); ++t) {
            EXPECT_EQ(elsewhere.root(t), plain.root(t));
            EXPECT_EQ(cluster_crossings(elsewhere, t), clusters);
          }
        }
      }
    }
  }
}

TEST(TopologyClusters, DoubleBinaryNoLongerCrossesBackIntoTheProducersCluster) {
  // The producer sits with members 0-3 ("trainer"); 4-7 are the rollout cluster.
  const std::vector<std::string> members{"trainer", "trainer", "trainer", "trainer",
                                         "rollout", "rollout", "rollout", "rollout"};
  const Topology before(TopologyKind::double_binary, members);
  // Without knowing, tree 1 starts in the mirror cluster (rollout) and crosses back: 2 crossings
  // of the one boundary, 1 of them the producer's edge.
  EXPECT_EQ(before.cluster_of(before.root(1)), 1);
  EXPECT_EQ(cluster_crossings(before, 1), 2);
  const Topology after(TopologyKind::double_binary, members, "trainer");
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(after.cluster_of(after.root(t)), 0) << t;
    EXPECT_EQ(cluster_crossings(after, t), 1) << t;
  }
  EXPECT_TRUE(topology_problems(after).empty());
}

// A producer group (docs/producer-group.md): M ranks, each with the kind's trees over the members
// rotated by rank * size / M within each cluster. Every tree is valid and crosses each boundary
// once; in one cluster rank 0's trees are the plain forest; the ranks' roots differ, so M boundary links end at M
// different members; and a member's send load stays bounded as M grows.
TEST(TopologyGroup, EveryRanksTreesAreValidCrossEachBoundaryOnceAndRankZerosAreThePlainForest) {
  for (TopologyKind kind : kKinds) {
    for (int producers = 1; producers <= 8; ++producers) {
      for (int n = 1; n <= 70; n += (n < 24 ? 1 : 5)) {
        for (int clusters : {1, 2, 3, 5}) {
          if (clusters > n) continue;
          for (bool round_robin : {false, true}) {
            const auto members = labels(n, clusters, round_robin);
            const Topology topo(kind, members, "", producers);
            const std::string where = std::string(topology_kind_name(kind)) + " M=" + std::to_string(producers) +
                                      " n=" + std::to_string(n) + " k=" + std::to_string(clusters);
            ASSERT_EQ(topo.trees(), producers * tree_count(kind)) << where;
            const auto problems = topology_problems(topo);
            ASSERT_TRUE(problems.empty()) << where << "\n" << joined(problems);
            for (int t = 0; t < topo.trees(); ++t) {
              ASSERT_EQ(topo.producer_of(t), t / tree_count(kind));
              ASSERT_EQ(cluster_crossings(topo, t), clusters) << where << " t=" << t;
            }
            for (int r = 0; r < n; ++r) {
              const double cap = kind == TopologyKind::binary ? 2.0 : kind == TopologyKind::chain ? 1.0 : 1.5;
              ASSERT_LE(send_load(topo, r), cap) << where << " r=" << r;
            }
            // In one cluster, rank 0's trees are the plain forest (no rotation), whatever M is.
            // (Across clusters the egress members, chosen by their load over every tree, may differ.)
            const Topology plain(kind, members);
            for (int t = 0; clusters == 1 && t < plain.trees(); ++t)
              for (int r = 0; r < n; ++r) {
                ASSERT_EQ(topo.parent(r, t), plain.parent(r, t)) << where;
                ASSERT_EQ(topo.children(r, t), plain.children(r, t)) << where;
              }
          }
        }
      }
    }
  }
}

TEST(TopologyGroup, TheRanksRootDifferentMembersAndAMembersSendLoadStaysBounded) {
  for (int producers = 2; producers <= 8; ++producers) {
    for (int n = 2 * producers; n <= 300; ++n) {
      const Topology binary(TopologyKind::binary, std::vector<std::string>(static_cast<size_t>(n)), "", producers);
      const Topology chain(TopologyKind::chain, std::vector<std::string>(static_cast<size_t>(n)), "", producers);
      const Topology dbt(TopologyKind::double_binary, std::vector<std::string>(static_cast<size_t>(n)), "", producers);
      std::vector<int> roots;
      roots.reserve(static_cast<size_t>(producers));
      for (int p = 0; p < producers; ++p) roots.push_back(binary.root(p));
      std::sort(roots.begin(), roots.end());
      ASSERT_EQ(std::unique(roots.begin(), roots.end()), roots.end()) << "M=" << producers << " n=" << n;
      for (int r = 0; r < n; ++r) {
        // Unrotated, the same members would be interior in every rank's binary tree and send
        // every byte twice (2.0); rotated, at most 1 + 1/M.
        ASSERT_LE(send_load(binary, r), 1.0 + 1.0 / producers + 1e-9) << "M=" << producers << " n=" << n << " r=" << r;
        ASSERT_LE(send_load(chain, r), 1.0);
        ASSERT_LE(send_load(dbt, r), 1.0);
      }
    }
  }
}

TEST(TopologyGroup, EachRankSendsItsChunksDownItsOwnTreesAndBadGroupSizesAreRefused) {
  const Topology dbt(TopologyKind::double_binary, std::vector<std::string>(10), "", 3);
  for (int p = 0; p < 3; ++p)
    for (uint64_t chunk = 0; chunk < 6; ++chunk) {
      const int t = dbt.tree_for_chunk(p, chunk);
      EXPECT_EQ(dbt.producer_of(t), p);
      EXPECT_EQ(dbt.base_tree(t), static_cast<int>(chunk % 2));
    }
  EXPECT_THROW(Topology(TopologyKind::binary, std::vector<std::string>(4), "", 0), Error);
  EXPECT_THROW(Topology(TopologyKind::binary, std::vector<std::string>(4), "", kMaxProducers + 1), Error);
}

TEST(TopologyClusters, DeterministicAndFirstAppearanceOrder) {
  const std::vector<std::string> members{"us-east", "eu", "us-east", "eu", "ap", "eu"};
  const Topology a(TopologyKind::double_binary, members);
  const Topology b(TopologyKind::double_binary, members);
  ASSERT_EQ(a.cluster_count(), 3);
  EXPECT_EQ(a.cluster_label(0), "us-east");
  EXPECT_EQ(a.cluster_label(1), "eu");
  EXPECT_EQ(a.cluster_label(2), "ap");
  EXPECT_EQ(a.cluster_members(1), (std::vector<int>{1, 3, 5}));
  for (int t = 0; t < a.trees(); ++t) {
    for (int r = 0; r < a.size(); ++r) {
      EXPECT_EQ(a.parent(r, t), b.parent(r, t));
      EXPECT_EQ(a.children(r, t), b.children(r, t));
    }
  }
}

TEST(TopologyClusters, ChainVisitsClustersInOrder) {
  const Topology topo(TopologyKind::chain, {"a", "b", "a", "b"});
  // a-members 0,2 then b-members 1,3: 0 -> 2 -> 1 -> 3
  EXPECT_EQ(topo.root(0), 0);
  EXPECT_EQ(topo.children(0, 0), (std::vector<int>{2}));
  EXPECT_EQ(topo.children(2, 0), (std::vector<int>{1}));
  EXPECT_EQ(topo.children(1, 0), (std::vector<int>{3}));
  EXPECT_EQ(cluster_crossings(topo, 0), 2);
}

}  // namespace
}  // namespace deltacast::tree
