#include "tools/probe/analysis.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "util/error.h"

namespace deltacast::tools {

std::optional<double> median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

namespace {

// Every member to and from the producer, then `per_member` distinct random other members as
// destinations for every member (drawn from `seed`), duplicates removed.
std::vector<RankPair> producer_and_random_pairs(int ranks, uint64_t seed, int per_member) {
  std::vector<RankPair> pairs;
  std::set<RankPair> seen;
  auto add = [&](int a, int b) {
    if (seen.insert({a, b}).second) pairs.push_back({a, b});
  };
  for (int r = 1; r < ranks; ++r) {
    add(0, r);
    add(r, 0);
  }
  if (ranks < 3) return pairs;
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<int> member(1, ranks - 1);
  for (int r = 1; r < ranks; ++r) {
    std::set<int> peers;
    while (static_cast<int>(peers.size()) < std::min(per_member, ranks - 2)) {
      const int p = member(random);
      if (p != r) peers.insert(p);
    }
    for (int p : peers) add(r, p);
  }
  return pairs;
}

}  // namespace

std::vector<RankPair> sample_pairs(int ranks, uint64_t seed) {
  if (ranks < 1) throw Error(Errc::invalid_argument, "sample_pairs: a job has at least one rank");
  std::vector<RankPair> pairs;
  if (ranks - 1 <= kAllPairsMaxMembers) {
    for (int a = 0; a < ranks; ++a)
      for (int b = 0; b < ranks; ++b)
        if (a != b) pairs.push_back({a, b});
    return pairs;
  }
  return producer_and_random_pairs(ranks, seed, static_cast<int>(std::ceil(2 * std::log2(static_cast<double>(ranks)))));
}

std::vector<RankPair> quick_pairs(int ranks, uint64_t seed, int per_member) {
  if (ranks < 1) throw Error(Errc::invalid_argument, "quick_pairs: a job has at least one rank");
  auto pairs = producer_and_random_pairs(ranks, seed, per_member);
  // A ring over the members too: hosts are usually listed cluster by cluster, and the ring then
  // links every member of a cluster even where the random picks missed it.
  std::set<RankPair> seen(pairs.begin(), pairs.end());
  for (int r = 1; r < ranks && ranks > 2; ++r) {
    const RankPair next{r, r % (ranks - 1) + 1};
    if (seen.insert(next).second) pairs.push_back(next);
  }
  return pairs;
}

std::vector<RankPair> unordered_pairs(const std::vector<RankPair>& pairs) {
  std::set<RankPair> seen;
  std::vector<RankPair> out;
  for (const auto& p : pairs) {
    const RankPair u{std::min(p.from, p.to), std::max(p.from, p.to)};
    if (u.from != u.to && seen.insert(u).second) out.push_back(u);
  }
  return out;
}

std::vector<int> concurrency_sample(const std::vector<int>& present, int members) {
  std::vector<int> out;
  std::vector<int> others;
  for (int r : present) (r == 0 ? out : others).push_back(r);
  const size_t take = std::min(others.size(), static_cast<size_t>(std::max(0, members)));
  for (size_t k = 0; k < take; ++k) out.push_back(others[k * others.size() / take]);
  return out;
}

std::vector<int> concurrency_peers(const RankMatrix& bandwidth, const std::vector<int>& present, int rank,
                                   bool rank_sends, int count) {
  std::vector<int> peers;
  const auto at = std::find(present.begin(), present.end(), rank);
  const size_t start = at == present.end() ? 0 : static_cast<size_t>(at - present.begin()) + 1;
  for (size_t k = 0; k < present.size(); ++k) {
    const int r = present[(start + k) % present.size()];
    if (r != rank) peers.push_back(r);
  }
  auto figure = [&](int peer) {
    const auto& v = rank_sends ? bandwidth[rank][peer] : bandwidth[peer][rank];
    return v.value_or(-1.0);
  };
  std::stable_sort(peers.begin(), peers.end(), [&](int a, int b) { return figure(a) > figure(b); });
  if (static_cast<int>(peers.size()) > count) peers.resize(static_cast<size_t>(count));
  return peers;
}

std::optional<double> symmetric(const RankMatrix& m, int a, int b) {
  const auto& ab = m[a][b];
  const auto& ba = m[b][a];
  if (ab && ba) return std::min(*ab, *ba);
  return ab ? ab : ba;
}

namespace {

// The gap rule over `closeness` (larger = closer): the symmetric figures of the measured pairs,
// sorted; the largest ratio between consecutive values; when it is >= min_gap and `accept` takes
// the values on either side, the connected components of the pairs above it, else one cluster.
ClusterResult split_at_gap(const RankMatrix& closeness, const std::vector<int>& present, double min_gap,
                           const std::function<bool(double below, double above)>& accept) {
  ClusterResult result;
  struct Edge {
    int a, b;
    double value;
  };
  std::vector<Edge> edges;
  for (size_t i = 0; i < present.size(); ++i)
    for (size_t j = i + 1; j < present.size(); ++j)
      if (auto v = symmetric(closeness, present[i], present[j]); v && *v > 0)
        edges.push_back({present[i], present[j], *v});
  std::vector<double> sorted;
  sorted.reserve(edges.size());
  for (const auto& e : edges) sorted.push_back(e.value);
  std::sort(sorted.begin(), sorted.end());
  double below = 0;
  for (size_t k = 0; k + 1 < sorted.size(); ++k) {
    const double ratio = sorted[k + 1] / sorted[k];
    if (ratio > result.gap_ratio) {
      result.gap_ratio = ratio;
      result.threshold = sorted[k + 1];
      below = sorted[k];
    }
  }
  if (result.gap_ratio < min_gap || !accept(below, *result.threshold)) {
    result.threshold.reset();
    if (!present.empty()) result.clusters.push_back(present);
    return result;
  }
  // Union-find over the edges above the gap.
  std::map<int, int> parent;
  for (int r : present) parent[r] = r;
  std::function<int(int)> root = [&](int r) { return parent[r] == r ? r : parent[r] = root(parent[r]); };
  for (const auto& e : edges)
    if (e.value >= *result.threshold) parent[root(e.a)] = root(e.b);
  std::map<int, std::vector<int>> groups;
  for (int r : present) groups[root(r)].push_back(r);
  for (auto& [_, members] : groups) result.clusters.push_back(std::move(members));
  std::sort(result.clusters.begin(), result.clusters.end());
  return result;
}

}  // namespace

ClusterResult find_clusters(const RankMatrix& bandwidth, const std::vector<int>& present, double min_gap) {
  ClusterResult result = split_at_gap(bandwidth, present, min_gap, [](double, double) { return true; });
  if (result.threshold) result.basis = "bandwidth";
  return result;
}

ClusterResult find_clusters_by_round_trip(const RankMatrix& latency_us, const std::vector<int>& present, double min_gap,
                                          double min_boundary_us) {
  RankMatrix closeness = latency_us;  // 1 / round trip: a short round trip is close
  for (auto& row : closeness)
    for (auto& v : row)
      if (v) v = *v > 0 ? std::optional<double>(1 / *v) : std::nullopt;
  ClusterResult result = split_at_gap(closeness, present, min_gap,
                                      [&](double below, double) { return below > 0 && 1 / below >= min_boundary_us; });
  if (result.threshold) {
    result.threshold = 1 / *result.threshold;  // the longest round trip inside a cluster
    result.basis = "round trip";
  }
  return result;
}

ClusterResult find_clusters(const RankMatrix& bandwidth, const RankMatrix& latency_us,
                            const std::vector<int>& present) {
  ClusterResult by_bandwidth = find_clusters(bandwidth, present);
  if (by_bandwidth.threshold) return by_bandwidth;
  ClusterResult by_round_trip = find_clusters_by_round_trip(latency_us, present);
  return by_round_trip.threshold ? by_round_trip : by_bandwidth;
}

uint64_t chunk_for_bandwidth(double bytes_per_second) {
  constexpr double lo = 256.0 * 1024, hi = 16.0 * 1024 * 1024;
  const double bytes = std::clamp(bytes_per_second * 0.010, lo, hi);
  return uint64_t{1} << static_cast<int>(std::lround(std::log2(bytes)));
}

std::vector<TreeCrossings> crossing_plan(const tree::Topology& topology, const std::vector<int>& member_ranks,
                                         const std::vector<int>& cluster_of_rank) {
  std::vector<TreeCrossings> plan;
  for (int t = 0; t < topology.trees(); ++t) {
    TreeCrossings crossings{t, {}};
    const int root = topology.root(t);
    if (cluster_of_rank[0] != cluster_of_rank[member_ranks[root]]) crossings.edges.push_back({0, member_ranks[root]});
    for (int m = 0; m < topology.size(); ++m) {
      for (int child : topology.children(m, t)) {
        const int from = member_ranks[m], to = member_ranks[child];
        if (cluster_of_rank[from] != cluster_of_rank[to]) crossings.edges.push_back({from, to});
      }
    }
    plan.push_back(std::move(crossings));
  }
  return plan;
}

namespace {

constexpr double kBytesPerGbit = 1e9 / 8;

// cluster index of every job rank (-1 for ranks in no cluster).
std::vector<int> cluster_index(const ProbeFigures& f) {
  std::vector<int> of(static_cast<size_t>(f.ranks), -1);
  for (size_t c = 0; c < f.clusters.size(); ++c)
    for (int r : f.clusters[c]) of[static_cast<size_t>(r)] = static_cast<int>(c);
  return of;
}

// Bandwidth estimator for tree edges (bytes per second), as evaluate_topology describes.
class EdgeBandwidth {
 public:
  explicit EdgeBandwidth(const ProbeFigures& f) : f_(f), cluster_of_(cluster_index(f)) {
    std::vector<double> all;
    for (int a = 0; a < f.ranks; ++a)
      for (int b = 0; b < f.ranks; ++b)
        if (auto v = f.bandwidth_gbit[a][b]; v && *v > 0) {
          all.push_back(*v);
          between_[key(cluster_of_[a], cluster_of_[b])].push_back(*v);
        }
    overall_ = median(all).value_or(0);
  }

  double operator()(int from, int to) const {
    if (auto v = f_.bandwidth_gbit[from][to]; v && *v > 0) return *v * kBytesPerGbit;
    if (auto v = f_.bandwidth_gbit[to][from]; v && *v > 0) return *v * kBytesPerGbit;
    const auto it = between_.find(key(cluster_of_[from], cluster_of_[to]));
    if (it != between_.end()) return median(it->second).value_or(overall_) * kBytesPerGbit;
    return overall_ * kBytesPerGbit;
  }

  // The median of the measured pairs inside clusters (all pairs when no cluster has two ranks).
  double inner() const {
    std::vector<double> values;
    for (int a = 0; a < f_.ranks; ++a)
      for (int b = 0; b < f_.ranks; ++b)
        if (auto v = f_.bandwidth_gbit[a][b]; v && *v > 0 && cluster_of_[a] == cluster_of_[b] && cluster_of_[a] >= 0)
          values.push_back(*v);
    return median(values).value_or(overall_) * kBytesPerGbit;
  }

  bool any() const { return overall_ > 0; }

 private:
  static std::pair<int, int> key(int a, int b) { return {std::min(a, b), std::max(a, b)}; }
  const ProbeFigures& f_;
  std::vector<int> cluster_of_;
  std::map<std::pair<int, int>, std::vector<double>> between_;
  double overall_ = 0;
};

std::vector<int> present_members(const ProbeFigures& f) {
  std::vector<int> members;
  for (int r : f.present)
    if (r != 0) members.push_back(r);
  return members;
}

tree::Topology topology_for(const ProbeFigures& f, tree::TopologyKind kind, const std::vector<int>& members) {
  const auto of = cluster_index(f);
  std::vector<std::string> labels;
  labels.reserve(members.size());
  for (int r : members) labels.push_back("cluster" + std::to_string(of[static_cast<size_t>(r)]));
  return tree::Topology(kind, labels);
}

double rtt_seconds(const ProbeFigures& f) {
  std::vector<double> values;
  for (int r : f.present)
    if (r != 0)
      if (auto v = symmetric(f.latency_us, 0, r)) values.push_back(*v);
  return median(values).value_or(0) * 1e-6;
}

}  // namespace

Candidate evaluate_topology(const ProbeFigures& f, tree::TopologyKind kind, const PredictOptions& o) {
  const EdgeBandwidth bandwidth(f);
  const auto members = present_members(f);
  const tree::Topology topology = topology_for(f, kind, members);
  // Every sender's uplink is taken as shared by all its edges (the conservative case): pushing one
  // payload byte through sender s takes sum over its edges of (share of the payload) / bandwidth.
  const double share = 1.0 / topology.trees();
  std::vector<double> seconds_per_byte(members.size() + 1, 0);  // [0] producer, [m+1] member m
  int depth = 0;
  for (int t = 0; t < topology.trees(); ++t) {
    seconds_per_byte[0] += share / bandwidth(0, members[static_cast<size_t>(topology.root(t))]);
    for (int m = 0; m < topology.size(); ++m)
      for (int child : topology.children(m, t))
        seconds_per_byte[static_cast<size_t>(m) + 1] +=
            share / bandwidth(members[static_cast<size_t>(m)], members[static_cast<size_t>(child)]);
    depth = std::max(depth, tree::tree_depth(topology, t) + 1);
  }
  Candidate c;
  c.kind = kind;
  c.depth = depth;
  const double worst = *std::max_element(seconds_per_byte.begin(), seconds_per_byte.end());
  c.bottleneck_bytes_per_second = worst > 0 ? 1 / worst : 0;
  c.chunk_bytes = chunk_for_bandwidth(c.bottleneck_bytes_per_second);
  c.inputs.params = o.params;
  c.inputs.change_rate = o.change_rates.empty() ? 0.01 : o.change_rates.front();
  c.inputs.bytes_per_change = o.bytes_per_change;
  c.inputs.diff_threads = o.diff_threads;
  c.inputs.producer_ranks = o.producer_ranks;
  c.inputs.apply_threads = o.apply_threads;
  c.inputs.delegated_commit = o.delegated_commit;
  c.inputs.bottleneck_seconds_per_byte = worst;
  c.inputs.producer_seconds_per_byte = seconds_per_byte[0];
  c.inputs.member_seconds_per_byte =
      members.empty() ? 0 : *std::max_element(seconds_per_byte.begin() + 1, seconds_per_byte.end());
  c.inputs.tree_depth = depth;
  c.inputs.chunk_bytes = static_cast<double>(c.chunk_bytes);
  c.inputs.inner_bytes_per_second = bandwidth.inner();
  c.inputs.rtt_seconds = rtt_seconds(f);
  c.prediction = predict(o.model, c.inputs);
  return c;
}

std::optional<Recommendation> recommend(const ProbeFigures& f, const PredictOptions& o) {
  const auto members = present_members(f);
  if (members.empty() || !EdgeBandwidth(f).any()) return std::nullopt;
  Recommendation r;
  for (auto kind : {tree::TopologyKind::double_binary, tree::TopologyKind::binary, tree::TopologyKind::chain}) {
    r.candidates.push_back(evaluate_topology(f, kind, o));
    if (r.candidates.size() == 1 || r.candidates.back().prediction.seconds < r.chosen.prediction.seconds * 0.99)
      r.chosen = r.candidates.back();
  }
  r.inner_bytes_per_second = r.chosen.inputs.inner_bytes_per_second;
  r.rtt_seconds = r.chosen.inputs.rtt_seconds;
  r.crossings = crossing_plan(topology_for(f, r.chosen.kind, members), members, cluster_index(f));
  return r;
}

nlohmann::json predictions_json(const Recommendation& r, const PredictOptions& o) {
  nlohmann::json out = nlohmann::json::array();
  for (double rate : o.change_rates) {
    CostInputs in = r.chosen.inputs;
    in.change_rate = rate;
    const CostPrediction p = predict(o.model, in);
    out.push_back({{"params", o.params},
                   {"change_rate", rate},
                   {"seconds", p.seconds},
                   {"topology", std::string(tree::topology_kind_name(r.chosen.kind))},
                   {"chunk_bytes", r.chosen.chunk_bytes},
                   {"commit", o.delegated_commit ? "delegated" : "producer"},
                   {"producer_ranks", std::max(1, o.producer_ranks)},
                   {"terms", p.terms_json()}});
  }
  return out;
}

nlohmann::json recommendation_json(const Recommendation& r) {
  nlohmann::json crossings = nlohmann::json::array();
  for (const auto& t : r.crossings) {
    nlohmann::json edges = nlohmann::json::array();
    for (const auto& [from, to] : t.edges) edges.push_back({from, to});
    crossings.push_back({{"tree", t.tree}, {"crossings", edges}});
  }
  nlohmann::json candidates = nlohmann::json::array();
  for (const auto& c : r.candidates)
    candidates.push_back({{"topology", std::string(tree::topology_kind_name(c.kind))},
                          {"chunk_bytes", c.chunk_bytes},
                          {"bottleneck_gbit", c.bottleneck_bytes_per_second * 8 / 1e9},
                          {"depth", c.depth},
                          {"seconds", c.prediction.seconds}});
  return {{"topology", std::string(tree::topology_kind_name(r.chosen.kind))},
          {"chunk_bytes", r.chosen.chunk_bytes},
          {"bottleneck_gbit", r.chosen.bottleneck_bytes_per_second * 8 / 1e9},
          {"inner_gbit", r.inner_bytes_per_second * 8 / 1e9},
          {"rtt_us", r.rtt_seconds * 1e6},
          {"depth", r.chosen.depth},
          {"crossings", crossings},
          {"candidates", candidates}};
}

}  // namespace deltacast::tools
