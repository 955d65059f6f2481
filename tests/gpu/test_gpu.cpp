// CUDA buffers (codec/cuda/device_apply.h, device_sync.h, device_mirror.h, device_encode.h):
// scatter/rollback/gather bit-exact in device memory, the device digest equal to the host's, the
// device sync's verification, and the producer's device diff giving encode_delta's frames byte for
// byte. GPU tests skip with the reason without a device; the CPU ones run anywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "codec/cuda/device_apply.h"
#include "codec/cuda/device_diff.h"
#include "codec/cuda/device_encode.h"
#include "codec/cuda/device_sync.h"
#include "codec/digest.h"
#include "codec/encoder.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

#define REQUIRE_GPU()                                                                                  \
  do {                                                                                                 \
    if (!cuda::cuda_device_available())                                                                \
      GTEST_SKIP() << "no CUDA device: this build or machine has no CUDA (build with "                 \
                      "DELTACAST_WITH_CUDA=ON, run on a GPU: scripts/gpu-check.sh)";                   \
  } while (0)

// ---- CPU: host-side logic ------------------------------------------------------------------------

TEST(CudaHost, CollectChangesSortsDeduplicatesAndReadsTheMirror) {
  std::vector<uint16_t> mirror = {10, 11, 12, 13, 14, 15, 16};
  std::vector<uint64_t> positions = {5, 1, 5, 3, 1, 6};
  std::vector<uint32_t> bits;
  cuda::collect_changes(positions, std::as_bytes(std::span(mirror)), 2, bits);
  EXPECT_EQ(positions, (std::vector<uint64_t>{1, 3, 5, 6}));
  EXPECT_EQ(bits, (std::vector<uint32_t>{11, 13, 15, 16}));
  std::vector<uint64_t> past = {7};
  EXPECT_THROW(cuda::collect_changes(past, std::as_bytes(std::span(mirror)), 2, bits), Error);
  std::vector<uint8_t> bytes = {1, 2, 255};
  std::vector<uint64_t> one = {2};
  cuda::collect_changes(one, std::as_bytes(std::span(bytes)), 1, bits);
  EXPECT_EQ(bits, (std::vector<uint32_t>{255}));
}

// The device digest sums element_hash_seeded (the header it shares with the host) over the
// units; that sum is the host's vectorised slice_digest.
TEST(CudaHost, SumOfSharedTermsIsTheHostDigest) {
  std::mt19937 rng(3);
  std::vector<uint16_t> v(70001);
  for (auto& x : v) x = static_cast<uint16_t>(rng());
  for (uint32_t tensor : {0u, 5u}) {
    const uint64_t seed = tensor_digest_seed(tensor);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < v.size(); ++i) sum += element_hash_seeded(seed, i + 1000, v[i]);
    EXPECT_EQ(sum, slice_digest(tensor, DType::bf16, 1000, std::as_bytes(std::span(v))));
  }
}

TEST(CudaHost, WithoutADeviceEveryCallIsUnsupported) {
  if (cuda::cuda_device_available()) GTEST_SKIP() << "a CUDA device is present";
  std::vector<uint16_t> host(8);
  cuda::DeviceTensor t{host.data(), host.size(), 2};
  const uint64_t pos = 0;
  const uint32_t bits = 1;
  cuda::DeviceScatter s;
  for (auto call : std::vector<std::function<void()>>{
           [&] { s.scatter(t, &pos, &bits, 1); }, [&] { (void)cuda::device_tensor_digest(t, 1); },
           [&] { cuda::DeviceDiffMirror m({t}); }, [&] { cuda::PinnedBuffer b(16); }}) {
    try {
      call();
      FAIL() << "expected Error(unsupported)";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::unsupported) << e.what();
    }
  }
  EXPECT_FALSE(cuda::is_device_pointer(host.data()));
}

// ---- GPU -------------------------------------------------------------------------------------------

// Special bits per unit width: NaN, +-inf, -0, subnormals, all-ones, zero.
std::vector<uint32_t> specials(unsigned width) {
  if (width == 2) return {0x7FC0, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x8001, 0xFFFF, 0x0000, 0x7E00, 0xFC00};
  if (width == 4) return {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0xFFFFFFFFu, 0};
  return {0x7F, 0x80, 0xFF, 0x00, 0x01, 0x78, 0xF8};
}

struct Case {
  unsigned width;
  uint64_t units;
  double changed;  // fraction; 1 = all, 0 = none
};

class DeviceApply : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceApply, ScatterRollbackGatherAndDigestAreBitExact) {
  REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937_64 rng(c.units * 7 + c.width);
  const size_t bytes = c.units * c.width;
  std::vector<std::byte> before(bytes), after;
  for (auto& b : before) b = static_cast<std::byte>(rng());
  after = before;
  std::vector<uint64_t> positions;
  std::vector<uint32_t> bits;
  const auto sp = specials(c.width);
  for (uint64_t i = 0; i < c.units; ++i) {
    const bool change = c.changed >= 1 || (c.changed > 0 && std::uniform_real_distribution<>(0, 1)(rng) < c.changed);
    if (!change) continue;
    uint32_t old = 0, v;
    std::memcpy(&old, before.data() + i * c.width, c.width);
    v = positions.size() < sp.size() ? sp[positions.size()] : static_cast<uint32_t>(rng());
    if (c.width < 4) v &= (1u << (8 * c.width)) - 1;
    if (v == old) v ^= 1;
    positions.push_back(i);
    bits.push_back(v);
    std::memcpy(after.data() + i * c.width, &v, c.width);
  }
  cuda::DeviceBuffer dev(bytes ? bytes : 1);
  cuda::copy_to_device(dev.data(), before.data(), bytes);
  cuda::DeviceTensor t{dev.data(), c.units, c.width};
  const uint64_t seed = tensor_digest_seed(3);
  const DType dtype = c.width == 1 ? DType::u8 : c.width == 2 ? DType::bf16 : DType::f32;
  EXPECT_EQ(cuda::device_tensor_digest(t, seed), slice_digest(3, dtype, 0, before));

  cuda::DeviceScatter s;
  s.scatter(t, positions.data(), bits.data(), positions.size());
  EXPECT_EQ(s.undo_entries(), positions.size());
  std::vector<std::byte> back(bytes);
  cuda::copy_to_host(back.data(), dev.data(), bytes);
  EXPECT_EQ(0, std::memcmp(back.data(), after.data(), bytes));
  EXPECT_EQ(cuda::device_tensor_digest(t, seed), slice_digest(3, dtype, 0, after));
  if (c.units > 10) {  // slices add up like the host's
    const uint64_t half = c.units / 2;
    EXPECT_EQ(cuda::device_slice_digest(t, seed, 0, half) + cuda::device_slice_digest(t, seed, half, c.units - half),
              slice_digest(3, dtype, 0, after));
  }
  std::vector<uint32_t> gathered(positions.size());
  s.gather(t, positions.data(), gathered.data(), positions.size());
  EXPECT_EQ(gathered, bits);

  s.rollback();
  cuda::copy_to_host(back.data(), dev.data(), bytes);
  EXPECT_EQ(0, std::memcmp(back.data(), before.data(), bytes)) << "rollback restores every bit";

  // Two overlapping batches roll back newest first.
  s.scatter(t, positions.data(), bits.data(), positions.size());
  std::vector<uint32_t> again(bits);
  for (auto& b : again) b ^= 1;
  s.scatter(t, positions.data(), again.data(), positions.size());
  s.rollback();
  cuda::copy_to_host(back.data(), dev.data(), bytes);
  EXPECT_EQ(0, std::memcmp(back.data(), before.data(), bytes));
}

INSTANTIATE_TEST_SUITE_P(Widths, DeviceApply,
                         ::testing::Values(Case{2, 1, 1}, Case{2, 1000003, 0.01}, Case{2, 4097, 1}, Case{2, 777, 0},
                                           Case{4, 65537, 0.03}, Case{4, 12345, 1}, Case{1, 99991, 0.05},
                                           Case{1, 3, 1}, Case{2, 0, 0}, Case{4, (1u << 22) + 3, 0.01}));

TEST(DeviceSync, CommitsVerifiedVersionsAndRestoresOnAMismatch) {
  REQUIRE_GPU();
  const uint64_t n = 100003;
  std::vector<uint16_t> mirror(n);
  std::mt19937 rng(5);
  for (auto& x : mirror) x = static_cast<uint16_t>(rng());
  cuda::PinnedBuffer pinned(n * 2);
  std::memcpy(pinned.data(), mirror.data(), n * 2);
  cuda::DeviceBuffer dev(n * 2);
  const std::span<const std::byte> view(pinned.data(), n * 2);
  cuda::DeviceMirrorSync sync({{1, {dev.data(), n, 2}, view}}, 2);
  auto digest = [&] { return StateDigest({0, slice_digest(1, DType::bf16, 0, view)}); };
  auto device_equals_mirror = [&] {
    std::vector<std::byte> back(n * 2);
    cuda::copy_to_host(back.data(), dev.data(), n * 2);
    return std::memcmp(back.data(), pinned.data(), n * 2) == 0;
  };
  // First sync: whole copy.
  auto st = sync.sync(digest());
  EXPECT_EQ(st.whole_bytes, n * 2);
  EXPECT_TRUE(device_equals_mirror());
  // A version: 1% of the elements, noted (some twice) and written into the mirror.
  auto* m = reinterpret_cast<uint16_t*>(pinned.data());
  for (int k = 0; k < 1000; ++k) {
    const uint64_t p = rng() % n;
    sync.note(1, p);
    sync.note(1, p);
    m[p] = static_cast<uint16_t>(m[p] + 1);
  }
  sync.note(0, 5);  // a host tensor: ignored
  st = sync.sync(digest());
  EXPECT_GT(st.scattered, 0u);
  EXPECT_EQ(st.whole_bytes, 0u);
  EXPECT_TRUE(device_equals_mirror());
  sync.audit(digest());
  // A mismatch (a write the sync was not told about): the scatter is undone, verify_failed, and
  // the next sync copies whole.
  std::vector<std::byte> kept(n * 2);
  cuda::copy_to_host(kept.data(), dev.data(), n * 2);
  m[7] ^= 0x10;        // not noted
  m[9] ^= 0x1;
  sync.note(1, 9);     // noted
  try {
    sync.sync(digest());
    FAIL() << "expected verify_failed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::verify_failed) << e.what();
  }
  std::vector<std::byte> back(n * 2);
  cuda::copy_to_host(back.data(), dev.data(), n * 2);
  EXPECT_EQ(0, std::memcmp(back.data(), kept.data(), n * 2)) << "device restored from the undo log";
  st = sync.sync(digest());
  EXPECT_EQ(st.whole_bytes, n * 2);
  EXPECT_TRUE(device_equals_mirror());
}

// The producer's device diff: frames byte-identical to encode_delta of the same bits on the host.
TEST(DeviceEncode, FramesAreByteIdenticalToTheHostEncoder) {
  REQUIRE_GPU();
  Manifest manifest({{"a.bf16", DType::bf16, {1031, 257}},
                     {"b.f32", DType::f32, {4099}},
                     {"c.f16", DType::f16, {3, 333}},
                     {"d.i8", DType::i8, {1001}},
                     {"e.f64", DType::f64, {517}},
                     {"f.empty", DType::bf16, {0}},
                     {"g.bf16", DType::bf16, {70000}}});
  std::mt19937_64 rng(9);
  std::vector<std::vector<std::byte>> base(manifest.size()), next;
  for (uint32_t i = 0; i < manifest.size(); ++i) {
    base[i].resize(manifest.at(i).nbytes());
    for (auto& b : base[i]) b = static_cast<std::byte>(rng());
  }
  next = base;
  std::vector<cuda::DeviceBuffer> dev;
  std::vector<cuda::DeviceTensor> tensors;
  for (uint32_t i = 0; i < manifest.size(); ++i) {
    dev.emplace_back(std::max<size_t>(1, base[i].size()));
    cuda::copy_to_device(dev.back().data(), base[i].data(), base[i].size());
    tensors.push_back({dev.back().data(), manifest.at(i).units(),
                       static_cast<unsigned>(dtype_unit_size(manifest.at(i).dtype))});
  }
  cuda::DeviceDiffMirror mirror(tensors);
  auto pulled = mirror.pull();
  EXPECT_EQ(pulled.full_bytes, manifest.total_bytes());
  ConstWeights base_w{&manifest, {}};
  for (auto& b : base) base_w.tensors.emplace_back(b);
  StateDigest base_digest = StateDigest::full_scan(base_w);
  EncodeOptions options;
  options.chunk_bytes = 64 << 10;
  for (uint64_t version = 1; version <= 4; ++version) {
    // A step: ~1% of the bytes (3%: version 3; nothing: version 4) plus specials into g.bf16.
    const double frac = version == 3 ? 0.03 : version == 4 ? 0 : 0.01;
    for (auto& t : next)
      for (auto& b : t)
        if (std::uniform_real_distribution<>(0, 1)(rng) < frac) b ^= static_cast<std::byte>(1 + rng() % 255);
    if (version == 2) {
      const uint16_t sp[] = {0x7FC0, 0x7F80, 0xFF80, 0x8000, 0x0001};
      std::memcpy(next[6].data() + 20, sp, sizeof sp);
    }
    for (uint32_t i = 0; i < manifest.size(); ++i) cuda::copy_to_device(dev[i].data(), next[i].data(), next[i].size());
    ConstWeights next_w{&manifest, {}};
    for (auto& b : next) next_w.tensors.emplace_back(b);
    const VersionIds ids{version - 1, version};
    const EncodedDelta host = encode_delta(base_w, next_w, base_digest, ids, options);
    cuda::PullStats stats;
    const EncodedDelta device = cuda::encode_from_device(base_w, mirror, base_digest, ids, options, &stats);
    for (uint32_t i = 0; i < manifest.size(); ++i)
      ASSERT_EQ(0, std::memcmp(mirror.host(i), next[i].data(), next[i].size())) << "mirror of tensor " << i;
    ASSERT_EQ(host.frames.size(), device.frames.size());
    for (size_t f = 0; f < host.frames.size(); ++f) EXPECT_EQ(host.frames[f], device.frames[f]) << "frame " << f;
    EXPECT_EQ(stats.full_bytes, 0u);
    EXPECT_EQ(stats.changed, host.stats.changes);
    EXPECT_LT(stats.bitmap_bytes + stats.value_bytes, manifest.total_bytes() / 4) << "only the bitmap and values cross";
    base = next;
    base_w.tensors.clear();
    for (auto& b : base) base_w.tensors.emplace_back(b);
    base_digest = host.new_digest;
  }
}

}  // namespace
}  // namespace deltacast::codec
