// The trainer simulator: determinism, realistic change rates from the Adam arithmetic, lr scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "sim/bf16.h"
#include "sim/trainer_simulator.h"
#include "util/error.h"

namespace deltacast::sim {
namespace {

std::vector<std::vector<std::byte>> snapshot(const TrainerSimulator& sim) {
  std::vector<std::vector<std::byte>> out;
  for (const auto& t : sim.bf16_weights().tensors) out.emplace_back(t.begin(), t.end());
  return out;
}

// Fraction of BF16 elements whose bits differ between two snapshots.
double changed_fraction(const std::vector<std::vector<std::byte>>& a, const std::vector<std::vector<std::byte>>& b) {
  uint64_t changed = 0, total = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    const size_t n = a[t].size() / 2;
    for (size_t i = 0; i < n; ++i) changed += std::memcmp(&a[t][2 * i], &b[t][2 * i], 2) != 0;
    total += n;
  }
  return static_cast<double>(changed) / static_cast<double>(total);
}

SimConfig small(float lr = 2e-6f, uint64_t seed = 7, unsigned threads = 2) {
  SimConfig c;
  c.params = 2'000'000;
  c.lr = lr;
  c.seed = seed;
  c.threads = threads;
  return c;
}

TEST(TrainerSimulator, DeterministicForASeedAndIndependentOfThreads) {
  TrainerSimulator a(small(2e-6f, 11, 1)), b(small(2e-6f, 11, 2)), c(small(2e-6f, 12, 2));
  EXPECT_EQ(snapshot(a), snapshot(b));
  EXPECT_NE(snapshot(a), snapshot(c));
  for (int s = 0; s < 3; ++s) {
    a.step();
    b.step();
    c.step();
  }
  EXPECT_EQ(a.step_index(), 3u);
  EXPECT_EQ(snapshot(a), snapshot(b));
  EXPECT_NE(snapshot(a), snapshot(c));
}

TEST(TrainerSimulator, InitialisationLooksLikeAModel) {
  TrainerSimulator sim(small());
  const auto w = sim.bf16_weights();
  const auto& m = sim.manifest();
  double sum_sq = 0;
  uint64_t n = 0;
  for (uint32_t t = 0; t < m.size(); ++t) {
    const auto* v = reinterpret_cast<const uint16_t*>(w.tensors[t].data());
    const uint64_t count = m.at(t).numel();
    if (is_norm_tensor(m.at(t).name)) {
      for (uint64_t i = 0; i < count; ++i) EXPECT_NEAR(bf16_to_fp32(v[i]), 1.0f, 0.5f);
    } else {
      for (uint64_t i = 0; i < count; ++i) sum_sq += double(bf16_to_fp32(v[i])) * bf16_to_fp32(v[i]);
      n += count;
    }
  }
  EXPECT_NEAR(std::sqrt(sum_sq / double(n)), 0.02, 0.001);
}

TEST(TrainerSimulator, ChangeFractionAtLr2e6IsRealistic) {
  TrainerSimulator sim(small());
  auto prev = snapshot(sim);
  for (int s = 0; s < 4; ++s) {
    sim.step();
    auto next = snapshot(sim);
    const double f = changed_fraction(prev, next);
    EXPECT_GE(f, 0.003) << "step " << s + 1;
    EXPECT_LE(f, 0.03) << "step " << s + 1;
    prev = std::move(next);
  }
}

TEST(TrainerSimulator, HigherLearningRateChangesMoreElements) {
  TrainerSimulator low(small(1e-6f)), high(small(1e-5f));
  const auto low0 = snapshot(low), high0 = snapshot(high);
  EXPECT_EQ(low0, high0);  // same seed, same initial model
  low.step();
  high.step();
  low.step();
  high.step();
  EXPECT_GT(changed_fraction(high0, snapshot(high)), 2 * changed_fraction(low0, snapshot(low)));
}

TEST(TrainerSimulator, FreshAdamFirstStepMovesEveryWeightByLr) {
  // With cold moments the first update is exactly lr * sign(g): far more elements change than in
  // the warm (mid-run) regime, which is why the warm start is the default.
  auto cold_config = small();
  cold_config.warm_optimizer = false;
  TrainerSimulator cold(cold_config), warm(small());
  const auto cold0 = snapshot(cold), warm0 = snapshot(warm);
  cold.step();
  warm.step();
  EXPECT_GT(changed_fraction(cold0, snapshot(cold)), 2 * changed_fraction(warm0, snapshot(warm)));
}

TEST(TrainerSimulator, RejectsBadConfig) {
  auto bad_lr = small(-1.0f);
  EXPECT_THROW(TrainerSimulator{bad_lr}, Error);
  auto no_threads = small();
  no_threads.threads = 0;
  EXPECT_THROW(TrainerSimulator{no_threads}, Error);
}

}  // namespace
}  // namespace deltacast::sim
