// The frame format is pinned by golden files (tests/golden/): a valid delta and corrupt variants.
// Regenerate deliberately with DELTACAST_REGEN_GOLDEN=1 after a format change (and bump the
// format version).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <xxhash.h>
#include <zstd.h>

#include "codec/wire.h"
#include "codec_test_util.h"
#include "util/error.h"

namespace deltacast::codec {
namespace {

using testing::OwnedWeights;

// A fixed input built from raw generator output only (no library distributions), so the bytes do
// not depend on the standard library's implementation.
struct GoldenInput {
  Manifest m{{{"layer.weight", DType::bf16, {64, 96}}, {"layer.norm", DType::f32, {96}}, {"codes", DType::u8, {50}}}};
  OwnedWeights base{m}, next{m};
  GoldenInput() {
    std::mt19937_64 rng(2024);
    for (uint64_t i = 0; i < 64 * 96; ++i) testing::store_bits(base.bytes[0].data(), 2, i, 0x3C00u | (rng() & 0x3FF) | ((rng() & 1) << 15));
    for (uint64_t i = 0; i < 96; ++i) testing::store_bits(base.bytes[1].data(), 4, i, 0x3F800000u + static_cast<uint32_t>(rng() % 4096));
    for (uint64_t i = 0; i < 50; ++i) testing::store_bits(base.bytes[2].data(), 1, i, static_cast<uint32_t>(rng() & 0xFF));
    next = base;
    for (uint64_t i = 0; i < 64 * 96; ++i)
      if (rng() % 50 == 0) testing::store_bits(next.bytes[0].data(), 2, i, testing::load_bits(next.bytes[0].data(), 2, i) + 1);
    testing::store_bits(next.bytes[0].data(), 2, 7, 0x7FC1);  // a NaN with payload
    testing::store_bits(next.bytes[1].data(), 4, 3, 0x80000000u);  // -0.0
    testing::store_bits(next.bytes[2].data(), 1, 9, 0xFF);
  }
  std::vector<std::byte> encode() const {
    EncodeOptions opts;
    opts.chunk_bytes = 8192;
    opts.overwrite_tensors = {false, true, false};
    auto d = encode_delta(base.view(), next.view(), StateDigest::full_scan(base.view()), {41, 42}, opts);
    std::vector<std::byte> file;
    for (auto& f : d.frames) file.insert(file.end(), f.begin(), f.end());
    return file;
  }
};

std::string golden(const std::string& name) { return std::string(DELTACAST_GOLDEN_DIR) + "/" + name; }

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("missing golden file " + path + " (run with DELTACAST_REGEN_GOLDEN=1)");
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}
void write_file(const std::string& path, const std::vector<std::byte>& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

using testing::errc_of;

std::vector<std::byte> corrupt_variant(const std::vector<std::byte>& file, const std::string& kind) {
  auto f = split_frames(file);
  std::vector<std::byte> first(f[0].begin(), f[0].end());
  if (kind == "bad-checksum") first[first.size() / 2] ^= std::byte{0x10};
  if (kind == "truncated") first.resize(first.size() - 5);
  if (kind == "bad-magic") first[0] = std::byte{'X'};
  if (kind == "future-version") {
    store_le<uint16_t>(first.data() + 4, kFormatVersion + 1);
    store_le<uint64_t>(first.data() + first.size() - 8, XXH3_64bits(first.data(), first.size() - 8));
  }
  return first;
}
const char* kCorruptKinds[] = {"bad-checksum", "truncated", "bad-magic", "future-version"};

TEST(Golden, EncodingMatchesCheckedInBytesAndApplies) {
  GoldenInput in;
  const auto bytes = in.encode();
  if (std::getenv("DELTACAST_REGEN_GOLDEN")) {
    write_file(golden("v2-small.dcx"), bytes);
    for (const char* k : kCorruptKinds) write_file(golden(std::string("v2-") + k + ".dcx"), corrupt_variant(bytes, k));
  }
  const auto expected = read_file(golden("v2-small.dcx"));
  ASSERT_EQ(bytes, expected) << "the encoder's output drifted from the golden frames: if the format changed on "
                                "purpose, bump kFormatVersion, update docs/frame-format.md and regenerate";
  OwnedWeights receiver = in.base;
  DeltaApplier applier(in.m, receiver.mut(), 41, StateDigest::full_scan(receiver.view()));
  for (auto f : split_frames(expected)) applier.apply(f);
  applier.verify();
  applier.commit();
  EXPECT_TRUE(receiver == in.next);
}

TEST(Golden, CorruptFramesAreRefusedWithTheRightError) {
  GoldenInput in;
  const std::pair<const char*, Errc> expect[] = {{"bad-checksum", Errc::corrupt_frame},
                                                 {"truncated", Errc::corrupt_frame},
                                                 {"bad-magic", Errc::corrupt_frame},
                                                 {"future-version", Errc::version_mismatch}};
  for (const auto& [kind, errc] : expect) {
    const auto bytes = read_file(golden(std::string("v2-") + kind + ".dcx"));
    OwnedWeights receiver = in.base;
    DeltaApplier applier(in.m, receiver.mut(), 41, StateDigest::full_scan(receiver.view()));
    EXPECT_EQ(errc_of([&] { applier.apply(bytes); }), errc) << kind;
    EXPECT_TRUE(receiver == in.base) << kind;
  }
}

TEST(Golden, HeaderFieldsParse) {
  const auto bytes = read_file(golden("v2-small.dcx"));
  const auto frames = split_frames(bytes);
  const auto first = parse_frame(frames.front());
  EXPECT_EQ(first.header.kind, FrameKind::chunk);
  EXPECT_EQ(first.header.base_version, 41u);
  EXPECT_EQ(first.header.new_version, 42u);
  EXPECT_EQ(first.header.chunk_count, frames.size() - 1);
  const auto seal = parse_frame(frames.back());
  EXPECT_EQ(seal.header.kind, FrameKind::seal);
  EXPECT_EQ(seal.tensor_digests.size(), 3u);
}

// Compressed sections are standard zstd frames: the zstd library (and CLI) decode them alone.
TEST(Frame, ZstdSectionsAreStandardZstdFrames) {
  Manifest m({{"w", DType::bf16, {1 << 16}}});
  OwnedWeights base(m);
  std::mt19937_64 rng(3);
  testing::fill_random(base, rng);
  OwnedWeights next = base;
  testing::mutate(next, 0.3, rng);
  EncodeOptions opts;
  opts.xor_safe_mode = ValueMode::xor_bits;
  auto d = encode_delta(base.view(), next.view(), StateDigest::full_scan(base.view()), {0, 1}, opts);
  const auto view = parse_frame(d.frames[0]);
  int zstd_sections = 0;
  for (const auto& s : view.sections) {
    if (s.codec != SectionCodec::zstd) continue;
    ++zstd_sections;
    std::vector<std::byte> out(s.raw_size);
    const size_t got = ZSTD_decompress(out.data(), out.size(), d.frames[0].data() + s.offset, s.stored_size);
    EXPECT_EQ(got, s.raw_size);
    if (std::system("command -v zstd >/dev/null 2>&1") == 0) {
      const std::string path = ::testing::TempDir() + "/section.zst";
      write_file(path, std::vector<std::byte>(d.frames[0].begin() + static_cast<long>(s.offset),
                                              d.frames[0].begin() + static_cast<long>(s.offset + s.stored_size)));
      EXPECT_EQ(std::system(("zstd -q -d -f -o " + path + ".raw " + path).c_str()), 0);
      EXPECT_EQ(read_file(path + ".raw"), out);
    }
  }
  EXPECT_GT(zstd_sections, 0);
}

}  // namespace
}  // namespace deltacast::codec
