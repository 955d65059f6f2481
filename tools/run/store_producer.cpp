// run_store_producer: the trainer's versions into the object store alone (tools/run/store_processes.h).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "codec/encoder.h"
#include "codec/owned_weights.h"
#include "tools/run/store_processes.h"
#include "tools/run/version_source.h"
#include "tree/config_options.h"
#include "tree/store_uplink.h"
#include "tree/store_versions.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

std::atomic<bool> store_stop_requested{false};

// The gateways (job member ranks) of the store clusters: what acknowledges each version.
std::vector<uint32_t> gateways_of(const config::Config& c) {
  std::vector<uint32_t> out;
  for (const auto& m : config::member_list(c))
    if (config::version_route(c, m.rank).kind == config::VersionRoute::Kind::gateway)
      out.push_back(static_cast<uint32_t>(m.rank));
  return out;
}

// Waits (polling every store.poll, at most timeouts.refit) until every gateway acknowledged
// version `version` (or a later one) with `digest`; returns how many did. A gateway that is down,
// or acknowledged another digest, is not counted (logged).
uint32_t wait_for_gateways(const config::Config& c, objstore::S3Client& client, const std::vector<uint32_t>& gateways,
                           uint64_t version, uint64_t digest) {
  const auto deadline = std::chrono::steady_clock::now() + c.timeouts.refit;
  const tree::StoreLayout layout = tree::store_layout(c);
  std::vector<bool> done(gateways.size(), false);
  uint32_t verified = 0;
  for (;;) {
    for (size_t i = 0; i < gateways.size(); ++i) {
      if (done[i]) continue;
      std::optional<tree::StoreAck> ack;
      try {
        ack = tree::read_ack(client, layout, gateways[i]);
      } catch (const Error& e) {
        logger("run")->warn("producer: the ack of gateway rank {}: {}", gateways[i] + 1, e.what());
      }
      if (!ack || ack->version < version) continue;
      done[i] = true;
      if (ack->version == version && ack->digest != digest) {
        logger("run")->error("producer: gateway rank {} holds version {} with digest {:016x}, not {:016x}",
                             gateways[i] + 1, version, ack->digest, digest);
        continue;
      }
      ++verified;
    }
    if (std::count(done.begin(), done.end(), true) == static_cast<long>(done.size())) return verified;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < gateways.size(); ++i)
        if (!done[i])
          logger("run")->warn("producer: gateway rank {} did not acknowledge version {} within timeouts.refit",
                              gateways[i] + 1, version);
      return verified;
    }
    std::this_thread::sleep_for(c.store.poll);
  }
}

}  // namespace

void run_store_producer(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o) {
  (void)env;
  if (c.trainer.kind == "watch") std::signal(SIGTERM, [](int) { store_stop_requested = true; });
  auto source = make_version_source(c, 0, std::nullopt, store_stop_requested);
  if (!source) {
    std::printf("producer: stopped before a checkpoint appeared in %s\n", c.trainer.dir.c_str());
    return;
  }
  const codec::Manifest manifest = source->manifest();
  auto client =
      std::make_unique<objstore::S3Client>(tree::store_s3_options(c), objstore::credentials_from_environment());
  objstore::S3Client acks(tree::store_s3_options(c), objstore::credentials_from_environment());
  const std::vector<uint32_t> gateways = gateways_of(c);
  tree::StoreUplink uplink(
      manifest, std::move(client),
      tree::StoreUplink::Options{tree::store_layout(c), c.store.snapshot_every, true, c.timeouts.producer_loss});
  std::printf("producer: no member in its own tree; publishing every version to %s/%s/%s only\n",
              c.store.endpoint.c_str(), c.store.bucket.c_str(), c.store.prefix.c_str());
  std::printf("producer: version 1 is %s, published whole\n", source->describe_bootstrap().c_str());
  std::fflush(stdout);

  codec::EncodeOptions encode;
  encode.chunk_bytes = c.chunk_bytes;
  encode.threads = std::max(1u, std::thread::hardware_concurrency());
  codec::OwnedWeights baseline(source->weights());
  codec::StateDigest digest = codec::StateDigest::full_scan(baseline.view(), encode.threads);
  uint64_t version = 1;
  bool all_verified = true;
  nlohmann::json steps = nlohmann::json::array();
  const double v1_started = unix_now();
  const auto v1_t0 = std::chrono::steady_clock::now();
  uplink.snapshot(1, std::make_shared<const codec::OwnedWeights>(baseline.view()));
  uplink.wait_idle();
  // Every version is acknowledged by every gateway (its cluster holds it) before the next: as over
  // the tree, one version at a time (timeouts.refit bounds the wait; a missing gateway is reported).
  const uint32_t v1_verified = wait_for_gateways(c, acks, gateways, 1, digest.combined());
  const double v1_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - v1_t0).count();
  steps.push_back({{"version", 1},
                   {"started_at_unix", v1_started},
                   {"whole", true},
                   {"seconds", v1_seconds},
                   {"verified_gateways", v1_verified}});
  std::printf("full checkpoint (version 1): %.1f MiB through the store in %.3f s, held by %u/%zu store clusters\n",
              mib(manifest.total_bytes()), v1_seconds, v1_verified, gateways.size());
  std::fflush(stdout);
  for (int step = 1; c.trainer.steps == 0 || step <= c.trainer.steps; ++step) {
    if (!source->next()) break;
    const double started = unix_now();
    const auto t0 = std::chrono::steady_clock::now();
    codec::EncodedDelta delta =
        codec::encode_delta(baseline.view(), source->weights(), digest, {version, version + 1}, encode);
    const double encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t payload = 0;
    for (const auto& f : delta.frames) payload += f.size();
    ++version;
    uplink.delta(version, version - 1, delta.new_digest.combined(), std::move(delta.frames));
    const bool whole = uplink.wants_snapshot(version);
    if (whole) uplink.snapshot(version, std::make_shared<const codec::OwnedWeights>(source->weights()));
    baseline.assign(source->weights());
    digest = std::move(delta.new_digest);
    uplink.wait_idle();
    const double publish_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint32_t verified = wait_for_gateways(c, acks, gateways, version, digest.combined());
    const double refit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    all_verified = all_verified && verified == gateways.size();
    steps.push_back({{"step", step},
                     {"version", version},
                     {"started_at_unix", started},
                     {"changes", delta.stats.changes},
                     {"elements", delta.stats.elements},
                     {"payload_bytes", payload},
                     {"encode_seconds", encode_seconds},
                     {"published_seconds", publish_seconds},
                     {"refit_seconds", refit_seconds},
                     {"verified_gateways", verified},
                     {"whole", whole}});
    std::printf(
        "step %d: version %llu  changed %.3f%%  payload %.2f MiB  refit %.3f s (encoded %.3f s, in the store at "
        "%.3f s)  held by %u/%zu store clusters%s\n",
        step, static_cast<unsigned long long>(version),
        100.0 * static_cast<double>(delta.stats.changes) /
            static_cast<double>(std::max<uint64_t>(1, delta.stats.elements)),
        mib(payload), refit_seconds, encode_seconds, publish_seconds, verified, gateways.size(),
        whole ? " (also whole)" : "");
    std::fflush(stdout);
  }
  const auto s = uplink.finish(version);
  std::printf("producer: store: %llu deltas and %llu whole versions published (%.1f MiB, %.3f s), %llu failed\n",
              static_cast<unsigned long long>(s.deltas), static_cast<unsigned long long>(s.snapshots),
              mib(s.bytes_uploaded), s.seconds, static_cast<unsigned long long>(s.failed));
  std::fflush(stdout);
  nlohmann::json report = {{"ok", s.failed == 0 && all_verified && v1_verified == gateways.size()},
                           {"gateways", gateways.size()},
                           {"transport", "store"},
                           {"receivers", 0},
                           {"params", manifest.total_elements()},
                           {"checkpoint_bytes", manifest.total_bytes()},
                           {"trainer_kind", c.trainer.kind},
                           {"chunk_bytes", c.chunk_bytes},
                           {"version", version},
                           {"digest", hex64(digest.combined())},
                           {"sha256", weights_sha256(baseline.view())},
                           {"peak_rss_bytes", peak_rss_bytes()},
                           {"store",
                            {{"deltas", s.deltas},
                             {"snapshots", s.snapshots},
                             {"failed", s.failed},
                             {"retried", s.retried},
                             {"bytes_uploaded", s.bytes_uploaded},
                             {"seconds", s.seconds},
                             {"last_error", s.last_error}}},
                           {"steps", steps}};
  const std::string path = !o.report_path.empty() ? o.report_path : c.output.metrics_file;
  if (!path.empty()) write_json(path, report);
  if (s.failed > 0)
    throw Error(Errc::io, std::to_string(s.failed) + " versions were not published to the store: " + s.last_error);
  if (!report["ok"].get<bool>())
    throw Error(Errc::verify_failed, "not every version was acknowledged by every store cluster's gateway");
}

}  // namespace deltacast::tools
