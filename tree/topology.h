#pragma once
// Relay-tree topology: pure functions from (kind, membership) to (parent, children) per member and
// per tree. Nothing here does I/O or names a transport; every member computes the same answer
// from the same ordered membership list, so no coordination is needed to agree on the tree.
//
// Ranks 0..n-1 are the receivers ("members"). The producer is not a member: it is the parent
// (kProducer) of each tree's root and sends every chunk of a tree to that root only.
//
// Kinds:
//  - binary:        heap-order binary tree. Simple and shallow, but an interior node sends every
//                   byte twice, so it halves the throughput of its uplink.
//  - double_binary: two complementary trees (as NCCL's double binary tree); chunk c travels over
//                   tree c % 2. Every member is interior in at most one tree and a leaf in the
//                   other, so it forwards about as many bytes as it receives.
//  - chain:         a pipelined chain 0 -> 1 -> ... -> n-1: bandwidth-optimal, depth n-1.
//
// Clusters (regions, datacenters): each member carries a cluster label. The topology is built so
// that each cluster boundary is crossed once per tree: the clusters form a tree of the same kind
// (over cluster indices); the producer feeds the gateway of the root cluster (cluster 0, or the
// mirror root for double_binary tree 1; the producer's own cluster in every tree when it is one of
// the members' clusters, so no tree crosses the producer's boundary twice); every other cluster's gateway is fed by one
// member of its parent cluster, and the data then fans out inside the cluster. Clusters are ordered by first appearance
// in the membership list; within a cluster, members keep their rank order.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deltacast::tree {

enum class TopologyKind { binary, double_binary, chain };

// The parent of a tree's root: the producer, which is not a member.
inline constexpr int kProducer = -1;
// The most ranks a producer group may have.
inline constexpr int kMaxProducers = 1024;

// One member's place in one tree. Children are in the order the member should send to them.
struct TreeLinks {
  int parent = kProducer;
  std::vector<int> children;
};

// "binary" | "double_binary" | "chain".
std::string_view topology_kind_name(TopologyKind kind) noexcept;
// Parses a kind name (also accepts "double-binary"). Throws Error(invalid_argument) naming the
// accepted names for anything else.
TopologyKind parse_topology_kind(std::string_view name);
// How many trees a kind uses: 2 for double_binary, 1 otherwise.
int tree_count(TopologyKind kind) noexcept;
// The tree that carries chunk `chunk`: chunk % tree_count(kind).
int tree_for_chunk(TopologyKind kind, uint64_t chunk) noexcept;

// Heap-order binary tree over ranks 0..n-1 rooted at 0. Depth floor(log2 n).
//                 0
//           1           2
//        3     4     5     6
//       7 8   9 10 11 12 13 14
// parent (r-1)/2, children 2r+1 and 2r+2 when < n. Throws Error(invalid_argument) unless
// 0 <= rank < n.
TreeLinks binary_tree_links(int n, int rank);

// Pipelined chain 0 -> 1 -> ... -> n-1. Throws Error(invalid_argument) unless 0 <= rank < n.
TreeLinks chain_links(int n, int rank);

// Double binary tree, tree 0 or 1. Tree 0 is an in-order "bit" tree over the first m ranks
// (m = n rounded down to even): a node's lowest set bit gives its level, odd ranks are leaves and
// even ranks interior. For m = 8:
//
//   tree 0:        0                tree 1 (mirror r -> m-1-r):     7
//                  4                                                3
//              2       6                                        5       1
//            1   3   5   7                                    6   4   2   0
//
// Tree 1 mirrors tree 0, so odd ranks are interior there and even ranks leaves. When n is odd,
// the extra rank n-1 hangs as a leaf under both roots (each root has a free child slot), so it is
// a leaf in both trees. Depth <= floor(log2 n) + 1. Throws Error(invalid_argument) unless
// 0 <= rank < n and tree is 0 or 1.
TreeLinks double_binary_tree_links(int n, int rank, int tree);

// Local root of tree `tree` for a single group of n members of the given kind (0, or m-1 for
// double_binary tree 1 when n >= 2).
int tree_root(TopologyKind kind, int n, int tree);

// (parent, children) per member for a given membership. Immutable after construction; all
// const members are thread-safe.
class Topology {
 public:
  // cluster_labels[r] is member r's cluster label; the empty string is a valid label.
  // `producer_cluster`: the producer's own cluster label. When it names a members' cluster, every
  // tree's cluster-level tree is rooted there (the producer feeds a member of its own cluster), so
  // each tree crosses each cluster boundary once counting the producer's edge; otherwise (empty or
  // unknown: the producer sits in a cluster of its own) the cluster-level trees keep their roots
  // (cluster 0; double_binary tree 1 the mirror root). Throws Error(invalid_argument) when the
  // list is empty.
  //
  // `producers` (a producer group, docs/producer-group.md): M ranks, each feeding trees of its
  // own. The forest has M x tree_count(kind) trees; tree t belongs to producer rank
  // t / tree_count(kind) and is that kind's tree t % tree_count(kind) over each cluster's members
  // rotated by rank * size / M (within the cluster), so the interior members differ from one rank's
  // trees to the next and a member's send load stays about what it is for one producer while M ranks
  // send at once. M = 1 is the plain forest. Throws Error(invalid_argument) unless
  // 1 <= producers <= kMaxProducers.
  Topology(TopologyKind kind, std::vector<std::string> cluster_labels, const std::string& producer_cluster = {},
           int producers = 1);
  // n members, all in one cluster.
  static Topology single_cluster(TopologyKind kind, int n);

  TopologyKind kind() const noexcept { return kind_; }
  int size() const noexcept { return static_cast<int>(labels_.size()); }
  int trees() const noexcept { return static_cast<int>(links_.size()); }
  int producers() const noexcept { return producers_; }
  // The producer rank that feeds tree `tree`, and which of the kind's trees it is.
  int producer_of(int tree) const noexcept { return tree / tree::tree_count(kind_); }
  int base_tree(int tree) const noexcept { return tree % tree::tree_count(kind_); }
  int tree_for_chunk(uint64_t chunk) const noexcept { return tree::tree_for_chunk(kind_, chunk); }
  // The tree producer rank `producer` sends its chunk `chunk` (its own numbering) down.
  int tree_for_chunk(int producer, uint64_t chunk) const noexcept;

  // The member the producer sends tree `tree` to. Throws Error(invalid_argument) for a bad tree.
  int root(int tree) const;
  // Throw Error(invalid_argument) for a bad rank or tree.
  const TreeLinks& links(int rank, int tree) const;
  int parent(int rank, int tree) const { return links(rank, tree).parent; }
  const std::vector<int>& children(int rank, int tree) const { return links(rank, tree).children; }

  int cluster_count() const noexcept { return static_cast<int>(cluster_members_.size()); }
  // Index of member `rank`'s cluster in first-appearance order. Throws for a bad rank.
  int cluster_of(int rank) const;
  const std::string& cluster_label(int cluster) const;
  // Members of a cluster, ascending. Throws Error(invalid_argument) for a bad index.
  const std::vector<int>& cluster_members(int cluster) const;
  // The member of `cluster` that receives tree `tree` from outside the cluster.
  int gateway(int cluster, int tree) const;
  // The producer's cluster index among the members' clusters, or -1 (a cluster of its own).
  int producer_cluster() const noexcept { return producer_cluster_; }

 private:
  void build_tree(int tree);
  // How far tree `tree` rotates a cluster of `s` members, and member i's links (cluster-local
  // indices) in it.
  int rotation(int s, int tree) const noexcept;
  TreeLinks rotated_links(int s, int i, int tree) const;

  TopologyKind kind_;
  std::vector<std::string> labels_;
  std::vector<int> cluster_of_;
  std::vector<std::vector<int>> cluster_members_;
  std::vector<std::vector<TreeLinks>> links_;  // [tree][rank]
  int producer_cluster_ = -1;
  int producers_ = 1;
  std::vector<int> local_load_;  // [rank]: children inside its cluster, summed over every tree
  // [tree][position in the cluster-level tree] = cluster index (identity unless the producer's
  // cluster is moved to the root position).
  std::vector<std::vector<int>> cluster_order_;
};

// Validation helpers, used by tests and by a relay that wants to refuse a broken membership.

// Problems with one tree of `topology`, empty when valid: the producer feeds exactly one root,
// every member is reached exactly once from it, parent and child links agree, no cycles.
std::vector<std::string> tree_problems(const Topology& topology, int tree);
// Problems across all trees (tree_problems for each).
std::vector<std::string> topology_problems(const Topology& topology);
// Longest root-to-member path in member hops (root has depth 0). Requires a valid tree.
int tree_depth(const Topology& topology, int tree);
// Bytes member `rank` sends per byte of payload: sum over trees of children / trees.
double send_load(const Topology& topology, int rank);
// Edges of tree `tree` that cross a cluster boundary, counting the producer -> root edge as one
// unless the root is in the producer's cluster (Topology's producer_cluster).
int cluster_crossings(const Topology& topology, int tree);

}  // namespace deltacast::tree
