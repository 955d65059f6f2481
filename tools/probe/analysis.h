#pragma once
// The analysis half of `deltacast probe` (docs/probe.md): which pairs to measure, clusters from
// the bandwidth structure, the recommended topology and chunk size, the per-tree crossing plan and
// the predicted refit times. Pure functions over the measured matrices, no I/O: the unit tests
// drive them with synthetic matrices. Ranks are job ranks throughout: 0 = producer, 1..N-1 =
// members (member index = rank - 1 in tree::Topology). All functions are thread-safe.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/probe/cost_model.h"
#include "tree/topology.h"

namespace deltacast::tools {

// [from][to], N x N; nullopt on the diagonal and for cells not measured (or failed).
using RankMatrix = std::vector<std::vector<std::optional<double>>>;

struct RankPair {
  int from = 0;
  int to = 0;
  bool operator==(const RankPair&) const = default;
  auto operator<=>(const RankPair&) const = default;
};

// Up to this many members every ordered pair is measured.
inline constexpr int kAllPairsMaxMembers = 64;

// The ordered pairs a probe of `ranks` processes measures, in measuring order. Members <= 64: all
// ranks x (ranks - 1) ordered pairs. Above: every member to and from the producer, plus, for every
// member, ceil(2 log2 ranks) distinct random other members as destinations (drawn from `seed`, so
// the same job gets the same sample), duplicates removed: at most 2(N-1) + (N-1) ceil(2 log2 N)
// pairs, O(N log N). Throws Error(invalid_argument) when ranks < 1.
std::vector<RankPair> sample_pairs(int ranks, uint64_t seed);
// The pairs of a quick probe (`run` with `clusters: auto` and no probe_file): every member to and
// from the producer, `per_member` random other members per member as destinations, and a ring
// over the members (r -> r + 1): at most (N - 1)(3 + per_member) pairs, O(N). A member whose
// sampled pairs inside its cluster all miss ends up a cluster of its own (safe, not optimal).
// Throws Error(invalid_argument) when ranks < 1.
std::vector<RankPair> quick_pairs(int ranks, uint64_t seed, int per_member = 2);

// The unordered pairs {a < b} among `pairs` (latency is measured once per unordered pair).
std::vector<RankPair> unordered_pairs(const std::vector<RankPair>& pairs);

// The sources (or destinations) whose concurrent flows are measured: the producer (when present)
// plus up to `members` members spread evenly over the present ones. `present` ascending.
std::vector<int> concurrency_sample(const std::vector<int>& present, int members = 8);
// Up to `count` peers of `rank` among `present` for its concurrent flows, fastest first by the
// isolated figure already measured (bandwidth[rank][peer] when `rank` sends, bandwidth[peer][rank]
// when it receives; unmeasured last), ties in the order after `rank`, wrapping around. The single
// flow goes to the first, so the 4 together are compared with the best one alone.
std::vector<int> concurrency_peers(const RankMatrix& bandwidth, const std::vector<int>& present, int rank,
                                   bool rank_sends, int count = 4);

// The symmetric figure of a pair: the minimum of both directions when both were measured, else the
// one measured, else nullopt.
std::optional<double> symmetric(const RankMatrix& m, int a, int b);

struct ClusterResult {
  std::vector<std::vector<int>> clusters;  // each ascending; ordered by smallest rank (rank 0's first)
  double gap_ratio = 1;                    // the largest ratio between consecutive sorted figures
  std::optional<double> threshold;         // the smallest figure above the gap, when it split
                                           // (by round trip: the longest round trip inside)
  std::string basis;                       // what split them: "bandwidth", "round trip"; "" when one
};

// Clusters from a bandwidth matrix over the ranks in `present` (others are left out): the
// symmetric figures of the measured pairs among them, sorted; the largest ratio between
// consecutive values; when it is >= min_gap, the clusters are the connected components of the
// graph of pairs whose figure lies above the gap, else all of `present` is one cluster.
ClusterResult find_clusters(const RankMatrix& bandwidth, const std::vector<int>& present, double min_gap = 3.0);

// Clusters from round trips (microseconds): the same rule over 1 / round trip (the pairs below the
// gap are joined), where the round trip just above the gap must also be >= min_boundary_us: a
// boundary is a wide-area link, not the noise between fast local pairs (30 vs 120 us is 4x).
ClusterResult find_clusters_by_round_trip(const RankMatrix& latency_us, const std::vector<int>& present,
                                          double min_gap = 3.0, double min_boundary_us = 1000);

// The cluster rule (docs/probe.md): by bandwidth when its gap splits them, else by round trip
// (clusters joined by links of the same bandwidth as their inside, e.g. 100-200 Mbit/s everywhere
// with 20-60 ms between clusters), else one cluster.
ClusterResult find_clusters(const RankMatrix& bandwidth, const RankMatrix& latency_us, const std::vector<int>& present);

// Chunk size for a bottleneck bandwidth (bytes per second): bandwidth x 10 ms, clamped to
// 256 KiB..16 MiB, rounded to the nearest power of two (in log scale).
uint64_t chunk_for_bandwidth(double bytes_per_second);

struct TreeCrossings {
  int tree = 0;
  std::vector<std::pair<int, int>> edges;  // [from, to] in job ranks, producer -> root included
};

// The edges of every tree of `topology` that cross a cluster boundary. `member_ranks[m]` is the
// job rank of topology member m; `cluster_of_rank[r]` the cluster index of job rank r (index 0 of
// that vector is the producer's).
std::vector<TreeCrossings> crossing_plan(const tree::Topology& topology, const std::vector<int>& member_ranks,
                                         const std::vector<int>& cluster_of_rank);

// What the recommendation and the predictions are computed from.
struct ProbeFigures {
  int ranks = 0;
  RankMatrix bandwidth_gbit;               // 10^9 bit/s
  RankMatrix latency_us;                   // median round trip, microseconds
  std::vector<int> present;                // ranks that took part, ascending (0 first)
  std::vector<std::vector<int>> clusters;  // find_clusters(...).clusters
};

struct PredictOptions {
  double params = 1e9;
  std::vector<double> change_rates{0.01, 0.03, 0.05};
  double bytes_per_change = 0;  // 0: the measured bytes per change at each rate
  int diff_threads = 8;         // per producer rank
  int producer_ranks = 1;       // M: a producer group's ranks, each with the measured producer's uplink
  int apply_threads = 8;
  bool delegated_commit = false;  // the run's commit mode (config::commit_is_delegated)
  CostModel model;                // the caller sets it: CostModel::installed() for a probe
};

struct Candidate {
  tree::TopologyKind kind = tree::TopologyKind::double_binary;
  uint64_t chunk_bytes = 0;
  double bottleneck_bytes_per_second = 0;  // payload rate the tree sustains (1 / seconds per byte)
  int depth = 0;                           // member hops, the producer's included
  CostInputs inputs;                       // at the first change rate
  CostPrediction prediction;               // at the first change rate
};

struct Recommendation {
  Candidate chosen;
  std::vector<Candidate> candidates;     // binary, double_binary, chain
  std::vector<TreeCrossings> crossings;  // of the chosen topology
  double inner_bytes_per_second = 0;
  double rtt_seconds = 0;
};

// Cost inputs (bottleneck, depth, chunk) of one topology over the present members, with the
// clusters as labels. Unmeasured edges are estimated: the reverse direction, else the median of
// the measured pairs between the two clusters, else the median of all measured pairs.
Candidate evaluate_topology(const ProbeFigures& f, tree::TopologyKind kind, const PredictOptions& o);

// The candidate with the smallest predicted refit at the first change rate (double_binary, then
// binary, then chain on ties within 1%), with its crossing plan. nullopt when no member is present
// or nothing was measured.
std::optional<Recommendation> recommend(const ProbeFigures& f, const PredictOptions& o);

// {"params", "change_rate", "seconds", "terms"} for every change rate, with the recommendation's
// topology and chunk.
nlohmann::json predictions_json(const Recommendation& r, const PredictOptions& o);
// {"topology", "chunk_bytes", "bottleneck_gbit", "depth", "crossings", "candidates"}.
nlohmann::json recommendation_json(const Recommendation& r);

// The median of `values` (nullopt when empty).
std::optional<double> median(std::vector<double> values);

}  // namespace deltacast::tools
