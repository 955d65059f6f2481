// run_store_producer: the trainer's versions into the object store alone (tools/run/store_processes.h).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include "codec/encoder.h"
#include "codec/owned_weights.h"
#include "tools/run/store_processes.h"
#include "tools/run/version_source.h"
#include "tree/config_options.h"
#include "tree/store_uplink.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

std::atomic<bool> store_stop_requested{false};

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
  nlohmann::json steps = nlohmann::json::array();
  steps.push_back({{"version", 1}, {"started_at_unix", unix_now()}, {"whole", true}});
  uplink.snapshot(1, std::make_shared<const codec::OwnedWeights>(baseline.view()));
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
    steps.push_back({{"step", step},
                     {"version", version},
                     {"started_at_unix", started},
                     {"changes", delta.stats.changes},
                     {"elements", delta.stats.elements},
                     {"payload_bytes", payload},
                     {"encode_seconds", encode_seconds},
                     {"whole", whole}});
    std::printf("step %d: version %llu  changed %.3f%%  payload %.2f MiB  encoded in %.3f s, queued for the store%s\n",
                step, static_cast<unsigned long long>(version),
                100.0 * static_cast<double>(delta.stats.changes) /
                    static_cast<double>(std::max<uint64_t>(1, delta.stats.elements)),
                mib(payload), encode_seconds, whole ? " (and whole)" : "");
    std::fflush(stdout);
  }
  const auto s = uplink.finish(version);
  std::printf("producer: store: %llu deltas and %llu whole versions published (%.1f MiB, %.3f s), %llu failed\n",
              static_cast<unsigned long long>(s.deltas), static_cast<unsigned long long>(s.snapshots),
              mib(s.bytes_uploaded), s.seconds, static_cast<unsigned long long>(s.failed));
  std::fflush(stdout);
  nlohmann::json report = {{"ok", s.failed == 0},
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
}

}  // namespace deltacast::tools
