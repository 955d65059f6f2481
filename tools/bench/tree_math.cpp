#include "tools/bench/tree_math.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "util/error.h"

namespace deltacast::tools {
namespace {

// A non-negative decimal integer filling `text` exactly.
std::optional<uint64_t> whole_number(std::string_view text) {
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// The largest count of Slurm's tasks-per-node form: "9", "4,3", "2(x3),1".
std::optional<int> largest_task_count(std::string_view text) {
  std::optional<int> best;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(at, end - at);
    item = item.substr(0, item.find('('));
    const auto n = whole_number(item);
    if (!n || *n == 0 || *n > 1'000'000) return std::nullopt;
    best = std::max(best.value_or(0), static_cast<int>(*n));
    at = end + 1;
  }
  return best;
}

}  // namespace

std::optional<uint64_t> mem_available_bytes(std::string_view meminfo) {
  constexpr std::string_view key = "MemAvailable:";
  size_t at = 0;
  while (at < meminfo.size()) {
    size_t end = meminfo.find('\n', at);
    if (end == std::string_view::npos) end = meminfo.size();
    std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (line.substr(0, key.size()) != key) continue;
    line.remove_prefix(key.size());
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    const size_t digits = line.find_first_not_of("0123456789");
    const auto kib = whole_number(line.substr(0, digits));
    std::string_view unit = digits == std::string_view::npos ? "" : line.substr(digits);
    while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
    if (!kib || unit != "kB" || *kib > std::numeric_limits<uint64_t>::max() / 1024) return std::nullopt;
    return *kib * 1024;
  }
  return std::nullopt;
}

uint64_t memory_size_cap(uint64_t mem_available, int local_processes, double factor, double fraction) {
  if (local_processes < 1 || !(factor > 0) || !(fraction > 0)) return 0;
  const double cap = static_cast<double>(mem_available) * fraction / (factor * local_processes);
  if (!(cap >= 2)) return 0;
  const uint64_t bytes = cap >= 1.8e19 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(cap);
  return bytes & ~uint64_t{1};
}

LocalProcesses local_process_count(const EnvLookup& env, int job_size) {
  if (const auto v = env("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    const auto n = whole_number(*v);
    if (n && *n >= 1 && *n <= 1'000'000) return {static_cast<int>(*n), "OMPI_COMM_WORLD_LOCAL_SIZE"};
  }
  for (const char* name : {"SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (const auto v = env(name)) {
      if (const auto n = largest_task_count(*v)) return {*n, name};
    }
  }
  return {std::max(job_size, 1), "job size"};
}

std::vector<uint64_t> sweep_sizes(uint64_t min_bytes, uint64_t max_bytes) {
  if (min_bytes == 0 || min_bytes % 2 != 0)
    throw Error(Errc::invalid_argument, "--min-size must be a positive, even byte count (BF16 elements)");
  if (max_bytes < min_bytes) throw Error(Errc::invalid_argument, "--max-size must be at least --min-size");
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_bytes;; s *= 4) {
    sizes.push_back(s);
    if (s > max_bytes / 4) break;
  }
  return sizes;
}

Spread spread_of(std::vector<double> values) {
  if (values.empty()) throw Error(Errc::invalid_argument, "spread_of: no values");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const double median = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  return {median, values.front(), values.back()};
}

double algbw_gbyte_s(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

std::optional<double> over_lower_bound(double seconds, uint64_t bytes, std::optional<double> bottleneck_gbit) {
  if (!bottleneck_gbit || !(*bottleneck_gbit > 0) || bytes == 0) return std::nullopt;
  const double bound = static_cast<double>(bytes) * 8 / (*bottleneck_gbit * 1e9);
  return seconds / bound;
}

std::optional<double> probe_bottleneck_gbit(const nlohmann::json& probe, tree::TopologyKind kind,
                                            const std::vector<std::string>& cluster_labels) {
  if (!probe.is_object() || !probe.contains("bandwidth_gbit") || !probe["bandwidth_gbit"].is_array())
    throw Error(Errc::invalid_argument,
                "the probe report has no bandwidth_gbit matrix (is it `deltacast probe` JSON?)");
  const auto& m = probe["bandwidth_gbit"];
  const size_t ranks = cluster_labels.size() + 1;
  if (m.size() != ranks)
    throw Error(Errc::invalid_argument, "the probe report covers " + std::to_string(m.size()) +
                                            " ranks, this job has " + std::to_string(ranks));
  auto cell = [&](size_t from, size_t to) -> std::optional<double> {
    if (!m[from].is_array() || m[from].size() != ranks) return std::nullopt;
    const auto& v = m[from][to];
    if (!v.is_number() || !(v.get<double>() > 0)) return std::nullopt;
    return v.get<double>();
  };
  std::optional<double> edges_min;
  auto consider = [&](size_t from, size_t to) {
    if (const auto v = cell(from, to)) edges_min = std::min(edges_min.value_or(*v), *v);
  };
  const tree::Topology topology(kind, cluster_labels);
  for (int t = 0; t < topology.trees(); ++t) {
    consider(0, static_cast<size_t>(topology.root(t)) + 1);
    for (int r = 0; r < topology.size(); ++r)
      for (int child : topology.children(r, t)) consider(static_cast<size_t>(r) + 1, static_cast<size_t>(child) + 1);
  }
  if (edges_min) return edges_min;
  std::optional<double> all_min;
  for (size_t i = 0; i < ranks; ++i)
    for (size_t j = 0; j < ranks; ++j)
      if (const auto v = i != j ? cell(i, j) : std::nullopt) all_min = std::min(all_min.value_or(*v), *v);
  return all_min;
}

std::string size_text(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (unit == 0 || value == std::floor(value))
    std::snprintf(text, sizeof text, "%.0f %s", value, kUnits[unit]);
  else
    std::snprintf(text, sizeof text, "%.3g %s", value, kUnits[unit]);
  return text;
}

}  // namespace deltacast::tools
