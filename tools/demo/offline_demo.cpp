#include "tools/demo/offline_demo.h"

#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "codec/applier.h"
#include "codec/encoder.h"
#include "codec/owned_weights.h"
#include "sim/trainer_simulator.h"
#include "util/error.h"

namespace deltacast::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

void run_offline_demo(const DemoOptions& o) {
  sim::SimConfig config;
  config.params = sim::parse_param_count(o.params);
  config.lr = static_cast<float>(o.lr);
  config.seed = o.seed;
  config.threads = o.threads;
  const auto t_init = Clock::now();
  sim::TrainerSimulator trainer(config);
  const auto& manifest = trainer.manifest();
  std::printf(
      "offline demo: SIMULATED trainer, %llu parameters (%.2f GB BF16), lr %g, %u steps, %.1f s to initialise\n",
      static_cast<unsigned long long>(manifest.total_elements()), double(manifest.total_bytes()) / 1e9, o.lr, o.steps,
      seconds_since(t_init));

  // The producer's baseline (last committed weights) and the receiver's buffers.
  codec::OwnedWeights committed(trainer.bf16_weights());
  codec::OwnedWeights receiver(trainer.bf16_weights());
  auto committed_digest = codec::StateDigest::full_scan(committed.view(), o.threads);
  codec::DeltaApplier applier(receiver.manifest(), receiver.mutable_view(), 0, committed_digest);

  codec::EncodeOptions options;
  options.threads = o.threads;
  nlohmann::ordered_json steps = nlohmann::json::array();
  std::printf("%5s %9s %14s %12s %10s %11s %10s\n", "step", "changed%", "payload_bytes", "bytes/change", "%ckpt",
              "encode_GB/s", "apply_GB/s");
  for (unsigned s = 1; s <= o.steps; ++s) {
    trainer.step();
    const auto next = trainer.bf16_weights();
    const auto t_enc = Clock::now();
    const auto delta =
        codec::encode_delta(committed.view(), next, committed_digest, codec::VersionIds{s - 1, s}, options);
    const double encode_s = seconds_since(t_enc);

    const auto t_apply = Clock::now();
    for (const auto& frame : delta.frames) applier.apply(frame);
    applier.verify();
    applier.commit();
    const double apply_s = seconds_since(t_apply);

    const bool same_bits = codec::bitwise_equal(receiver.view(), next);
    const bool same_digest = applier.digest() == delta.new_digest;
    if (!same_bits || !same_digest) {
      throw Error(Errc::verify_failed, "step " + std::to_string(s) + ": receiver is not bit-exact (memcmp " +
                                           (same_bits ? "ok" : "FAILED") + ", digest " +
                                           (same_digest ? "ok" : "FAILED") + ")");
    }
    committed.assign(next);
    committed_digest = delta.new_digest;

    const auto& st = delta.stats;
    const double changed = st.elements ? 100.0 * double(st.changes) / double(st.elements) : 0.0;
    const double per_change = st.changes ? double(st.frame_bytes) / double(st.changes) : 0.0;
    const double pct = st.checkpoint_bytes ? 100.0 * double(st.frame_bytes) / double(st.checkpoint_bytes) : 0.0;
    const double enc_gbps = double(st.checkpoint_bytes) / encode_s / 1e9;
    const double app_gbps = double(st.checkpoint_bytes) / apply_s / 1e9;
    std::printf("%5u %9.3f %14llu %12.3f %10.3f %11.2f %10.2f\n", s, changed,
                static_cast<unsigned long long>(st.frame_bytes), per_change, pct, enc_gbps, app_gbps);
    steps.push_back(nlohmann::ordered_json{{"step", s},
                                           {"changes", st.changes},
                                           {"elements", st.elements},
                                           {"changed_percent", changed},
                                           {"payload_bytes", st.frame_bytes},
                                           {"bytes_per_change", per_change},
                                           {"percent_of_checkpoint", pct},
                                           {"encode_seconds", encode_s},
                                           {"apply_seconds", apply_s},
                                           {"encode_gbps", enc_gbps},
                                           {"apply_gbps", app_gbps},
                                           {"bit_exact", true}});
  }
  std::printf("all %u steps bit-exact (memcmp and digest)\n", o.steps);
  if (!o.json_path.empty()) {
    nlohmann::ordered_json j;
    j["mode"] = "offline";
    j["params"] = manifest.total_elements();
    j["checkpoint_bytes"] = manifest.total_bytes();
    j["lr"] = o.lr;
    j["steps"] = steps;
    std::ofstream out(o.json_path);
    out << j.dump(2) << "\n";
    if (!out) throw Error(Errc::io, "cannot write " + o.json_path);
  }
}

}  // namespace deltacast::tools
