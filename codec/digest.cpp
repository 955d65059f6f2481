#include "codec/digest.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include <xxhash.h>

#include "codec/element_bits.h"
#include "codec/simd.h"
#include "util/error.h"

namespace deltacast::codec {

namespace {
DC_INLINE uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ULL;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ULL;
  x ^= x >> 32;
  return x;
}
DC_INLINE uint64_t tensor_seed(uint32_t tensor_index) { return mix64(uint64_t{tensor_index} + 0x51ED2701F3A5C0B1ULL); }

// Sum of element_hash_seeded over n elements, with the same value mod 2^64 as the scalar sum, in
// 32-bit lanes so that the loop vectorises: only the high halves' sum mod 2^32 matters (it is
// shifted up by 32), and the low halves are summed as 16-bit pieces, which 32-bit lanes hold
// for up to 2^16 elements before they are folded into 64 bits. The index word steps by a
// constant inside each 2^32 block of indexes.
// `p` need not be aligned to T (load_unit): a safetensors tensor may start at any byte offset.
template <typename T>
DC_INLINE uint64_t sum_terms(const std::byte* p, uint64_t n, uint64_t first_index, uint64_t seed) {
  using namespace detail;
  uint32_t sum_hi = 0;
  uint64_t sum_lo = 0;
  const uint32_t seed_hi = static_cast<uint32_t>(seed >> 32);
  while (n > 0) {
    const uint64_t to_block_end = (uint64_t{1} << 32) - (first_index & 0xFFFFFFFFu);
    const uint64_t m = std::min({n, to_block_end, uint64_t{1} << 16});
    uint32_t u = digest_index_word(seed, first_index);
    uint32_t lo_low = 0, lo_high = 0;  // sums of the low and high 16 bits of the low halves
    for (uint64_t i = 0; i < m; ++i) {
      const uint32_t hi = digest_term_hi(u, load_unit<T>(p, i));
      const uint32_t lo = digest_term_lo(hi, seed_hi);
      sum_hi += hi;
      lo_low += lo & 0xFFFFu;
      lo_high += lo >> 16;
      u += kDigestIndexMul;
    }
    sum_lo += uint64_t{lo_low} + (uint64_t{lo_high} << 16);
    p += m * sizeof(T);
    n -= m;
    first_index += m;
  }
  return (uint64_t{sum_hi} << 32) + sum_lo;
}
DC_HOT_CLONES uint64_t sum_terms_u8(const std::byte* p, uint64_t n, uint64_t first, uint64_t seed) {
  return sum_terms<uint8_t>(p, n, first, seed);
}
DC_HOT_CLONES uint64_t sum_terms_u16(const std::byte* p, uint64_t n, uint64_t first, uint64_t seed) {
  return sum_terms<uint16_t>(p, n, first, seed);
}
DC_HOT_CLONES uint64_t sum_terms_u32(const std::byte* p, uint64_t n, uint64_t first, uint64_t seed) {
  return sum_terms<uint32_t>(p, n, first, seed);
}

// changes_digest_delta in 32-bit lanes: index first + p has the low word lo32(first) + p (mod 2^32)
// and the high word hi32(first) plus the carry out of that sum. Only the high halves' difference
// mod 2^32 matters (it is shifted up by 32); the low halves are summed in 64 bits.
DC_HOT_CLONES uint64_t sum_change_terms(uint64_t seed, uint64_t first, const uint32_t* positions,
                                        const uint32_t* old_bits, const uint32_t* new_bits, size_t count) {
  using namespace detail;
  const uint32_t first_lo = static_cast<uint32_t>(first);
  const uint32_t first_hi = static_cast<uint32_t>(first >> 32);
  const uint32_t seed_lo = static_cast<uint32_t>(seed);
  const uint32_t seed_hi = static_cast<uint32_t>(seed >> 32);
  uint32_t diff_hi = 0;
  uint64_t diff_lo = 0;
  for (size_t k = 0; k < count; ++k) {
    const uint32_t lo = first_lo + positions[k];
    const uint32_t carry = lo < first_lo ? 1u : 0u;
    const uint32_t u = lo * kDigestIndexMul + (first_hi + carry) * kDigestIndexHiMul + seed_lo;
    const uint32_t hi_new = digest_term_hi(u, new_bits[k]);
    const uint32_t hi_old = digest_term_hi(u, old_bits[k]);
    diff_hi += hi_new - hi_old;
    diff_lo += uint64_t{digest_term_lo(hi_new, seed_hi)} - uint64_t{digest_term_lo(hi_old, seed_hi)};
  }
  return (uint64_t{diff_hi} << 32) + diff_lo;
}

// Sum of the terms of n code units stored at `data`, the first of which has index `first`.
uint64_t digest_range(uint32_t tensor_index, DType dtype, const std::byte* data, uint64_t first, uint64_t n) {
  const uint64_t seed = tensor_seed(tensor_index);
  switch (dtype_unit_size(dtype)) {
    case 1:
      return sum_terms_u8(data, n, first, seed);
    case 2:
      return sum_terms_u16(data, n, first, seed);
    case 4:
      return sum_terms_u32(data, n, first, seed);
    default: DC_ASSERT(false && "bad dtype size");
  }
  return 0;
}
}  // namespace

uint64_t tensor_digest_seed(uint32_t tensor_index) noexcept { return tensor_seed(tensor_index); }

uint64_t element_hash(uint32_t tensor_index, uint64_t element_index, uint32_t bits) noexcept {
  return element_hash_seeded(tensor_seed(tensor_index), element_index, bits);
}

uint64_t changes_digest_delta(uint32_t tensor_index, uint64_t first, const uint32_t* positions,
                              const uint32_t* old_bits, const uint32_t* new_bits, size_t count) noexcept {
  return sum_change_terms(tensor_seed(tensor_index), first, positions, old_bits, new_bits, count);
}

uint64_t tensor_digest(uint32_t tensor_index, DType dtype, std::span<const std::byte> bytes) {
  const size_t w = dtype_unit_size(dtype);
  if (w == 0 || bytes.size() % dtype_size(dtype) != 0)
    throw Error(Errc::invalid_argument, "tensor_digest: buffer size is not a multiple of the element size");
  return digest_range(tensor_index, dtype, bytes.data(), 0, bytes.size() / w);
}

uint64_t slice_digest(uint32_t tensor_index, DType dtype, uint64_t first_element, std::span<const std::byte> bytes) {
  const size_t w = dtype_unit_size(dtype);
  if (w == 0 || bytes.size() % w != 0)
    throw Error(Errc::invalid_argument, "slice_digest: buffer size is not a multiple of the element size");
  return digest_range(tensor_index, dtype, bytes.data(), first_element, bytes.size() / w);
}

StateDigest StateDigest::full_scan(const ConstWeights& weights, unsigned threads) {
  check_weights(weights);
  const auto& m = *weights.manifest;
  std::vector<PartRange> whole;
  for (uint32_t t = 0; t < m.size(); ++t)
    if (m.at(t).units() > 0) whole.push_back({t, 0, m.at(t).units()});
  return part_scan(weights, whole, threads);
}

StateDigest StateDigest::zeros(const Manifest& manifest) {
  const std::vector<std::byte> zero(size_t{1} << 20);
  std::vector<uint64_t> per(manifest.size(), 0);
  for (uint32_t t = 0; t < manifest.size(); ++t) {
    const auto dtype = manifest.at(t).dtype;
    const uint64_t width = dtype_unit_size(dtype);
    const uint64_t block = zero.size() / width;
    const uint64_t units = manifest.at(t).units();
    for (uint64_t first = 0; first < units; first += block)
      per[t] += digest_range(t, dtype, zero.data(), first, std::min(block, units - first));
  }
  return StateDigest(std::move(per));
}

StateDigest StateDigest::part_scan(const ConstWeights& weights, std::span<const PartRange> ranges, unsigned threads) {
  if (weights.manifest == nullptr) throw Error(Errc::invalid_argument, "digest: weights without a manifest");
  const auto& m = *weights.manifest;
  if (weights.tensors.size() != m.size())
    throw Error(Errc::invalid_argument, "digest: " + std::to_string(weights.tensors.size()) +
                                            " buffers for a manifest of " + std::to_string(m.size()) + " tensors");
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // Work items: slices of at most 64 Mi elements so large tensors spread over threads.
  struct Item { uint32_t tensor; uint64_t first, count; };
  std::vector<Item> items;
  constexpr uint64_t kSlice = uint64_t{64} << 20;
  for (const auto& r : ranges) {
    if (r.tensor >= m.size() || r.begin > r.end || r.end > m.at(r.tensor).units())
      throw Error(Errc::invalid_argument, "digest: a range outside its tensor");
    if (weights.tensors[r.tensor].size() != m.at(r.tensor).nbytes())
      throw Error(Errc::invalid_argument, "digest: tensor '" + m.at(r.tensor).name + "' buffer holds " +
                                              std::to_string(weights.tensors[r.tensor].size()) + " bytes, expected " +
                                              std::to_string(m.at(r.tensor).nbytes()));
    for (uint64_t first = r.begin; first < r.end; first += kSlice)
      items.push_back({r.tensor, first, std::min(kSlice, r.end - first)});
  }
  std::vector<uint64_t> partial(items.size(), 0);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t k; (k = next.fetch_add(1)) < items.size();) {
      const auto& it = items[k];
      const auto dtype = m.at(it.tensor).dtype;
      const std::byte* data = weights.tensors[it.tensor].data() + it.first * dtype_unit_size(dtype);
      partial[k] = digest_range(it.tensor, dtype, data, it.first, it.count);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < std::min<size_t>(threads, items.size()); ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  std::vector<uint64_t> per(m.size(), 0);
  for (size_t k = 0; k < items.size(); ++k) per[items[k].tensor] += partial[k];
  return StateDigest(std::move(per));
}

uint64_t StateDigest::combined() const noexcept {
  return XXH3_64bits(per_tensor_.data(), per_tensor_.size() * sizeof(uint64_t));
}

}  // namespace deltacast::codec
