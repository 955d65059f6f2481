// What tensor-parallel receivers cost the payload (docs/placement.md, "Partly held segments"): a
// segment some member holds only partly cannot be coded by class, so the producer codes it by
// positions. This encodes the same simulator step for receivers that hold every tensor whole
// (the baseline, in the same run) and for a fleet of vLLM-style TP workers at T = 2, 4, 8 (q/k/v,
// gate/up, the embedding and lm_head split by rows; o_proj and down_proj by columns; norms whole),
// and prints bytes per change and the ratio to the baseline. Frame bytes are deterministic for
// the data: no timing, nothing to repeat.
// Usage: dc_bench_placement_bytes [--params 200M] [--lr 1.3e-6] [--lr-high 5e-6]
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "codec/encoder.h"
#include "codec/owned_weights.h"
#include "codec/placement.h"
#include "codec/tp_placement.h"
#include "sim/model_shape.h"
#include "sim/trainer_simulator.h"

using namespace deltacast;

int main(int argc, char** argv) {
  std::string params = "200M";
  double lrs[2] = {1.3e-6, 5e-6};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--params")
      params = next();
    else if (a == "--lr")
      lrs[0] = std::stod(next());
    else if (a == "--lr-high")
      lrs[1] = std::stod(next());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("| changed %% | receivers | B/change | vs whole | classed segments |\n| --- | --- | --- | --- | --- |\n");
  for (const double lr : lrs) {
    sim::SimConfig cfg;
    cfg.params = sim::parse_param_count(params);
    cfg.lr = static_cast<float>(lr);
    cfg.seed = 1;
    cfg.threads = 2;
    sim::TrainerSimulator trainer(cfg);
    trainer.step();
    const codec::OwnedWeights a(trainer.bf16_weights());
    trainer.step();
    const codec::OwnedWeights b(trainer.bf16_weights());
    const auto& m = a.manifest();
    const auto base_digest = codec::StateDigest::full_scan(a.view(), 2);
    double whole = 0;
    for (const uint32_t t : {1u, 2u, 4u, 8u}) {
      codec::EncodeOptions o;
      o.threads = 2;
      if (t > 1) {
        auto held = std::make_shared<codec::HeldSlices>();
        for (uint32_t r = 0; r < t; ++r) held->add(codec::Placement::compile(m, codec::llama_tp_placement(m, r, t)));
        o.held_slices = held;
      }
      const auto stats = codec::encode_delta(a.view(), b.view(), base_digest, {0, 1}, o).stats;
      const double per_change = static_cast<double>(stats.frame_bytes) / static_cast<double>(stats.changes);
      if (t == 1) whole = per_change;
      uint64_t segments = 0;
      for (const uint64_t s : stats.segments_by_coding) segments += s;
      std::printf("| %.2f | %s | %.3f | %.3f | %llu of %llu |\n",
                  100.0 * static_cast<double>(stats.changes) / static_cast<double>(stats.elements),
                  t == 1 ? "whole" : ("TP=" + std::to_string(t)).c_str(), per_change, per_change / whole,
                  static_cast<unsigned long long>(
                      stats.segments_by_coding[static_cast<int>(codec::LocationCoding::classed_gaps)]),
                  static_cast<unsigned long long>(segments));
      std::fflush(stdout);
    }
  }
  return 0;
}
