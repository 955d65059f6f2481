#include "tree/membership.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "util/error.h"

namespace deltacast::tree {
namespace {

std::string rank_name(uint32_t rank) {
  return rank == kProducerRank ? "the producer" : "member " + std::to_string(rank);
}

void erase_one(std::vector<uint32_t>& list, uint32_t rank) {
  auto it = std::find(list.begin(), list.end(), rank);
  if (it != list.end()) list.erase(it);
}

}  // namespace

// Repairs one tree. Orphans are placed one at a time, top-down, each under a member that is
// already reachable from the producer ("attached"): an orphan's own subtree is not attached until
// the orphan is placed, so no placement can close a cycle. Attached members never move again in
// the same repair, so their depths are known once they are attached.
class Membership::TreeRepair {
 public:
  // The tree as it was before the change: what orders the orphans and finds their ancestors.
  struct OldTree {
    std::vector<uint32_t> parent;
    std::vector<int> depth;  // -1 for ranks not in the tree
    std::vector<int> order;  // breadth-first position, following the child lists
    int root_cluster = -1;
  };

  static OldTree snapshot(const Membership& m, int tree) {
    const TreeState& state = m.trees_[tree];
    OldTree old{state.parent, std::vector<int>(state.parent.size(), -1), std::vector<int>(state.parent.size(), -1),
                state.children[0].empty() ? -1 : m.cluster_[state.children[0].front()]};
    std::vector<uint32_t> queue(state.children[0]);
    for (uint32_t r : queue) old.depth[r] = 0;
    for (size_t i = 0; i < queue.size(); ++i) {
      const uint32_t r = queue[i];
      old.order[r] = static_cast<int>(i);
      for (uint32_t c : state.children[r]) {
        old.depth[c] = old.depth[r] + 1;
        queue.push_back(c);
      }
    }
    return old;
  }

  // `excluded`: the parent an orphan should not return to (reparent), kNoParent when none.
  TreeRepair(Membership& m, int tree, uint32_t excluded)
      : m_(m),
        state_(m.trees_[tree]),
        tree_(tree),
        excluded_(excluded),
        attached_(state_.parent.size(), 0),
        depth_(state_.parent.size(), -1),
        attached_in_cluster_(m.clusters_, 0) {
    for (uint32_t root : state_.children[kProducerRank]) mark_attached(root, 0);
  }

  // Places every orphan (each detached: no parent, not in any child list) and returns the new
  // edges in placement order, which is also the order that rebuilds the same child lists.
  std::vector<TreeEdge> place(const std::vector<uint32_t>& orphans, const OldTree& old) {
    std::vector<Orphan> queue;
    for (uint32_t o : orphans) queue.push_back(describe(o, old));
    std::sort(queue.begin(), queue.end(), [](const Orphan& a, const Orphan& b) { return a.key() < b.key(); });
    std::vector<TreeEdge> moves;
    for (const Orphan& o : queue) {
      const uint32_t parent = entry_attached(o.rank) ? in_cluster_parent(o) : entry_parent(o);
      m_.set_parent(o.rank, tree_, parent);
      mark_attached(o.rank, parent == kProducerRank ? 0 : depth_[parent] + 1);
      moves.push_back(TreeEdge{o.rank, static_cast<uint32_t>(tree_), parent});
    }
    return moves;
  }

 private:
  struct Orphan {
    uint32_t rank = 0;
    uint32_t old_parent = 0;
    uint32_t ancestor = 0;  // nearest live ancestor of the old parent (the old parent itself when live)
    bool root_cluster_first = false;
    int old_depth = 0;
    bool same_cluster = false;  // in the old parent's cluster
    int order = 0;
    // With the root gone, the old root's cluster is placed first so that it keeps the root slot;
    // then top-down, in-cluster orphans before cluster entries, then the old sending order.
    std::tuple<bool, int, bool, int> key() const {
      return std::make_tuple(!root_cluster_first, old_depth, !same_cluster, order);
    }
  };

  Orphan describe(uint32_t rank, const OldTree& old) const {
    Orphan o;
    o.rank = rank;
    o.old_parent = old.parent[rank];
    o.ancestor = o.old_parent;
    while (o.ancestor != kProducerRank && !m_.live_[o.ancestor]) o.ancestor = old.parent[o.ancestor];
    o.root_cluster_first = o.ancestor == kProducerRank && m_.cluster_[rank] == old.root_cluster;
    o.old_depth = old.depth[rank];
    o.same_cluster = o.old_parent != kProducerRank && m_.cluster_[o.old_parent] == m_.cluster_[rank];
    o.order = old.order[rank];
    return o;
  }

  // Every member of cluster k hangs, inside k, below k's one entry; so k has an entry in the
  // partial tree exactly when some member of k is attached.
  bool entry_attached(uint32_t rank) const { return attached_in_cluster_[m_.cluster_[rank]] > 0; }

  // The orphan becomes its cluster's entry.
  uint32_t entry_parent(const Orphan& o) const {
    const int k = m_.cluster_[o.rank];
    const uint32_t a = o.ancestor;
    if (a != excluded_) {
      if (a == kProducerRank && state_.children[kProducerRank].empty()) return kProducerRank;
      if (a != kProducerRank && attached_[a] && m_.cluster_[a] != k) return a;
    }
    const int old_parent_cluster = o.old_parent == kProducerRank ? -1 : m_.cluster_[o.old_parent];
    const int ancestor_cluster = a == kProducerRank ? -1 : m_.cluster_[a];
    uint32_t best = kNoParent;
    std::tuple<int, size_t, bool, int, uint32_t> best_key;
    for (uint32_t x = 1; x < attached_.size(); ++x) {
      if (!attached_[x] || x == excluded_ || m_.cluster_[x] == k) continue;
      const int group = m_.cluster_[x] == old_parent_cluster ? 0 : m_.cluster_[x] == ancestor_cluster ? 1 : 2;
      const auto key =
          std::make_tuple(group, state_.children[x].size(), m_.interior_in_other_tree(x, tree_), depth_[x], x);
      if (best == kNoParent || key < best_key) std::tie(best, best_key) = std::make_pair(x, key);
    }
    if (best != kNoParent) return best;
    if (state_.children[kProducerRank].empty() && excluded_ != kProducerRank) return kProducerRank;
    DC_ASSERT(excluded_ != kNoParent);  // nothing attached and the root slot taken cannot happen
    return excluded_;
  }

  // The orphan joins its cluster's tree below a member with a free in-cluster slot.
  uint32_t in_cluster_parent(const Orphan& o) const {
    const int k = m_.cluster_[o.rank];
    const int cap = m_.fan_out_cap();
    const uint32_t a = o.ancestor;
    if (a != excluded_ && a != kProducerRank && attached_[a] && m_.cluster_[a] == k &&
        m_.in_cluster_children(a, tree_) < cap) {
      return a;
    }
    uint32_t best = kNoParent;
    std::tuple<bool, int, uint32_t> best_key;
    for (uint32_t x = 1; x < attached_.size(); ++x) {
      if (!attached_[x] || x == excluded_ || m_.cluster_[x] != k || m_.in_cluster_children(x, tree_) >= cap) continue;
      const auto key = std::make_tuple(m_.interior_in_other_tree(x, tree_), depth_[x], x);
      if (best == kNoParent || key < best_key) std::tie(best, best_key) = std::make_pair(x, key);
    }
    if (best != kNoParent) return best;
    // Back under the excluded parent: it lost this child, so it has the room no one else has.
    if (excluded_ != kNoParent && excluded_ != kProducerRank && attached_[excluded_] && m_.cluster_[excluded_] == k) {
      return excluded_;
    }
    // Unreachable while the forest is valid (an attached cluster always has a leaf); kept so a
    // broken state degrades to an over-full member rather than a lost one.
    for (uint32_t x = 1; x < attached_.size(); ++x) {
      if (attached_[x] && m_.cluster_[x] == k && (best == kNoParent || depth_[x] < depth_[best])) best = x;
    }
    DC_ASSERT(best != kNoParent);
    return best;
  }

  void mark_attached(uint32_t top, int depth) {
    std::vector<std::pair<uint32_t, int>> stack{{top, depth}};
    while (!stack.empty()) {
      auto [r, d] = stack.back();
      stack.pop_back();
      DC_ASSERT(!attached_[r]);
      attached_[r] = 1;
      depth_[r] = d;
      ++attached_in_cluster_[m_.cluster_[r]];
      for (uint32_t c : state_.children[r]) stack.emplace_back(c, d + 1);
    }
  }

  Membership& m_;
  TreeState& state_;
  int tree_;
  uint32_t excluded_;
  std::vector<char> attached_;
  std::vector<int> depth_;
  std::vector<int> attached_in_cluster_;
};

void Membership::init(TopologyKind kind, std::vector<std::string> labels, int producers) {
  kind_ = kind;
  labels_.clear();
  labels_.reserve(labels.size() + 1);
  labels_.emplace_back();
  for (auto& label : labels) labels_.push_back(std::move(label));
  cluster_.assign(labels_.size(), -1);
  std::unordered_map<std::string, int> index;
  for (size_t r = 1; r < labels_.size(); ++r) {
    cluster_[r] = index.emplace(labels_[r], static_cast<int>(index.size())).first->second;
  }
  clusters_ = static_cast<int>(index.size());
  live_.assign(labels_.size(), 0);
  trees_.assign(
      static_cast<size_t>(tree_count(kind)) * static_cast<size_t>(producers),
      TreeState{std::vector<uint32_t>(labels_.size(), kNoParent), std::vector<std::vector<uint32_t>>(labels_.size())});
}

Membership::Membership(TopologyKind kind, std::vector<std::string> labels, const std::string& producer_cluster,
                       int producers) {
  if (labels.empty()) throw Error(Errc::invalid_argument, "membership needs at least one member");
  const Topology topology(kind, labels, producer_cluster, producers);
  init(kind, std::move(labels), producers);
  std::fill(live_.begin() + 1, live_.end(), 1);
  const auto rank_of = [](int index) { return index == kProducer ? kProducerRank : static_cast<uint32_t>(index + 1); };
  for (int t = 0; t < topology.trees(); ++t) {
    TreeState& state = trees_[t];
    state.children[kProducerRank] = {rank_of(topology.root(t))};
    for (int i = 0; i < topology.size(); ++i) {
      state.parent[rank_of(i)] = rank_of(topology.parent(i, t));
      for (int c : topology.children(i, t)) state.children[rank_of(i)].push_back(rank_of(c));
    }
  }
}

Membership Membership::from_welcome(TopologyKind kind, uint64_t epoch, const std::vector<Member>& members,
                                    const std::vector<TreeEdge>& forest, int producers) {
  const auto count =
      std::count_if(members.begin(), members.end(), [](const Member& m) { return m.rank != kProducerRank; });
  if (count == 0) throw Error(Errc::corrupt_frame, "welcome: no members");
  const auto n = static_cast<uint32_t>(count);
  std::vector<const Member*> by_rank(n + 1, nullptr);
  for (const Member& m : members) {
    if (m.rank == kProducerRank) continue;
    if (m.rank > n)
      throw Error(Errc::corrupt_frame,
                  "welcome: rank " + std::to_string(m.rank) + " out of range 1.." + std::to_string(n));
    if (by_rank[m.rank] != nullptr)
      throw Error(Errc::corrupt_frame, "welcome: rank " + std::to_string(m.rank) + " listed twice");
    by_rank[m.rank] = &m;
  }
  std::vector<std::string> labels;
  for (uint32_t r = 1; r <= n; ++r) labels.push_back(by_rank[r]->cluster);
  Membership out;
  if (producers < 1 || producers > kMaxProducers)
    throw Error(Errc::corrupt_frame, "welcome: a producer group of " + std::to_string(producers) + " ranks");
  out.init(kind, std::move(labels), producers);
  out.epoch_ = epoch;
  for (uint32_t r = 1; r <= n; ++r) out.live_[r] = by_rank[r]->live ? 1 : 0;
  for (const TreeEdge& e : forest) {
    const std::string edge = "welcome: edge of " + rank_name(e.rank) + " in tree " + std::to_string(e.tree);
    if (e.tree >= out.trees_.size()) throw Error(Errc::corrupt_frame, edge + ": no such tree");
    if (!out.live(e.rank)) throw Error(Errc::corrupt_frame, edge + ": not a live member");
    if (e.parent > n) throw Error(Errc::corrupt_frame, edge + ": parent " + std::to_string(e.parent) + " out of range");
    if (out.trees_[e.tree].parent[e.rank] != kNoParent) throw Error(Errc::corrupt_frame, edge + ": listed twice");
    out.set_parent(e.rank, static_cast<int>(e.tree), e.parent);
  }
  out.throw_if_invalid("welcome");
  return out;
}

TopologyKind Membership::kind() const noexcept { return kind_; }
int Membership::trees() const noexcept { return static_cast<int>(trees_.size()); }
int Membership::producers() const noexcept { return trees() / tree_count(kind_); }
uint32_t Membership::producer_of(int tree) const noexcept { return static_cast<uint32_t>(tree / tree_count(kind_)); }

std::string parent_url(const std::vector<Member>& members, const std::vector<std::string>& producer_urls,
                       const Membership& membership, int tree, uint32_t parent) {
  if (parent == kProducerRank && !producer_urls.empty()) {
    const uint32_t g = membership.producer_of(tree);
    if (g >= producer_urls.size())
      throw Error(Errc::not_found, "no URL for producer rank " + std::to_string(g) + " (tree " + std::to_string(tree) +
                                       "): the group lists " + std::to_string(producer_urls.size()));
    return producer_urls[g];
  }
  for (const auto& m : members)
    if (m.rank == parent) return m.url;
  throw Error(Errc::not_found, "no URL for rank " + std::to_string(parent));
}
uint64_t Membership::epoch() const noexcept { return epoch_; }
uint32_t Membership::size() const noexcept { return static_cast<uint32_t>(labels_.size() - 1); }
bool Membership::live(uint32_t rank) const { return rank < live_.size() && live_[rank] != 0; }

std::vector<uint32_t> Membership::live_ranks() const {
  std::vector<uint32_t> out;
  for (uint32_t r = 1; r < live_.size(); ++r) {
    if (live_[r]) out.push_back(r);
  }
  return out;
}

void Membership::check_rank(uint32_t rank) const {
  if (rank == kProducerRank || rank > size()) {
    throw Error(Errc::invalid_argument,
                "membership: rank " + std::to_string(rank) + " is outside 1.." + std::to_string(size()));
  }
}

void Membership::check_tree(int tree) const {
  if (tree < 0 || tree >= trees()) throw Error(Errc::invalid_argument, "membership: no tree " + std::to_string(tree));
}

const std::string& Membership::cluster(uint32_t rank) const {
  check_rank(rank);
  return labels_[rank];
}

std::optional<uint32_t> Membership::parent(uint32_t rank, int tree) const {
  check_tree(tree);
  if (!live(rank)) return std::nullopt;
  return trees_[tree].parent[rank];
}

const std::vector<uint32_t>& Membership::children(uint32_t rank, int tree) const {
  check_tree(tree);
  if (rank != kProducerRank) check_rank(rank);
  return trees_[tree].children[rank];
}

std::optional<uint32_t> Membership::root(int tree) const {
  check_tree(tree);
  const auto& roots = trees_[tree].children[kProducerRank];
  if (roots.empty()) return std::nullopt;
  return roots.front();
}

int Membership::depth(uint32_t rank, int tree) const {
  check_tree(tree);
  if (!live(rank)) throw Error(Errc::invalid_argument, "membership: " + rank_name(rank) + " is not live");
  int hops = 0;
  for (uint32_t r = trees_[tree].parent[rank]; r != kProducerRank; r = trees_[tree].parent[r]) {
    ++hops;
    DC_ASSERT(hops <= static_cast<int>(size()));  // the forest is valid between calls
  }
  return hops;
}

std::vector<TreeEdge> Membership::forest() const {
  std::vector<TreeEdge> out;
  for (int t = 0; t < trees(); ++t) {
    for (uint32_t r = 1; r <= size(); ++r) {
      if (live_[r]) out.push_back(TreeEdge{r, static_cast<uint32_t>(t), trees_[t].parent[r]});
    }
  }
  return out;
}

int Membership::fan_out_cap() const noexcept { return kind_ == TopologyKind::chain ? 1 : 2; }

int Membership::in_cluster_children(uint32_t rank, int tree) const {
  const auto& children = trees_[tree].children[rank];
  return static_cast<int>(
      std::count_if(children.begin(), children.end(), [&](uint32_t c) { return cluster_[c] == cluster_[rank]; }));
}

bool Membership::interior_in_other_tree(uint32_t rank, int tree) const {
  return kind_ == TopologyKind::double_binary && !trees_[tree ^ 1].children[rank].empty();
}

std::vector<int> Membership::depths(int tree) const {
  std::vector<int> depth(labels_.size(), -1);
  std::vector<uint32_t> queue(trees_[tree].children[kProducerRank]);
  for (uint32_t r : queue) depth[r] = 0;
  for (size_t i = 0; i < queue.size(); ++i) {
    for (uint32_t c : trees_[tree].children[queue[i]]) {
      depth[c] = depth[queue[i]] + 1;
      queue.push_back(c);
    }
  }
  return depth;
}

void Membership::set_parent(uint32_t rank, int tree, uint32_t parent) {
  TreeState& state = trees_[tree];
  if (state.parent[rank] != kNoParent) erase_one(state.children[state.parent[rank]], rank);
  state.parent[rank] = parent;
  state.children[parent].push_back(rank);
}

void Membership::drop(uint32_t rank) {
  live_[rank] = 0;
  for (TreeState& state : trees_) {
    if (state.parent[rank] != kNoParent) erase_one(state.children[state.parent[rank]], rank);
    state.parent[rank] = kNoParent;
    state.children[rank].clear();
  }
}

void Membership::throw_if_invalid(const std::string& what) const {
  const auto problems = forest_problems(*this);
  if (!problems.empty()) throw Error(Errc::corrupt_frame, what + ": " + problems.front());
}

std::vector<TreeEdge> Membership::remove(std::span<const uint32_t> dead) {
  std::vector<uint32_t> leaving;
  for (uint32_t r : dead) {
    if (live(r) && std::find(leaving.begin(), leaving.end(), r) == leaving.end()) leaving.push_back(r);
  }
  if (leaving.empty()) return {};
  std::vector<TreeRepair::OldTree> old;
  for (int t = 0; t < trees(); ++t) old.push_back(TreeRepair::snapshot(*this, t));
  for (uint32_t r : leaving) drop(r);
  std::vector<TreeEdge> moves;
  for (int t = 0; t < trees(); ++t) {
    // Orphans: live members whose parent left; they are detached until placed.
    std::vector<uint32_t> orphans;
    for (uint32_t r = 1; r <= size(); ++r) {
      const uint32_t p = old[t].parent[r];
      if (live_[r] && p != kProducerRank && !live_[p]) orphans.push_back(r);
    }
    for (uint32_t r : orphans) trees_[t].parent[r] = kNoParent;
    auto placed = TreeRepair(*this, t, kNoParent).place(orphans, old[t]);
    moves.insert(moves.end(), placed.begin(), placed.end());
  }
  ++epoch_;
  return moves;
}

std::vector<TreeEdge> Membership::reparent(uint32_t rank, int tree) {
  check_tree(tree);
  if (!live(rank)) throw Error(Errc::invalid_argument, "membership: cannot reparent " + rank_name(rank) + ": not live");
  const TreeRepair::OldTree old = TreeRepair::snapshot(*this, tree);
  TreeState& state = trees_[tree];
  const uint32_t old_parent = state.parent[rank];
  erase_one(state.children[old_parent], rank);
  state.parent[rank] = kNoParent;
  auto moves = TreeRepair(*this, tree, old_parent).place({rank}, old);
  ++epoch_;
  return moves;
}

std::vector<TreeEdge> Membership::reconnect_roots(uint32_t producer) {
  if (producer >= static_cast<uint32_t>(producers()))
    throw Error(Errc::invalid_argument, "membership: producer rank " + std::to_string(producer) +
                                            " is outside a group of " + std::to_string(producers()));
  std::vector<TreeEdge> moves;
  for (int t = 0; t < trees(); ++t)
    if (producer_of(t) == producer)
      if (const auto r = root(t)) moves.push_back({*r, static_cast<uint32_t>(t), kProducerRank});
  ++epoch_;
  return moves;
}

uint32_t Membership::join_parent(uint32_t rank, int tree) const {
  const std::vector<int> depth = depths(tree);
  const int k = cluster_[rank];
  const int cap = fan_out_cap();
  // In its cluster: the free in-cluster slot the repair rules would pick.
  uint32_t inside = kNoParent;
  std::tuple<bool, int, uint32_t> inside_key;
  bool cluster_live = false;
  for (uint32_t x = 1; x <= size(); ++x) {
    if (!live_[x] || x == rank || cluster_[x] != k) continue;
    cluster_live = true;
    if (in_cluster_children(x, tree) >= cap) continue;
    const auto key = std::make_tuple(interior_in_other_tree(x, tree), depth[x], x);
    if (inside == kNoParent || key < inside_key) std::tie(inside, inside_key) = std::make_pair(x, key);
  }
  if (cluster_live) {
    DC_ASSERT(inside != kNoParent);  // a valid cluster tree has a leaf
    return inside;
  }
  // Its cluster's entry: under the member with the fewest children (then as the repair's entries).
  uint32_t outside = kNoParent;
  std::tuple<size_t, bool, int, uint32_t> outside_key;
  for (uint32_t x = 1; x <= size(); ++x) {
    if (!live_[x] || x == rank) continue;
    const auto key = std::make_tuple(trees_[tree].children[x].size(), interior_in_other_tree(x, tree), depth[x], x);
    if (outside == kNoParent || key < outside_key) std::tie(outside, outside_key) = std::make_pair(x, key);
  }
  return outside == kNoParent ? kProducerRank : outside;
}

std::vector<TreeEdge> Membership::add(uint32_t rank) {
  check_rank(rank);
  if (live(rank)) throw Error(Errc::invalid_argument, "membership: cannot add " + rank_name(rank) + ": already live");
  std::vector<TreeEdge> moves;
  for (int t = 0; t < trees(); ++t) {
    const uint32_t parent = join_parent(rank, t);
    set_parent(rank, t, parent);
    moves.push_back(TreeEdge{rank, static_cast<uint32_t>(t), parent});
  }
  live_[rank] = 1;
  ++epoch_;
  return moves;
}

void Membership::apply(uint64_t epoch, std::span<const DeadMember> dead, std::span<const Member> joined,
                       std::span<const TreeEdge> moves) {
  const std::string what = "epoch " + std::to_string(epoch) + " update";
  if (epoch <= epoch_) {
    throw Error(Errc::corrupt_frame, what + ": not newer than the current epoch " + std::to_string(epoch_));
  }
  Membership next = *this;
  for (const DeadMember& d : dead) {
    if (!next.live(d.rank)) throw Error(Errc::corrupt_frame, what + ": dead " + rank_name(d.rank) + " is not live");
    next.drop(d.rank);
  }
  for (const Member& j : joined) {
    if (j.rank == kProducerRank || j.rank > size() || next.live(j.rank)) {
      throw Error(Errc::corrupt_frame, what + ": joined " + rank_name(j.rank) + " is out of range or already live");
    }
    if (j.cluster != labels_[j.rank]) {
      throw Error(Errc::corrupt_frame, what + ": joined " + rank_name(j.rank) + " names cluster '" + j.cluster +
                                           "', not '" + labels_[j.rank] + "'");
    }
    next.live_[j.rank] = 1;
  }
  std::vector<std::vector<char>> moved(trees(), std::vector<char>(labels_.size(), 0));
  for (const TreeEdge& e : moves) {
    const std::string edge = what + ": move of " + rank_name(e.rank) + " in tree " + std::to_string(e.tree);
    if (e.tree >= trees_.size()) throw Error(Errc::corrupt_frame, edge + ": no such tree");
    if (!next.live(e.rank)) throw Error(Errc::corrupt_frame, edge + ": not a live member");
    if (e.parent > size())
      throw Error(Errc::corrupt_frame, edge + ": parent " + std::to_string(e.parent) + " out of range");
    if (moved[e.tree][e.rank]++) throw Error(Errc::corrupt_frame, edge + ": listed twice");
    next.set_parent(e.rank, static_cast<int>(e.tree), e.parent);
  }
  next.throw_if_invalid(what);
  next.epoch_ = epoch;
  *this = std::move(next);
}

namespace {

// Checks one tree's edges; `where` prefixes every problem.
class TreeCheck {
 public:
  TreeCheck(const Membership& m, int tree) : m_(m), tree_(tree), where_("tree " + std::to_string(tree) + ": ") {}

  std::vector<std::string> run() {
    check_links();
    if (problems_.empty()) check_reach();
    if (problems_.empty()) check_clusters();
    return std::move(problems_);
  }

 private:
  void problem(const std::string& what) { problems_.push_back(where_ + what); }

  void check_links() {
    const auto& roots = m_.children(kProducerRank, tree_);
    const size_t want = m_.live_ranks().empty() ? 0 : 1;
    if (roots.size() != want) {
      problem(std::to_string(roots.size()) + " members are fed by the producer (want " + std::to_string(want) + ")");
    }
    for (uint32_t c : roots) check_child(kProducerRank, c);
    const int cap = m_.kind() == TopologyKind::chain ? 1 : 2;
    for (uint32_t r = 1; r <= m_.size(); ++r) {
      const auto& children = m_.children(r, tree_);
      if (!m_.live(r)) {
        if (!children.empty()) problem("member " + std::to_string(r) + " is not live but has children");
        continue;
      }
      const uint32_t p = *m_.parent(r, tree_);
      if (p != kProducerRank && p > m_.size()) {
        problem("member " + std::to_string(r) + " has no parent");
        continue;
      }
      if (p != kProducerRank && !m_.live(p)) {
        problem("member " + std::to_string(r) + " has parent " + std::to_string(p) + ", which is not live");
        continue;
      }
      const auto& siblings = m_.children(p, tree_);
      if (std::count(siblings.begin(), siblings.end(), r) != 1) {
        problem("member " + std::to_string(r) + " is not listed once among " + rank_name(p) + "'s children");
      }
      int in_cluster = 0;
      for (uint32_t c : children) {
        check_child(r, c);
        in_cluster += c <= m_.size() && m_.cluster(c) == m_.cluster(r);
      }
      if (in_cluster > cap) {
        problem("member " + std::to_string(r) + " has " + std::to_string(in_cluster) +
                " children in its cluster (cap " + std::to_string(cap) + ")");
      }
    }
  }

  void check_child(uint32_t r, uint32_t c) {
    if (!m_.live(c)) {
      problem(rank_name(r) + " lists " + std::to_string(c) + ", which is not a live member, as a child");
    } else if (*m_.parent(c, tree_) != r) {
      problem("child " + std::to_string(c) + " of " + rank_name(r) + " does not name it as parent");
    }
  }

  // Each live member reached exactly once from the producer (with agreeing lists, a member on a
  // cycle is never reached).
  void check_reach() {
    std::vector<char> reached(m_.size() + 1, 0);
    std::vector<uint32_t> stack(m_.children(kProducerRank, tree_));
    while (!stack.empty()) {
      const uint32_t r = stack.back();
      stack.pop_back();
      if (reached[r]++) {
        problem("member " + std::to_string(r) + " reached twice");
        return;
      }
      for (uint32_t c : m_.children(r, tree_)) stack.push_back(c);
    }
    for (uint32_t r = 1; r <= m_.size(); ++r) {
      if (m_.live(r) && !reached[r]) problem("member " + std::to_string(r) + " is unreachable (cycle or orphan)");
    }
  }

  // Each cluster with live members has exactly one entry: fed by the producer or another cluster.
  void check_clusters() {
    std::unordered_map<std::string, int> index;
    std::vector<std::string> labels;
    std::vector<int> entries;
    for (uint32_t r : m_.live_ranks()) {
      auto [it, fresh] = index.emplace(m_.cluster(r), static_cast<int>(labels.size()));
      if (fresh) {
        labels.push_back(m_.cluster(r));
        entries.push_back(0);
      }
      const uint32_t p = *m_.parent(r, tree_);
      entries[it->second] += p == kProducerRank || m_.cluster(p) != m_.cluster(r);
    }
    for (size_t k = 0; k < labels.size(); ++k) {
      if (entries[k] != 1) {
        problem("cluster '" + labels[k] + "' has " + std::to_string(entries[k]) + " entries (want 1)");
      }
    }
  }

  const Membership& m_;
  int tree_;
  std::string where_;
  std::vector<std::string> problems_;
};

}  // namespace

std::vector<std::string> forest_problems(const Membership& membership) {
  std::vector<std::string> all;
  for (int t = 0; t < membership.trees(); ++t) {
    auto problems = TreeCheck(membership, t).run();
    all.insert(all.end(), problems.begin(), problems.end());
  }
  return all;
}

}  // namespace deltacast::tree
