// `deltacast probe --config FILE [--rank R --size N] --out probe.json`: what the links between a
// job's processes carry, before the first refit (docs/probe.md). Launched exactly like `deltacast
// run` (mpirun, srun or --rank/--size), with the same config: rank 0 listens on the producer URL,
// member r on its member URL, over the config's transport and secret. Rank 0 measures, one figure
// at a time, the bandwidth and latency between ranks and concurrent flows (tools/probe/measure.h),
// finds clusters and recommends a topology and chunk size with predicted refit times
// (tools/probe/analysis.h, tools/probe/cost_model.h), and writes JSON, an SVG heatmap and a
// table on stdout. Rank 0 exits 0 once the file is written, also when members were unreachable;
// a member exits 0 when rank 0 says done, non-zero when rank 0 disappears.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "tools/cli.h"
#include "tools/probe/analysis.h"
#include "tools/probe/cost_model.h"
#include "tools/probe/job.h"
#include "tools/probe/measure.h"
#include "tools/probe/svg.h"
#include "tree/launch_env.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools::probe_command {  // its own namespace: unity builds batch the commands together
namespace {

struct ProbeOptions {
  std::string config_path;
  std::optional<int> rank;
  std::optional<int> size;
  std::optional<std::string> producer;
  std::vector<std::string> sets;
  std::string out_path = "probe.json";
  std::string svg_path;  // default: out_path with .svg
  std::string flow_time = "300ms";
  std::string join_timeout = "30s";
  std::string predict_params = "1G";
  std::vector<double> change_rates{0.01, 0.03, 0.05};
  double bytes_per_change = 0;  // 0: the measured one at each rate (the installed cost model fit)
  int diff_threads = 8;
  int producer_ranks = 0;  // 0: the config's `producers`
  int apply_threads = 8;
  uint64_t seed = 1;
};

void write_text(const std::string& path, const std::string& text) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  if (!out || !(out << text)) throw Error(Errc::io, "cannot write " + path);
}

nlohmann::json matrix_json(const RankMatrix& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : m) {
    nlohmann::json cells = nlohmann::json::array();
    for (const auto& v : row) cells.push_back(v ? nlohmann::json(*v) : nlohmann::json(nullptr));
    rows.push_back(cells);
  }
  return rows;
}

std::string figure(const std::optional<double>& v) {
  char text[32];
  if (!v) return "-";
  std::snprintf(text, sizeof text, "%.3g", *v);
  return text;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? " " : "") + std::to_string(ranks[i]);
  return text + "]";
}

void print_table(const Measurements& m, const ClusterResult& clusters, const std::optional<Recommendation>& rec,
                 const nlohmann::json& predicted, const std::string& transport) {
  std::vector<int> cluster_of(static_cast<size_t>(m.ranks), -1);
  for (size_t c = 0; c < clusters.clusters.size(); ++c)
    for (int r : clusters.clusters[c]) cluster_of[static_cast<size_t>(r)] = static_cast<int>(c);
  std::printf("probe: %d ranks over %s in %.1f s (Gbit/s = 10^9 bit/s)\n", m.ranks, transport.c_str(), m.seconds);
  std::printf("%5s %12s %14s %16s %12s %8s\n", "rank", "to-producer", "from-producer", "median-to-peers", "rtt-prod-us",
              "cluster");
  for (int r = 0; r < m.ranks; ++r) {
    std::vector<double> peers;
    for (int j = 1; j < m.ranks; ++j)
      if (j != r && m.bandwidth_gbit[r][j]) peers.push_back(*m.bandwidth_gbit[r][j]);
    const bool missing = std::find(m.unreachable.begin(), m.unreachable.end(), r) != m.unreachable.end();
    std::printf("%5d %12s %14s %16s %12s %8s\n", r, r ? figure(m.bandwidth_gbit[r][0]).c_str() : "-",
                r ? figure(m.bandwidth_gbit[0][r]).c_str() : "-", figure(median(peers)).c_str(),
                r ? figure(m.latency_us[0][r]).c_str() : "-",
                missing                                  ? "unreachable"
                : cluster_of[static_cast<size_t>(r)] < 0 ? "-"
                                                         : std::to_string(cluster_of[static_cast<size_t>(r)]).c_str());
  }
  std::printf("clusters (%s gap %.1fx%s):", clusters.basis.empty() ? "largest" : clusters.basis.c_str(),
              clusters.gap_ratio, clusters.threshold ? "" : ", below 3x in bandwidth and round trip: one cluster");
  for (const auto& c : clusters.clusters) std::printf(" %s", ranks_text(c).c_str());
  std::printf("\n");
  for (const auto& s : m.shared_links) {
    const bool up = s["direction"] == "uplink";
    std::printf("%s %s %s: 1 flow %.3g, 4 flows %.3g Gbit/s: %s\n", up ? "uplink of" : "downlink of",
                up ? std::to_string(s["from"].get<int>()).c_str() : std::to_string(s["to"].get<int>()).c_str(),
                up ? ("to " + s["to"].dump()).c_str() : ("from " + s["from"].dump()).c_str(),
                s["single_gbit"].get<double>(), s["parallel_total_gbit"].get<double>(),
                s["shared"].get<bool>() ? "shared" : "not shared");
  }
  if (rec) {
    std::printf("recommended: topology %s, chunk_bytes %llu (bottleneck %.3g Gbit/s, depth %d)\n",
                std::string(tree::topology_kind_name(rec->chosen.kind)).c_str(),
                static_cast<unsigned long long>(rec->chosen.chunk_bytes),
                rec->chosen.bottleneck_bytes_per_second * 8 / 1e9, rec->chosen.depth);
    for (const auto& t : rec->crossings) {
      std::printf("  tree %d crosses clusters on:", t.tree);
      if (t.edges.empty()) std::printf(" nothing");
      for (const auto& [from, to] : t.edges) std::printf(" %d->%d", from, to);
      std::printf("\n");
    }
  } else {
    std::printf("recommended: nothing (no member was measured)\n");
  }
  for (const auto& p : predicted) {
    const auto& t = p["terms"];
    std::printf(
        "predicted refit, %.3g params at %.3g%% changed, %d producer rank%s: %.3f s = max(diff %.3f, transfer %.3f, "
        "apply %.3f) + fill "
        "%.3f + commit %.4f (%.2f round trips, %s commit; %.3f s if nothing overlapped)\n",
        p["params"].get<double>(), 100 * p["change_rate"].get<double>(), p["producer_ranks"].get<int>(),
        p["producer_ranks"].get<int>() == 1 ? "" : "s", p["seconds"].get<double>(), t["diff"].get<double>(),
        t["transfer"].get<double>(), t["apply"].get<double>(), t["fill"].get<double>(), t["commit"].get<double>(),
        t["commit_round_trips"].get<double>(), p["commit"].get<std::string>().c_str(),
        t["serial_seconds"].get<double>());
  }
  for (const auto& f : m.failed) std::printf("failed: %d -> %d: %s\n", f.from, f.to, f.error.c_str());
}

// Whether `deltacast run` with this config would delegate the commit, with the clusters found.
bool run_commits_delegated(const config::Config& c, const std::vector<std::vector<int>>& found) {
  try {
    return config::commit_is_delegated(c, found);
  } catch (const Error& e) {
    logger("probe")->warn("predictions assume the producer's commit: {}", e.what());
    return false;
  }
}

void report(const Measurements& m, const ProbeOptions& o, const config::Config& c) {
  const ClusterResult clusters = find_clusters(m.bandwidth_gbit, m.latency_us, m.present);
  PredictOptions predict_options;
  predict_options.params = static_cast<double>(config::parse_size(o.predict_params));
  predict_options.change_rates = o.change_rates;
  predict_options.bytes_per_change = o.bytes_per_change;
  predict_options.diff_threads = o.diff_threads;
  predict_options.producer_ranks = o.producer_ranks > 0 ? o.producer_ranks : static_cast<int>(c.producers);
  predict_options.model = CostModel::installed();
  predict_options.apply_threads = o.apply_threads;
  predict_options.delegated_commit = run_commits_delegated(c, clusters.clusters);
  const ProbeFigures figures{m.ranks, m.bandwidth_gbit, m.latency_us, m.present, clusters.clusters};
  const auto rec = recommend(figures, predict_options);
  const nlohmann::json predicted = rec ? predictions_json(*rec, predict_options) : nlohmann::json::array();

  nlohmann::json failed = nlohmann::json::array();
  for (const auto& f : m.failed) failed.push_back({{"from", f.from}, {"to", f.to}, {"error", f.error}});
  const nlohmann::json out{{"ranks", m.ranks},
                           {"transport", c.transport},
                           {"flow_seconds", std::chrono::duration<double>(config::parse_duration(o.flow_time)).count()},
                           {"probe_seconds", m.seconds},
                           {"sampled", m.ranks - 1 > kAllPairsMaxMembers},
                           {"bandwidth_gbit", matrix_json(m.bandwidth_gbit)},
                           {"latency_us", matrix_json(m.latency_us)},
                           {"shared_links", m.shared_links},
                           {"clusters", clusters.clusters},
                           {"cluster_gap_ratio", clusters.gap_ratio},
                           {"cluster_basis", clusters.basis},
                           {"recommended", rec ? recommendation_json(*rec) : nlohmann::json(nullptr)},
                           {"predicted", predicted},
                           {"cost_model", predict_options.model.to_json()},
                           {"unreachable", m.unreachable},
                           {"lost", m.lost},
                           {"failed", failed}};
  write_text(o.out_path, out.dump(2) + "\n");
  const std::string svg_path =
      !o.svg_path.empty() ? o.svg_path : std::filesystem::path(o.out_path).replace_extension(".svg").string();
  write_text(svg_path, bandwidth_heatmap_svg(
                           m.bandwidth_gbit, clusters.clusters,
                           "deltacast probe: bandwidth, " + std::to_string(m.ranks) + " ranks over " + c.transport));
  print_table(m, clusters, rec, predicted, c.transport);
  std::printf("wrote %s and %s\n", o.out_path.c_str(), svg_path.c_str());
  if (!m.unreachable.empty())
    std::printf("warning: unreachable (never joined within --join-timeout): ranks %s\n",
                ranks_text(m.unreachable).c_str());
  if (!m.lost.empty()) std::printf("warning: lost during the probe: ranks %s\n", ranks_text(m.lost).c_str());
  std::fflush(stdout);
}

void probe(const ProbeOptions& o) {
  config::Config c = config::load_config(o.config_path);
  config::apply_flag_overrides(c, o.sets);
  config::validate(c);
  for (const char* subsystem : {"probe", "tree", "transport", "cli"})
    logger(subsystem)->set_level(spdlog::level::from_str(c.log_level));
  if (c.transport == "loop" || c.transport == "loopback")
    throw Error(Errc::config, "transport '" + c.transport + "' only works inside one process");
  ProbeSettings settings;
  settings.flow_time = config::parse_duration(o.flow_time);
  settings.join_timeout = config::parse_duration(o.join_timeout);
  settings.seed = o.seed;
  if (settings.flow_time.count() <= 0) throw Error(Errc::invalid_argument, "--flow-time must be positive");
  if (o.diff_threads < 1) throw Error(Errc::invalid_argument, "--diff-threads must be at least 1");
  if (o.producer_ranks < 0) throw Error(Errc::invalid_argument, "--producers must be at least 1");
  if (o.apply_threads < 1) throw Error(Errc::invalid_argument, "--apply-threads must be at least 1");
  if (o.bytes_per_change < 0) throw Error(Errc::invalid_argument, "--bytes-per-change must not be negative");
  for (double rate : o.change_rates)
    if (!(rate > 0 && rate <= 1)) throw Error(Errc::invalid_argument, "--change-rates: each rate must be in (0, 1]");
  config::parse_size(o.predict_params);  // a bad value fails before the job starts

  const tree::LaunchEnv env = tree::detect_job_env(process_env(), {o.rank, o.size, o.producer}, c, o.config_path);
  JobProbe probe = run_job_probe(c, env, settings);
  if (env.is_part_rank())
    std::printf(
        "producer rank %d: a group's part rank takes no part in the probe (rank 0 measures the producer "
        "side)\n",
        env.rank);
  else if (env.is_producer())
    report(*probe.measurements, o, c);
}

void setup(CLI::App& parent) {
  auto o = std::make_shared<ProbeOptions>();
  auto* cmd = parent.add_subcommand(
      "probe", "Measure bandwidth, latency and shared links between a job's processes (launched like `run`)");
  cmd->add_option("--config", o->config_path, "Cluster YAML (see docs/config.md)")->required();
  cmd->add_option("--rank", o->rank, "This process's rank (default: from mpirun/srun)");
  cmd->add_option("--size", o->size, "Processes in the job (default: from mpirun/srun)");
  cmd->add_option("--producer", o->producer, "Rendezvous URL (default: DELTACAST_PRODUCER, then the config)");
  cmd->add_option("--set", o->sets, "Override a config key: key=value (repeatable)");
  cmd->add_option("--out", o->out_path, "Rank 0: the JSON report")->capture_default_str();
  cmd->add_option("--svg", o->svg_path, "Rank 0: the bandwidth heatmap (default: --out with .svg)");
  cmd->add_option("--flow-time", o->flow_time, "Duration of one bandwidth flow")->capture_default_str();
  cmd->add_option("--join-timeout", o->join_timeout, "How long rank 0 waits for members (and members for rank 0)")
      ->capture_default_str();
  cmd->add_option("--predict-params", o->predict_params, "Model size (BF16 elements) for the predictions")
      ->capture_default_str();
  cmd->add_option("--change-rates", o->change_rates, "Changed fractions to predict refits for")
      ->capture_default_str()
      ->delimiter(',');
  cmd->add_option("--bytes-per-change", o->bytes_per_change,
                  "Encoded bytes per changed element (0: the measured one at each rate)")
      ->capture_default_str();
  cmd->add_option("--diff-threads", o->diff_threads, "Encode threads of each producer rank in the prediction")
      ->capture_default_str();
  cmd->add_option("--producers", o->producer_ranks,
                  "Producer ranks in the prediction, each with an uplink like the measured producer's (default: the "
                  "config's producers)");
  cmd->add_option("--apply-threads", o->apply_threads, "Threads applying one receiver's changes in the prediction")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the pair sample (jobs of more than 64 members)")->capture_default_str();
  cmd->callback([o] { probe(*o); });
}

// NOLINTNEXTLINE(cert-err58-cpp): registration at start-up, as in every cmd_*.cpp
const CommandRegistrar registrar{"probe", &setup};

}  // namespace
}  // namespace deltacast::tools::probe_command
