// `deltacast bench tree`'s arithmetic (tools/bench/tree_math.h) and plot (tools/bench/tree_svg.h).
#include <map>
#include <string>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/bench/tree_math.h"
#include "tools/bench/tree_svg.h"
#include "util/error.h"

namespace deltacast::tools {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

EnvLookup env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(MemoryCap, NineProcessesOfFourGiBDoNotFitTwentyFourGiB) {
  // The example: 9 processes x 2 x 4 GiB = 72 GiB, far over 60% of 24 GiB.
  const uint64_t cap = memory_size_cap(24 * kGiB, 9, kBroadcastBytesFactor);
  EXPECT_LT(cap, 4 * kGiB);
  EXPECT_LT(cap, 1 * kGiB);
  EXPECT_GE(cap, 256 * kMiB);  // 24 GiB x 0.6 / 18 = 0.8 GiB: 256 MiB still runs
  // The rule itself: processes x factor x cap <= fraction x available, and one byte-pair more breaks it.
  EXPECT_LE(9.0 * 2.0 * static_cast<double>(cap), 0.6 * 24.0 * static_cast<double>(kGiB));
  EXPECT_GT(9.0 * 2.0 * static_cast<double>(cap + 2), 0.6 * 24.0 * static_cast<double>(kGiB));
}

TEST(MemoryCap, ScalesWithProcessesFactorAndFraction) {
  EXPECT_EQ(memory_size_cap(100 * kGiB, 1, 1.0, 0.5), 50 * kGiB);
  EXPECT_EQ(memory_size_cap(100 * kGiB, 2, 1.0, 0.5), 25 * kGiB);
  EXPECT_EQ(memory_size_cap(100 * kGiB, 2, 2.5, 0.5), 10 * kGiB);
  EXPECT_EQ(memory_size_cap(120 * kGiB, 4, 3.0, 0.5), 5 * kGiB);
  EXPECT_EQ(memory_size_cap(1000, 1, 1.0, 0.6) % 2, 0u);  // even: whole BF16 elements
  EXPECT_EQ(memory_size_cap(1000, 1, 1.0, 0.6), 600u);
  EXPECT_EQ(memory_size_cap(1001, 3, 1.0, 1.0), 332u);
}

TEST(MemoryCap, DegenerateInputsGiveZero) {
  EXPECT_EQ(memory_size_cap(0, 4, 2.0), 0u);
  EXPECT_EQ(memory_size_cap(kGiB, 0, 2.0), 0u);
  EXPECT_EQ(memory_size_cap(kGiB, -1, 2.0), 0u);
  EXPECT_EQ(memory_size_cap(kGiB, 4, 0.0), 0u);
  EXPECT_EQ(memory_size_cap(3, 1, 1.0, 0.5), 0u);  // 1.5 bytes: not even one element
}

TEST(MemAvailable, ParsesProcMeminfo) {
  const std::string meminfo =
      "MemTotal:       32768000 kB\nMemFree:         1000000 kB\nMemAvailable:   25165824 kB\nBuffers: 1 kB\n";
  EXPECT_EQ(mem_available_bytes(meminfo), uint64_t{25165824} * 1024);
  EXPECT_EQ(mem_available_bytes("MemAvailable: 24 kB"), 24u * 1024);
  EXPECT_EQ(mem_available_bytes("MemTotal: 5 kB\n"), std::nullopt);
  EXPECT_EQ(mem_available_bytes("MemAvailable: x kB\n"), std::nullopt);
  EXPECT_EQ(mem_available_bytes("MemAvailable: 5 MB\n"), std::nullopt);
  EXPECT_EQ(mem_available_bytes(""), std::nullopt);
}

TEST(LocalProcesses, FromTheLauncher) {
  EXPECT_EQ(local_process_count(env_of({{"OMPI_COMM_WORLD_LOCAL_SIZE", "5"}, {"SLURM_NTASKS_PER_NODE", "8"}}), 9).count,
            5);
  auto slurm = local_process_count(env_of({{"SLURM_NTASKS_PER_NODE", "8"}}), 16);
  EXPECT_EQ(slurm.count, 8);
  EXPECT_EQ(slurm.source, "SLURM_NTASKS_PER_NODE");
  EXPECT_EQ(local_process_count(env_of({{"SLURM_STEP_TASKS_PER_NODE", "4"}}), 4).count, 4);
  EXPECT_EQ(local_process_count(env_of({{"SLURM_TASKS_PER_NODE", "2(x3),5"}}), 11).count, 5);
  auto job = local_process_count(env_of({}), 9);
  EXPECT_EQ(job.count, 9);
  EXPECT_EQ(job.source, "job size");
  EXPECT_EQ(local_process_count(env_of({{"OMPI_COMM_WORLD_LOCAL_SIZE", "x"}}), 3).count, 3);
  EXPECT_EQ(local_process_count(env_of({{"SLURM_TASKS_PER_NODE", "garbage"}}), 7).count, 7);
}

TEST(Sweep, TimesFourUpToTheMaximum) {
  EXPECT_EQ(sweep_sizes(kMiB, 4 * kGiB),
            (std::vector<uint64_t>{kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB, kGiB, 4 * kGiB}));
  EXPECT_EQ(sweep_sizes(kMiB, 16 * kMiB), (std::vector<uint64_t>{kMiB, 4 * kMiB, 16 * kMiB}));
  EXPECT_EQ(sweep_sizes(kMiB, 15 * kMiB), (std::vector<uint64_t>{kMiB, 4 * kMiB}));
  EXPECT_EQ(sweep_sizes(kMiB, kMiB), (std::vector<uint64_t>{kMiB}));
  EXPECT_EQ(sweep_sizes(2, UINT64_MAX).size(), 32u);  // no overflow
  EXPECT_THROW(sweep_sizes(0, kMiB), Error);
  EXPECT_THROW(sweep_sizes(3, kMiB), Error);
  EXPECT_THROW(sweep_sizes(4 * kMiB, kMiB), Error);
}

TEST(Spread, MedianMinMax) {
  auto s = spread_of({3.0, 1.0, 2.0});
  EXPECT_EQ(s.median, 2.0);
  EXPECT_EQ(s.min, 1.0);
  EXPECT_EQ(s.max, 3.0);
  EXPECT_EQ(spread_of({4.0, 1.0, 2.0, 3.0}).median, 2.5);
  EXPECT_EQ(spread_of({7.0}).median, 7.0);
  EXPECT_THROW(spread_of({}), Error);
}

TEST(Bandwidth, NcclTestsColumns) {
  EXPECT_DOUBLE_EQ(algbw_gbyte_s(2'000'000'000, 2.0), 1.0);
  EXPECT_DOUBLE_EQ(busbw_gbyte_s_broadcast(1.5), 1.5);
  EXPECT_EQ(algbw_gbyte_s(100, 0.0), 0.0);
  // 1 GB over 8 Gbit/s takes 1 s: 2 s is 2x the bound.
  EXPECT_DOUBLE_EQ(*over_lower_bound(2.0, 1'000'000'000, 8.0), 2.0);
  EXPECT_EQ(over_lower_bound(2.0, 1'000'000'000, std::nullopt), std::nullopt);
  EXPECT_EQ(over_lower_bound(2.0, 1'000'000'000, 0.0), std::nullopt);
}

// A probe report for 4 ranks (producer + 3 members): every pair at 10 Gbit/s but `cells` ({from, to, Gbit/s}; < 0:
// null).
nlohmann::json probe_with(const std::vector<std::tuple<int, int, double>>& cells) {
  nlohmann::json m = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) {
    nlohmann::json row = nlohmann::json::array();
    for (int j = 0; j < 4; ++j) row.push_back(i == j ? nlohmann::json(nullptr) : nlohmann::json(10.0));
    m.push_back(row);
  }
  for (auto [i, j, v] : cells) m[i][j] = v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v);
  return {{"ranks", 4}, {"bandwidth_gbit", m}};
}

TEST(ProbeBottleneck, SlowestEdgeTheTreesUse) {
  const std::vector<std::string> labels(3, "local");
  // Chain over members 0 -> 1 -> 2: job edges 0->1, 1->2, 2->3. A slow 3->1 edge is not used.
  EXPECT_DOUBLE_EQ(*probe_bottleneck_gbit(probe_with({{3, 1, 1.0}}), tree::TopologyKind::chain, labels), 10.0);
  EXPECT_DOUBLE_EQ(*probe_bottleneck_gbit(probe_with({{2, 3, 2.0}}), tree::TopologyKind::chain, labels), 2.0);
  // Binary: the producer feeds member 0 (rank 1), which feeds members 1 and 2 (ranks 2, 3).
  EXPECT_DOUBLE_EQ(*probe_bottleneck_gbit(probe_with({{1, 3, 3.0}}), tree::TopologyKind::binary, labels), 3.0);
  EXPECT_DOUBLE_EQ(*probe_bottleneck_gbit(probe_with({{2, 3, 1.0}}), tree::TopologyKind::binary, labels), 10.0);
  EXPECT_DOUBLE_EQ(*probe_bottleneck_gbit(probe_with({{0, 1, 0.5}}), tree::TopologyKind::binary, labels), 0.5);
}

TEST(ProbeBottleneck, UnmeasuredEdgesFallBackToTheWholeMatrix) {
  const std::vector<std::string> labels(3, "local");
  auto probe = probe_with({{0, 1, -1}, {1, 2, -1}, {2, 3, -1}, {3, 2, 4.0}});
  EXPECT_DOUBLE_EQ(*probe_bottleneck_gbit(probe, tree::TopologyKind::chain, labels), 4.0);
  nlohmann::json empty = probe_with({});
  for (auto& row : empty["bandwidth_gbit"])
    for (auto& v : row) v = nullptr;
  EXPECT_EQ(probe_bottleneck_gbit(empty, tree::TopologyKind::chain, labels), std::nullopt);
}

TEST(ProbeBottleneck, RejectsAReportOfAnotherJob) {
  const std::vector<std::string> labels(4, "local");
  EXPECT_THROW(probe_bottleneck_gbit(probe_with({}), tree::TopologyKind::binary, labels), Error);
  EXPECT_THROW(probe_bottleneck_gbit(nlohmann::json::object(), tree::TopologyKind::binary, labels), Error);
}

TEST(SizeText, BinaryUnits) {
  EXPECT_EQ(size_text(512), "512 B");
  EXPECT_EQ(size_text(kMiB), "1 MiB");
  EXPECT_EQ(size_text(4 * kGiB), "4 GiB");
  EXPECT_EQ(size_text(1536), "1.5 KiB");
}

TEST(Plot, OneLinePerSeriesAndEscapedText) {
  PlotAxes axes;
  axes.title = "busbw <&>";
  axes.x_label = "size";
  axes.y_label = "GB/s";
  axes.log_x = true;
  axes.x_tick = [](double x) { return size_text(static_cast<uint64_t>(x)); };
  const std::string svg = line_plot_svg(axes, {{"binary", {{1.0 * kMiB, 0.5}, {4.0 * kMiB, 1.0}}},
                                               {"chain", {{1.0 * kMiB, 0.7}, {4.0 * kMiB, 1.2}}},
                                               {"empty", {}}});
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("busbw &lt;&amp;&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<&>"), std::string::npos);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_NE(svg.find("4 MiB"), std::string::npos);
  EXPECT_NE(svg.find(">empty<"), std::string::npos);
  // One point, linear axis: still a finite, well-formed chart.
  PlotAxes linear;
  std::string one = line_plot_svg(linear, {{"x", {{0.01, 2.0}}}});
  for (size_t at = one.find("dominant"); at != std::string::npos; at = one.find("dominant")) one.erase(at, 8);
  EXPECT_EQ(one.find("nan"), std::string::npos);
  EXPECT_EQ(one.find("inf"), std::string::npos);
}

}  // namespace
}  // namespace deltacast::tools
