#include "tools/run/producer_process.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "tools/run/fault.h"
#include "tools/run/producer_state.h"
#include "tools/run/version_source.h"
#include "transport/transport.h"
#include "tree/config_options.h"
#include "tree/group_parts.h"
#include "tree/producer.h"
#include "tree/report_json.h"
#include "tree/store_uplink.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

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

// SIGTERM ends a producer that follows a trainer (trainer.steps 0) cleanly: BYE, report, exit 0.
std::atomic<bool> stop_requested{false};

// One producer process from start to report. The steps are its methods, in the order run() calls
// them; every member below is set by the step that first needs it.
class ProducerRun {
 public:
  ProducerRun(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o)
      : c_(c),
        env_(env),
        o_(o),
        tree_members_(config::producer_tree_members(c)),
        state_file_(state_path(c, env.rank)),
        rank_(static_cast<uint32_t>(env.rank)),
        who_(c.producers > 1 ? "producer rank " + std::to_string(env.rank) : "producer") {
    if (o.resume) {
      resumed_ = read_state(state_file_);
      check_state_against_config(*resumed_, c, state_file_);
      state_ = *resumed_;
    }
    if (!o.fault.empty()) {
      fault_ = parse_fault(o.fault);
      if (fault_->action == "stall")
        throw Error(Errc::invalid_argument, "--fault " + o.fault + ": stall is a receiver's fault (a relay thread)");
    }
  }

  void run() {
    if (!open_source()) return;
    if (resumed_ && resumed_->ended) return ended_already();
    transport_ = transport::make_transport(c_.transport, tree::producer_transport_options(c_));
    const tree::ProducerOptions options = producer_options();
    // The producer keeps a reference to its manifest: a copy of its own, as the source may be
    // replaced (stepped_back).
    manifest_.emplace(source_->manifest());
    open_store();
    producer_ = std::make_unique<tree::Producer>(*transport_, *manifest_, options);
    const tree::StartReport started = producer_->start();
    if (resumed_ && producer_->version() < resumed_->version) stepped_back();
    previous_source_.reset();
    std::printf("%s: %u receivers joined at %s (%s tree, %s, chunks of %.1f MiB%s)\n", who_.c_str(), tree_members_,
                producer_->url().c_str(), c_.topology.c_str(), c_.transport.c_str(), mib(c_.chunk_bytes),
                c_.producers > 1 ? (", " + std::to_string(c_.producers) + " producer ranks").c_str() : "");
    std::fflush(stdout);
    state_.topology = std::string(tree::topology_kind_name(options.topology));
    full_ = bootstrap_or_resume(started);
    bool ok = full_.committed;
    // Anonymous memory once version 1 is committed (the baseline copy included): what reading
    // later checkpoints may not grow (docs/config.md, trainer.kind watch).
    rss_anon_after_bootstrap_ = max_rss_anon_ = rss_anon_bytes();
    const int first_step = resumed_ ? static_cast<int>(resumed_->trainer_step) + 1 : 1;
    for (int step = first_step; ok && (c_.trainer.steps == 0 || step <= c_.trainer.steps); ++step) {
      if (!source_->next()) break;  // watch: SIGTERM while waiting for the next checkpoint
      ok = refit_step(step);
    }
    producer_->finish();
    if (rank_ > 0) ended();  // the coordinator's BYE reached this rank (rank 0: before_bye)
    close_store();
    write_report(ok, started);
    if (!ok) throw Error(Errc::verify_failed, "not every version was verified and committed by every live receiver");
  }

 private:
  // The trainer's versions. False when a watch was stopped before any checkpoint appeared.
  bool open_source() {
    if (c_.trainer.kind == "watch") std::signal(SIGTERM, [](int) { stop_requested = true; });
    source_ = make_version_source(c_, rank_, resumed_, stop_requested);
    if (!source_) std::printf("producer: stopped before a checkpoint appeared in %s\n", c_.trainer.dir.c_str());
    return source_ != nullptr;
  }

  tree::ProducerOptions producer_options() {
    tree::ProducerOptions options = tree::producer_options_from(c_);
    options.listen_url = env_.require_rendezvous();
    if (c_.producers > 1) {
      // Rank g listens at the rendezvous address's port + g (config::producer_rank_urls).
      config::Config at = c_;
      at.producer = env_.require_rendezvous();
      options.listen_url = config::producer_rank_urls(at).at(rank_);
      options.group = {rank_, c_.producers, env_.require_rendezvous(), {}};
      // The trainer's layout (config group_parts): every rank computes it from the same checkpoint
      // (shards) or text, and the group compares the partitions' fingerprints at GROUP_HELLO.
      if (c_.group_parts == "shards")
        options.group.parts = tree::shard_parts(source_->layout(), source_->manifest(), c_.producers);
      else if (c_.group_parts != "balanced")
        options.group.parts = tree::parse_group_parts(c_.group_parts, source_->manifest(), c_.producers);
    }
    options.receivers = tree_members_;
    if (c_.store.enabled())
      options.on_committed_delta = [this](uint64_t v, uint64_t base, uint64_t digest,
                                          std::vector<std::vector<std::byte>> frames) {
        uplink_->delta(v, base, digest, std::move(frames));
        if (uplink_->wants_snapshot(v))
          uplink_->snapshot(v, std::make_shared<const codec::OwnedWeights>(source_->weights()));
      };
    options.encode.threads = std::max(1u, std::thread::hardware_concurrency());
    options.layout = source_->layout();
    if (fault_ && !fault_->at_commit) options.on_progress = producer_fault_hook(*fault_, sending_);
    if (resumed_) {
      options.resume =
          tree::ProducerResume{resumed_->version, source_->weights(), resumed_->attempt, resumed_->history, {}};
      // A coordinator lost after deciding its state's version, before anybody heard so, steps back
      // to the version before (the trainer's previous position, rebuilt only then).
      if (rank_ == 0 && c_.producers > 1 && resumed_->previous.version != 0)
        options.resume->previous = tree::ProducerResume::Previous{
            resumed_->previous.version, [this] {
              previous_source_ = make_version_source(c_, rank_, resumed_->at_previous(), stop_requested);
              return std::make_pair(previous_source_->weights(), previous_source_->layout());
            }};
    }
    // The state file is written when a version is decided, before its COMMIT goes out (a group's
    // part rank: once the coordinator said it committed, part_committed()).
    if (rank_ == 0) options.before_commit = [this](uint64_t version, uint64_t digest) { decided(version, digest); };
    if (rank_ == 0) options.before_bye = [this] { ended(); };
    return options;
  }

  // store.endpoint: the uplink that publishes every committed version to the object store (a fresh
  // run clears the prefix; a resumed one keeps the chain). Fails the start when the store cannot
  // be written.
  void open_store() {
    if (!c_.store.enabled()) return;
    auto client =
        std::make_unique<objstore::S3Client>(tree::store_s3_options(c_), objstore::credentials_from_environment());
    uplink_ = std::make_unique<tree::StoreUplink>(
        *manifest_, std::move(client),
        tree::StoreUplink::Options{tree::store_layout(c_), c_.store.snapshot_every, !resumed_.has_value(),
                                   c_.timeouts.producer_loss});
    std::printf("producer: publishing every committed version to %s/%s/%s\n", c_.store.endpoint.c_str(),
                c_.store.bucket.c_str(), c_.store.prefix.c_str());
    std::fflush(stdout);
  }

  void close_store() {
    if (!uplink_) return;
    const auto s = uplink_->finish(producer_->version());
    store_json_ = {{"deltas", s.deltas},        {"snapshots", s.snapshots},           {"failed", s.failed},
                   {"retried", s.retried},      {"bytes_uploaded", s.bytes_uploaded}, {"seconds", s.seconds},
                   {"last_error", s.last_error}};
    std::printf("producer: store: %llu deltas and %llu whole versions published (%.1f MiB, %.3f s), %llu failed\n",
                static_cast<unsigned long long>(s.deltas), static_cast<unsigned long long>(s.snapshots),
                mib(s.bytes_uploaded), s.seconds, static_cast<unsigned long long>(s.failed));
    std::fflush(stdout);
  }

  // Every version, once decided and before its COMMIT (so before its progress line: a line printed
  // means its state is on disk). A state that cannot be written is no reason to stop refitting:
  // the file keeps an older version, and a producer resumed from it refuses members that hold
  // newer ones. Then the :commit fault, if it names this version.
  void decided(uint64_t version, uint64_t digest) {
    state_.push_previous(version);
    state_.version = version;
    state_.digest = digest;
    state_.trainer_step = sending_step_;
    state_.attempt = producer_->attempt();
    state_.history = producer_->history();
    state_.history[version] = digest;  // a delegated commit is recorded before history() holds it
    state_.history.erase(0);           // version 0 needs no record (the all-zero state)
    source_->save(state_);
    try {
      write_state(state_file_, state_);
    } catch (const Error& e) {
      logger("run")->error("producer state not updated to version {}: {}", state_.version, e.what());
    }
    if (fault_ && fault_->at_commit && fault_->version == version) {
      std::printf("producer: --fault %s@%llu:commit: %s this process after writing the state, before COMMIT\n",
                  fault_->action.c_str(), static_cast<unsigned long long>(version),
                  fault_->signal == SIGKILL ? "killing" : "stopping");
      std::fflush(stdout);
      std::raise(fault_->signal);
    }
  }

  // BYE goes out (rank 0), or went out (a part rank): the state file says the receivers left, so
  // that a producer lost from here on is not resumed to wait timeouts.join for them. Nothing to
  // write before a version committed (the file would name version 0).
  void ended() {
    if (state_.version == 0) return;
    state_.ended = true;
    try {
      write_state(state_file_, state_);
    } catch (const Error& e) {
      logger("run")->error("producer state not marked ended at version {}: {}", state_.version, e.what());
    }
  }

  // --resume of a state whose BYE went out: the receivers left, there is nobody to send to. A job
  // that ran its trainer.steps (or followed a trainer until it was stopped: steps 0) reports the
  // version it ended at, with the trainer's bits re-checked against it (open_source), and exits 0;
  // one that ended before its last step cannot be continued: Error(state).
  void ended_already() {
    const uint64_t version = resumed_->version, step = resumed_->trainer_step;
    if (c_.trainer.steps != 0 && step < static_cast<uint64_t>(c_.trainer.steps))
      throw Error(Errc::state, "--resume: the run in " + state_file_ + " ended at version " + std::to_string(version) +
                                   " (trainer step " + std::to_string(step) + " of " +
                                   std::to_string(c_.trainer.steps) +
                                   "): BYE went out and the receivers left; nothing can continue it (start a new run)");
    std::printf(
        "%s: the run in %s had ended at version %llu (step %llu): BYE went out and the receivers left; "
        "nothing to resume\n",
        who_.c_str(), state_file_.c_str(), static_cast<unsigned long long>(version),
        static_cast<unsigned long long>(step));
    std::fflush(stdout);
    full_.version = 1;
    full_.committed = true;
    full_.refit_seconds = resumed_->full_seconds;
    write_report(true, tree::StartReport{});
  }

  // The group stepped back to the state's previous version in start() (tree::ProducerResume::
  // previous): the trainer goes on from there, and the state file says so.
  void stepped_back() {
    const uint64_t decided_version = resumed_->version;
    resumed_ = resumed_->at_previous();
    state_ = *resumed_;
    source_ = std::move(previous_source_);
    std::printf(
        "producer: stepped back from version %llu to version %llu (step %llu): every producer rank and every "
        "receiver holds it; version %llu was decided here only, it is sent again\n",
        static_cast<unsigned long long>(decided_version), static_cast<unsigned long long>(resumed_->version),
        static_cast<unsigned long long>(resumed_->trainer_step), static_cast<unsigned long long>(decided_version));
    std::fflush(stdout);
    try {
      write_state(state_file_, state_);
    } catch (const Error& e) {
      logger("run")->error("producer state not stepped back to version {}: {}", state_.version, e.what());
    }
  }

  // A producer group's version. When a producer rank was lost before its part was out, the version
  // aborted on every member; the coordinator waits up to timeouts.producer_loss for the rank to
  // come back (`run --resume` on it) and sends the version again, and a part rank sends it again
  // with it (the coordinator ends the session, BYE, when it gives up: the rank's refit throws).
  tree::RefitReport group_refit(const std::function<tree::RefitReport()>& send) {
    tree::RefitReport r = send();
    if (rank_ > 0) {
      while (!r.committed) {
        std::printf("%s: version %llu aborted (%s); sending it again with the group\n", who_.c_str(),
                    static_cast<unsigned long long>(r.version), r.abort_reason.c_str());
        std::fflush(stdout);
        r = send();
      }
      return r;
    }
    const auto deadline = std::chrono::steady_clock::now() + c_.timeouts.producer_loss;
    while (!r.committed && r.producer_rank_lost) {
      std::printf(
          "producer: version %llu aborted on every member: %s; waiting up to %.0f s for the rank "
          "(run --resume on it)\n",
          static_cast<unsigned long long>(r.version), r.abort_reason.c_str(),
          std::chrono::duration<double>(c_.timeouts.producer_loss).count());
      std::fflush(stdout);
      for (;;) {
        try {
          r = send();
          break;
        } catch (const Error& e) {
          // Error(state): a rank has not said GROUP_HELLO yet.
          if (e.code() != Errc::state || std::chrono::steady_clock::now() > deadline) throw;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
      }
    }
    return r;
  }

  // A part rank's state, once its refit returns committed (the coordinator's is written before
  // its COMMIT goes out: decided()).
  void part_committed(const tree::RefitReport& r) {
    if (rank_ == 0 || !r.committed) return;
    const auto history = producer_->history();
    const auto known = history.find(r.version);
    decided(r.version, known != history.end() ? known->second : 0);
  }

  // Version 1, the full checkpoint; or, resumed, nothing sent: the members kept the committed
  // version, and the bootstrap time of the run that created the chain stays the reference of the
  // speedup column.
  tree::RefitReport bootstrap_or_resume(const tree::StartReport& started) {
    tree::RefitReport full;
    if (resumed_) {
      full.version = 1;
      full.committed = true;
      full.refit_seconds = resumed_->full_seconds;
      state_.full_seconds = resumed_->full_seconds;
      std::printf("producer: resumed at version %llu (step %llu) from %s; %s\n",
                  static_cast<unsigned long long>(resumed_->version),
                  static_cast<unsigned long long>(resumed_->trainer_step), state_file_.c_str(),
                  start_summary(started).c_str());
    } else {
      // A group: every rank sends its own part's RAW pieces, from its own memory.
      sending_->store(1);
      std::printf("%s: version 1 is %s%s\n", who_.c_str(), source_->describe_bootstrap().c_str(),
                  c_.producers > 1 ? ", its part as RAW pieces" : "");
      full = producer_->bootstrap(source_->weights());
      part_committed(full);
      if (uplink_ && full.committed)
        uplink_->snapshot(1, std::make_shared<const codec::OwnedWeights>(source_->weights()));
      state_.full_seconds = full.refit_seconds;
      if (rank_ > 0)
        std::printf("%s: full checkpoint (version 1): its part, %.1f MiB raw, in %.3f s, %s\n", who_.c_str(),
                    mib(full.frames_bytes), full.refit_seconds,
                    full.committed ? "committed" : ("ABORTED: " + full.abort_reason).c_str());
      else
        std::printf(
            "full checkpoint (version 1): %.1f MiB raw through the tree in %.3f s, verified by "
            "%u/%u receivers%s%s\n",
            mib(full.checkpoint_bytes), full.refit_seconds, full.verified_receivers, full.receivers,
            repair_suffix(full).c_str(), full.committed ? "" : (", ABORTED: " + full.abort_reason).c_str());
    }
    std::fflush(stdout);
    return full;
  }

  // One trainer step: its version refit through the tree, a progress line and a report entry.
  // False when the version aborted.
  bool refit_step(int step) {
    sending_->store(producer_->version() + 1);
    sending_step_ = static_cast<uint64_t>(step);
    // A checkpoint whose __metadata__, index metadata, side files or shard split changed goes with
    // its layout (the producer sends it only when it differs from the committed version's).
    tree::RefitOptions refit_options;
    refit_options.layout = source_->layout();
    const codec::WeightsReader* reader = source_->reader();
    const double started_at = unix_now();  // benches compare members' committed_at_unix with it
    auto send = [&] {
      return reader ? producer_->refit(*reader, refit_options) : producer_->refit(source_->weights(), refit_options);
    };
    tree::RefitReport r = c_.producers > 1 ? group_refit(send) : send();
    const auto committed_at = std::chrono::steady_clock::now();
    part_committed(r);
    if (rank_ > 0) {
      // A part rank: its own line (rank 0's "step" lines are the run's).
      std::printf("%s: step %d: version %llu %s, its part %.2f MiB in %.3f s\n", who_.c_str(), step,
                  static_cast<unsigned long long>(r.version), r.committed ? "committed" : "ABORTED",
                  mib(r.frames_bytes), r.refit_seconds);
      std::fflush(stdout);
      steps_.push_back(step_json(step, r, full_.refit_seconds));
      return r.committed;
    }

    max_rss_anon_ = std::max(max_rss_anon_, rss_anon_bytes());
    nlohmann::json entry = step_json(step, r, full_.refit_seconds);
    entry["started_at_unix"] = started_at;
    // How this checkpoint was read: said by the branch that chose the refit, not by the config.
    if (c_.trainer.kind == "watch") entry["read"] = reader ? "pread" : "map";
    source_->describe(entry, committed_at);
    steps_.push_back(entry);
    if (entry.contains("checkpoint"))
      logger("run")->info("version {} is checkpoint {} (its name appeared {:.3f} s before the commit)", r.version,
                          entry["checkpoint"].get<std::string>(), entry["appeared_to_commit_seconds"].get<double>());
    std::printf(
        "step %d: version %llu  changed %.3f%%  payload %.2f MiB  refit %.3f s  "
        "full %.3f s  speedup %.1fx  verified %u/%u%s%s\n",
        step, static_cast<unsigned long long>(r.version),
        100.0 * static_cast<double>(r.changes) / static_cast<double>(std::max<uint64_t>(1, r.elements)),
        mib(r.frames_bytes), r.refit_seconds, full_.refit_seconds,
        r.refit_seconds > 0 ? full_.refit_seconds / r.refit_seconds : 0.0, r.verified_receivers, r.receivers,
        r.committed ? "" : "  ABORTED", repair_suffix(r).c_str());
    std::fflush(stdout);
    if (!r.committed) logger("run")->error("version {} aborted: {}", r.version, r.abort_reason);
    return r.committed;
  }

  // The JSON report (--report, else output.metrics_file). ok: every version committed, each on
  // every member live at its end.
  void write_report(bool ok, const tree::StartReport& started) {
    nlohmann::json full_json = {{"versions", full_.version},      {"payload_bytes", full_.frames_bytes},
                                {"seconds", full_.refit_seconds}, {"committed", full_.committed},
                                {"receivers", full_.receivers},   {"verified_receivers", full_.verified_receivers}};
    tree::add_repair_json(full_json, full_);
    if (resumed_) full_json["from_state"] = true;  // this process sent no bootstrap: the original run's time
    nlohmann::json report = {{"ok", ok},
                             {"topology", c_.topology},
                             {"transport", c_.transport},
                             {"receivers", tree_members_},
                             {"params", source_->manifest().total_elements()},
                             {"checkpoint_bytes", source_->manifest().total_bytes()},
                             {"trainer_kind", c_.trainer.kind},
                             {"rss_anon_after_bootstrap_bytes", rss_anon_after_bootstrap_},
                             {"max_rss_anon_bytes", max_rss_anon_},
                             {"peak_rss_bytes", peak_rss_bytes()},
                             {"trainer_bytes", source_->trainer_bytes()},
                             {"part_bytes", producer_ ? producer_->part_bytes() : 0},
                             {"chunk_bytes", c_.chunk_bytes},
                             {"full", full_json},
                             {"steps", steps_}};  // only the steps this process ran
    if (resumed_) {
      using Role = tree::MemberAtStart::Role;
      report["resumed"] = {{"state_file", state_file_},
                           {"version", resumed_->version},
                           {"trainer_step", resumed_->trainer_step},
                           {"live", started.count(Role::live)},
                           {"catching_up", started.count(Role::catching_up)},
                           {"refused", started.count(Role::refused)}};
      if (!producer_) report["resumed"]["ended"] = true;  // ended_already(): nothing was started
    }
    const uint64_t version = producer_ ? producer_->version() : state_.version;
    report["version"] = version;
    if (uplink_) report["store"] = store_json_;
    // The committed version's combined StateDigest (a group's: the sum of its ranks' parts, each
    // taken from that rank's own memory), and the SHA-256 of the bits when this process holds them
    // all (a group's synthetic rank holds its part only).
    const auto history = producer_ ? producer_->history() : state_.history;
    if (const auto known = history.find(version); known != history.end()) report["digest"] = hex64(known->second);
    if (source_->whole()) report["sha256"] = weights_sha256(source_->weights());
    if (c_.producers > 1) report["producer_rank"] = rank_;
    std::string path = !o_.report_path.empty() ? o_.report_path : c_.output.metrics_file;
    if (!path.empty() && rank_ > 0) {
      // A part rank's report beside rank 0's: metrics.json -> metrics-rank<g>.json.
      const size_t dot = path.rfind('.');
      const size_t slash = path.rfind('/');
      const size_t at = dot != std::string::npos && (slash == std::string::npos || dot > slash) ? dot : path.size();
      path.insert(at, "-rank" + std::to_string(rank_));
    }
    if (!path.empty()) write_json(path, report);
  }

  const config::Config& c_;
  const tree::LaunchEnv& env_;
  const RunOptions& o_;
  const uint32_t tree_members_;  // the members in the producer's own tree (not behind the store)
  const std::string state_file_;
  const uint32_t rank_;    // a producer group's rank (0: the coordinator, or the one producer)
  const std::string who_;  // "producer" / "producer rank g", for its lines
  std::optional<ProducerState> resumed_;
  std::optional<Fault> fault_;
  std::unique_ptr<VersionSource> source_;
  std::unique_ptr<VersionSource> previous_source_;  // the state's previous version, while start() may step back
  std::optional<codec::Manifest> manifest_;         // the producer's (every version's)
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<tree::StoreUplink> uplink_;  // store.endpoint
  nlohmann::json store_json_;
  std::unique_ptr<tree::Producer> producer_;
  ProducerState state_;
  std::shared_ptr<std::atomic<uint64_t>> sending_ = std::make_shared<std::atomic<uint64_t>>(0);  // --fault
  uint64_t sending_step_ = 0;  // the trainer step of the version being sent
  tree::RefitReport full_;
  nlohmann::json steps_ = nlohmann::json::array();
  uint64_t rss_anon_after_bootstrap_ = 0, max_rss_anon_ = 0;
};

}  // namespace

void run_producer(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o) {
  ProducerRun(c, env, o).run();
}

}  // namespace deltacast::tools
