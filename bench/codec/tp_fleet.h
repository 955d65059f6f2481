#pragma once
// Shared by the placement benchmarks (placement_bytes, placed_apply, slice_digests): one step of
// the trainer simulator on a Llama-like model, the placements of a fleet of vLLM-style TP workers
// (codec::llama_tp_placement), their command line and the median/range of timed rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "codec/digest.h"
#include "codec/owned_weights.h"
#include "codec/placement.h"
#include "codec/tp_placement.h"
#include "sim/model_shape.h"
#include "sim/trainer_simulator.h"

namespace deltacast::bench {

// --params P, --lr L (and, where given, --lr-high H, --rounds N); exits 2 on anything else.
struct StepArgs {
  std::string params = "200M";
  double lr = 1.3e-6;
  double lr_high = 5e-6;
  int rounds = 5;
  StepArgs(int argc, char** argv, std::string default_params) : params(std::move(default_params)) {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
      if (a == "--params")
        params = next();
      else if (a == "--lr")
        lr = std::stod(next());
      else if (a == "--lr-high")
        lr_high = std::stod(next());
      else if (a == "--rounds")
        rounds = std::stoi(next());
      else {
        std::fprintf(stderr, "unknown argument %s\n", a.c_str());
        std::exit(2);
      }
    }
  }
};

// Versions a (one step) and b (the next) of the simulated model of `params` at learning rate
// `lr` (seed 1, 2 threads), and a's digest.
struct SimStep {
  std::unique_ptr<codec::OwnedWeights> a, b;
  codec::StateDigest base_digest;
  SimStep(const std::string& params, double lr) {
    sim::SimConfig cfg;
    cfg.params = sim::parse_param_count(params);
    cfg.lr = static_cast<float>(lr);
    cfg.seed = 1;
    cfg.threads = 2;
    sim::TrainerSimulator trainer(cfg);
    trainer.step();
    a = std::make_unique<codec::OwnedWeights>(trainer.bf16_weights());
    trainer.step();
    b = std::make_unique<codec::OwnedWeights>(trainer.bf16_weights());
    base_digest = codec::StateDigest::full_scan(a->view(), 2);
  }
  const codec::Manifest& manifest() const { return a->manifest(); }
};

// The placements of TP ranks 0..t-1.
inline std::vector<std::shared_ptr<const codec::Placement>> tp_placements(const codec::Manifest& m, uint32_t t) {
  std::vector<std::shared_ptr<const codec::Placement>> out;
  for (uint32_t r = 0; r < t; ++r)
    out.push_back(
        std::make_shared<const codec::Placement>(codec::Placement::compile(m, codec::llama_tp_placement(m, r, t))));
  return out;
}

// What the producer knows of those placements.
inline std::shared_ptr<codec::HeldSlices> held_by(const std::vector<std::shared_ptr<const codec::Placement>>& fleet) {
  auto held = std::make_shared<codec::HeldSlices>();
  for (const auto& p : fleet) held->add(*p);
  return held;
}

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Values over rounds: median and range.
struct Range {
  std::vector<double> v;
  double median() const {
    auto s = v;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
  double lo() const { return *std::min_element(v.begin(), v.end()); }
  double hi() const { return *std::max_element(v.begin(), v.end()); }
};

}  // namespace deltacast::bench
