#pragma once
// A SIMULATOR of an RL trainer's weights, for benchmarks, demos and tests. It trains nothing: the
// gradients are random. What it reproduces faithfully is the arithmetic that decides which BF16
// elements change between optimizer steps:
//   - FP32 master weights initialised like a real model (normal, std 0.02; RMSNorm weights near 1),
//   - Adam (beta1 0.9, beta2 0.999, eps 1e-8, bias correction, no weight decay) on heavy-tailed
//     gradients: Student-t with 2 degrees of freedom (closed-form inverse CDF, so it is cheap and
//     vectorises; tails as heavy as the ~3-dof fits reported for LLM gradient noise), scaled by a
//     per-tensor factor,
//   - the published BF16 weights are the master weights cast with round-to-nearest-even after
//     every step (sim/bf16.h).
//   - by default the optimizer starts warm: Adam moments are drawn near their steady state under
//     this noise and bias correction is off, as thousands of steps into a run. A cold (fresh)
//     Adam's first step moves every weight by exactly lr (m/sqrt(v) = sign(g)), which changes ~7%
//     of BF16 elements at lr 2e-6 -- an artefact of starting an optimizer, not of RL refit.
// So the fraction of BF16 elements that change per step comes out of the arithmetic: with
// |update| ~ lr and BF16 spacing |w|/128..|w|/256, small weights cross a rounding boundary more
// often than large ones, and raising lr raises the change rate. Nothing is injected.
// Determinism: every random number is a function of (seed, step, tensor, element) (sim/philox.h),
// so the weights after step k are identical for a seed regardless of the thread count.
// Memory: 14 bytes per parameter (FP32 master + two FP32 Adam moments + the BF16 copy); with a
// `part`, 14 bytes per parameter of the part (a producer group's rank: docs/producer-group.md).
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "codec/manifest.h"
#include "sim/model_shape.h"

namespace deltacast::sim {

// Elements [begin, end) of tensor `tensor` (manifest order).
struct SimRange {
  uint32_t tensor = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SimConfig {
  uint64_t params = 200'000'000;    // target parameter count, turned into a shape by model_shape_for
  std::optional<ModelShape> shape;  // explicit shape; overrides params
  float lr = 2e-6f;                 // Adam learning rate
  uint64_t seed = 0;
  unsigned threads = 2;             // worker threads for initialisation and steps (>= 1)
  float init_std = 0.02f;           // std of the normal initialisation of matrices
  bool warm_optimizer = true;       // start Adam near steady state (see above); false = fresh Adam
  // Simulate only these elements (a producer group's rank holds its part, as a trainer rank holds
  // its shard): their bits are exactly a whole simulation's. A tensor no range touches has no
  // memory and an empty span in bf16_weights(); a tensor a range touches has a span of its whole
  // size, whose elements outside the ranges (rounded out to the random streams' batches) read as
  // zeros and take no memory until touched. Empty: the whole model.
  std::vector<SimRange> part;
};

class TrainerSimulator {
 public:
  // Allocates and initialises the model, or its part (step_index() == 0: the initial checkpoint).
  // Throws Error(invalid_argument) for a bad config (lr not positive and finite, threads 0, tiny
  // params, a part range outside its tensor), std::bad_alloc when memory runs out.
  explicit TrainerSimulator(SimConfig config);
  ~TrainerSimulator();
  TrainerSimulator(const TrainerSimulator&) = delete;
  TrainerSimulator& operator=(const TrainerSimulator&) = delete;

  const codec::Manifest& manifest() const noexcept;
  const ModelShape& shape() const noexcept;
  // Advances one Adam step on fresh random gradients and refreshes the BF16 weights.
  void step();
  // Number of completed steps.
  uint64_t step_index() const noexcept;
  // The current BF16 weights (spans into the simulator; valid until the next step() changes their
  // contents, and until destruction); with a part, empty spans for the tensors outside it. Not
  // thread-safe against a concurrent step().
  codec::ConstWeights bf16_weights() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast::sim
