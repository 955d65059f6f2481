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

// A producer group's rank simulates its part only: the bits of its ranges are a whole
// simulation's, at every step; tensors outside the part have no buffer.
TEST(TrainerSimulator, APartHoldsExactlyTheWholeSimulationsBitsOfItsRanges) {
  TrainerSimulator whole(small(5e-6f, 3, 2));
  const codec::Manifest& m = whole.manifest();
  ASSERT_GE(m.size(), 4u);
  // The largest tensor: two ranges off the random streams' batches and within one batch of each
  // other (so a merge is needed: a doubly stepped element would differ), and a one-element range.
  uint32_t big = 0;
  for (uint32_t t = 0; t < m.size(); ++t)
    if (m.at(t).numel() > m.at(big).numel()) big = t;
  const uint64_t n = m.at(big).numel();
  ASSERT_GT(n, 150'000u);
  const uint32_t whole_tensor = big == 0 ? 1 : 0;
  SimConfig c = small(5e-6f, 3, 1);
  c.part = {
      {big, 1001, 70'003}, {big, 70'010, 70'011}, {big, n - 77, n}, {whole_tensor, 0, m.at(whole_tensor).numel()}};
  TrainerSimulator part(c);
  ASSERT_EQ(part.manifest().digest(), m.digest());
  for (int step = 0; step <= 3; ++step) {
    const auto w = whole.bf16_weights(), p = part.bf16_weights();
    for (uint32_t t = 0; t < m.size(); ++t) {
      if (t == big || t == whole_tensor) {
        ASSERT_EQ(p.tensors[t].size(), m.at(t).nbytes()) << t;
      } else {
        EXPECT_TRUE(p.tensors[t].empty()) << t;
      }
    }
    for (const auto& r : c.part)
      EXPECT_EQ(std::memcmp(p.tensors[r.tensor].data() + 2 * r.begin, w.tensors[r.tensor].data() + 2 * r.begin,
                            2 * (r.end - r.begin)),
                0)
          << "step " << step << " tensor " << r.tensor << " [" << r.begin << ", " << r.end << ")";
    // Far from every range, the part's buffer was never written: zeros.
    std::vector<std::byte> zeros(2 * 1000);
    EXPECT_EQ(std::memcmp(p.tensors[big].data() + 2 * 100'000, zeros.data(), zeros.size()), 0);
    whole.step();
    part.step();
  }
  EXPECT_EQ(part.step_index(), 4u);
}

TEST(TrainerSimulator, RefusesAPartRangeOutsideItsTensor) {
  SimConfig c = small();
  TrainerSimulator whole(c);
  c.part = {{0, 0, whole.manifest().at(0).numel() + 1}};
  EXPECT_THROW(TrainerSimulator{c}, Error);
  c.part = {{static_cast<uint32_t>(whole.manifest().size()), 0, 1}};
  EXPECT_THROW(TrainerSimulator{c}, Error);
}

}  // namespace
}  // namespace deltacast::sim
