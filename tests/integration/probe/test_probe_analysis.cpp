// The analysis of `deltacast probe` (tools/probe/analysis.h, tools/probe/cost_model.h,
// tools/probe/svg.h) on synthetic matrices: clusters, chunk rounding, crossing plan, the pair
// sample's size, and the cost model's arithmetic.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/probe/analysis.h"
#include "tools/probe/cost_model.h"
#include "tools/probe/svg.h"
#include "util/error.h"

namespace deltacast::tools {
namespace {

// n ranks; ranks in `group_b` form a second group: 10 Gbit/s inside a group, 0.5 across.
RankMatrix two_groups(int n, const std::set<int>& group_b, double inside = 10, double across = 0.5) {
  RankMatrix m(n, std::vector<std::optional<double>>(n));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) m[a][b] = (group_b.count(a) == group_b.count(b) ? inside : across) * (1 + 0.01 * ((a + 2 * b) % 5));
  return m;
}

std::vector<int> all_ranks(int n) {
  std::vector<int> r(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

TEST(ProbeClusters, TwoGroupsAreFound) {
  const auto result = find_clusters(two_groups(5, {3, 4}), all_ranks(5));
  ASSERT_EQ(result.clusters.size(), 2u);
  EXPECT_EQ(result.clusters[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(result.clusters[1], (std::vector<int>{3, 4}));
  EXPECT_GT(result.gap_ratio, 10);
}

TEST(ProbeClusters, InterleavedGroups) {
  const auto result = find_clusters(two_groups(8, {1, 3, 5, 7}), all_ranks(8));
  ASSERT_EQ(result.clusters.size(), 2u);
  EXPECT_EQ(result.clusters[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(result.clusters[1], (std::vector<int>{1, 3, 5, 7}));
}

TEST(ProbeClusters, UniformIsOneCluster) {
  const auto result = find_clusters(two_groups(6, {}), all_ranks(6));
  ASSERT_EQ(result.clusters.size(), 1u);
  EXPECT_EQ(result.clusters[0], all_ranks(6));
  EXPECT_LT(result.gap_ratio, 3);
  EXPECT_FALSE(result.threshold);
}

TEST(ProbeClusters, GapBelowThreeIsOneCluster) {
  const auto result = find_clusters(two_groups(6, {4, 5}, 10, 4), all_ranks(6));  // 2.5x
  EXPECT_EQ(result.clusters.size(), 1u);
}

TEST(ProbeClusters, SymmetricUsesTheMinimumAndAbsentRanksAreLeftOut) {
  auto m = two_groups(5, {3, 4});
  m[1][3] = 10;  // one fast direction across: the slower one counts
  EXPECT_DOUBLE_EQ(*symmetric(m, 1, 3), *m[3][1]);
  m[2][0].reset();
  EXPECT_DOUBLE_EQ(*symmetric(m, 0, 2), *m[0][2]);
  const auto result = find_clusters(m, {0, 1, 3, 4});  // rank 2 unreachable
  ASSERT_EQ(result.clusters.size(), 2u);
  EXPECT_EQ(result.clusters[0], (std::vector<int>{0, 1}));
}

// The layout of probe_wan_test.sh (measured there): the producer 0 alone, clusters {1,2} and {3,4};
// 100 and 50 Mbit/s links at 20 and 40 ms, 200 Mbit/s and ~0.1 ms inside. Bandwidth has gaps of 2x
// only; the round trips split them.
TEST(ProbeClusters, RoundTripsSplitWhereBandwidthDoesNot) {
  const double mbit[5][5] = {{0, 95.6, 95.0, 47.8, 47.8},
                             {95.3, 0, 192.1, 47.8, 47.8},
                             {95.6, 192.2, 0, 47.8, 47.8},
                             {47.7, 47.9, 47.8, 0, 191.5},
                             {47.8, 47.8, 47.9, 192.1, 0}};
  const double rtt_us[5][5] = {{0, 20922, 20930, 40911, 40920},
                               {20922, 0, 95, 61454, 61460},
                               {20930, 95, 0, 61450, 61458},
                               {40911, 61454, 61450, 0, 88},
                               {40920, 61460, 61458, 88, 0}};
  RankMatrix bw(5, std::vector<std::optional<double>>(5)), rtt = bw;
  for (int a = 0; a < 5; ++a)
    for (int b = 0; b < 5; ++b)
      if (a != b) bw[a][b] = mbit[a][b] / 1000, rtt[a][b] = rtt_us[a][b];
  EXPECT_EQ(find_clusters(bw, all_ranks(5)).clusters.size(), 1u);  // bandwidth alone: one cluster
  const auto result = find_clusters(bw, rtt, all_ranks(5));
  EXPECT_EQ(result.clusters, (std::vector<std::vector<int>>{{0}, {1, 2}, {3, 4}}));
  EXPECT_EQ(result.basis, "round trip");
  EXPECT_GT(result.gap_ratio, 100);
  EXPECT_DOUBLE_EQ(*result.threshold, 95);  // the longest round trip inside a cluster
}

// Local pairs whose round trips differ by 4x (30 vs 120 us) are not split: a boundary is >= 1 ms.
TEST(ProbeClusters, RoundTripNoiseBelowAMillisecondSplitsNothing) {
  const int n = 6;
  RankMatrix rtt(n, std::vector<std::optional<double>>(n));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) rtt[a][b] = (a < 3) == (b < 3) ? 30 : 120;
  const auto bw = two_groups(n, {});
  EXPECT_EQ(find_clusters_by_round_trip(rtt, all_ranks(n)).clusters.size(), 1u);
  const auto result = find_clusters(bw, rtt, all_ranks(n));
  EXPECT_EQ(result.clusters.size(), 1u);
  EXPECT_EQ(result.basis, "");
  // The same shape at 0.3 vs 12 ms is two clusters.
  for (auto& row : rtt)
    for (auto& v : row)
      if (v) v = *v == 30 ? 300 : 12000;
  EXPECT_EQ(find_clusters(bw, rtt, all_ranks(n)).clusters, (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}}));
}

// Where bandwidth splits, it decides (round trips that would split otherwise are not consulted).
TEST(ProbeClusters, BandwidthSplitComesFirst) {
  const int n = 5;
  RankMatrix rtt(n, std::vector<std::optional<double>>(n));
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) rtt[a][b] = (a < 2) == (b < 2) ? 100 : 20000;  // {0,1} {2,3,4} by round trip
  const auto result = find_clusters(two_groups(n, {3, 4}), rtt, all_ranks(n));
  EXPECT_EQ(result.basis, "bandwidth");
  EXPECT_EQ(result.clusters, (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}}));
}

TEST(ProbeChunk, RoundedToAPowerOfTwoAndClamped) {
  EXPECT_EQ(chunk_for_bandwidth(1e6), 256u << 10);       // 10 KB -> 256 KiB floor
  EXPECT_EQ(chunk_for_bandwidth(100e9 / 8), 16u << 20);  // 125 MB -> 16 MiB ceiling
  EXPECT_EQ(chunk_for_bandwidth(10e9 / 8), 16u << 20);   // 12.5 MB: log2 23.6 -> 16 MiB
  EXPECT_EQ(chunk_for_bandwidth(4e9 / 8), 4u << 20);     // 5 MB: log2 22.25 -> 4 MiB
  EXPECT_EQ(chunk_for_bandwidth(1e9 / 8), 1u << 20);     // 1.25 MB -> 1 MiB
  EXPECT_EQ(chunk_for_bandwidth(50e6), 512u << 10);      // 500 KB: log2 18.93 -> 512 KiB
  for (double bw = 1e5; bw < 1e12; bw *= 1.7) {
    const uint64_t c = chunk_for_bandwidth(bw);
    EXPECT_EQ(c & (c - 1), 0u);
    EXPECT_GE(c, 256u << 10);
    EXPECT_LE(c, 16u << 20);
  }
}

TEST(ProbeCrossings, OneCrossingPerClusterPerTree) {
  // Members (job ranks 1..6), clusters {0,1,2,3} and {4,5,6}: producer in the first.
  const std::vector<int> members{1, 2, 3, 4, 5, 6};
  const std::vector<int> cluster_of{0, 0, 0, 0, 1, 1, 1};
  for (auto kind : {tree::TopologyKind::binary, tree::TopologyKind::double_binary, tree::TopologyKind::chain}) {
    std::vector<std::string> labels;
    labels.reserve(members.size());
    for (int r : members) labels.push_back(std::to_string(cluster_of[r]));
    const tree::Topology topology(kind, labels);
    const auto plan = crossing_plan(topology, members, cluster_of);
    ASSERT_EQ(static_cast<int>(plan.size()), topology.trees());
    for (const auto& t : plan) {
      // The boundary once; plus producer -> root when the tree's root cluster is not the
      // producer's (double_binary's tree 1 is rooted in the mirror cluster).
      const int root = members[static_cast<size_t>(topology.root(t.tree))];
      const size_t producer_edge = cluster_of[root] != cluster_of[0] ? 1 : 0;
      ASSERT_EQ(t.edges.size(), 1 + producer_edge) << tree::topology_kind_name(kind) << " tree " << t.tree;
      if (producer_edge) {
        EXPECT_EQ(t.edges[0], (std::pair<int, int>{0, root}));
      }
      for (const auto& [from, to] : t.edges) EXPECT_NE(cluster_of[from], cluster_of[to]);
    }
    if (kind != tree::TopologyKind::double_binary) {
      EXPECT_EQ(plan[0].edges.size(), 1u);
    }
  }
}

TEST(ProbeCrossings, ProducerOutsideTheRootCluster) {
  // The producer (cluster 1) is alone: its edge to the root crosses.
  const std::vector<int> members{1, 2, 3};
  const std::vector<int> cluster_of{1, 0, 0, 0};
  const tree::Topology topology(tree::TopologyKind::binary, {"a", "a", "a"});
  const auto plan = crossing_plan(topology, members, cluster_of);
  ASSERT_EQ(plan.size(), 1u);
  ASSERT_EQ(plan[0].edges.size(), 1u);
  EXPECT_EQ(plan[0].edges[0], (std::pair<int, int>{0, 1}));
}

TEST(ProbeSample, AllPairsUpTo64Members) {
  EXPECT_EQ(sample_pairs(65, 1).size(), 65u * 64u);
  EXPECT_EQ(sample_pairs(5, 1).size(), 20u);
  EXPECT_EQ(unordered_pairs(sample_pairs(5, 1)).size(), 10u);
}

TEST(ProbeSample, N200IsOrderNLogN) {
  const int n = 200;
  const auto pairs = sample_pairs(n, 7);
  const double bound = 2.0 * (n - 1) + (n - 1) * std::ceil(2 * std::log2(n));
  EXPECT_LE(static_cast<double>(pairs.size()), bound);
  EXPECT_LE(static_cast<double>(pairs.size()), 3.0 * n * std::log2(n));
  EXPECT_LT(pairs.size(), static_cast<size_t>(n) * (n - 1) / 4);
  std::set<RankPair> seen(pairs.begin(), pairs.end());
  EXPECT_EQ(seen.size(), pairs.size());  // no duplicates
  for (int r = 1; r < n; ++r) {
    EXPECT_TRUE(seen.count({0, r}));
    EXPECT_TRUE(seen.count({r, 0}));
  }
  for (const auto& p : pairs) EXPECT_NE(p.from, p.to);
  EXPECT_EQ(pairs, sample_pairs(n, 7));  // deterministic
}

TEST(ProbeSample, QuickPairsAreOrderNAndFindTwoGroups) {
  for (int n : {2, 3, 9, 200}) {
    const auto pairs = quick_pairs(n, 3);
    EXPECT_LE(pairs.size(), static_cast<size_t>(5 * (n - 1))) << n;  // producer both ways, 2 peers, ring
    std::set<RankPair> seen(pairs.begin(), pairs.end());
    EXPECT_EQ(seen.size(), pairs.size());
    for (int r = 1; r < n; ++r) EXPECT_TRUE(seen.count({0, r}) && seen.count({r, 0})) << n << " " << r;
    for (const auto& p : pairs) EXPECT_NE(p.from, p.to);
  }
  // Two groups {0..4} and {5..8}, 10 Gbit/s inside, 1 Gbit/s between: the quick sample finds them.
  const int n = 9;
  RankMatrix bw(n, std::vector<std::optional<double>>(n));
  for (const auto& p : quick_pairs(n, 3)) bw[p.from][p.to] = (p.from < 5) == (p.to < 5) ? 10.0 : 1.0;
  EXPECT_EQ(find_clusters(bw, all_ranks(n)).clusters, (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}, {5, 6, 7, 8}}));
}

TEST(ProbeSample, ConcurrencySampleAndPeers) {
  const auto present = all_ranks(20);
  const auto sample = concurrency_sample(present, 8);
  ASSERT_EQ(sample.size(), 9u);
  EXPECT_EQ(sample[0], 0);
  const RankMatrix none(20, std::vector<std::optional<double>>(20));
  EXPECT_EQ(concurrency_peers(none, present, 18, true, 4), (std::vector<int>{19, 0, 1, 2}));
  EXPECT_EQ(concurrency_peers(none, {0, 1, 2}, 1, true, 4), (std::vector<int>{2, 0}));
  // Fastest measured first: 2 sends fast to 3 and 4 (its group), slowly to 0 and 1.
  const auto m = two_groups(5, {2, 3, 4});
  EXPECT_GE(concurrency_peers(m, all_ranks(5), 2, true, 4).front(), 3);
  const auto into0 = concurrency_peers(m, all_ranks(5), 0, false, 4);
  EXPECT_EQ(into0.front(), 1);  // the only fast sender into 0
}

// Round numbers, so every term can be checked by hand.
CostModel round_model() {
  CostModel m;
  m.t_scan_s_per_byte = 0.5e-9;
  m.t_change_s = 40e-9;
  m.t_apply_c_s = 1e-9;
  m.t_apply_rc_s = 15e-9;
  m.t_scan_rc_s_per_byte = 0.1e-9;
  m.t_hop_s = 0.01;
  m.c0_s = 0.002;
  m.k_rtt_producer = 2.5;
  m.k_rtt_delegated = 1.0;
  m.bytes_per_change_1 = 1.0;
  m.bytes_per_change_3 = 0.85;
  m.bytes_per_change_5 = 0.8;
  return m;
}

TEST(ProbeCostModel, TermsByHand) {
  const CostModel model = round_model();
  CostInputs in;
  in.params = 1e9;
  in.change_rate = 0.01;
  in.diff_threads = 8;
  in.apply_threads = 4;
  in.bottleneck_seconds_per_byte = 1 / 1.25e9;  // 10 Gbit/s
  in.tree_depth = 4;
  in.chunk_bytes = 1 << 20;
  in.inner_bytes_per_second = 1.25e9;
  in.rtt_seconds = 0.1;
  const auto p = predict(model, in);
  EXPECT_DOUBLE_EQ(p.bytes_per_change, 1.0);  // measured at 1%
  EXPECT_DOUBLE_EQ(p.payload_bytes, 1e7);
  EXPECT_NEAR(p.diff, (2e9 * 0.5e-9 + 1e7 * 40e-9) / 8, 1e-12);
  EXPECT_NEAR(p.transfer, 1e7 / 1.25e9, 1e-12);
  EXPECT_NEAR(p.apply, (1e7 * 16e-9 + 2e9 * 0.1e-9) / 4, 1e-12);
  EXPECT_NEAR(p.fill, 4 * (0.01 + (1 << 20) / 2.0 * 0.01 * 1.0 / 1.25e9), 1e-12);
  EXPECT_NEAR(p.commit, 0.002 + 2.5 * 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(p.commit_round_trips, 2.5);
  // Pipelined: the slowest stage (diff, 0.175 s) sets the pace; serial adds all three.
  EXPECT_NEAR(p.seconds, p.diff + p.fill + p.commit, 1e-12);
  EXPECT_NEAR(p.serial_seconds, p.diff + p.transfer + p.apply + p.fill + p.commit, 1e-12);

  // The wire bound: a slow link makes transfer the max.
  in.bottleneck_seconds_per_byte = 1 / 12.5e6;  // 100 Mbit/s
  const auto slow = predict(model, in);
  EXPECT_NEAR(slow.seconds, slow.transfer + slow.fill + slow.commit, 1e-12);

  // A delegated commit: one round trip per version instead of 2.5.
  in.delegated_commit = true;
  const auto delegated = predict(model, in);
  EXPECT_NEAR(slow.seconds - delegated.seconds, 1.5 * 0.1, 1e-12);

  // A given bytes-per-change overrides the measured one.
  in.bytes_per_change = 0.5;
  EXPECT_NEAR(predict(model, in).payload_bytes, 5e6, 1e-6);
}

// M producer ranks: the producer's diff and its uplink's share of the transfer divide by M; what
// the members relay does not, so past the point where a member's link is the slower, M buys nothing.
TEST(ProbeCostModel, ProducerRanksDivideTheProducersShareOnly) {
  const CostModel model = round_model();
  CostInputs in;
  in.params = 1e9;
  in.change_rate = 0.03;
  in.diff_threads = 8;
  in.producer_seconds_per_byte = 1 / 12.5e6;  // the producer's uplink: 100 Mbit/s
  in.member_seconds_per_byte = 1 / 125e6;     // the slowest member relays at 1 Gbit/s
  in.bottleneck_seconds_per_byte = in.producer_seconds_per_byte;
  const auto one = predict(model, in);
  EXPECT_NEAR(one.transfer, one.payload_bytes / 12.5e6, 1e-9);
  in.producer_ranks = 4;
  const auto four = predict(model, in);
  EXPECT_NEAR(four.transfer, one.transfer / 4, 1e-9);
  EXPECT_NEAR(four.diff, one.diff / 4, 1e-12);
  EXPECT_DOUBLE_EQ(four.payload_bytes, one.payload_bytes);  // splitting costs no payload
  in.producer_ranks = 32;  // 100 Mbit/s / 32 is slower than the member's 1 Gbit/s no more
  EXPECT_NEAR(predict(model, in).transfer, one.payload_bytes / 125e6, 1e-9);
  // Without the producer's share known apart, the whole bottleneck divides (the older inputs).
  in.producer_seconds_per_byte = 0;
  in.producer_ranks = 2;
  EXPECT_NEAR(predict(model, in).transfer, one.transfer / 2, 1e-9);
  // Zero or negative ranks count as one.
  in.producer_ranks = 0;
  EXPECT_NEAR(predict(model, in).transfer, one.transfer, 1e-9);
}

TEST(ProbeCostModel, MeasuredBytesPerChangeAtNearestRate) {
  const CostModel model = round_model();
  EXPECT_DOUBLE_EQ(model.bytes_per_change_at(0.001), 1.0);
  EXPECT_DOUBLE_EQ(model.bytes_per_change_at(0.015), 1.0);
  EXPECT_DOUBLE_EQ(model.bytes_per_change_at(0.025), 0.85);
  EXPECT_DOUBLE_EQ(model.bytes_per_change_at(0.045), 0.8);
  EXPECT_DOUBLE_EQ(model.bytes_per_change_at(0.5), 0.8);
}

// The constants a probe predicts with are those of the fit installed with the CLI
// (tools/probe/cost_model_fit.json, copied to <build>/share/deltacast/ and to the install prefix).
TEST(ProbeCostModel, FittedConstantsAreTheFitFile) {
  std::ifstream in(DELTACAST_COST_MODEL_FIT);
  ASSERT_TRUE(in) << DELTACAST_COST_MODEL_FIT;
  const auto fit = nlohmann::json::parse(in);
  const auto& c = fit.at("constants");
  const CostModel m = CostModel::load(DELTACAST_COST_MODEL_FIT);
  EXPECT_EQ(m.source, DELTACAST_COST_MODEL_FIT);
  EXPECT_EQ(m.to_json().at("source"), DELTACAST_COST_MODEL_FIT);
  EXPECT_DOUBLE_EQ(m.t_scan_s_per_byte, c.at("t_scan_s_per_byte").get<double>());
  EXPECT_DOUBLE_EQ(m.t_change_s, c.at("t_change_s").get<double>());
  EXPECT_DOUBLE_EQ(m.t_apply_c_s, c.at("t_apply_c_s").get<double>());
  EXPECT_DOUBLE_EQ(m.t_apply_rc_s, c.at("t_apply_rc_s").get<double>());
  EXPECT_DOUBLE_EQ(m.t_scan_rc_s_per_byte, c.at("t_scan_rc_s_per_byte").get<double>());
  EXPECT_DOUBLE_EQ(m.t_hop_s, c.at("t_hop_s").get<double>());
  EXPECT_DOUBLE_EQ(m.c0_s, c.at("c0_s").get<double>());
  EXPECT_DOUBLE_EQ(m.k_rtt_producer, c.at("k_rtt").get<double>());
  EXPECT_DOUBLE_EQ(m.k_rtt_delegated, c.at("k_rtt_delegated").get<double>());
  const auto& bpc = fit.at("bytes_per_change");
  EXPECT_DOUBLE_EQ(m.bytes_per_change_1, bpc.at("0.01").at("median").get<double>());
  EXPECT_DOUBLE_EQ(m.bytes_per_change_3, bpc.at("0.03").at("median").get<double>());
  EXPECT_DOUBLE_EQ(m.bytes_per_change_5, bpc.at("0.05").at("median").get<double>());
  // Sane magnitudes: a fit that lost a unit would be off by 10^3 or more.
  EXPECT_GT(m.t_scan_s_per_byte, 1e-11);
  EXPECT_LT(m.t_scan_s_per_byte, 1e-8);
  EXPECT_GT(m.k_rtt_producer, m.k_rtt_delegated);
  EXPECT_GT(m.bytes_per_change_1, 0.5);
  EXPECT_LT(m.bytes_per_change_1, 2.0);
}

// A fit that is missing, not JSON, or lacks a constant is refused with the file and the key, and
// installed() takes $DELTACAST_COST_MODEL before the installed file.
TEST(ProbeCostModel, ABadFitFileIsRefusedByName) {
  const auto dir = std::filesystem::temp_directory_path() / ("dc_fit_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto expect_error = [](const std::filesystem::path& file, Errc code, const std::string& mention) {
    try {
      (void)CostModel::load(file);
      ADD_FAILURE() << "accepted " << file;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  };
  expect_error(dir / "absent.json", Errc::io, "absent.json");
  std::ofstream(dir / "junk.json") << "{ not json";
  expect_error(dir / "junk.json", Errc::config, "junk.json");
  std::ifstream in(DELTACAST_COST_MODEL_FIT);
  auto fit = nlohmann::json::parse(in);
  fit["constants"].erase("t_hop_s");
  std::ofstream(dir / "no_hop.json") << fit.dump();
  expect_error(dir / "no_hop.json", Errc::config, "/constants/t_hop_s");
  fit = nlohmann::json::parse(std::ifstream(DELTACAST_COST_MODEL_FIT));
  fit["constants"]["t_hop_s"] = 0.25;
  std::ofstream(dir / "other.json") << fit.dump();
  ::setenv("DELTACAST_COST_MODEL", (dir / "other.json").c_str(), 1);
  EXPECT_DOUBLE_EQ(CostModel::installed().t_hop_s, 0.25);
  ::setenv("DELTACAST_COST_MODEL", (dir / "absent.json").c_str(), 1);
  EXPECT_THROW((void)CostModel::installed(), Error);
  ::unsetenv("DELTACAST_COST_MODEL");
  std::filesystem::remove_all(dir);
}

TEST(ProbeRecommend, TwoClustersGiveAPlanAndPredictions) {
  ProbeFigures f;
  f.ranks = 7;
  f.bandwidth_gbit = two_groups(7, {4, 5, 6});
  f.latency_us = two_groups(7, {4, 5, 6}, 50, 2000);
  f.present = all_ranks(7);
  f.clusters = find_clusters(f.bandwidth_gbit, f.present).clusters;
  ASSERT_EQ(f.clusters.size(), 2u);
  PredictOptions o;
  o.model = CostModel::load(DELTACAST_COST_MODEL_FIT);
  const auto r = recommend(f, o);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->candidates.size(), 3u);
  for (const auto& t : r->crossings) EXPECT_LE(t.edges.size(), 2u);  // the boundary (+ producer -> root)
  // The 0.5 Gbit/s links bound it (double_binary spreads the payload over two of them).
  EXPECT_LT(r->chosen.bottleneck_bytes_per_second, 1.1e9 / 8);
  EXPECT_EQ(r->chosen.chunk_bytes, chunk_for_bandwidth(r->chosen.bottleneck_bytes_per_second));
  const auto predicted = predictions_json(*r, o);
  ASSERT_EQ(predicted.size(), 3u);
  EXPECT_LT(predicted[0]["seconds"].get<double>(), predicted[2]["seconds"].get<double>());
  EXPECT_GT(r->rtt_seconds, 0);
}

TEST(ProbeRecommend, NothingMeasuredGivesNoRecommendation) {
  ProbeFigures f;
  f.ranks = 3;
  f.bandwidth_gbit.assign(3, std::vector<std::optional<double>>(3));
  f.latency_us = f.bandwidth_gbit;
  f.present = {0};
  EXPECT_FALSE(recommend(f, {}));
}

TEST(ProbeSvg, HasOneCellPerPairAndClusterOutlines) {
  const auto m = two_groups(5, {3, 4});
  const std::string svg = bandwidth_heatmap_svg(m, {{0, 1, 2}, {3, 4}}, "a <title> & more");
  size_t cells = 0;
  for (size_t at = 0; (at = svg.find("<title>", at)) != std::string::npos; ++at) ++cells;
  EXPECT_EQ(cells, 25u);
  EXPECT_NE(svg.find("&lt;title&gt; &amp; more"), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#d62728\""), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace deltacast::tools
