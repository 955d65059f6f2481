#include "codec/location_coding.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#ifdef DELTACAST_HAVE_X86_KERNELS
#include <immintrin.h>
#endif

#include "codec/bitstream.h"
#include "codec/simd.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::codec {

namespace {

constexpr unsigned kMaxRiceK = 40;

// Position gaps (first position, then pos[i] - pos[i-1] - 1) of c >= 1 ascending positions.
DC_HOT_CLONES void position_gaps(const uint32_t* pos, size_t c, uint32_t* gaps) {
  gaps[0] = pos[0];
  for (size_t i = 1; i < c; ++i) gaps[i] = pos[i] - pos[i - 1] - 1;
}

// Bytes of the LEB128 varints of the gaps.
DC_HOT_CLONES uint64_t varint_cost_bytes(const uint32_t* gaps, size_t c) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < c; ++i) {
    const uint32_t g = gaps[i];
    bytes += 1u + (g >= (1u << 7)) + (g >= (1u << 14)) + (g >= (1u << 21)) + (g >= (1u << 28));
  }
  return bytes;
}

// Sums of g >> k (over codes below the escape) and counts of escaped codes, for three parameters
// (a shift by 32 or more gives 0 for these 32-bit gaps).
struct RiceSums {
  uint64_t quotients[3] = {};
  uint64_t escaped[3] = {};
};
DC_HOT_CLONES RiceSums rice_sums(const uint32_t* gaps, size_t count, unsigned k0, unsigned k1, unsigned k2) {
  RiceSums r;
  const uint32_t keep0 = k0 < 32 ? ~0u : 0u, keep1 = k1 < 32 ? ~0u : 0u, keep2 = k2 < 32 ? ~0u : 0u;
  k0 &= 31;
  k1 &= 31;
  k2 &= 31;
  // 32-bit lane sums: below 2^26 codes of quotient < 32 each cannot overflow.
  constexpr size_t kBlock = size_t{1} << 26;
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t end = std::min(count, at + kBlock);
    uint32_t q0 = 0, q1 = 0, q2 = 0, e0 = 0, e1 = 0, e2 = 0;
    for (size_t i = at; i < end; ++i) {
      const uint32_t g = gaps[i];
      const uint32_t a = (g >> k0) & keep0, b = (g >> k1) & keep1, c = (g >> k2) & keep2;
      q0 += a < kRiceEscape ? a : 0;
      q1 += b < kRiceEscape ? b : 0;
      q2 += c < kRiceEscape ? c : 0;
      e0 += a >= kRiceEscape;
      e1 += b >= kRiceEscape;
      e2 += c >= kRiceEscape;
    }
    r.quotients[0] += q0;
    r.quotients[1] += q1;
    r.quotients[2] += q2;
    r.escaped[0] += e0;
    r.escaped[1] += e1;
    r.escaped[2] += e2;
  }
  return r;
}

// The best Rice parameter for a gap sequence whose gaps sum to `sum`, and its exact cost in bits:
// the mean suggests k0 (Golomb's rule for geometric gaps); k0-1, k0 and k0+1 are costed exactly in
// one fused pass.
std::pair<unsigned, uint64_t> best_rice(const uint32_t* gaps, size_t count, uint64_t sum) {
  if (count == 0) return {0, 0};
  const double mean = static_cast<double>(sum) / static_cast<double>(count);
  const int k0 = mean * 0.69 >= 1 ? static_cast<int>(std::floor(std::log2(mean * 0.69))) : 0;
  const unsigned kc[3] = {static_cast<unsigned>(std::max(0, k0 - 1)), static_cast<unsigned>(std::min<int>(k0, kMaxRiceK)),
                          static_cast<unsigned>(std::min<int>(k0 + 1, kMaxRiceK))};
  const RiceSums sums = rice_sums(gaps, count, kc[0], kc[1], kc[2]);
  // Escaped codes (rare: long gaps) are costed exactly in one pass for the three parameters; the
  // escapes of a larger parameter are a subset of those of a smaller one.
  uint64_t escaped_bits[3] = {0, 0, 0};
  if (sums.escaped[0]) {
    const uint64_t lowest = uint64_t{kRiceEscape} << kc[0];
    for (size_t i = 0; i < count; ++i)
      if (gaps[i] >= lowest) [[unlikely]]
        for (int j = 0; j < 3; ++j)
          if ((uint64_t{gaps[i]} >> kc[j]) >= kRiceEscape) escaped_bits[j] += rice_cost_bits(gaps[i], kc[j]);
  }
  unsigned best_k = kc[0];
  uint64_t best_bits = UINT64_MAX;
  for (int j = 0; j < 3; ++j) {
    const uint64_t total = sums.quotients[j] + (count - sums.escaped[j]) * (1 + kc[j]) + escaped_bits[j];
    if (total < best_bits) {
      best_bits = total;
      best_k = kc[j];
    }
  }
  return {best_k, best_bits};
}

// Appends the changes i in [from, c) of class j, in position order, at order_out (their indexes)
// and rank_out (their ranks); returns how many there are. Branch-free: every change is written at the next
// slot, which only advances for class j, so up to kGatherSlack slots past the class's changes are
// overwritten (the caller provides them; they belong to the next class or are spare).
constexpr size_t kGatherSlack = 8;
DC_HOT_CLONES size_t gather_class_portable(const uint8_t* cls, const uint32_t* rank, size_t from, size_t c, unsigned j,
                                           uint32_t* order_out, uint32_t* rank_out) {
  size_t n = 0;
  for (size_t i = from; i < c; ++i) {
    order_out[n] = static_cast<uint32_t>(i);
    rank_out[n] = rank[i];
    n += cls[i] == j ? 1 : 0;
  }
  return n;
}

#ifdef DELTACAST_HAVE_X86_KERNELS
// Lane indexes that move the selected lanes of an 8-lane vector to its front, per 8-bit mask.
struct CompactTable {
  uint64_t lanes[256];
  constexpr CompactTable() : lanes{} {
    for (unsigned m = 0; m < 256; ++m) {
      unsigned at = 0;
      for (unsigned l = 0; l < 8; ++l)
        if ((m >> l) & 1) lanes[m] |= uint64_t{l} << (8 * at++);
    }
  }
};
constexpr CompactTable kCompact{};

// gather_class_portable, 8 changes per step with AVX2 (only called when the CPU has it).
__attribute__((target("avx2,popcnt"))) size_t gather_class_avx2(const uint8_t* cls, const uint32_t* rank, size_t c,
                                                                 unsigned j, uint32_t* order_out, uint32_t* rank_out) {
  const __m256i want = _mm256_set1_epi32(static_cast<int>(j));
  const __m256i step = _mm256_set1_epi32(8);
  __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  size_t n = 0, i = 0;
  for (; i + 8 <= c; i += 8) {
    uint64_t bytes;
    std::memcpy(&bytes, cls + i, 8);
    const __m256i classes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes)));
    const unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(classes, want))));
    const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kCompact.lanes[mask])));
    const __m256i ranks = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rank + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(order_out + n), _mm256_permutevar8x32_epi32(index, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rank_out + n), _mm256_permutevar8x32_epi32(ranks, perm));
    n += static_cast<size_t>(__builtin_popcount(mask));
    index = _mm256_add_epi32(index, step);
  }
  return n + gather_class_portable(cls, rank, i, c, j, order_out + n, rank_out + n);
}
#endif

size_t gather_class(const uint8_t* cls, const uint32_t* rank, size_t c, unsigned j, uint32_t* order_out,
                    uint32_t* rank_out) {
#ifdef DELTACAST_HAVE_X86_KERNELS
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  if (avx2) return gather_class_avx2(cls, rank, c, j, order_out, rank_out);
#endif
  return gather_class_portable(cls, rank, 0, c, j, order_out, rank_out);
}

// BitReader::get_rice_positions compiled per ISA level (tzcnt, shrx where the CPU has them). An
// exception cannot leave a GCC 12 target_clones function (the process terminates instead: a
// corrupt stream would kill the receiver), so the clone catches and read_rice_positions rethrows.
DC_HOT_CLONES bool read_rice_positions_clone(BitReader& br, unsigned k, uint64_t count, uint64_t limit, uint32_t* out,
                                             const char* past_end, Error* failure) {
  try {
    br.get_rice_positions(k, count, limit, out, past_end);
    return true;
  } catch (const Error& e) {
    *failure = e;
    return false;
  }
}
void read_rice_positions(BitReader& br, unsigned k, uint64_t count, uint64_t limit, uint32_t* out,
                         const char* past_end) {
  Error failure(Errc::internal, "");
  if (!read_rice_positions_clone(br, k, count, limit, out, past_end, &failure)) throw failure;
}

double group_cost_bits(double n, double c) {
  if (c <= 0 || c >= n) return 0;
  return c * std::log2(n / c) + (n - c) * std::log2(n / (n - c));
}

}  // namespace

LocationPlan encode_locations(const SegmentChanges& changes, std::vector<std::byte>& out) {
  const auto& pos = changes.scan->positions;
  const uint64_t n = changes.element_count;
  const size_t c = pos.size();
  LocationPlan plan;
  if (c == 0) return plan;
  if (c == n) {
    plan.coding = LocationCoding::range;
    return plan;
  }
  thread_local ScanVector<uint32_t> gaps, rank_gaps, class_ranks;
  gaps.resize(c);
  position_gaps(pos.data(), c, gaps.data());
  const auto [gap_k, gap_bits] = best_rice(gaps.data(), c, uint64_t{pos[c - 1]} + 1 - c);
  const uint64_t gaps_bytes = 1 + (gap_bits + 7) / 8;
  const uint64_t bitmap_bytes = (n + 7) / 8;

  // Classed: gaps between ranks inside each class, classes concatenated.
  const unsigned k_classes = changes.classes.count;
  ScanVector<uint32_t> class_order;
  uint64_t class_counts[kMaxClasses] = {};
  unsigned class_k[kMaxClasses] = {};
  uint64_t classed_bits = 0;
  uint64_t classed_bytes = UINT64_MAX;
  if (k_classes > 1) {
    const uint8_t* cls = changes.scan->change_class.data();
    const uint32_t* rank = changes.scan->change_rank.data();
    // Class by class (one pass each, classes in order): indexes, ranks, then the rank gaps.
    class_order.resize(c + kGatherSlack);
    class_ranks.resize(c + kGatherSlack);
    rank_gaps.resize(c);
    uint64_t start = 0;
    for (unsigned j = 0; j < k_classes; ++j) {
      const size_t m = gather_class(cls, rank, c, j, class_order.data() + start, class_ranks.data() + start);
      class_counts[j] = m;
      if (m > 0) {
        const uint32_t* r = class_ranks.data() + start;
        position_gaps(r, m, rank_gaps.data() + start);
        const auto [kj, bj] = best_rice(rank_gaps.data() + start, m, uint64_t{r[m - 1]} + 1 - m);
        class_k[j] = kj;
        classed_bits += bj;
      }
      start += m;
    }
    class_order.resize(c);
    classed_bytes = 1 + 4 * (k_classes - 1) + 9 * k_classes + (classed_bits + 7) / 8;
  }
  // Varints take at least a byte per change: when another coding is already that small, they
  // cannot be chosen (they must be strictly smaller than gaps and classed_gaps, and no larger than
  // the bitmap), so they are not costed.
  const bool varint_may_win = std::min(gaps_bytes, classed_bytes) > c && bitmap_bytes >= c;
  const uint64_t varint_bytes = varint_may_win ? varint_cost_bytes(gaps.data(), c) : UINT64_MAX;

  const uint64_t best = std::min({gaps_bytes, bitmap_bytes, classed_bytes, varint_bytes});
  if (best == classed_bytes) {
    plan.coding = LocationCoding::classed_gaps;
    ByteWriter w(out);
    w.u8(static_cast<uint8_t>(k_classes));
    for (unsigned j = 0; j + 1 < k_classes; ++j) w.u32(changes.classes.thresholds[j]);
    for (unsigned j = 0; j < k_classes; ++j) w.u64(class_counts[j]);
    for (unsigned j = 0; j < k_classes; ++j) w.u8(static_cast<uint8_t>(class_k[j]));
    const size_t at = out.size();
    out.resize(at + (classed_bits + 7) / 8);
    SpanBitWriter bw(out.data() + at);
    const uint32_t* g = rank_gaps.data();
    for (unsigned j = 0; j < k_classes; ++j)
      for (uint64_t i = 0; i < class_counts[j]; ++i) bw.put_rice(*g++, class_k[j]);
    DC_ASSERT(bw.flush() == out.data() + out.size());
    plan.order = std::move(class_order);
  } else if (best == varint_bytes && varint_bytes < gaps_bytes) {
    plan.coding = LocationCoding::gap_varint;
    ByteWriter varints(out);
    for (size_t i = 0; i < c; ++i) varints.leb128(gaps[i]);
  } else if (best == gaps_bytes) {
    plan.coding = LocationCoding::gaps;
    ByteWriter(out).u8(static_cast<uint8_t>(gap_k));
    const size_t at = out.size();
    out.resize(at + (gap_bits + 7) / 8);
    SpanBitWriter bw(out.data() + at);
    for (size_t i = 0; i < c; ++i) bw.put_rice(gaps[i], gap_k);
    DC_ASSERT(bw.flush() == out.data() + out.size());
  } else {
    plan.coding = LocationCoding::bitmap;
    const size_t at = out.size();
    out.resize(at + bitmap_bytes, std::byte{0});
    for (uint32_t p : pos) out[at + p / 8] |= static_cast<std::byte>(1u << (p % 8));
  }
  return plan;
}

void decode_locations(LocationCoding coding, uint64_t n, uint64_t change_count, uint32_t abs_mask,
                      std::span<const std::byte>& in, DecodedLocations& out) {
  out.coding = coding;
  auto& positions = out.positions;
  positions.clear();
  // Checked before anything below is sized by change_count.
  if (change_count > n) throw Error(Errc::corrupt_frame, "locations: more changes announced than the segment has elements");
  switch (coding) {
    case LocationCoding::none:
      if (change_count != 0) throw Error(Errc::corrupt_frame, "locations: 'none' coding with changes announced");
      return;
    case LocationCoding::range:
      if (change_count != n) throw Error(Errc::corrupt_frame, "locations: 'range' coding must change every element");
      positions.resize(n);
      for (uint64_t i = 0; i < n; ++i) positions[i] = static_cast<uint32_t>(i);
      return;
    case LocationCoding::bitmap: {
      const uint64_t bytes = (n + 7) / 8;
      if (in.size() < bytes) throw Error(Errc::corrupt_frame, "locations: truncated bitmap");
      positions.reserve(change_count);
      for (uint64_t b = 0; b < bytes; ++b) {
        unsigned v = static_cast<uint8_t>(in[b]);
        while (v) {
          const uint64_t p = b * 8 + static_cast<unsigned>(std::countr_zero(v));
          if (p >= n) throw Error(Errc::corrupt_frame, "locations: bitmap marks an element past the segment end");
          positions.push_back(static_cast<uint32_t>(p));
          v &= v - 1;
        }
      }
      if (positions.size() != change_count)
        throw Error(Errc::corrupt_frame, "locations: bitmap holds " + std::to_string(positions.size()) +
                                             " changes, segment announces " + std::to_string(change_count));
      in = in.subspan(bytes);
      return;
    }
    case LocationCoding::gaps: {
      ByteReader wr(in, "locations");
      const unsigned k = wr.get<uint8_t>();
      if (k > kMaxRiceK) throw Error(Errc::corrupt_frame, "locations: Rice parameter out of range");
      const auto rest = in.subspan(1);
      BitReader br(rest);
      if (change_count > 8 * rest.size())  // every Rice code takes at least one bit
        throw Error(Errc::corrupt_frame, "locations: more gaps announced than the stream can hold");
      positions.resize(change_count);
      read_rice_positions(br, k, change_count, n, positions.data(), "locations: position past the segment end");
      in = rest.subspan(br.bytes_consumed(rest.data()));
      return;
    }
    case LocationCoding::gap_varint: {
      if (change_count > in.size())  // every varint takes at least one byte
        throw Error(Errc::corrupt_frame, "locations: more varint gaps announced than the stream can hold");
      positions.reserve(change_count);
      uint64_t next = 0;
      size_t at = 0;
      for (uint64_t i = 0; i < change_count; ++i) {
        uint64_t g = 0;
        for (unsigned shift = 0;; shift += 7) {
          if (at >= in.size()) throw Error(Errc::corrupt_frame, "locations: truncated varint gap");
          if (shift > 35) throw Error(Errc::corrupt_frame, "locations: varint gap too long");
          const uint8_t b = static_cast<uint8_t>(in[at++]);
          g |= uint64_t{b & 0x7Fu} << shift;
          if (!(b & 0x80)) break;
        }
        if (g >= n || next + g >= n) throw Error(Errc::corrupt_frame, "locations: position past the segment end");
        positions.push_back(static_cast<uint32_t>(next + g));
        next += g + 1;
      }
      in = in.subspan(at);
      return;
    }
    case LocationCoding::classed_gaps: {
      ByteReader wr(in, "locations");
      const unsigned k = wr.get<uint8_t>();
      if (k < 2 || k > kMaxClasses) throw Error(Errc::corrupt_frame, "locations: class count out of range");
      ClassSpec& spec = out.classes;
      spec = ClassSpec{};
      spec.count = k;
      for (unsigned j = 0; j + 1 < k; ++j) {
        spec.thresholds[j] = wr.get<uint32_t>();
        if (spec.thresholds[j] > abs_mask || (j > 0 && spec.thresholds[j] <= spec.thresholds[j - 1]))
          throw Error(Errc::corrupt_frame, "locations: class thresholds not ascending or out of range");
      }
      std::vector<uint64_t> counts(k);
      uint64_t total = 0;
      for (unsigned j = 0; j < k; ++j) {
        counts[j] = wr.get<uint64_t>();
        if (counts[j] > n) throw Error(Errc::corrupt_frame, "locations: class change count exceeds segment size");
        total += counts[j];
      }
      if (total != change_count)
        throw Error(Errc::corrupt_frame, "locations: class change counts do not add up to the segment's changes");
      std::vector<unsigned> ks(k);
      for (unsigned j = 0; j < k; ++j) {
        ks[j] = wr.get<uint8_t>();
        if (ks[j] > kMaxRiceK) throw Error(Errc::corrupt_frame, "locations: Rice parameter out of range");
      }
      const auto rest = in.subspan(wr.position());
      BitReader br(rest);
      if (change_count > 8 * rest.size())  // every Rice code takes at least one bit
        throw Error(Errc::corrupt_frame, "locations: more ranks announced than the stream can hold");
      auto& ranks = out.ranks;  // capacity reused across segments
      if (ranks.size() < k) ranks.resize(k);
      for (unsigned j = 0; j < k; ++j) {
        ranks[j].resize(counts[j]);
        read_rice_positions(br, ks[j], counts[j], n, ranks[j].data(), "locations: class rank past the segment end");
      }
      in = rest.subspan(br.bytes_consumed(rest.data()));
      return;
    }
  }
  throw Error(Errc::corrupt_frame, "locations: unknown coding");
}

ClassSpec choose_classes(const std::vector<uint64_t>& hist_all, const std::vector<uint64_t>& hist_changed,
                         unsigned mantissa_bits) {
  ClassSpec none;
  std::vector<uint32_t> exps;
  uint64_t n_all = 0, n_chg = 0;
  for (uint32_t e = 0; e < hist_all.size(); ++e)
    if (hist_all[e]) {
      exps.push_back(e);
      n_all += hist_all[e];
      n_chg += hist_changed[e];
    }
  if (exps.size() < 2 || n_chg < 32 || n_chg == n_all) return none;
  const size_t m = exps.size();
  std::vector<double> pre_n(m + 1, 0), pre_c(m + 1, 0);
  for (size_t i = 0; i < m; ++i) {
    pre_n[i + 1] = pre_n[i] + static_cast<double>(hist_all[exps[i]]);
    pre_c[i + 1] = pre_c[i] + static_cast<double>(hist_changed[exps[i]]);
  }
  auto cost = [&](size_t i, size_t j) { return group_cost_bits(pre_n[j] - pre_n[i], pre_c[j] - pre_c[i]); };
  constexpr unsigned kUse = 4;  // at most 4 classes: 6 saved <0.5% and cost 2 more masks per block
  const double inf = 1e300;
  // dp[g][j]: best cost of the first j exponents in g groups; cut[g][j]: start of the last group.
  std::vector<std::vector<double>> dp(kUse + 1, std::vector<double>(m + 1, inf));
  std::vector<std::vector<size_t>> cut(kUse + 1, std::vector<size_t>(m + 1, 0));
  dp[0][0] = 0;
  for (unsigned g = 1; g <= kUse; ++g)
    for (size_t j = 1; j <= m; ++j)
      for (size_t i = g - 1; i < j; ++i)
        if (dp[g - 1][i] < inf) {
          const double v = dp[g - 1][i] + cost(i, j);
          if (v < dp[g][j]) {
            dp[g][j] = v;
            cut[g][j] = i;
          }
        }
  // More classes must pay for their header and for sampling noise: 1% of the unclassed cost each.
  const double base = dp[1][m];
  unsigned best_g = 1;
  double best = base;
  for (unsigned g = 2; g <= kUse && g <= m; ++g) {
    const double v = dp[g][m] + 0.01 * base * (g - 1);
    if (v < best) {
      best = v;
      best_g = g;
    }
  }
  if (best_g == 1 || best > 0.97 * base) return none;
  ClassSpec spec;
  spec.count = best_g;
  size_t j = m;
  for (unsigned g = best_g; g >= 2; --g) {
    const size_t i = cut[g][j];
    spec.thresholds[g - 2] = exps[i] << mantissa_bits;
    j = i;
  }
  return spec;
}

}  // namespace deltacast::codec
