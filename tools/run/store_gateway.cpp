// run_store_gateway: a store cluster's gateway (tools/run/store_processes.h).
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "tools/run/store_processes.h"
#include "transport/transport.h"
#include "tree/config_options.h"
#include "tree/producer.h"
#include "tree/store_versions.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

using Clock = std::chrono::steady_clock;

// A store cluster's gateway from its first poll to its summary.
class Gateway {
 public:
  Gateway(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o, const config::VersionRoute& route)
      : c_(c),
        env_(env),
        o_(o),
        route_(route),
        me_(config::member_list(c).at(static_cast<size_t>(env.member_rank()))),
        layout_(tree::store_layout(c)),
        client_(tree::store_s3_options(c), objstore::credentials_from_environment()) {}

  void run() {
    const codec::Manifest manifest = wait_for_model();
    manifest_ = &manifest;
    for (const auto& t : manifest.tensors()) buffers_.emplace_back(t.nbytes());
    codec::MutableWeights weights{&manifest, {}};
    for (auto& b : buffers_) weights.tensors.emplace_back(b.data(), b.size());
    weights_ = weights.as_const();
    follower_.emplace(manifest, client_, layout_, weights, 0, codec::StateDigest::zeros(manifest));
    follower_->relay_deltas([this](const objstore::VersionManifest& m,
                                   const std::vector<std::vector<std::byte>>& frames,
                                   const std::function<void()>& apply) { relay(m, frames, apply); });
    // Version 1 (or whatever the store holds now): the cluster's tree starts from it.
    const auto first_by = Clock::now() + c_.timeouts.join;
    while (follow(first_by, "no version in the store") == 0) {
      if (Clock::now() > first_by)
        throw Error(Errc::timeout, "the store holds a model but no version after timeouts.join");
      std::this_thread::sleep_for(c_.store.poll);
    }
    if (!route_.behind.empty()) {
      start_cluster(manifest, weights.as_const());
      acknowledge(follower_->version());
    }
    // Until the version end.json names; a store that shows nothing new for 4 x timeouts.refit (a
    // producer lost for good) ends it as the producer's silence ends a receiver.
    // A poll reads the next version's manifest only (one request); the first poll, and one every
    // 2 s while nothing new comes, also looks for a gap (latest.json, a snapshot) and for end.json
    // (written after the last version). Those take a few round trips in which a new version is not
    // seen, so they are rare (a version found meanwhile is fetched by the next poll at once).
    auto progress_at = Clock::now();
    auto wide_at = Clock::time_point{};
    for (uint64_t held = follower_->version();;) {
      const bool wide = Clock::now() - wide_at >= std::chrono::seconds(2);
      if (wide) wide_at = Clock::now();
      const uint64_t now_held = follow(Clock::now() + c_.timeouts.producer_loss, "the store stayed unreadable", wide);
      if (now_held > held) {
        progress_at = Clock::now();
        held = now_held;
        continue;
      }
      if (wide) {
        if (const auto end = read_end_or_nullopt(); end && held >= *end) break;
      }
      if (Clock::now() - progress_at > 4 * c_.timeouts.refit)
        throw Error(Errc::timeout, "no new version in the store for 4 x timeouts.refit (at version " +
                                       std::to_string(held) + "; the producer wrote no end.json)");
      std::this_thread::sleep_for(c_.store.poll);
    }
    if (producer_) producer_->finish();
    report(weights.as_const());
  }

 private:
  codec::Manifest wait_for_model() {
    const auto deadline = Clock::now() + c_.timeouts.join;
    for (;;) {
      std::optional<codec::Manifest> model;
      try {
        model = tree::read_model(client_, layout_);
      } catch (const Error& e) {
        if (e.code() == Errc::auth || Clock::now() > deadline) throw;
        logger("run")->warn("gateway rank {}: the store: {}; trying again", env_.receiver_rank(), e.what());
      }
      if (model) return *model;
      if (Clock::now() > deadline)
        throw Error(Errc::timeout, "the store " + c_.store.endpoint + "/" + c_.store.bucket + "/" + c_.store.prefix +
                                       " holds no model.json after timeouts.join (is the producer publishing there?)");
      std::this_thread::sleep_for(c_.store.poll);
    }
  }

  std::optional<uint64_t> read_end_or_nullopt() {
    try {
      return tree::read_end(client_, layout_);
    } catch (const Error& e) {
      logger("run")->warn("gateway rank {}: end.json: {}", env_.receiver_rank(), e.what());
      return std::nullopt;
    }
  }

  // One catch_up, retried (after store.poll) until `deadline` while the store fails or serves a
  // version that does not verify; the weights stay at the last version committed here meanwhile.
  // `wide`: catch_up (a gap or version 0: a snapshot); else follow_deltas (the next manifests only).
  uint64_t follow(Clock::time_point deadline, const char* what, bool wide = true) {
    for (;;) {
      const uint64_t before = follower_->version();
      try {
        const uint64_t held = wide ? follower_->catch_up() : follower_->follow_deltas();
        if (producer_ && forwarded_ != held) restart_cluster();  // a snapshot and no delta after it
        for (uint64_t v = before + 1; v <= held; ++v) committed_at_.emplace(v, unix_now());  // a snapshot's
        // A cluster's version counts once its tree has it (start_cluster acknowledges the first).
        if (held > before && (producer_ || route_.behind.empty())) acknowledge(held);
        return held;
      } catch (const Error& e) {
        for (uint64_t v = before + 1; v <= follower_->version(); ++v) committed_at_.emplace(v, unix_now());
        if (cluster_failed_ || e.code() == Errc::state || Clock::now() > deadline)
          throw Error(e.code(), std::string(what) + ": " + e.what());
        ++store_errors_;
        logger("run")->warn("gateway rank {}: at version {}: {}; trying again", env_.receiver_rank(),
                            follower_->version(), e.what());
      }
      std::this_thread::sleep_for(c_.store.poll);
    }
  }

  // Tells a producer that reaches its members only through the store which version this cluster
  // holds (best effort: a producer that misses it reports this gateway unverified).
  void acknowledge(uint64_t version) {
    try {
      tree::publish_ack(client_, layout_, static_cast<uint32_t>(env_.member_rank()),
                        tree::StoreAck{version, follower_->digest()});
    } catch (const Error& e) {
      logger("run")->warn("gateway rank {}: could not acknowledge version {} in the store: {}", env_.receiver_rank(),
                          version, e.what());
    }
  }

  // The cluster's relay tree, rooted here: a producer resumed at the version held (its members,
  // at version 0 or at an older one, catch up by a snapshot of it), fed the store's frames.
  void start_cluster(const codec::Manifest& manifest, const codec::ConstWeights& weights) {
    if (!transport_)
      transport_ = transport::make_transport(c_.transport, tree::member_transport_options(c_, env_.member_rank()));
    tree::ProducerOptions options = tree::producer_options_from(c_);
    options.listen_url = me_.url;
    options.receivers = static_cast<uint32_t>(route_.behind.size());
    options.cluster = me_.cluster;
    options.delegate_commit = false;
    options.encode.threads = std::max(1u, std::thread::hardware_concurrency());
    const uint64_t v = follower_->version();
    options.resume = tree::ProducerResume{v, weights, 0, {{v, follower_->digest()}}, {}};
    producer_ = std::make_unique<tree::Producer>(*transport_, manifest, options);
    producer_->start();
    forwarded_ = v;
    std::printf("gateway rank %d: cluster %s: %zu members joined its tree at version %llu\n", env_.receiver_rank(),
                me_.cluster.c_str(), route_.behind.size(), static_cast<unsigned long long>(v));
    std::fflush(stdout);
  }

  // The gateway jumped by a snapshot (it was away longer than store.retain_versions deltas): its
  // members, at the version last forwarded, cannot take the deltas after it. The cluster's tree
  // starts again at the version held here, as after a restart of the gateway: the old producer goes
  // without BYE (its members wait for one at this address for timeouts.producer_loss), the new one
  // resumes at the snapshot's version and its members catch up to it by a snapshot from it.
  void restart_cluster() {
    logger("run")->warn(
        "gateway rank {}: went from version {} to {} by a snapshot (away longer than store.retain_versions "
        "deltas): the cluster's tree starts again at version {}",
        env_.receiver_rank(), forwarded_, follower_->version(), follower_->version());
    producer_.reset();
    try {
      start_cluster(*manifest_, weights_);
    } catch (const Error&) {
      cluster_failed_ = true;  // a cluster without its tree: the gateway stops
      throw;
    }
  }

  // A delta from the store: applied here and, once the cluster's tree runs, sent on through it at
  // the same time (the tree's members apply it as it passes while this gateway applies its own
  // copy; the version commits in the cluster only once both hold it).
  void relay(const objstore::VersionManifest& m, const std::vector<std::vector<std::byte>>& frames,
             const std::function<void()>& apply) {
    if (!producer_) {
      apply();
      committed_at_[m.version] = unix_now();
      return;
    }
    if (m.base_version != forwarded_) restart_cluster();  // a snapshot, then this delta on it
    double applied_at = 0;
    const std::shared_future<tree::Producer::RelayCopy> copy =
        std::async(std::launch::async, [&] {
          apply();
          applied_at = unix_now();
          return tree::Producer::RelayCopy{weights_, follower_->state_digest()};
        }).share();
    try {
      forward(m, frames, copy);
    } catch (...) {
      copy.wait();  // the apply reads `frames`: it ends before they go
      if (applied_at > 0) committed_at_[m.version] = applied_at;
      throw;
    }
    committed_at_[m.version] = applied_at;
  }

  // A delta through the cluster's tree (tried three times), `copy` this gateway's own.
  void forward(const objstore::VersionManifest& m, const std::vector<std::vector<std::byte>>& frames,
               const std::shared_future<tree::Producer::RelayCopy>& copy) {
    tree::RefitReport r;
    for (int attempt = 1; attempt <= 3; ++attempt) {
      r = producer_->forward(frames, m.version, m.digest, copy);
      if (r.committed) break;
      logger("run")->warn("gateway rank {}: version {} aborted in the cluster ({}); sending it again",
                          env_.receiver_rank(), m.version, r.abort_reason);
    }
    if (!r.committed) {
      cluster_failed_ = true;
      throw Error(Errc::verify_failed,
                  "version " + std::to_string(m.version) + " aborted three times in the cluster: " + r.abort_reason);
    }
    forwarded_ = m.version;
    cluster_seconds_ += r.refit_seconds;
    std::printf("gateway rank %d: version %llu through the cluster in %.3f s (%.2f MiB), verified %u/%u\n",
                env_.receiver_rank(), static_cast<unsigned long long>(m.version), r.refit_seconds, mib(r.frames_bytes),
                r.verified_receivers, r.receivers);
    std::fflush(stdout);
  }

  void report(const codec::ConstWeights& weights) {
    const auto f = follower_->stats();
    const auto s3 = client_.stats();
    logger("run")->info(
        "gateway rank {}: version {} (digest {:016x}): {} deltas, {} snapshots, {} bytes from the store",
        env_.receiver_rank(), follower_->version(), follower_->digest(), f.deltas_applied, f.snapshots_taken,
        s3.bytes_received);
    if (!o_.summary_path.empty()) {
      nlohmann::json at = nlohmann::json::object();
      for (const auto& [v, t] : committed_at_) at[std::to_string(v)] = t;
      write_json(o_.summary_path, {{"rank", env_.receiver_rank()},
                                   {"version", follower_->version()},
                                   {"sha256", weights_sha256(weights)},
                                   {"digest", hex64(codec::StateDigest::full_scan(weights).combined())},
                                   {"started_at_version", 0},
                                   {"versions_committed", f.deltas_applied + f.snapshots_taken},
                                   {"versions_aborted", 0},
                                   {"gateway", true},
                                   {"cluster_receivers", route_.behind.size()},
                                   {"committed_at_unix", at},
                                   {"store",
                                    {{"deltas_applied", f.deltas_applied},
                                     {"snapshots_taken", f.snapshots_taken},
                                     {"frame_bytes", f.bytes_downloaded},
                                     {"bytes_received", s3.bytes_received},
                                     {"requests", s3.requests},
                                     {"retries", s3.retries},
                                     {"errors", store_errors_}}},
                                   {"cluster_seconds", cluster_seconds_},
                                   {"peak_rss_bytes", peak_rss_bytes()}});
    }
    if (follower_->version() == 0)
      throw Error(Errc::verify_failed, "gateway rank " + std::to_string(env_.receiver_rank()) + ": no version");
  }

  const config::Config& c_;
  const tree::LaunchEnv& env_;
  const RunOptions& o_;
  const config::VersionRoute route_;
  const config::MemberConfig me_;
  const tree::StoreLayout layout_;
  objstore::S3Client client_;
  const codec::Manifest* manifest_ = nullptr;  // run()'s, the model read from the store
  std::vector<std::vector<std::byte>> buffers_;
  codec::ConstWeights weights_;  // buffers_ as the follower's model
  std::optional<tree::StoreFollower> follower_;
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<tree::Producer> producer_;
  uint64_t forwarded_ = 0;
  uint64_t store_errors_ = 0;
  bool cluster_failed_ = false;  // a version could not be committed in the cluster: the gateway stops
  double cluster_seconds_ = 0;
  std::map<uint64_t, double> committed_at_;
};

}  // namespace

void run_store_gateway(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o,
                       const config::VersionRoute& route) {
  Gateway(c, env, o, route).run();
}

}  // namespace deltacast::tools
