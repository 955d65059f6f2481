// `deltacast run --config FILE [--rank R --size N]`: one process of a relay-tree job. The rank
// comes from the launcher (mpirun, srun) or the flags (tree/launch_env.h). Rank 0 is the producer:
// it takes versions from the synthetic trainer or from a real trainer's checkpoint directory
// (trainer.kind synth | watch, tools/run/version_source.h), sends the first as the full checkpoint
// (bootstrap) and then one delta per version through the tree, and writes a JSON report. Ranks 1..N are receivers
// holding the weights in buffers this process owns. Members that fail are repaired around by the tree; the producer
// exits 0 only when every version was verified and committed by every member live at its end,
// a receiver only when it committed every version it saw (none aborted).
//
// After every committed version (the bootstrap included) the producer writes its state file,
// <output.dir>/producer-state.json (docs/config.md). `--resume` (rank 0) restarts a producer from
// it: the trainer is re-simulated to the state's step (watch: the state's checkpoint is opened),
// its bits are checked against the state's digest, and the version chain goes on where it stopped, with the members
// that kept the committed version (docs/protocol.md, "Producer loss").
//
// --fault ACTION@VERSION[:N] is a testing aid (the tests and `deltacast demo --kill/--freeze`):
// a receiver kills (SIGKILL) or freezes (SIGSTOP) itself after handling N data messages of
// VERSION; the producer does so after sending N data messages of VERSION, or, with
// ACTION@VERSION:commit, once VERSION is decided and its state written, right before its COMMIT.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <openssl/evp.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <nlohmann/json.hpp>

#include "codec/digest.h"
#include "config/config.h"
#include "tools/cli.h"
#include "tools/probe/job.h"
#include "tools/run/checkpoint_output.h"
#include "tools/run/producer_state.h"
#include "tools/run/version_source.h"
#include "transport/transport.h"
#include "tree/config_options.h"
#include "tree/launch_env.h"
#include "tree/producer.h"
#include "tree/receiver.h"
#include "tree/report_json.h"
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
  std::string fault;                      // ACTION@VERSION[:N] (testing aid)
  bool resume = false;                    // producer: continue from <output.dir>/producer-state.json
  double slow_disk_bytes_per_second = 0;  // receiver, testing aid: output.checkpoint_dir writes this slow
};

// A parsed --fault: after `after` data messages of `version`, raise `signal` at this process.
struct Fault {
  int signal = 0;  // SIGKILL (kill) or SIGSTOP (stop)
  std::string action;
  uint64_t version = 0;
  uint64_t after = 1;
  bool at_commit = false;  // producer, ACTION@VERSION:commit: once VERSION is decided and its state
                           // written, before its COMMIT goes out
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
  if (f.action == "kill")
    f.signal = SIGKILL;
  else if (f.action == "stop")
    f.signal = SIGSTOP;
  else
    throw Error(Errc::invalid_argument, "--fault " + spec + ": unknown action '" + f.action + "' (kill or stop)");
  const std::string rest = spec.substr(at + 1);
  const size_t colon = rest.find(':');
  f.version = parse_positive(rest.substr(0, colon), spec, "VERSION");
  if (colon != std::string::npos && rest.substr(colon + 1) == "commit")
    f.at_commit = true;
  else if (colon != std::string::npos)
    f.after = parse_positive(rest.substr(colon + 1), spec, "N");
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

// The producer's fault (the same spec): it fires after the N-th data message of f.version the
// producer sent (the messages posted to the roots, re-sends not counted). `sending` is the version
// the host thread is sending.
std::function<void(uint32_t, uint32_t)> producer_fault_hook(const Fault& f,
                                                            std::shared_ptr<std::atomic<uint64_t>> sending) {
  auto seen = std::make_shared<std::atomic<uint64_t>>(0);
  return [f, sending, seen](uint32_t, uint32_t) {
    if (sending->load() != f.version || seen->fetch_add(1) + 1 != f.after) return;
    std::printf("producer: --fault %s@%llu:%llu: %s this process now\n", f.action.c_str(),
                static_cast<unsigned long long>(f.version), static_cast<unsigned long long>(f.after),
                f.signal == SIGKILL ? "killing" : "stopping");
    std::fflush(stdout);
    logger("run")->flush();
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

// The process's anonymous resident memory (RssAnon): what it allocated, not file pages it maps.
uint64_t rss_anon_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  return 0;
}

// "3 receivers hold it" / "2 receivers hold it, rank 3 catches up from version 0, rank 4 refused".
std::string start_summary(const tree::StartReport& r) {
  using Role = tree::MemberAtStart::Role;
  const uint32_t live = r.count(Role::live);
  std::string text = std::to_string(live) + (live == 1 ? " receiver holds it" : " receivers hold it");
  for (const auto& m : r.members) {
    if (m.role == Role::catching_up)
      text += ", rank " + std::to_string(m.rank) + " catches up from version " + std::to_string(m.held_version);
    else if (m.role == Role::refused)
      text += ", rank " + std::to_string(m.rank) + " refused (" + m.detail + ")";
  }
  return text;
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
  nlohmann::json out = tree::refit_report_json(r);
  out["step"] = step;
  out["full_seconds"] = full_seconds;
  out["speedup"] = r.refit_seconds > 0 ? full_seconds / r.refit_seconds : 0.0;
  return out;
}

void run_producer(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o) {
  auto log = logger("run");
  const auto members = config::member_list(c);
  const std::string state_file = state_path(c);
  std::optional<ProducerState> resumed;
  if (o.resume) {
    resumed = read_state(state_file);
    check_state_against_config(*resumed, c, state_file);
  }
  // SIGTERM ends a producer that follows a trainer (trainer.steps 0) cleanly: BYE, report, exit 0.
  static std::atomic<bool> stop_requested{false};
  if (c.trainer.kind == "watch") std::signal(SIGTERM, [](int) { stop_requested = true; });
  const auto source = make_version_source(c, resumed, stop_requested);
  if (!source) {
    std::printf("producer: stopped before a checkpoint appeared in %s\n", c.trainer.dir.c_str());
    return;
  }
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());

  auto transport = transport::make_transport(c.transport, tree::producer_transport_options(c));
  tree::ProducerOptions options = tree::producer_options_from(c);
  options.listen_url = env.require_rendezvous();
  options.receivers = static_cast<uint32_t>(members.size());
  options.encode.threads = threads;
  options.layout = source->layout();
  auto sending = std::make_shared<std::atomic<uint64_t>>(0);  // the version being sent (--fault)
  const std::optional<Fault> fault = o.fault.empty() ? std::nullopt : std::optional(parse_fault(o.fault));
  if (fault && !fault->at_commit) options.on_progress = producer_fault_hook(*fault, sending);
  if (resumed)
    options.resume = tree::ProducerResume{resumed->version, source->weights(), resumed->attempt, resumed->history};
  // The state file is written when a version is decided, before its COMMIT goes out (set below,
  // once the producer and the state exist): a producer lost at any moment after that resumes at
  // that version, and members that did not get the COMMIT catch up to it.
  std::function<void(uint64_t, uint64_t)> on_decided;
  options.before_commit = [&on_decided](uint64_t version, uint64_t digest) {
    if (on_decided) on_decided(version, digest);
  };
  tree::Producer producer(*transport, source->manifest(), options);
  const tree::StartReport started = producer.start();
  std::printf("producer: %zu receivers joined at %s (%s tree, %s, chunks of %.1f MiB)\n", members.size(),
              producer.url().c_str(), c.topology.c_str(), c.transport.c_str(), mib(c.chunk_bytes));
  std::fflush(stdout);

  ProducerState state;
  state.topology = std::string(tree::topology_kind_name(options.topology));
  // Every version, once decided and before its COMMIT (so before its progress line: a line printed
  // means its state is on disk). A state that cannot be written is no reason to stop refitting:
  // the file keeps an older version, and a producer resumed from it refuses members that hold
  // newer ones.
  uint64_t sending_step = 0;  // the trainer step of the version being sent
  auto save_state = [&](uint64_t trainer_step, uint64_t version, uint64_t digest) {
    state.version = version;
    state.digest = digest;
    state.trainer_step = trainer_step;
    state.attempt = producer.attempt();
    state.history = producer.history();
    state.history[version] = digest;  // a delegated commit is recorded before history() holds it
    state.history.erase(0);           // version 0 needs no record (the all-zero state)
    source->save(state);
    try {
      write_state(state_file, state);
    } catch (const Error& e) {
      log->error("producer state not updated to version {}: {}", state.version, e.what());
    }
  };

  const std::optional<Fault> commit_fault = fault && fault->at_commit ? fault : std::nullopt;
  on_decided = [&](uint64_t version, uint64_t digest) {
    save_state(sending_step, version, digest);
    if (commit_fault && commit_fault->version == version) {
      std::printf("producer: --fault %s@%llu:commit: %s this process after writing the state, before COMMIT\n",
                  commit_fault->action.c_str(), static_cast<unsigned long long>(version),
                  commit_fault->signal == SIGKILL ? "killing" : "stopping");
      std::fflush(stdout);
      std::raise(commit_fault->signal);
    }
  };

  tree::RefitReport full;
  if (resumed) {
    // No bootstrap: the members kept the committed version. The bootstrap time of the run that
    // created the chain stays the reference of the speedup column.
    full.version = 1;
    full.committed = true;
    full.refit_seconds = resumed->full_seconds;
    state.full_seconds = resumed->full_seconds;
    std::printf("producer: resumed at version %llu (step %llu) from %s; %s\n",
                static_cast<unsigned long long>(resumed->version),
                static_cast<unsigned long long>(resumed->trainer_step), state_file.c_str(),
                start_summary(started).c_str());
  } else {
    sending->store(1);
    std::printf("producer: version 1 is %s\n", source->describe_bootstrap().c_str());
    full = producer.bootstrap(source->weights());
    state.full_seconds = full.refit_seconds;

    std::printf(
        "full checkpoint (version 1): %.1f MiB raw through the tree in %.3f s, verified by "
        "%u/%u receivers%s\n",
        mib(full.checkpoint_bytes), full.refit_seconds, full.verified_receivers, full.receivers,
        repair_suffix(full).c_str());
  }
  std::fflush(stdout);
  bool ok = full.committed;
  nlohmann::json steps = nlohmann::json::array();
  const int first_step = resumed ? static_cast<int>(resumed->trainer_step) + 1 : 1;
  // Anonymous memory once version 1 is committed (the baseline copy included): what reading
  // later checkpoints may not grow (docs/config.md, trainer.kind watch).
  const uint64_t rss_anon_after_bootstrap = rss_anon_bytes();
  uint64_t max_rss_anon = rss_anon_after_bootstrap;
  for (int step = first_step; ok && (c.trainer.steps == 0 || step <= c.trainer.steps); ++step) {
    if (!source->next()) break;  // watch: SIGTERM while waiting for the next checkpoint
    sending->store(producer.version() + 1);
    sending_step = static_cast<uint64_t>(step);
    // A checkpoint whose __metadata__, index metadata, side files or shard split changed goes with
    // its layout (the producer sends it only when it differs from the committed version's).
    tree::RefitOptions refit_options;
    refit_options.layout = source->layout();
    const codec::WeightsReader* reader = source->reader();
    tree::RefitReport r =
        reader ? producer.refit(*reader, refit_options) : producer.refit(source->weights(), refit_options);
    const auto committed_at = std::chrono::steady_clock::now();

    max_rss_anon = std::max(max_rss_anon, rss_anon_bytes());
    nlohmann::json entry = step_json(step, r, full.refit_seconds);
    // How this checkpoint was read: said by the branch that chose the refit, not by the config.
    if (c.trainer.kind == "watch") entry["read"] = reader ? "pread" : "map";
    source->describe(entry, committed_at);
    steps.push_back(entry);
    if (entry.contains("checkpoint"))
      log->info("version {} is checkpoint {} (its name appeared {:.3f} s before the commit)", r.version,
                entry["checkpoint"].get<std::string>(), entry["appeared_to_commit_seconds"].get<double>());
    std::printf(
        "step %d: version %llu  changed %.3f%%  payload %.2f MiB  refit %.3f s  "
        "full %.3f s  speedup %.1fx  verified %u/%u%s%s\n",
        step, static_cast<unsigned long long>(r.version),
        100.0 * static_cast<double>(r.changes) / static_cast<double>(std::max<uint64_t>(1, r.elements)),
        mib(r.frames_bytes), r.refit_seconds, full.refit_seconds,
        r.refit_seconds > 0 ? full.refit_seconds / r.refit_seconds : 0.0, r.verified_receivers, r.receivers,
        r.committed ? "" : "  ABORTED", repair_suffix(r).c_str());
    std::fflush(stdout);
    if (!r.committed) {
      log->error("version {} aborted: {}", r.version, r.abort_reason);
      ok = false;
    }
  }
  producer.finish();

  nlohmann::json full_json = {{"versions", full.version},      {"payload_bytes", full.frames_bytes},
                              {"seconds", full.refit_seconds}, {"committed", full.committed},
                              {"receivers", full.receivers},   {"verified_receivers", full.verified_receivers}};
  tree::add_repair_json(full_json, full);
  // ok: every version committed, each on every member live at its end.
  nlohmann::json report = {{"ok", ok},
                           {"topology", c.topology},
                           {"transport", c.transport},
                           {"receivers", members.size()},
                           {"params", source->manifest().total_elements()},
                           {"checkpoint_bytes", source->manifest().total_bytes()},
                           {"trainer_kind", c.trainer.kind},
                           {"rss_anon_after_bootstrap_bytes", rss_anon_after_bootstrap},
                           {"max_rss_anon_bytes", max_rss_anon},
                           {"chunk_bytes", c.chunk_bytes},
                           {"full", full_json},
                           {"steps", steps}};
  if (resumed) {
    // This process sent no bootstrap: `full` is the original run's time, steps[] only the steps
    // this process ran.
    full_json["from_state"] = true;
    report["full"] = full_json;
    using Role = tree::MemberAtStart::Role;
    report["resumed"] = {{"state_file", state_file},
                         {"version", resumed->version},
                         {"trainer_step", resumed->trainer_step},
                         {"live", started.count(Role::live)},
                         {"catching_up", started.count(Role::catching_up)},
                         {"refused", started.count(Role::refused)}};
  }
  report["version"] = producer.version();
  report["sha256"] = weights_sha256(source->weights());
  std::string path = !o.report_path.empty() ? o.report_path : c.output.metrics_file;
  if (!path.empty()) write_json(path, report);
  if (!ok) throw Error(Errc::verify_failed, "not every version was verified and committed by every live receiver");
}

// A receiver's buffers and what they hold at start: version 0 (all zeros), or the version that
// <output.checkpoint_dir>/latest holds (a restarted receiver rejoins from it by replaying deltas).
struct Held {
  uint64_t version = 0;
  uint64_t digest = 0;
  std::optional<codec::Manifest> manifest;  // the order the buffers were recorded in
  std::vector<std::vector<std::byte>> buffers;
};

Held held_at_start(const std::string& checkpoint_dir, int rank) {
  if (checkpoint_dir.empty()) return {};
  try {
    auto latest = load_latest(checkpoint_dir, std::max(1u, std::thread::hardware_concurrency()));
    if (!latest) return {};
    logger("run")->info("rank {}: {} holds version {} (digest {:016x}, verified); rejoining with it", rank,
                        latest->path.string(), latest->version, latest->digest);
    return Held{latest->version, latest->digest, std::move(latest->manifest), std::move(latest->buffers)};
  } catch (const Error& e) {
    logger("run")->warn("rank {}: cannot rejoin from {}/latest ({}); starting from version 0", rank, checkpoint_dir,
                        e.what());
    return {};
  }
}

// Buffers for `manifest`: the held bits when they are that model (matched by name), else zeros.
std::vector<std::vector<std::byte>> buffers_for(const codec::Manifest& manifest, Held& held) {
  std::vector<std::vector<std::byte>> out;
  for (size_t i = 0; i < manifest.size(); ++i) {
    const auto& t = manifest.tensors()[i];
    const auto j = held.manifest ? held.manifest->find(t.name) : std::nullopt;
    if (j && held.manifest->at(*j).dtype == t.dtype && held.manifest->at(*j).shape == t.shape)
      out.push_back(std::move(held.buffers[*j]));
    else
      out.emplace_back(t.nbytes());
  }
  return out;
}

void run_receiver(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o) {
  auto log = logger("run");
  const auto members = config::member_list(c);
  const auto& me = members.at(static_cast<size_t>(env.member_rank()));
  auto transport = transport::make_transport(c.transport, tree::member_transport_options(c, env.member_rank()));
  const std::string checkpoint_dir = config::checkpoint_dir_for_rank(c.output.checkpoint_dir, env.rank);
  tree::ReceiverOptions options = tree::receiver_options_from(c);
  options.rank = static_cast<uint32_t>(env.rank);
  options.producer_url = env.require_rendezvous();
  options.listen_url = me.url;
  options.cluster = me.cluster;
  // Writing checkpoints: refits queue behind the apply gate, the writer thread applies them
  // between writes (tools/run/checkpoint_output.h), so the tree never waits for the disk.
  options.gated = !checkpoint_dir.empty();
  std::unique_ptr<tree::Receiver> receiver;  // declared first: the writer (which reads it) goes first
  std::unique_ptr<CheckpointDirWriter> writer;
  // Set once the writer exists (on_active runs only inside run(), on the receiver's control thread,
  // where layout() is the version's own).
  auto announce = std::make_shared<std::atomic<CheckpointDirWriter*>>(nullptr);
  options.on_active = [announce, &receiver](uint64_t version) {
    if (auto* w = announce->load()) w->committed(version, receiver->layout());
  };
  if (!o.fault.empty()) {
    const Fault f = parse_fault(o.fault);
    if (f.at_commit) throw Error(Errc::invalid_argument, "--fault " + o.fault + ": ':commit' is a producer fault");
    install_fault(options, f, env.rank);
  }
  Held held = held_at_start(checkpoint_dir, env.rank);
  receiver = std::make_unique<tree::Receiver>(*transport, options);
  const codec::Manifest* manifest = nullptr;
  try {
    manifest = &receiver->join(held.version, held.digest);
    if (held.manifest && held.manifest->digest() != manifest->digest())
      throw Error(Errc::version_mismatch, "it holds another model than the producer's (or in another order)");
  } catch (const Error& e) {
    if (held.version == 0 || (e.code() != Errc::verify_failed && e.code() != Errc::version_mismatch)) throw;
    // The producer does not continue from what latest holds (another run, another model): start
    // over from version 0 as a new member. latest is replaced once the bootstrap is written.
    log->warn("rank {}: the producer refused version {} from {}/latest: {}; rejoining from version 0", env.rank,
              held.version, checkpoint_dir, e.what());
    held = Held{};
    receiver.reset();
    receiver = std::make_unique<tree::Receiver>(*transport, options);
    manifest = &receiver->join();
  }
  std::vector<std::vector<std::byte>> buffers = buffers_for(*manifest, held);
  codec::MutableWeights weights{manifest, {}};
  for (auto& b : buffers) weights.tensors.emplace_back(b.data(), b.size());
  receiver->attach(weights, held.version);
  if (!checkpoint_dir.empty())
    writer = std::make_unique<CheckpointDirWriter>(
        CheckpointDirWriter::Options{checkpoint_dir, c.output.keep, o.slow_disk_bytes_per_second,
                                     std::max(1u, std::thread::hardware_concurrency())},
        *receiver, weights.as_const(), held.version);
  announce->store(writer.get());
  tree::RunSummary summary = receiver->run();
  // Everything committed reaches the buffers (and, with a checkpoint_dir, the disk) before the
  // summary reads them.
  announce->store(nullptr);
  const uint64_t written = writer ? writer->finish() : 0;
  receiver->apply_pending();
  log->info("rank {}: active version {} (digest {:016x}), {} frames received, {} forwarded, {} committed, {} aborted{}",
            env.rank, summary.version, summary.digest, summary.stats.frames_received, summary.stats.frames_forwarded,
            summary.stats.versions_committed, summary.stats.versions_aborted,
            writer ? ", " + checkpoint_dir + "/latest = version " + std::to_string(written) : "");
  if (!o.summary_path.empty()) {
    nlohmann::json s = {{"rank", env.rank},
                        {"version", summary.version},
                        {"sha256", weights_sha256(weights.as_const())},
                        {"started_at_version", held.version},
                        {"frames_received", summary.stats.frames_received},
                        {"frames_forwarded", summary.stats.frames_forwarded},
                        {"versions_committed", summary.stats.versions_committed},
                        {"versions_aborted", summary.stats.versions_aborted}};
    if (writer) {
      const auto w = writer->stats();
      s["checkpoint_dir"] = {
          {"latest", w.latest}, {"written", w.written}, {"skipped", w.skipped}, {"failed", w.failed}};
    }
    write_json(o.summary_path, s);
  }
  if (summary.stats.versions_aborted > 0 || (summary.stats.versions_committed == 0 && held.version == 0))
    throw Error(Errc::verify_failed, "rank " + std::to_string(env.rank) + ": " +
                                         std::to_string(summary.stats.versions_aborted) + " versions aborted");
}

void run(const RunOptions& o) {
  config::Config c = config::load_config(o.config_path);
  config::apply_flag_overrides(c, o.sets);
  config::validate(c);
  config::resolve_clusters(c);
  set_log_level(c.log_level);
  if (c.transport == "loop" || c.transport == "loopback")
    throw Error(Errc::config, "transport '" + c.transport + "' only works inside one process");
  tree::LaunchEnv env = tree::detect_launch_env(process_env(), {o.rank, o.size, o.producer}, c.producer);
  const size_t members = config::member_list(c).size();
  if (static_cast<size_t>(env.size) != members + 1)
    throw Error(Errc::config, "the job has " + std::to_string(env.size) + " processes but " + o.config_path +
                                  " lists " + std::to_string(members) + " receivers (+1 producer)");
  if (c.clusters == "auto" && c.probe_file.empty()) {
    // No probe file: every rank measures a quick probe (O(N) flows) before the tree starts, and
    // takes the clusters rank 0 found.
    tools::quick_probe_clusters(c, env);
  } else if (c.clusters == "auto" && env.is_producer()) {
    std::string text;
    for (const auto& m : config::member_list(c)) text += " " + std::to_string(m.rank + 1) + ":" + m.cluster;
    std::printf("producer: clusters from %s: producer in %s; members%s\n", c.probe_file.c_str(),
                c.producer_cluster.empty() ? "its own cluster" : c.producer_cluster.c_str(), text.c_str());
  }
  if (!o.fault.empty()) parse_fault(o.fault);  // a bad spec fails before the job starts
  if (o.resume && !env.is_producer())
    throw Error(Errc::invalid_argument,
                "--resume applies to the producer (rank 0), not to rank " + std::to_string(env.rank) +
                    ": a receiver keeps its committed version and rejoins a restarted producer by itself "
                    "(within timeouts.producer_loss)");
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
  cmd->add_option("--report", options->report_path,
                  "Producer: write the JSON report here (default: output.metrics_file)");
  cmd->add_option("--summary", options->summary_path,
                  "Receiver: write {rank, version, sha256 of the weights} as JSON here");
  cmd->add_flag("--resume", options->resume,
                "Producer (rank 0): continue the version chain from <output.dir>/producer-state.json "
                "after the producer process was lost; receivers rejoin by themselves");
  cmd->add_option("--fault", options->fault,
                  "TESTING AID: ACTION@VERSION[:N] with ACTION kill (SIGKILL) or stop (SIGSTOP): this "
                  "process kills or freezes itself once it has handled (a receiver) or sent (the "
                  "producer) N (default 1) data messages of VERSION (version 1 = the full checkpoint, "
                  "step s = version s+1)")
      ->group("Testing aids");
  cmd->add_option_function<std::string>(
         "--slow-disk",
         [options](const std::string& rate) {
           options->slow_disk_bytes_per_second = static_cast<double>(config::parse_size(rate));
         },
         "TESTING AID: a receiver's output.checkpoint_dir writes take at least the model's bytes / RATE "
         "(bytes per second, e.g. 1MiB), as on a slow disk")
      ->group("Testing aids");
  cmd->callback([options] { run(*options); });
}

const CommandRegistrar registrar{"run", &setup};

}  // namespace
}  // namespace deltacast::tools
