#include "sim/trainer_simulator.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <new>
#include <numbers>
#include <string>
#include <thread>
#include <vector>

#include "sim/bf16.h"
#include "sim/philox.h"
#include "util/error.h"

namespace deltacast::sim {
namespace {

constexpr float kBeta1 = 0.9f;
constexpr float kBeta2 = 0.999f;
constexpr float kEps = 1e-8f;
constexpr uint64_t kBlockElements = uint64_t{1} << 16;  // unit of work handed to a thread
constexpr size_t kBatch = 4 * kPhiloxLanes;              // elements per inner batch (one Philox call)
static_assert(kBlockElements % kBatch == 0, "batches must align to global element indexes");

struct FreeDelete {
  void operator()(void* p) const noexcept { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], FreeDelete>;

// n elements: malloc (pages first touched by the init threads, in parallel), or calloc where
// elements outside a part must read as zeros (large blocks come from mmap: untouched pages cost
// nothing).
template <typename T>
Buffer<T> allocate(uint64_t n, bool zeroed) {
  void* p =
      zeroed ? std::calloc(std::max<uint64_t>(n, 1), sizeof(T)) : std::malloc(std::max<uint64_t>(n, 1) * sizeof(T));
  if (!p) throw std::bad_alloc();
  return Buffer<T>(static_cast<T*>(p));
}

struct TensorState {
  uint64_t numel = 0;
  bool norm = false;
  float grad_scale = 1.0f;
  Buffer<float> master;
  Buffer<float> m;
  Buffer<float> v;
  Buffer<uint16_t> bf16;  // null: a tensor outside the part (every buffer is)
};

struct Block {
  uint32_t tensor;
  uint64_t begin;
  uint64_t end;
};

// Random streams (Philox counter word 3). Steps use their step number 1, 2, ...
constexpr uint32_t kInitStream = 0;
constexpr uint32_t kWarmStream = 0xFFFFFFFEu;
constexpr uint32_t kScaleStream = 0xFFFFFFFFu;

// The hot kernels are compiled for AVX-512 and AVX2 as well as the baseline, picked at load time.
// Every variant performs the same IEEE operations (no FMA contraction: -ffp-contract=off), so the
// results are bit-identical whichever runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DC_SIM_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DC_SIM_KERNEL
#endif

// Uniforms in (0, 1) for the kBatch elements starting at element `first` (a multiple of kBatch).
// Element first + e takes word e / kPhiloxLanes of counter first / 4 + e % kPhiloxLanes.
DC_SIM_KERNEL void batch_uniforms(uint64_t seed, uint32_t tensor, uint32_t stream, uint64_t first, float* out) {
  uint32_t words[kBatch];
  philox4x32_10_lanes(first / 4, tensor, stream, seed, words);
  for (size_t e = 0; e < kBatch; ++e) out[e] = uniform_open01(words[e]);
}

// Natural log for u in (0, 1], vectorisable: u = 2^e * mant, mant in [1, 2), and
// ln(mant) = 2 atanh(t), t = (mant - 1) / (mant + 1) <= 1/3, by its series to t^11 (error < 1e-7).
// Only initial weights use it, where a sample's last bit does not matter but determinism does.
inline float fast_log(float u) {
  const uint32_t bits = std::bit_cast<uint32_t>(u);
  const float e = static_cast<float>(static_cast<int32_t>(bits >> 23) - 127);
  const float mant = std::bit_cast<float>((bits & 0x007FFFFFu) | 0x3F800000u);
  const float t = (mant - 1.0f) / (mant + 1.0f);
  const float t2 = t * t;
  const float series = 1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9 + t2 * (1.0f / 11)))));
  return e * std::numbers::ln2_v<float> + 2.0f * t * series;
}

// cos and sin of 2*pi*u for u in [0, 1), vectorisable: quadrant from 4u, then Taylor polynomials
// on [0, pi/2] (error < 4e-6).
inline void fast_cos_sin_2pi(float u, float& c, float& s) {
  const float a = 4.0f * u;
  const float quadrant = std::floor(a);
  const float x = (a - quadrant) * (std::numbers::pi_v<float> / 2);
  const float x2 = x * x;
  const float sin_x = x * (1.0f - x2 / 6 * (1.0f - x2 / 20 * (1.0f - x2 / 42 * (1.0f - x2 / 72 * (1.0f - x2 / 110)))));
  const float cos_x = 1.0f - x2 / 2 * (1.0f - x2 / 12 * (1.0f - x2 / 30 * (1.0f - x2 / 56 * (1.0f - x2 / 90))));
  const int q = static_cast<int>(quadrant) & 3;
  // Rotating by q quarter turns: (cos, sin) -> (-sin, cos) per turn.
  c = q == 0 ? cos_x : q == 1 ? -sin_x : q == 2 ? -cos_x : sin_x;
  s = q == 0 ? sin_x : q == 1 ? cos_x : q == 2 ? -sin_x : -cos_x;
}

// Box-Muller over a batch: uniforms (e, e + n/2) become normals at the same positions.
DC_SIM_KERNEL void box_muller(size_t n, const float* __restrict u, float* __restrict out) {
  const size_t half = n / 2;
  for (size_t e = 0; e < half; ++e) {
    const float r = std::sqrt(-2.0f * fast_log(u[e]));
    float c, s;
    fast_cos_sin_2pi(u[e + half], c, s);
    out[e] = r * c;
    out[e + half] = r * s;
  }
}

// Student-t with 2 degrees of freedom by its inverse CDF: (2u - 1) / sqrt(2u(1 - u)).
inline float student_t2(float u) { return (2.0f * u - 1.0f) / std::sqrt(2.0f * u * (1.0f - u)); }

// One Adam step over n elements; `uniforms` are turned into Student-t(2) gradients of scale `scale`.
DC_SIM_KERNEL void adam_kernel(size_t n, const float* __restrict uniforms, float scale, float lr_c1, float c2,
                               float* __restrict master, float* __restrict m, float* __restrict v,
                               uint16_t* __restrict out) {
  for (size_t j = 0; j < n; ++j) {
    const float g = scale * student_t2(uniforms[j]);
    m[j] = kBeta1 * m[j] + (1.0f - kBeta1) * g;
    v[j] = kBeta2 * v[j] + (1.0f - kBeta2) * (g * g);
    master[j] -= lr_c1 * m[j] / (std::sqrt(v[j] * c2) + kEps);
    out[j] = fp32_to_bf16(master[j]);
  }
}

// Initial values for n elements: master = mean + std_dev * noise, moments m = m_scale * t2(warm),
// v = v_value, and the BF16 copy.
DC_SIM_KERNEL void init_kernel(size_t n, const float* __restrict noise, const float* __restrict warm, float mean,
                               float std_dev, float m_scale, float v_value, float* __restrict master,
                               float* __restrict m, float* __restrict v, uint16_t* __restrict out) {
  for (size_t j = 0; j < n; ++j) {
    master[j] = mean + std_dev * noise[j];
    m[j] = m_scale * student_t2(warm[j]);
    v[j] = v_value;
    out[j] = fp32_to_bf16(master[j]);
  }
}

// Steady-state Adam moments under Student-t(2) noise of unit scale, used by the warm start: m is
// an EMA with weight 0.1, so its spread is sqrt(0.1 / 1.9) of the noise's; v is the EMA of g^2
// over ~1/(1 - beta2) = 1000 steps, whose typical value for t(2) noise is the second moment
// truncated at the largest of ~1000 draws: 2 (ln(sqrt(2) * 31) - 1) ~= 5.5.
constexpr float kWarmMSpread = 0.2294f;
constexpr float kWarmV = 5.5f;

}  // namespace

struct TrainerSimulator::Impl {
  SimConfig config;
  ModelShape shape;
  codec::Manifest manifest;
  std::vector<TensorState> tensors;
  std::vector<Block> blocks;
  uint64_t steps = 0;

  explicit Impl(SimConfig c) : config(std::move(c)) {
    if (!(config.lr > 0) || !std::isfinite(config.lr)) {
      throw Error(Errc::invalid_argument, "simulator learning rate must be positive and finite, got " + std::to_string(config.lr));
    }
    if (config.threads == 0) throw Error(Errc::invalid_argument, "simulator needs at least one thread");
    shape = config.shape ? *config.shape : model_shape_for(config.params);
    manifest = codec::Manifest(model_tensors(shape));
    tensors.resize(manifest.size());
    const std::vector<std::vector<Span>> spans = element_spans();
    const bool part = !config.part.empty();
    for (uint32_t t = 0; t < manifest.size(); ++t) {
      auto& ts = tensors[t];
      const auto& info = manifest.at(t);
      ts.numel = info.numel();
      ts.norm = is_norm_tensor(info.name);
      // Per-tensor gradient scale between 1e-5 and 1e-3 (log-uniform): Adam is scale-invariant,
      // but eps is not, so the scale keeps eps as negligible as in real training.
      const PhiloxBlock w = philox4x32_10({0, 0, t, kScaleStream}, config.seed);
      ts.grad_scale = std::pow(10.0f, -5.0f + 2.0f * uniform_open01(w[0]));
      if (spans[t].empty()) continue;
      ts.master = allocate<float>(ts.numel, part);
      ts.m = allocate<float>(ts.numel, part);
      ts.v = allocate<float>(ts.numel, part);
      ts.bf16 = allocate<uint16_t>(ts.numel, part);
      for (const Span& s : spans[t])
        for (uint64_t b = s.begin; b < s.end; b += kBlockElements)
          blocks.push_back(Block{t, b, std::min(s.end, b + kBlockElements)});
    }
    run_blocks([this](const Block& b) { init_block(b); });
  }

  struct Span {
    uint64_t begin, end;
  };

  // Per tensor, the elements to simulate: the whole tensor, or the part's ranges rounded out to
  // whole batches (an element's random numbers come in batches of kBatch) and merged, so no
  // element is stepped twice.
  std::vector<std::vector<Span>> element_spans() const {
    std::vector<std::vector<Span>> spans(manifest.size());
    if (config.part.empty()) {
      for (uint32_t t = 0; t < manifest.size(); ++t)
        if (manifest.at(t).numel() > 0) spans[t].push_back({0, manifest.at(t).numel()});
      return spans;
    }
    for (const SimRange& r : config.part) {
      if (r.tensor >= manifest.size() || r.begin > r.end || r.end > manifest.at(r.tensor).numel())
        throw Error(Errc::invalid_argument, "simulator part: range [" + std::to_string(r.begin) + ", " +
                                                std::to_string(r.end) + ") of tensor " + std::to_string(r.tensor) +
                                                " lies outside the model's " + std::to_string(manifest.size()) +
                                                " tensors or outside its tensor");
      if (r.begin == r.end) continue;
      const uint64_t numel = manifest.at(r.tensor).numel();
      spans[r.tensor].push_back({r.begin / kBatch * kBatch, std::min(numel, (r.end + kBatch - 1) / kBatch * kBatch)});
    }
    for (auto& list : spans) {
      std::sort(list.begin(), list.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
      std::vector<Span> merged;
      for (const Span& s : list) {
        if (!merged.empty() && s.begin <= merged.back().end)
          merged.back().end = std::max(merged.back().end, s.end);
        else
          merged.push_back(s);
      }
      list = std::move(merged);
    }
    return spans;
  }

  template <typename Fn>
  void run_blocks(Fn fn) {
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t i = next.fetch_add(1); i < blocks.size(); i = next.fetch_add(1)) fn(blocks[i]);
    };
    std::vector<std::thread> pool;
    for (unsigned i = 1; i < config.threads; ++i) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();
  }

  void init_block(const Block& b) {
    auto& ts = tensors[b.tensor];
    float u[kBatch], noise[kBatch], warm[kBatch];
    const float std_dev = ts.norm ? 0.05f : config.init_std;
    const float mean = ts.norm ? 1.0f : 0.0f;
    const float scale = ts.grad_scale;
    const float warm_m = config.warm_optimizer ? scale * kWarmMSpread : 0.0f;
    const float warm_v = config.warm_optimizer ? scale * scale * kWarmV : 0.0f;
    for (uint64_t i = b.begin; i < b.end; i += kBatch) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kBatch, b.end - i));
      batch_uniforms(config.seed, b.tensor, kInitStream, i, u);
      box_muller(kBatch, u, noise);
      batch_uniforms(config.seed, b.tensor, kWarmStream, i, warm);
      init_kernel(n, noise, warm, mean, std_dev, warm_m, warm_v, ts.master.get() + i, ts.m.get() + i,
                  ts.v.get() + i, ts.bf16.get() + i);
    }
  }

  void step_block(const Block& b, float lr_c1, float c2) {
    auto& ts = tensors[b.tensor];
    float grad[kBatch];
    const auto stream = static_cast<uint32_t>(steps);
    for (uint64_t i = b.begin; i < b.end; i += kBatch) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kBatch, b.end - i));
      batch_uniforms(config.seed, b.tensor, stream, i, grad);
      adam_kernel(n, grad, ts.grad_scale, lr_c1, c2, ts.master.get() + i, ts.m.get() + i, ts.v.get() + i,
                  ts.bf16.get() + i);
    }
  }

  void step() {
    ++steps;
    if (steps > 0xFFFFFFFEu) throw Error(Errc::state, "simulator step counter exhausted");
    const double t = static_cast<double>(steps);
    // Bias corrections: lr * m / (1 - beta1^t) and v / (1 - beta2^t). A warm optimizer stands in
    // for one thousands of steps into training, where both corrections are 1.
    const bool warm = config.warm_optimizer;
    const auto lr_c1 = static_cast<float>(warm ? config.lr : config.lr / (1.0 - std::pow(double{kBeta1}, t)));
    const auto c2 = static_cast<float>(warm ? 1.0 : 1.0 / (1.0 - std::pow(double{kBeta2}, t)));
    run_blocks([&](const Block& b) { step_block(b, lr_c1, c2); });
  }
};

TrainerSimulator::TrainerSimulator(SimConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
TrainerSimulator::~TrainerSimulator() = default;

const codec::Manifest& TrainerSimulator::manifest() const noexcept { return impl_->manifest; }
const ModelShape& TrainerSimulator::shape() const noexcept { return impl_->shape; }
void TrainerSimulator::step() { impl_->step(); }
uint64_t TrainerSimulator::step_index() const noexcept { return impl_->steps; }

codec::ConstWeights TrainerSimulator::bf16_weights() const {
  codec::ConstWeights w;
  w.manifest = &impl_->manifest;
  for (const auto& ts : impl_->tensors) {
    w.tensors.push_back(ts.bf16 ? std::as_bytes(std::span<const uint16_t>(ts.bf16.get(), ts.numel))
                                : std::span<const std::byte>());
  }
  return w;
}

}  // namespace deltacast::sim
