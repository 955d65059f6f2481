#include "tree/topology.h"

#include <algorithm>
#include <bit>
#include <unordered_map>

#include "util/error.h"

namespace deltacast::tree {
namespace {

void check_rank(int n, int rank) {
  if (n < 1 || rank < 0 || rank >= n) {
    throw Error(Errc::invalid_argument, "topology: rank " + std::to_string(rank) +
                                            " is outside a group of " + std::to_string(n));
  }
}

// In-order bit tree over ranks 0..m-1 (NCCL's btree): rank r's lowest set bit b is its level;
// its parent is r+b or r-b (whichever clears b and has bit 2b set), falling back to r-b when
// r+b is out of range. Rank 0 is the root with one child, the largest power of two below m.
TreeLinks bit_tree_links(int m, int r) {
  TreeLinks out;
  if (r == 0) {
    if (m > 1) out.children.push_back(static_cast<int>(std::bit_floor(static_cast<unsigned>(m - 1))));
    return out;
  }
  const int b = r & -r;
  int up = (r ^ b) | (b << 1);
  if (up >= m) up = r ^ b;
  out.parent = up;
  const int half = b >> 1;
  if (half == 0) return out;  // odd ranks are leaves
  out.children.push_back(r - half);
  int step = half;
  // The right subtree is cut off at m: take the largest in-range step.
  while (step > 0 && r + step >= m) step >>= 1;
  if (step > 0) out.children.push_back(r + step);
  return out;
}

// Maps a bit-tree result through a rank permutation given as a function.
template <typename Map>
TreeLinks map_links(const TreeLinks& in, Map map) {
  TreeLinks out;
  out.parent = in.parent == kProducer ? kProducer : map(in.parent);
  for (int c : in.children) out.children.push_back(map(c));
  return out;
}

TreeLinks local_links(TopologyKind kind, int n, int rank, int tree) {
  switch (kind) {
    case TopologyKind::binary: return binary_tree_links(n, rank);
    case TopologyKind::chain: return chain_links(n, rank);
    case TopologyKind::double_binary: return double_binary_tree_links(n, rank, tree);
  }
  DC_ASSERT(false);
  return {};
}

}  // namespace

std::string_view topology_kind_name(TopologyKind kind) noexcept {
  switch (kind) {
    case TopologyKind::binary: return "binary";
    case TopologyKind::double_binary: return "double_binary";
    case TopologyKind::chain: return "chain";
  }
  return "unknown";
}

TopologyKind parse_topology_kind(std::string_view name) {
  if (name == "binary") return TopologyKind::binary;
  if (name == "double_binary" || name == "double-binary") return TopologyKind::double_binary;
  if (name == "chain") return TopologyKind::chain;
  throw Error(Errc::invalid_argument, "unknown topology '" + std::string(name) +
                                          "' (expected binary, double_binary or chain)");
}

int tree_count(TopologyKind kind) noexcept { return kind == TopologyKind::double_binary ? 2 : 1; }

int tree_for_chunk(TopologyKind kind, uint64_t chunk) noexcept {
  return static_cast<int>(chunk % static_cast<uint64_t>(tree_count(kind)));
}

TreeLinks binary_tree_links(int n, int rank) {
  check_rank(n, rank);
  TreeLinks out;
  out.parent = rank == 0 ? kProducer : (rank - 1) / 2;
  for (int c : {2 * rank + 1, 2 * rank + 2}) {
    if (c < n) out.children.push_back(c);
  }
  return out;
}

TreeLinks chain_links(int n, int rank) {
  check_rank(n, rank);
  TreeLinks out;
  out.parent = rank == 0 ? kProducer : rank - 1;
  if (rank + 1 < n) out.children.push_back(rank + 1);
  return out;
}

TreeLinks double_binary_tree_links(int n, int rank, int tree) {
  check_rank(n, rank);
  if (tree != 0 && tree != 1) {
    throw Error(Errc::invalid_argument, "double binary tree index must be 0 or 1, got " + std::to_string(tree));
  }
  const int m = n - (n % 2);  // the paired part; an odd n leaves rank n-1 over
  if (m == 0) return {};      // n == 1: the single member is the root of both trees
  const int root = tree == 0 ? 0 : m - 1;
  if (rank == m) {  // odd n: the extra member is a leaf under each root
    TreeLinks out;
    out.parent = root;
    return out;
  }
  TreeLinks out = tree == 0 ? bit_tree_links(m, rank)
                            : map_links(bit_tree_links(m, m - 1 - rank), [m](int r) { return m - 1 - r; });
  if (rank == root && n > m) out.children.push_back(m);
  return out;
}

int tree_root(TopologyKind kind, int n, int tree) {
  if (kind == TopologyKind::double_binary && tree == 1 && n >= 2) return n - (n % 2) - 1;
  return 0;
}

Topology::Topology(TopologyKind kind, std::vector<std::string> cluster_labels, const std::string& producer_cluster,
                   int producers)
    : kind_(kind), labels_(std::move(cluster_labels)), producers_(producers) {
  if (labels_.empty()) throw Error(Errc::invalid_argument, "topology needs at least one member");
  if (producers < 1 || producers > kMaxProducers)
    throw Error(Errc::invalid_argument, "a producer group has 1 to " + std::to_string(kMaxProducers) + " ranks, not " +
                                            std::to_string(producers));
  std::unordered_map<std::string, int> index;
  cluster_of_.resize(labels_.size());
  for (size_t r = 0; r < labels_.size(); ++r) {
    auto [it, fresh] = index.emplace(labels_[r], static_cast<int>(cluster_members_.size()));
    if (fresh) cluster_members_.emplace_back();
    cluster_of_[r] = it->second;
    cluster_members_[it->second].push_back(static_cast<int>(r));
  }
  if (auto it = index.find(producer_cluster); !producer_cluster.empty() && it != index.end())
    producer_cluster_ = it->second;
  const int clusters = cluster_count();
  links_.resize(static_cast<size_t>(tree_count(kind_)) * static_cast<size_t>(producers_));
  cluster_order_.resize(links_.size());
  for (int t = 0; t < trees(); ++t) {
    auto& order = cluster_order_[t];
    order.resize(static_cast<size_t>(clusters));
    for (int k = 0; k < clusters; ++k) order[static_cast<size_t>(k)] = k;
    if (producer_cluster_ >= 0) {
      // The producer's cluster takes the root position; the others keep their order around it.
      const int root_position = tree_root(kind_, clusters, base_tree(t));
      order.erase(order.begin() + producer_cluster_);
      order.insert(order.begin() + root_position, producer_cluster_);
    }
  }
  // Each member's children over every tree inside its cluster: the same for every tree built.
  local_load_.assign(labels_.size(), 0);
  for (const auto& members : cluster_members_) {
    const int s = static_cast<int>(members.size());
    for (int i = 0; i < s; ++i)
      for (int t = 0; t < trees(); ++t)
        local_load_[members[i]] += static_cast<int>(rotated_links(s, i, t).children.size());
  }
  for (int t = 0; t < trees(); ++t) build_tree(t);
}

Topology Topology::single_cluster(TopologyKind kind, int n) {
  if (n < 1) throw Error(Errc::invalid_argument, "topology needs at least one member, got " + std::to_string(n));
  return Topology(kind, std::vector<std::string>(static_cast<size_t>(n)));
}

// Builds each cluster's local tree, then hangs each child cluster's gateway under one "egress"
// member of its parent cluster. Egress members are local leaves with the least forwarding work (fewest
// children over all local trees), so a child cluster adds at most one send to a member that
// otherwise only receives in this tree; sibling clusters get different egress members when the
// parent cluster has enough leaves.
void Topology::build_tree(int tree) {
  auto& links = links_[tree];
  links.assign(labels_.size(), TreeLinks{});
  const int clusters = cluster_count();
  std::vector<std::vector<int>> egress(clusters);  // candidates in preference order
  for (int k = 0; k < clusters; ++k) {
    const auto& members = cluster_members_[k];
    const int s = static_cast<int>(members.size());
    for (int i = 0; i < s; ++i)
      links[members[i]] = map_links(rotated_links(s, i, tree), [&members](int r) { return members[r]; });
    for (int i = 0; i < s; ++i) {
      if (links[members[i]].children.empty()) egress[k].push_back(i);
    }
    std::stable_sort(egress[k].begin(), egress[k].end(), [&](int a, int b) {
      const int load_a = local_load_[members[a]], load_b = local_load_[members[b]];
      return load_a != load_b ? load_a < load_b : a > b;
    });
    for (int& i : egress[k]) i = members[i];
  }
  // The clusters themselves form a tree of the same kind, so singleton clusters reduce to the
  // plain kind (and double_binary keeps its interior-in-one-tree property between clusters).
  const auto& order = cluster_order_[tree];
  for (int position = 0; position < clusters; ++position) {
    const auto& candidates = egress[order[position]];
    size_t next = 0;
    for (int child_position : local_links(kind_, clusters, position, base_tree(tree)).children) {
      const int from = candidates[std::min(next++, candidates.size() - 1)];
      const int root = gateway(order[child_position], tree);
      links[root].parent = from;
      links[from].children.push_back(root);
    }
  }
}

int Topology::root(int tree) const {
  if (tree < 0 || tree >= trees())
    throw Error(Errc::invalid_argument, "no tree " + std::to_string(tree) + " in this topology");
  return gateway(cluster_order_[tree][tree_root(kind_, cluster_count(), base_tree(tree))], tree);
}

int Topology::rotation(int s, int tree) const noexcept {
  return static_cast<int>(static_cast<int64_t>(producer_of(tree)) * s / producers_);
}

TreeLinks Topology::rotated_links(int s, int i, int tree) const {
  const int shift = rotation(s, tree);
  const TreeLinks local = local_links(kind_, s, (i - shift + s) % s, base_tree(tree));
  return map_links(local, [shift, s](int r) { return (r + shift) % s; });
}

int Topology::tree_for_chunk(int producer, uint64_t chunk) const noexcept {
  return producer * tree_count(kind_) + tree::tree_for_chunk(kind_, chunk);
}

const TreeLinks& Topology::links(int rank, int tree) const {
  if (tree < 0 || tree >= trees()) throw Error(Errc::invalid_argument, "no tree " + std::to_string(tree) + " in this topology");
  check_rank(size(), rank);
  return links_[tree][rank];
}

int Topology::cluster_of(int rank) const {
  check_rank(size(), rank);
  return cluster_of_[rank];
}

const std::vector<int>& Topology::cluster_members(int cluster) const {
  if (cluster < 0 || cluster >= cluster_count()) throw Error(Errc::invalid_argument, "no cluster " + std::to_string(cluster));
  return cluster_members_[cluster];
}

const std::string& Topology::cluster_label(int cluster) const {
  return labels_[cluster_members(cluster).front()];
}

int Topology::gateway(int cluster, int tree) const {
  if (tree < 0 || tree >= trees()) throw Error(Errc::invalid_argument, "no tree " + std::to_string(tree) + " in this topology");
  const auto& members = cluster_members(cluster);
  const int s = static_cast<int>(members.size());
  return members[(tree_root(kind_, s, base_tree(tree)) + rotation(s, tree)) % s];
}

std::vector<std::string> tree_problems(const Topology& topology, int tree) {
  std::vector<std::string> problems;
  const int n = topology.size();
  const std::string where = "tree " + std::to_string(tree) + ": ";
  int roots = 0;
  for (int r = 0; r < n; ++r) {
    const TreeLinks& l = topology.links(r, tree);
    if (l.parent == kProducer) {
      ++roots;
      if (r != topology.root(tree)) problems.push_back(where + "member " + std::to_string(r) + " is fed by the producer but is not the root");
    } else if (l.parent < 0 || l.parent >= n) {
      problems.push_back(where + "member " + std::to_string(r) + " has parent " + std::to_string(l.parent) + " out of range");
    } else {
      const auto& siblings = topology.children(l.parent, tree);
      if (std::count(siblings.begin(), siblings.end(), r) != 1) {
        problems.push_back(where + "member " + std::to_string(r) + " is not listed once among its parent's children");
      }
    }
    for (int c : l.children) {
      if (c < 0 || c >= n || topology.parent(c, tree) != r) {
        problems.push_back(where + "child " + std::to_string(c) + " of " + std::to_string(r) + " does not name it as parent");
      }
    }
  }
  if (roots != 1) problems.push_back(where + std::to_string(roots) + " members are fed by the producer (want 1)");
  if (!problems.empty()) return problems;
  // Walk from the root: each member must be reached exactly once (this also rules out cycles,
  // since a member on a cycle is unreachable from the root when parent links agree).
  std::vector<int> reached(n, 0);
  std::vector<int> stack{topology.root(tree)};
  while (!stack.empty()) {
    const int r = stack.back();
    stack.pop_back();
    if (++reached[r] > 1) {
      problems.push_back(where + "member " + std::to_string(r) + " reached twice");
      return problems;
    }
    for (int c : topology.children(r, tree)) stack.push_back(c);
  }
  for (int r = 0; r < n; ++r) {
    if (reached[r] == 0) problems.push_back(where + "member " + std::to_string(r) + " is unreachable (cycle or orphan)");
  }
  return problems;
}

std::vector<std::string> topology_problems(const Topology& topology) {
  std::vector<std::string> all;
  for (int t = 0; t < topology.trees(); ++t) {
    auto p = tree_problems(topology, t);
    all.insert(all.end(), p.begin(), p.end());
  }
  return all;
}

int tree_depth(const Topology& topology, int tree) {
  int deepest = 0;
  std::vector<std::pair<int, int>> stack{{topology.root(tree), 0}};
  while (!stack.empty()) {
    auto [r, d] = stack.back();
    stack.pop_back();
    DC_ASSERT(d < topology.size());  // a cycle would loop forever; validate first
    deepest = std::max(deepest, d);
    for (int c : topology.children(r, tree)) stack.emplace_back(c, d + 1);
  }
  return deepest;
}

double send_load(const Topology& topology, int rank) {
  double sends = 0;
  for (int t = 0; t < topology.trees(); ++t) sends += static_cast<double>(topology.children(rank, t).size());
  return sends / topology.trees();
}

int cluster_crossings(const Topology& topology, int tree) {
  // producer -> root: a crossing unless the root is in the producer's own cluster.
  int crossings = topology.cluster_of(topology.root(tree)) == topology.producer_cluster() ? 0 : 1;
  for (int r = 0; r < topology.size(); ++r) {
    for (int c : topology.children(r, tree)) {
      if (topology.cluster_of(c) != topology.cluster_of(r)) ++crossings;
    }
  }
  return crossings;
}

}  // namespace deltacast::tree
