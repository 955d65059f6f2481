// `deltacast run --config FILE [--rank R --size N]`: one process of a relay-tree job. The rank
// comes from the launcher (mpirun, srun) or the flags (tree/launch_env.h). Rank 0 is the producer:
// it runs the synthetic trainer, sends the full checkpoint (bootstrap) and then one delta per
// step through the tree, and writes a JSON report. Ranks 1..N are receivers holding the weights
// in buffers this process owns. Members that fail are repaired around by the tree; the producer
// exits 0 only when every version was verified and committed by every member live at its end,
// a receiver only when it committed every version it saw (none aborted).
//
// --fault ACTION@VERSION[:N] is a testing aid (the tests and `deltacast demo --kill/--freeze`):
// the receiver kills (SIGKILL) or freezes (SIGSTOP) itself after handling N data messages of
// VERSION.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <spdlog/sinks/basic_file_sink.h>

#include "config/config.h"
#include "sim/trainer_simulator.h"
#include "tools/cli.h"
#include "transport/transport.h"
#include "tree/launch_env.h"
#include "tree/producer.h"
#include "tree/receiver.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

struct RunOptions {
  std::string config_path;
  std::optional<int> rank;
  std::optional<int> size;
  std::optional<std::string> producer;
  std::vector<std::string> sets;
  std::string report_path;
  std::string summary_path;
  std::string fault;  // ACTION@VERSION[:N], receivers only (testing aid)
};

// A parsed --fault: after `after` data messages of `version`, raise `signal` at this process.
struct Fault {
  int signal = 0;  // SIGKILL (kill) or SIGSTOP (stop)
  std::string action;
  uint64_t version = 0;
  uint64_t after = 1;
};

uint64_t parse_positive(const std::string& text, const std::string& spec, const char* what) {
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value == 0)
    throw Error(Errc::invalid_argument,
                "--fault " + spec + ": " + what + " must be a positive integer, got '" + text + "'");
  return value;
}

// "kill@3", "stop@2:5". Throws Error(invalid_argument) naming what is wrong.
Fault parse_fault(const std::string& spec) {
  const size_t at = spec.find('@');
  if (at == std::string::npos)
    throw Error(Errc::invalid_argument, "--fault " + spec + ": expected ACTION@VERSION[:N], e.g. kill@3 or stop@2:5");
  Fault f;
  f.action = spec.substr(0, at);
  if (f.action == "kill") f.signal = SIGKILL;
  else if (f.action == "stop") f.signal = SIGSTOP;
  else throw Error(Errc::invalid_argument, "--fault " + spec + ": unknown action '" + f.action + "' (kill or stop)");
  const std::string rest = spec.substr(at + 1);
  const size_t colon = rest.find(':');
  f.version = parse_positive(rest.substr(0, colon), spec, "VERSION");
  if (colon != std::string::npos) f.after = parse_positive(rest.substr(colon + 1), spec, "N");
  return f;
}

// Installs the fault as the receiver's on_data hook (called on the relay threads, one per tree).
// The hook counts the messages of f.version itself rather than trusting the receiver's count, so
// the fault fires once, at the N-th message of that version, however the receiver counts.
void install_fault(tree::ReceiverOptions& options, const Fault& f, int rank) {
  auto seen = std::make_shared<std::atomic<uint64_t>>(0);
  options.on_data = [f, rank, seen](uint64_t version, uint64_t /*handled*/) {
    if (version != f.version || seen->fetch_add(1) + 1 != f.after) return;
    auto log = logger("run");
    log->warn("rank {}: --fault {}@{}:{}: {} this process now", rank, f.action, f.version, f.after,
              f.signal == SIGKILL ? "killing" : "stopping");
    log->flush();
    std::raise(f.signal);
  };
}

// SHA-256 over every tensor's bytes in manifest order: an end-to-end bit-equality check that is
// independent of the codec's own digests.
std::string weights_sha256(const codec::ConstWeights& weights) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw Error(Errc::internal, "OpenSSL SHA-256 is not available");
  for (const auto& t : weights.tensors) EVP_DigestUpdate(ctx.get(), t.data(), t.size());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    char byte[3];
    std::snprintf(byte, sizeof byte, "%02x", digest[i]);
    hex += byte;
  }
  return hex;
}

void write_json(const std::string& path, const nlohmann::json& value) {
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  if (!out) throw Error(Errc::io, "cannot write " + path);
  out << value.dump(2) << "\n";
}

transport::TransportOptions transport_options(const config::Config& c) {
  transport::TransportOptions options;
  if (!c.secret_file.empty()) options.secret = transport::load_secret(c.secret_file);
  options.connect_timeout = c.timeouts.connect;
  options.heartbeat_interval = c.timeouts.heartbeat;
  options.peer_timeout = c.timeouts.peer;
  return options;
}

// Every subsystem that logs (util/log.h creates loggers on first use; creating them here means
// set_log_level and the log file reach all of them).
constexpr const char* kSubsystems[] = {"tree", "transport", "codec", "run", "cli"};

void set_log_level(const std::string& level) {
  for (const char* subsystem : kSubsystems) logger(subsystem)->set_level(spdlog::level::from_str(level));
}

// output.log_file: this process's logs also go to FILE with the rank inserted before the
// extension (run.log -> run.rank3.log), appended, so one file per rank survives restarts. Returns
// a logger writing only to that file (for the final error, which main() prints to stderr), or
// nullptr when no log file is configured.
std::shared_ptr<spdlog::logger> open_log_file(const config::Config& c, int rank) {
  if (c.output.log_file.empty()) return nullptr;
  const std::string path = config::log_file_for_rank(c.output.log_file, rank);
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink;
  try {
    sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  } catch (const spdlog::spdlog_ex& e) {
    throw Error(Errc::io, "output.log_file: cannot open " + path + ": " + e.what());
  }
  sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
  for (const char* subsystem : kSubsystems) logger(subsystem);
  // Before any transport or tree thread exists: nothing logs while the sink lists change. Every
  // line is flushed: a member killed or crashing must not lose its last lines.
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) {
    l->sinks().push_back(sink);
    l->flush_on(spdlog::level::trace);
  });
  auto file_only = std::make_shared<spdlog::logger>("run", sink);
  file_only->set_level(spdlog::level::trace);
  return file_only;
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Failures during (or before) a version and their repair: the keys every steps[] entry and `full`
// carry.
void add_repair_json(nlohmann::json& out, const tree::RefitReport& r) {
  nlohmann::json failed = nlohmann::json::array();
  for (const auto& m : r.failed_members)
    failed.push_back({{"rank", m.rank},
                      {"cause", m.cause},
                      {"detected_at_s", m.detected_at_s},
                      {"detection_seconds", m.detection_seconds}});
  out["failed_members"] = failed;
  out["epoch"] = r.epoch;
  out["repair_seconds"] = r.repair_seconds;
  out["resent_chunks"] = r.resent_chunks;
}

// Appended to a progress line (after its existing text, which scripts parse) when members failed:
// "  repaired: rank 3 (link_closed), rank 5 (silent) in 0.120 s, 4 chunks re-sent".
std::string repair_suffix(const tree::RefitReport& r) {
  if (r.failed_members.empty()) return "";
  std::string text = r.committed ? "  repaired: " : "  failed: ";
  for (size_t i = 0; i < r.failed_members.size(); ++i) {
    if (i > 0) text += ", ";
    text += "rank " + std::to_string(r.failed_members[i].rank) + " (" + r.failed_members[i].cause + ")";
  }
  char detail[96];
  std::snprintf(detail, sizeof detail, " in %.3f s, %u chunks re-sent", r.repair_seconds, r.resent_chunks);
  return text + detail;
}

nlohmann::json step_json(int step, const tree::RefitReport& r, double full_seconds) {
  double changed = r.elements ? static_cast<double>(r.changes) / static_cast<double>(r.elements) : 0;
  nlohmann::json out = {{"step", step},
                        {"version", r.version},
                        {"committed", r.committed},
                        {"changed_fraction", changed},
                        {"changes", r.changes},
                        {"payload_bytes", r.frames_bytes},
                        {"chunks", r.chunks},
                        {"encode_seconds", r.encode_seconds},
                        {"refit_seconds", r.refit_seconds},
                        {"full_seconds", full_seconds},
                        {"speedup", r.refit_seconds > 0 ? full_seconds / r.refit_seconds : 0.0},
                        {"receivers", r.receivers},
                        {"verified_receivers", r.verified_receivers}};
  add_repair_json(out, r);
  return out;
}

void run_producer(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o) {
  auto log = logger("run");
  const auto members = config::member_list(c);
  sim::SimConfig sim_config;
  sim_config.params = c.trainer.params;
  sim_config.lr = static_cast<float>(c.trainer.lr);
  sim_config.seed = c.trainer.seed;
  sim_config.threads = std::max(1u, std::thread::hardware_concurrency());
  std::printf("producer: building a synthetic model of %llu parameters\n",
              static_cast<unsigned long long>(c.trainer.params));
  std::fflush(stdout);
  sim::TrainerSimulator trainer(sim_config);

  auto transport = transport::make_transport(c.transport, transport_options(c));
  tree::ProducerOptions options;
  options.listen_url = env.require_rendezvous();
  options.receivers = static_cast<uint32_t>(members.size());
  options.topology = tree::parse_topology_kind(c.topology);
  options.encode.chunk_bytes = c.chunk_bytes;
  options.encode.threads = sim_config.threads;
  options.version_timeout = c.timeouts.refit;
  // Every member's HELLO + READY: timeouts.join, but never less than the refit bound this always
  // allowed (launchers may start receivers long after the producer on a busy machine).
  options.join_timeout = std::max(c.timeouts.join, c.timeouts.refit);
  options.peer_timeout = c.timeouts.peer;
  options.retain_versions = c.retain_versions;
  tree::Producer producer(*transport, trainer.manifest(), options);
  producer.start();
  std::printf("producer: %zu receivers joined at %s (%s tree, %s, chunks of %.1f MiB)\n",
              members.size(), producer.url().c_str(), c.topology.c_str(), c.transport.c_str(),
              mib(c.chunk_bytes));
  std::fflush(stdout);

  tree::RefitReport full = producer.bootstrap(trainer.bf16_weights());
  std::printf("full checkpoint (version 1): %.1f MiB raw through the tree in %.3f s, verified by "
              "%u/%u receivers%s\n",
              mib(full.checkpoint_bytes), full.refit_seconds, full.verified_receivers,
              full.receivers, repair_suffix(full).c_str());
  std::fflush(stdout);
  bool ok = full.committed;
  nlohmann::json steps = nlohmann::json::array();
  for (int step = 1; ok && step <= c.trainer.steps; ++step) {
    trainer.step();
    tree::RefitReport r = producer.refit(trainer.bf16_weights());
    steps.push_back(step_json(step, r, full.refit_seconds));
    std::printf("step %d: version %llu  changed %.3f%%  payload %.2f MiB  refit %.3f s  "
                "full %.3f s  speedup %.1fx  verified %u/%u%s%s\n",
                step, static_cast<unsigned long long>(r.version),
                100.0 * static_cast<double>(r.changes) / static_cast<double>(std::max<uint64_t>(1, r.elements)),
                mib(r.frames_bytes), r.refit_seconds, full.refit_seconds,
                r.refit_seconds > 0 ? full.refit_seconds / r.refit_seconds : 0.0,
                r.verified_receivers, r.receivers, r.committed ? "" : "  ABORTED", repair_suffix(r).c_str());
    std::fflush(stdout);
    if (!r.committed) {
      log->error("version {} aborted: {}", r.version, r.abort_reason);
      ok = false;
    }
  }
  producer.finish();

  nlohmann::json full_json = {{"versions", full.version},
                               {"payload_bytes", full.frames_bytes},
                               {"seconds", full.refit_seconds},
                               {"committed", full.committed},
                               {"receivers", full.receivers},
                               {"verified_receivers", full.verified_receivers}};
  add_repair_json(full_json, full);
  // ok: every version committed, each on every member live at its end.
  nlohmann::json report = {
      {"ok", ok},
      {"topology", c.topology},
      {"transport", c.transport},
      {"receivers", members.size()},
      {"params", trainer.manifest().total_elements()},
      {"checkpoint_bytes", trainer.manifest().total_bytes()},
      {"chunk_bytes", c.chunk_bytes},
      {"full", full_json},
      {"steps", steps}};
  report["version"] = producer.version();
  report["sha256"] = weights_sha256(trainer.bf16_weights());
  std::string path = !o.report_path.empty() ? o.report_path : c.output.metrics_file;
  if (!path.empty()) write_json(path, report);
  if (!ok)
    throw Error(Errc::verify_failed, "not every version was verified and committed by every live receiver");
}

void run_receiver(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o) {
  const auto members = config::member_list(c);
  const auto& me = members.at(static_cast<size_t>(env.member_rank()));
  auto transport = transport::make_transport(c.transport, transport_options(c));
  tree::ReceiverOptions options;
  options.rank = static_cast<uint32_t>(env.rank);
  options.producer_url = env.require_rendezvous();
  options.listen_url = me.url;
  options.cluster = me.cluster;
  options.retain_versions = c.retain_versions;
  options.connect_timeout = c.timeouts.connect;
  options.join_timeout = c.timeouts.join;
  options.peer_timeout = c.timeouts.peer;
  options.producer_loss_timeout = c.timeouts.producer_loss;
  options.idle_timeout = c.timeouts.refit * 4;
  if (!o.fault.empty()) install_fault(options, parse_fault(o.fault), env.rank);
  tree::Receiver receiver(*transport, options);
  const codec::Manifest& manifest = receiver.join();
  // The host's buffers: version 0 is all zeros.
  std::vector<std::vector<std::byte>> buffers;
  codec::MutableWeights weights{&manifest, {}};
  for (const auto& t : manifest.tensors()) buffers.emplace_back(t.nbytes());
  for (auto& b : buffers) weights.tensors.emplace_back(b.data(), b.size());
  receiver.attach(weights, 0);
  tree::RunSummary summary = receiver.run();
  logger("run")->info("rank {}: active version {} (digest {:016x}), {} frames received, {} forwarded, "
                      "{} committed, {} aborted",
                      env.rank, summary.version, summary.digest, summary.stats.frames_received,
                      summary.stats.frames_forwarded, summary.stats.versions_committed,
                      summary.stats.versions_aborted);
  if (!o.summary_path.empty())
    write_json(o.summary_path, {{"rank", env.rank},
                                {"version", summary.version},
                                {"sha256", weights_sha256(weights.as_const())},
                                {"frames_received", summary.stats.frames_received},
                                {"frames_forwarded", summary.stats.frames_forwarded},
                                {"versions_committed", summary.stats.versions_committed},
                                {"versions_aborted", summary.stats.versions_aborted}});
  if (summary.stats.versions_aborted > 0 || summary.stats.versions_committed == 0)
    throw Error(Errc::verify_failed, "rank " + std::to_string(env.rank) + ": " +
                                         std::to_string(summary.stats.versions_aborted) +
                                         " versions aborted");
}

void run(const RunOptions& o) {
  config::Config c = config::load_config(o.config_path);
  config::apply_flag_overrides(c, o.sets);
  config::validate(c);
  set_log_level(c.log_level);
  if (c.transport == "loop" || c.transport == "loopback")
    throw Error(Errc::config, "transport '" + c.transport + "' only works inside one process");
  tree::LaunchEnv env = tree::detect_launch_env(tree::process_environment(),
                                                {o.rank, o.size, o.producer}, c.producer);
  const size_t members = config::member_list(c).size();
  if (static_cast<size_t>(env.size) != members + 1)
    throw Error(Errc::config, "the job has " + std::to_string(env.size) + " processes but " +
                                  o.config_path + " lists " + std::to_string(members) +
                                  " receivers (+1 producer)");
  if (!o.fault.empty()) {
    if (env.is_producer())
      throw Error(Errc::invalid_argument, "--fault applies to receivers (rank >= 1), not the producer");
    parse_fault(o.fault);  // a bad spec fails before the job starts
  }
  auto log_file = open_log_file(c, env.rank);
  try {
    if (env.is_producer())
      run_producer(c, env, o);
    else
      run_receiver(c, env, o);
  } catch (const std::exception& e) {
    // main() prints the error to stderr; the log file gets it too.
    if (log_file) {
      log_file->error("rank {}: {}", env.rank, e.what());
      log_file->flush();
    }
    throw;
  }
}

void setup(CLI::App& parent) {
  auto options = std::make_shared<RunOptions>();
  auto* cmd = parent.add_subcommand("run", "Run one process of a relay-tree job (rank 0 = producer)");
  cmd->add_option("--config", options->config_path, "Cluster YAML (see docs/config.md)")->required();
  cmd->add_option("--rank", options->rank, "This process's rank (default: from mpirun/srun)");
  cmd->add_option("--size", options->size, "Processes in the job (default: from mpirun/srun)");
  cmd->add_option("--producer", options->producer, "Rendezvous URL (default: DELTACAST_PRODUCER, then the config)");
  cmd->add_option("--set", options->sets, "Override a config key: key=value (repeatable)");
  cmd->add_option("--report", options->report_path, "Producer: write the JSON report here (default: output.metrics_file)");
  cmd->add_option("--summary", options->summary_path,
                  "Receiver: write {rank, version, sha256 of the weights} as JSON here");
  cmd->add_option("--fault", options->fault,
                  "TESTING AID, receivers only: ACTION@VERSION[:N] with ACTION kill (SIGKILL) or stop "
                  "(SIGSTOP): this process kills or freezes itself once it has handled N (default 1) "
                  "data messages of VERSION (version 1 = the full checkpoint, step s = version s+1)")
      ->group("Testing aids");
  cmd->callback([options] { run(*options); });
}

const CommandRegistrar registrar{"run", &setup};

}  // namespace
}  // namespace deltacast::tools
