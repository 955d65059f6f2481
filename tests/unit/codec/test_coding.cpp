// Bit streams, Rice codes, the scan kernels (AVX-512 vs portable) and the location coding choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "codec/bitstream.h"
#include "codec/digest.h"
#include "codec/location_coding.h"
#include "codec/scan.h"
#include "codec_test_util.h"

namespace deltacast::codec {
void scan_changes_generic(unsigned, uint32_t, const void*, const void*, uint64_t, const ClassSpec*, ScanOutput&,
                          const ScanTap&);
void select_positions_generic(unsigned, uint32_t, const void*, uint64_t, const ClassSpec&,
                              const std::vector<ScanVector<uint32_t>>&, ScanVector<uint32_t>&, ScanVector<uint32_t>&,
                              ScanVector<uint32_t>&);
#if defined(__x86_64__)
// The plain AVX2 kernels (broadword select); the dispatcher may prefer the PDEP variant here.
void scan_changes_avx2(unsigned, uint32_t, const void*, const void*, uint64_t, const ClassSpec*, ScanOutput&,
                       const ScanTap&);
void select_positions_avx2(unsigned, uint32_t, const void*, uint64_t, const ClassSpec&,
                           const std::vector<ScanVector<uint32_t>>&, ScanVector<uint32_t>&, ScanVector<uint32_t>&,
                           ScanVector<uint32_t>&);
void select_and_write_avx2(unsigned, uint32_t, uint64_t, const ClassSpec&, const std::vector<ScanVector<uint32_t>>&,
                           const SegmentWrite&);
// The plain AVX-512 scan; the dispatcher prefers the one with vector compression where the CPU has
// AVX512-VBMI2 and VPOPCNTDQ.
void scan_changes_avx512(unsigned, uint32_t, const void*, const void*, uint64_t, const ClassSpec*, ScanOutput&,
                         const ScanTap&);
#endif
void select_and_write_generic(unsigned, uint32_t, uint64_t, const ClassSpec&, const std::vector<ScanVector<uint32_t>>&,
                              const SegmentWrite&);
namespace {

TEST(Rice, RoundTripsSmallLargeAndEscapedGaps) {
  std::mt19937_64 rng(1);
  std::vector<uint64_t> gaps = {0, 1, 2, 31, 32, 63, 64, 1000, (1ull << 32) - 1, 1ull << 32, (1ull << 40) + 12345};
  for (int i = 0; i < 5000; ++i) gaps.push_back(rng() % 300);
  for (unsigned k : {0u, 1u, 5u, 7u, 12u}) {
    std::vector<std::byte> buf;
    BitWriter w(buf);
    uint64_t bits = 0;
    for (uint64_t g : gaps) {
      w.put_rice(g, k);
      bits += rice_cost_bits(g, k);
    }
    w.flush();
    EXPECT_EQ(buf.size(), (bits + 7) / 8);
    BitReader r(buf);
    for (uint64_t g : gaps) ASSERT_EQ(r.get_rice(k), g) << "k=" << k;
    EXPECT_EQ(r.bytes_consumed(buf.data()), buf.size());
  }
}

// get_rice_positions (the applier's batch decoder, with its own fast path) yields the same
// positions as get_rice one code at a time, escapes and the last bytes of the stream included,
// and refuses a position at or past the limit.
TEST(Rice, BatchPositionDecodingMatchesSingleCodes) {
  std::mt19937_64 rng(2);
  std::vector<uint64_t> gaps;
  for (int i = 0; i < 3000; ++i) gaps.push_back(i % 97 == 0 ? 5000 + rng() % 200000 : rng() % 40);
  uint64_t limit = 0;
  for (uint64_t g : gaps) limit += g + 1;
  for (unsigned k : {0u, 3u, 6u}) {
    std::vector<std::byte> buf;
    BitWriter w(buf);
    for (uint64_t g : gaps) w.put_rice(g, k);
    w.flush();
    std::vector<uint32_t> got(gaps.size());
    BitReader batch(buf);
    batch.get_rice_positions(k, gaps.size(), limit, got.data(), "past the end");
    EXPECT_EQ(batch.bytes_consumed(buf.data()), buf.size());
    uint64_t next = 0;
    for (size_t i = 0; i < gaps.size(); ++i) {
      ASSERT_EQ(got[i], next + gaps[i]) << "k=" << k << " i=" << i;
      next += gaps[i] + 1;
    }
    BitReader short_limit(buf);
    EXPECT_THROW(short_limit.get_rice_positions(k, gaps.size(), limit - 1, got.data(), "past the end"), Error);
  }
}

TEST(Rice, TruncatedStreamThrows) {
  std::vector<std::byte> buf;
  BitWriter w(buf);
  w.put_rice(1ull << 40, 3);
  w.flush();
  buf.resize(buf.size() - 2);
  BitReader r(buf);
  EXPECT_THROW(r.get_rice(3), Error);
}

// What a select_and_write reported to its ChangeLog.
struct CollectedLog {
  std::vector<uint32_t> positions, old_bits, new_bits;
  size_t largest_batch = 0;
  static void flush(void* ctx, const uint32_t* p, const uint32_t* o, const uint32_t* n, size_t count) noexcept {
    auto& log = *static_cast<CollectedLog*>(ctx);
    log.positions.insert(log.positions.end(), p, p + count);
    log.old_bits.insert(log.old_bits.end(), o, o + count);
    log.new_bits.insert(log.new_bits.end(), n, n + count);
    log.largest_batch = std::max(log.largest_batch, count);
  }
};
using SelectWriteKernel = void (*)(unsigned, uint32_t, uint64_t, const ClassSpec&,
                                   const std::vector<ScanVector<uint32_t>>&, const SegmentWrite&);

// A fused select-and-write turns a (base bits) into b exactly, in both value modes a classed
// segment may use, and reports every element it wrote, once, with its old and new bits.
template <class T>
void check_select_and_write(SelectWriteKernel kernel, const std::vector<T>& a, const std::vector<T>& b,
                            uint32_t mask, const ClassSpec& cs, const std::vector<ScanVector<uint32_t>>& ranks,
                            const ScanVector<uint32_t>& coded_positions) {
  for (ValueMode mode : {ValueMode::xor_bits, ValueMode::ulp_delta}) {
    std::vector<uint32_t> tokens;
    for (uint32_t p : coded_positions)
      tokens.push_back(mode == ValueMode::xor_bits ? uint32_t{static_cast<T>(a[p] ^ b[p])}
                                                   : ulp_difference(sizeof(T), true, a[p], b[p]));
    std::vector<T> target = a;
    CollectedLog log;
    kernel(sizeof(T), mask, a.size(), cs, ranks,
           SegmentWrite{target.data(), mode, true, tokens.data(), ChangeLog{&CollectedLog::flush, &log}});
    ASSERT_TRUE(target == b) << "mode " << static_cast<int>(mode);
    ASSERT_EQ(log.positions.size(), coded_positions.size());
    ASSERT_LE(log.largest_batch, kChangeBatch);
    std::vector<uint32_t> sorted = log.positions;
    std::ranges::sort(sorted);
    ASSERT_TRUE(std::ranges::equal(sorted, [&] {
      std::vector<uint32_t> s(coded_positions.begin(), coded_positions.end());
      std::ranges::sort(s);
      return s;
    }()));
    for (size_t k = 0; k < log.positions.size(); ++k) {
      ASSERT_EQ(log.old_bits[k], uint32_t{a[log.positions[k]]});
      ASSERT_EQ(log.new_bits[k], uint32_t{b[log.positions[k]]});
    }
  }
}

// A scan's tap: the ranges it reported, which must cover [0, n) in order, in stretches of
// kScanTapSpan elements (the last may be shorter).
struct RecordingTap {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  ScanTap tap() { return ScanTap{&RecordingTap::add, this}; }
  static void add(void* context, uint64_t first, uint64_t count) noexcept {
    static_cast<RecordingTap*>(context)->ranges.emplace_back(first, count);
  }
  void expect_covers(uint64_t n) const {
    ASSERT_EQ(ranges.size(), (n + kScanTapSpan - 1) / kScanTapSpan);
    uint64_t at = 0;
    for (const auto& [first, count] : ranges) {
      ASSERT_EQ(first, at);
      ASSERT_EQ(count, std::min(kScanTapSpan, n - at));
      at += count;
    }
  }
};

template <class T>
void check_scan_equivalence(unsigned seed) {
  std::mt19937_64 rng(seed);
  // Sizes around a block (64 elements) and a tap stretch (kScanTapSpan), several stretches with a
  // tail. Every seventh block is changed whole (more changes than the vector path takes per
  // block: 16), the others at 10% (0-2 changes and 3-16 both occur).
  for (uint64_t n : std::initializer_list<uint64_t>{1, 63, 64, 65, 1000, 4096, kScanTapSpan, kScanTapSpan + 3,
                                                    2 * kScanTapSpan + 77}) {
    std::vector<T> a(n), b(n);
    for (auto& x : a) x = static_cast<T>(rng());
    b = a;
    for (uint64_t i = 0; i < n; ++i)
      if (rng() % 10 == 0 || (i / 64) % 7 == 3) b[i] = static_cast<T>(b[i] + 1);
    const uint32_t mask = sizeof(T) == 4 ? 0x7FFFFFFFu : (1u << (8 * sizeof(T) - 1)) - 1;
    // Unaligned thresholds, exponent-aligned ones (low 7 bits clear), and every class count the
    // select loop specialises (2, 3, 4) or runs generically (5, 8), zero threshold included.
    std::vector<ClassSpec> specs(2);
    specs[0].count = specs[1].count = 4;
    specs[0].thresholds = {mask / 8, mask / 4, mask / 2};
    specs[1].thresholds = {(mask / 8) & ~0x7Fu, (mask / 4) & ~0x7Fu, (mask / 2) & ~0x7Fu};
    for (unsigned count : {2u, 3u, 5u, 8u}) {
      ClassSpec cs;
      cs.count = count;
      for (unsigned j = 0; j + 1 < count; ++j) cs.thresholds[j] = static_cast<uint32_t>(uint64_t{mask} * (j + 1) / count);
      specs.push_back(cs);
    }
    specs.back().thresholds[0] = 0;  // class 0 empty
    std::vector<const ClassSpec*> cases = {nullptr};
    for (const auto& cs : specs) cases.push_back(&cs);
    for (const ClassSpec* c : cases) {
      const ClassSpec& cs = c ? *c : specs[0];
      ScanOutput fast, slow;
      RecordingTap fast_tap, slow_tap;
      scan_changes(sizeof(T), mask, a.data(), b.data(), n, c, fast, fast_tap.tap());
      scan_changes_generic(sizeof(T), mask, a.data(), b.data(), n, c, slow, slow_tap.tap());
      fast_tap.expect_covers(n);
      slow_tap.expect_covers(n);
      ScanOutput untapped;
      scan_changes(sizeof(T), mask, a.data(), b.data(), n, c, untapped);
      ASSERT_EQ(untapped.positions, fast.positions);
      ASSERT_EQ(untapped.change_rank, fast.change_rank);
      ASSERT_EQ(fast.positions, slow.positions);
      ASSERT_EQ(fast.change_class, slow.change_class);
      ASSERT_EQ(fast.change_rank, slow.change_rank);
      ASSERT_EQ(fast.class_sizes, slow.class_sizes);
      // Brute-force check of positions and ranks.
      std::vector<uint32_t> expect;
      for (uint64_t i = 0; i < n; ++i)
        if (a[i] != b[i]) expect.push_back(static_cast<uint32_t>(i));
      ASSERT_TRUE(std::ranges::equal(fast.positions, expect));
      ASSERT_EQ(fast.old_bits.size(), expect.size());
      ASSERT_EQ(fast.new_bits.size(), expect.size());
      for (size_t k = 0; k < expect.size(); ++k) {
        ASSERT_EQ(fast.old_bits[k], uint32_t{a[expect[k]]});
        ASSERT_EQ(fast.new_bits[k], uint32_t{b[expect[k]]});
      }
      ASSERT_EQ(fast.old_bits, slow.old_bits);
      ASSERT_EQ(fast.new_bits, slow.new_bits);
      if (c) {
        auto cls = [&](T x) {
          unsigned cl = 0;
          for (unsigned j = 0; j + 1 < cs.count; ++j) cl += (static_cast<uint32_t>(x) & mask) >= cs.thresholds[j];
          return cl;
        };
        // rank of element i: the elements of its class before it.
        std::vector<uint32_t> seen(cs.count, 0), rank_of(n);
        for (uint64_t i = 0; i < n; ++i) rank_of[i] = seen[cls(a[i])]++;
        for (unsigned cl = 0; cl < cs.count; ++cl) ASSERT_EQ(fast.class_sizes[cl], seen[cl]);
        for (size_t k = 0; k < expect.size(); ++k) {
          ASSERT_EQ(fast.change_class[k], cls(a[expect[k]]));
          ASSERT_EQ(fast.change_rank[k], rank_of[expect[k]]);
        }
        // select_positions inverts the ranks (same answer from the fast and the portable kernel).
        std::vector<ScanVector<uint32_t>> ranks(cs.count);
        std::vector<size_t> class_first(cs.count + 1, 0);
        for (size_t k = 0; k < expect.size(); ++k) ranks[fast.change_class[k]].push_back(fast.change_rank[k]);
        for (unsigned cl = 0; cl < cs.count; ++cl) class_first[cl + 1] = class_first[cl] + ranks[cl].size();
        ScanVector<uint32_t> pos_fast, idx_fast, old_fast, pos_slow, idx_slow, old_slow;
        select_positions(sizeof(T), mask, a.data(), n, cs, ranks, pos_fast, idx_fast, old_fast);
        select_positions_generic(sizeof(T), mask, a.data(), n, cs, ranks, pos_slow, idx_slow, old_slow);
        ASSERT_EQ(pos_fast, pos_slow);
        ASSERT_EQ(idx_fast, idx_slow);
        ASSERT_EQ(old_fast.size(), pos_fast.size());
        for (size_t k = 0; k < pos_fast.size(); ++k) ASSERT_EQ(old_fast[k], static_cast<uint32_t>(a[pos_fast[k]]));
        ASSERT_EQ(old_slow, old_fast);
        // coded_positions[i]: the position of coding index i.
        ScanVector<uint32_t> coded_positions(pos_fast.size());
        for (size_t k = 0; k < pos_fast.size(); ++k) coded_positions[idx_fast[k]] = pos_fast[k];
        check_select_and_write<T>(&select_and_write, a, b, mask, cs, ranks, coded_positions);
        check_select_and_write<T>(&select_and_write_generic, a, b, mask, cs, ranks, coded_positions);
#if defined(__x86_64__)
        // A kernel the dispatcher does not pick on this CPU: the same output as the portable one.
        auto check_kernel = [&](auto* kernel) {
          ScanOutput plain;
          RecordingTap plain_tap;
          kernel(sizeof(T), mask, a.data(), b.data(), n, c, plain, plain_tap.tap());
          plain_tap.expect_covers(n);
          ASSERT_EQ(plain.positions, slow.positions);
          ASSERT_EQ(plain.old_bits, slow.old_bits);
          ASSERT_EQ(plain.new_bits, slow.new_bits);
          ASSERT_EQ(plain.change_class, slow.change_class);
          ASSERT_EQ(plain.change_rank, slow.change_rank);
          ASSERT_EQ(plain.class_sizes, slow.class_sizes);
        };
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt")) {
          check_kernel(&scan_changes_avx2);
          ScanVector<uint32_t> pos_plain, idx_plain, old_plain;
          select_positions_avx2(sizeof(T), mask, a.data(), n, cs, ranks, pos_plain, idx_plain, old_plain);
          ASSERT_EQ(pos_plain, pos_slow);
          ASSERT_EQ(idx_plain, idx_slow);
          ASSERT_EQ(old_plain, old_slow);
          check_select_and_write<T>(&select_and_write_avx2, a, b, mask, cs, ranks, coded_positions);
        }
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi2"))
          check_kernel(&scan_changes_avx512);
#endif
        ASSERT_EQ(pos_fast.size(), expect.size());
        // Coding index i belongs to class cl and rank ranks[cl][i - class_first[cl]]: its position must
        // be the element of that class and rank, and a change.
        std::vector<std::vector<uint32_t>> member(cs.count);  // member[cl][rank]: its position
        for (uint64_t p = 0; p < n; ++p) member[cls(a[p])].push_back(static_cast<uint32_t>(p));
        for (size_t k = 0; k < pos_fast.size(); ++k) {
          const size_t i = idx_fast[k];
          unsigned cl = 0;
          while (i >= class_first[cl + 1]) ++cl;
          const uint32_t rank = ranks[cl][i - class_first[cl]];
          ASSERT_LT(rank, member[cl].size());
          ASSERT_EQ(pos_fast[k], member[cl][rank]);
          ASSERT_NE(a[pos_fast[k]], b[pos_fast[k]]);
        }
      }
    }
  }
}

TEST(Scan, DispatchedAndPortableKernelsAgreeWithBruteForce) {
  check_scan_equivalence<uint8_t>(1);
  check_scan_equivalence<uint16_t>(2);
  check_scan_equivalence<uint32_t>(3);
}

TEST(Scan, SelectRejectsRankBeyondClass) {
  std::vector<uint16_t> a(100, 0x3F80);
  ClassSpec cs;
  cs.count = 2;
  cs.thresholds[0] = 0x4000;
  std::vector<ScanVector<uint32_t>> ranks{{5}, {0}};
  ScanVector<uint32_t> pos, idx, old;
  EXPECT_THROW(select_positions(2, 0x7FFF, a.data(), a.size(), cs, ranks, pos, idx, old), Error);
  EXPECT_TRUE(pos.empty() && idx.empty() && old.empty());
  // The fused write has written class 0's rank by the time it finds class 1's missing: it reports
  // that write before throwing, so its caller can undo it.
  const std::vector<uint32_t> tokens{0x0001, 0x0002};
  CollectedLog log;
  EXPECT_THROW(select_and_write(2, 0x7FFF, a.size(), cs, ranks,
                                SegmentWrite{a.data(), ValueMode::xor_bits, true, tokens.data(),
                                             ChangeLog{&CollectedLog::flush, &log}}),
               Error);
  EXPECT_EQ(log.positions, std::vector<uint32_t>{5});
  EXPECT_EQ(log.old_bits, std::vector<uint32_t>{0x3F80});
  EXPECT_EQ(a[5], 0x3F81);
}

TEST(Locations, ClassesChosenWhenChangeRateDependsOnMagnitude) {
  // Small-magnitude elements change 30x more often than large ones: the classed coding must win.
  std::mt19937_64 rng(5);
  const uint64_t n = 1 << 18;
  std::vector<uint16_t> a(n), b(n);
  for (uint64_t i = 0; i < n; ++i) {
    const bool small = rng() % 8 == 0;
    a[i] = static_cast<uint16_t>((small ? 0x3800 : 0x3C00) | (rng() & 0x7F));
    b[i] = a[i];
    if (rng() % 1000 < (small ? 150u : 5u)) b[i] = static_cast<uint16_t>(a[i] + 1);
  }
  std::vector<uint64_t> all, chg;
  sample_exponents(2, 0x7FFF, 7, a.data(), b.data(), n, 1, all, chg);
  const ClassSpec cs = choose_classes(all, chg, 7);
  ASSERT_GE(cs.count, 2u);
  ScanOutput scan;
  scan_changes(2, 0x7FFF, a.data(), b.data(), n, &cs, scan);
  std::vector<std::byte> out;
  const auto plan = encode_locations(SegmentChanges{n, &scan, cs}, out);
  EXPECT_EQ(plan.coding, LocationCoding::classed_gaps);
  // Decode and compare with the true positions (in class order).
  std::span<const std::byte> in(out);
  DecodedLocations locs;
  decode_locations(plan.coding, n, scan.positions.size(), 0x7FFF, in, locs);
  ScanVector<uint32_t> decoded;
  ScanVector<uint32_t> coding_index, old_values;
  select_positions(2, 0x7FFF, a.data(), n, locs.classes, locs.ranks, decoded, coding_index, old_values);
  EXPECT_TRUE(in.empty());
  ASSERT_EQ(decoded.size(), scan.positions.size());
  ASSERT_EQ(coding_index.size(), decoded.size());
  ASSERT_EQ(old_values.size(), decoded.size());
  for (size_t k = 0; k < decoded.size(); ++k) {
    EXPECT_EQ(decoded[k], scan.positions[plan.order[coding_index[k]]]);
    EXPECT_EQ(old_values[k], a[decoded[k]]);
  }
  // Positions come out in block order: never more than one block (64 elements) out of order.
  for (size_t k = 1; k < decoded.size(); ++k) EXPECT_GT(decoded[k] / 64 + 1, decoded[k - 1] / 64);
}

TEST(Locations, DenseSegmentsUseBitmapOrRange) {
  const uint64_t n = 10000;
  ScanOutput scan;
  for (uint32_t i = 0; i < n; i += 2) scan.positions.push_back(i);
  std::vector<std::byte> out;
  EXPECT_EQ(encode_locations(SegmentChanges{n, &scan, {}}, out).coding, LocationCoding::bitmap);
  scan.positions.clear();
  for (uint32_t i = 0; i < n; ++i) scan.positions.push_back(i);
  out.clear();
  EXPECT_EQ(encode_locations(SegmentChanges{n, &scan, {}}, out).coding, LocationCoding::range);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace deltacast::codec

namespace deltacast::codec {
uint64_t select_bit_for_test(uint64_t mask, unsigned r);
namespace {
TEST(Select, BroadwordSelectMatchesNaiveOnRandomMasks) {
  std::mt19937_64 rng(77);
  for (int i = 0; i < 20000; ++i) {
    uint64_t mask = rng() & rng();
    if (i % 7 == 0) mask = rng();
    if (i % 11 == 0) mask = ~uint64_t{0};
    if (mask == 0) continue;
    unsigned pos = 0, seen = 0;
    for (unsigned bit = 0; bit < 64; ++bit)
      if ((mask >> bit) & 1) {
        ASSERT_EQ(select_bit_for_test(mask, seen), bit) << std::hex << mask << " r=" << std::dec << seen;
        ++seen;
        pos = bit;
      }
    (void)pos;
  }
}
}  // namespace
}  // namespace deltacast::codec

namespace deltacast::codec {
namespace {
TEST(Locations, GapVarintDecodesAndRejectsBadInput) {
  const std::vector<uint32_t> want = {0, 5, 6, 300, 70000, 70001};
  std::vector<std::byte> bytes;
  uint32_t prev_plus_one = 0;
  for (uint32_t p : want) {
    uint32_t g = p - prev_plus_one;
    prev_plus_one = p + 1;
    while (g >= 0x80) {
      bytes.push_back(static_cast<std::byte>((g & 0x7F) | 0x80));
      g >>= 7;
    }
    bytes.push_back(static_cast<std::byte>(g));
  }
  std::span<const std::byte> in(bytes);
  DecodedLocations got;
  decode_locations(LocationCoding::gap_varint, 100000, want.size(), 0x7FFF, in, got);
  EXPECT_TRUE(std::ranges::equal(got.positions, want));
  EXPECT_TRUE(in.empty());
  std::span<const std::byte> truncated(bytes.data(), bytes.size() - 1);
  EXPECT_THROW(decode_locations(LocationCoding::gap_varint, 100000, want.size(), 0x7FFF, truncated, got), Error);
  std::span<const std::byte> small(bytes);
  EXPECT_THROW(decode_locations(LocationCoding::gap_varint, 70001, want.size(), 0x7FFF, small, got), Error);
  const std::vector<std::byte> endless(12, std::byte{0xFF});
  std::span<const std::byte> e(endless);
  EXPECT_THROW(decode_locations(LocationCoding::gap_varint, 100000, 1, 0x7FFF, e, got), Error);
}
}  // namespace
}  // namespace deltacast::codec

TEST(Digest, ChangesDeltaMatchesScalarSumAcrossIndexBlocks) {
  using deltacast::codec::changes_digest_delta;
  using deltacast::codec::element_hash;
  std::mt19937_64 rng(7);
  // Segment starts below, at and across a 2^32 block of element indexes.
  for (const uint64_t first : {uint64_t{0}, uint64_t{123456}, (uint64_t{1} << 32) - 40, (uint64_t{3} << 32) + 5}) {
    std::vector<uint32_t> pos, old_bits, new_bits;
    for (uint32_t p = static_cast<uint32_t>(rng() % 3); p < 100000; p += 1 + static_cast<uint32_t>(rng() % 7)) {
      pos.push_back(p);
      old_bits.push_back(static_cast<uint32_t>(rng()));
      new_bits.push_back(static_cast<uint32_t>(rng()));
    }
    for (const uint32_t tensor : {0u, 17u}) {
      uint64_t expect = 0;
      for (size_t k = 0; k < pos.size(); ++k)
        expect += element_hash(tensor, first + pos[k], new_bits[k]) - element_hash(tensor, first + pos[k], old_bits[k]);
      EXPECT_EQ(changes_digest_delta(tensor, first, pos.data(), old_bits.data(), new_bits.data(), pos.size()), expect);
    }
  }
}
