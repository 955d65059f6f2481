#pragma once
// Membership of a relay-tree session: the live set, the epoch, and the forest (each live
// member's parent in each tree), with the repair rules that keep the forest valid as members
// die, are moved, and rejoin. Pure computation, no I/O: the producer decides with it and sends
// the result (EPOCH messages); every member applies the same updates to its copy, so all agree on
// who feeds whom at each epoch.
//
// Identity: members are job ranks 1..N (0 is the producer, the parent of every root). A rank
// keeps its identity for the whole session: dropping one renumbers nobody.
//
// Epoch 0 is the forest of tree::Topology over every member (ranks 1..N in order, with their
// cluster labels). Every change (remove, reparent, add) increments the epoch by one.
//
// Repair rules (what `remove` and `reparent` do), per tree:
//  * Only orphans move: a live member whose parent left (or whose edge failed) gets a new parent;
//    every other member keeps its parent and its children.
//  * Orphans are placed top-down (by the depth of their old place, then same-cluster orphans
//    before cluster entries, then their old order), each under a member already reachable from
//    the producer, so no cycle can form. When the root died, the orphans of the root's cluster
//    that have no live ancestor go first, so the root stays in its cluster while it has members.
//  * Clusters: each cluster with live members keeps exactly one entry (a member whose parent is
//    outside the cluster, or the producer): the tree crosses each cluster boundary once,
//    counting the producer's edge. An orphan whose cluster lost its entry becomes the entry
//    under the nearest live ancestor of its old parent (when that is outside the cluster; else
//    under a member outside it: of the old parent's cluster, then of that ancestor's, then any,
//    the one with the fewest children first); other orphans stay inside their cluster.
//  * Fan-out: a member has at most cap(kind) children inside its own cluster (chain 1, binary and
//    double_binary 2); cluster entries hanging below it do not count. The producer feeds one root
//    per tree.
//  * Preference among candidates: the nearest live ancestor of the old parent when it has room,
//    then (double_binary) members that are leaves in the other tree, then the shallowest, then
//    the lowest rank. Deterministic: the same inputs (including the child lists' order) give the
//    same forest everywhere. `reparent` avoids the failed edge's parent; it returns there only
//    when no other member can take the orphan (a chain's one free slot is often in the orphan's
//    own subtree, and a root has nowhere else to go).
//  * double_binary's "interior in at most one tree" is kept where the candidates allow it; after
//    repairs a member may end up interior in both (a bandwidth cost, never a correctness one).
//
// `add` (a rejoin or late join) attaches the member as a leaf in every tree, in its own cluster
// when that cluster has live members, at a free slot picked as above (else as its entry, under
// the member with the fewest children, then the shallowest; the root when no member is live).
//
// New children go to the end of their parent's child list (sending order). A copy built by
// from_welcome lists children in the order of the WELCOME's edges (WELCOME carries parents
// only: forest() gives rank order), not necessarily the producer's; `apply` appends
// moved members in the order of `moves`, which `remove`/`reparent`/`add` return in placement
// order, so child lists then change alike in both.
//
// Thread-safety: none; callers serialise. Copyable.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tree/protocol.h"
#include "tree/topology.h"

namespace deltacast::tree {

class Membership {
 public:
  // Epoch 0 over members 1..labels.size(): labels[r - 1] is rank r's cluster label; every member
  // is live and the forest is Topology(kind, labels, producer_cluster)'s (producer_cluster: the
  // producer's own cluster label, empty for a cluster of its own). Throws Error(invalid_argument)
  // when labels is empty. `producers`: a producer group's M ranks (Topology's; tree t's root is fed
  // by rank t / tree_count(kind), the "producer" of that tree in every edge and repair).
  Membership(TopologyKind kind, std::vector<std::string> labels, const std::string& producer_cluster = {},
             int producers = 1);
  // The state a WELCOME describes: `members` (ranks 1..N; index 0, the producer, may be
  // included and is ignored), their liveness, and the forest over the live ones. Throws
  // Error(invalid_argument | corrupt_frame) when the forest is not valid (forest_problems).
  static Membership from_welcome(TopologyKind kind, uint64_t epoch, const std::vector<Member>& members,
                                 const std::vector<TreeEdge>& forest, int producers = 1);

  TopologyKind kind() const noexcept;
  int trees() const noexcept;
  // A producer group's size M (1: one producer), and the producer rank that feeds tree `tree`
  // (its roots' "parent 0").
  int producers() const noexcept;
  uint32_t producer_of(int tree) const noexcept;
  uint64_t epoch() const noexcept;
  uint32_t size() const noexcept;  // N: ranks 1..N, live or not
  bool live(uint32_t rank) const;  // false for rank 0 or out of range
  std::vector<uint32_t> live_ranks() const;  // ascending
  const std::string& cluster(uint32_t rank) const;  // throws Error(invalid_argument) when out of range

  // rank's parent in `tree` (kProducerRank for the root); nullopt when rank is not live.
  std::optional<uint32_t> parent(uint32_t rank, int tree) const;
  // rank's children in `tree`, in sending order (kProducerRank: the root, if any).
  const std::vector<uint32_t>& children(uint32_t rank, int tree) const;
  // The member the producer feeds in `tree`; nullopt when no member is live.
  std::optional<uint32_t> root(int tree) const;
  // Member hops from the root (root = 0); requires live(rank).
  int depth(uint32_t rank, int tree) const;
  // Every live member's parent in every tree (ordered by tree, then rank): what WELCOME carries.
  std::vector<TreeEdge> forest() const;

  // Drops `dead` (ranks not live are ignored) and re-parents every orphaned subtree by the rules
  // above. Increments the epoch when anything changed. Returns the new parent of every member
  // that moved (empty when nothing moved).
  std::vector<TreeEdge> remove(std::span<const uint32_t> dead);
  // Moves live member `rank` in `tree` away from its current parent (the edge between them
  // failed while both stay live), by the same rules, never back under that parent unless no
  // other candidate exists. Increments the epoch. Returns the moves (the one edge).
  std::vector<TreeEdge> reparent(uint32_t rank, int tree);
  // Adds a member that is not live (a rejoin or late join) as a leaf in every tree. Increments
  // the epoch. Returns its edges. Throws Error(invalid_argument) when rank is 0, out of range or
  // already live.
  std::vector<TreeEdge> add(uint32_t rank);
  // Producer rank `producer`'s trees' roots JOIN it again (it came back at another data URL):
  // increments the epoch; returns each of those trees' root edge (parent 0: unchanged), the moves
  // that make the roots reconnect. Throws Error(invalid_argument) for a rank outside the group.
  std::vector<TreeEdge> reconnect_roots(uint32_t producer);
  // Applies an EPOCH update received from the producer (members): marks `dead` not live, `joined`
  // live, sets every edge in `moves`, and takes `epoch`. Throws Error(corrupt_frame) when the
  // result is not a valid forest (the update is then not applied) or epoch is not newer.
  void apply(uint64_t epoch, std::span<const DeadMember> dead, std::span<const Member> joined,
             std::span<const TreeEdge> moves);

 private:
  // A rank that is not live has no parent.
  static constexpr uint32_t kNoParent = 0xFFFFFFFFu;
  // One tree's edges over ranks 0..N: parent[r] (kNoParent when r is not live) and children[r]
  // in sending order; children[0] is the producer's list (the root, when any member is live).
  struct TreeState {
    std::vector<uint32_t> parent;
    std::vector<std::vector<uint32_t>> children;
  };
  // Places one tree's orphans after a remove or reparent (membership.cpp).
  class TreeRepair;

  Membership() = default;
  // Sets kind, labels (labels[r - 1] is rank r's) and cluster indices; every rank not live and
  // every tree empty.
  void init(TopologyKind kind, std::vector<std::string> labels, int producers);
  void check_rank(uint32_t rank) const;  // 1..N, else Error(invalid_argument)
  void check_tree(int tree) const;
  int fan_out_cap() const noexcept;
  int in_cluster_children(uint32_t rank, int tree) const;
  // double_binary: rank has children in the other tree (a candidate to avoid when another has room).
  bool interior_in_other_tree(uint32_t rank, int tree) const;
  // Hop counts from the root over the current child lists (-1: not reached).
  std::vector<int> depths(int tree) const;
  // Unlinks `rank` from its parent's child list and appends it to `parent`'s.
  void set_parent(uint32_t rank, int tree, uint32_t parent);
  // Takes a member out of every tree: out of its parent's list, its own list emptied. Its children
  // keep naming it until they are moved.
  void drop(uint32_t rank);
  // Where `add` puts `rank` (not yet linked) in `tree`.
  uint32_t join_parent(uint32_t rank, int tree) const;
  // Throws Error(corrupt_frame) naming the first problem of forest_problems, prefixed by `what`.
  void throw_if_invalid(const std::string& what) const;

  TopologyKind kind_ = TopologyKind::binary;
  uint64_t epoch_ = 0;
  std::vector<std::string> labels_;  // [rank]; [0] (the producer) is empty
  std::vector<int> cluster_;         // [rank]: cluster index by first appearance; [0] is -1
  int clusters_ = 0;
  std::vector<char> live_;  // [rank]; [0] is 0
  std::vector<TreeState> trees_;

  friend std::vector<std::string> forest_problems(const Membership& membership);
};

// Where a member of `membership` connects to reach `parent` in `tree`: the parent member's URL, or
// for a root ("parent 0") the URL of the producer rank that feeds that tree (`producer_urls`,
// a WELCOME's; empty: one producer, members' rank 0). Throws Error(not_found) when none is known.
std::string parent_url(const std::vector<Member>& members, const std::vector<std::string>& producer_urls,
                       const Membership& membership, int tree, uint32_t parent);

// Problems with the forest, empty when valid: in every tree each live member is reachable from
// the one root exactly once, parents are live (or the producer for the one root), parent and
// child lists agree, fan-out within caps, and each cluster with live members has exactly one
// entry. Used by tests and by members checking an update.
std::vector<std::string> forest_problems(const Membership& membership);

}  // namespace deltacast::tree
