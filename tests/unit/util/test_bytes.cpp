// The little-endian byte writer and bounds-checked reader (util/bytes.h).
#include "util/bytes.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace deltacast {
namespace {

std::vector<std::byte> bytes_of(std::initializer_list<unsigned> values) {
  std::vector<std::byte> out;
  for (unsigned v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

TEST(ByteWriter, AppendsLittleEndianWhateverTheHost) {
  std::vector<std::byte> out;
  ByteWriter w(out);
  w.u8(0x01);
  w.u16(0x0302);
  w.u32(0x07060504);
  w.u64(0x0f0e0d0c0b0a0908ull);
  EXPECT_EQ(out, bytes_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(w.size(), 15u);
}

TEST(ByteWriter, AppendsToWhatTheVectorAlreadyHolds) {
  std::vector<std::byte> out = bytes_of({0xAA});
  ByteWriter w(out);
  w.put<int16_t>(-2);
  w.bytes(bytes_of({0x10, 0x20}));
  w.zeros(2);
  EXPECT_EQ(out, bytes_of({0xAA, 0xFE, 0xFF, 0x10, 0x20, 0, 0}));
}

TEST(ByteWriter, PatchRewritesBytesAlreadyWritten) {
  std::vector<std::byte> out;
  ByteWriter w(out);
  w.u32(0);
  w.u64(0);
  w.patch<uint32_t>(0, 0xDDCCBBAA);
  w.patch<uint16_t>(10, 0x2211);
  EXPECT_EQ(out, bytes_of({0xAA, 0xBB, 0xCC, 0xDD, 0, 0, 0, 0, 0, 0, 0x11, 0x22}));
  EXPECT_EQ(out.size(), 12u);
}

TEST(ByteWriterDeathTest, PatchPastTheEndIsACallerBug) {
  std::vector<std::byte> out(4);
  ByteWriter w(out);
  EXPECT_DEATH(w.patch<uint64_t>(0, 1), "");
  EXPECT_DEATH(w.patch<uint8_t>(4, 1), "");
}

TEST(ByteReader, ReadsBackWhatTheWriterWrote) {
  std::vector<std::byte> buf;
  ByteWriter w(buf);
  w.u8(0xFE);
  w.u16(0xBEEF);
  w.u32(0xDEADBEEF);
  w.u64(0x0123456789ABCDEFull);
  w.bytes(bytes_of({7, 8, 9}));
  w.put<int32_t>(-5);
  ByteReader r(buf, "sample");
  EXPECT_EQ(r.remaining(), buf.size());
  EXPECT_EQ(r.u8(), 0xFE);
  EXPECT_EQ(r.u16(), 0xBEEF);
  EXPECT_EQ(r.u32(), 0xDEADBEEFu);
  EXPECT_EQ(r.position(), 7u);
  EXPECT_EQ(r.u64(), 0x0123456789ABCDEFull);
  auto taken = r.take(3);
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken.data(), buf.data() + 15);  // a view, not a copy
  EXPECT_EQ(r.get<int32_t>(), -5);
  EXPECT_TRUE(r.at_end());
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_EQ(r.take(0).size(), 0u);
}

TEST(ByteReader, RefusesToReadPastTheEndAndStaysPut) {
  const auto buf = bytes_of({1, 2, 3});
  ByteReader r(buf, "thing header");
  EXPECT_EQ(r.u16(), 0x0201);
  try {
    (void)r.u16();
    FAIL() << "read past the end";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_frame);
    EXPECT_EQ(std::string(e.what()), "thing header: truncated (needs 2 more bytes at offset 2, has 1)");
  }
  EXPECT_EQ(r.position(), 2u);
  EXPECT_THROW((void)r.u64(), Error);
  EXPECT_THROW((void)r.take(2), Error);
  EXPECT_THROW(r.skip(uint64_t{1} << 63), Error);  // no overflow in the bounds check
  EXPECT_THROW((void)r.take(UINT64_MAX), Error);
  EXPECT_EQ(r.u8(), 3);
  EXPECT_THROW((void)r.u8(), Error);
}

TEST(ByteReader, EmptySpan) {
  ByteReader r({}, "nothing");
  EXPECT_TRUE(r.at_end());
  EXPECT_THROW((void)r.u8(), Error);
}

TEST(LoadStoreLe, FixedByteOrderAtAnyAlignment) {
  std::byte buf[16] = {};
  store_le<uint32_t>(buf + 1, 0x44332211);  // unaligned
  EXPECT_EQ(std::to_integer<unsigned>(buf[1]), 0x11u);
  EXPECT_EQ(std::to_integer<unsigned>(buf[4]), 0x44u);
  EXPECT_EQ(load_le<uint32_t>(buf + 1), 0x44332211u);
  store_le<uint64_t>(buf + 3, 0x8877665544332211ull);
  EXPECT_EQ(std::to_integer<unsigned>(buf[3]), 0x11u);
  EXPECT_EQ(std::to_integer<unsigned>(buf[10]), 0x88u);
  EXPECT_EQ(load_le<uint64_t>(buf + 3), 0x8877665544332211ull);
  store_le<uint16_t>(buf, 0xA1B2);
  EXPECT_EQ(load_le<uint16_t>(buf), 0xA1B2);
  EXPECT_EQ(std::to_integer<unsigned>(buf[0]), 0xB2u);
  store_le<int64_t>(buf + 5, -1234567890123ll);
  EXPECT_EQ(load_le<int64_t>(buf + 5), -1234567890123ll);
  store_le<uint8_t>(buf, 0x7F);
  EXPECT_EQ(load_le<uint8_t>(buf), 0x7F);
}

}  // namespace
}  // namespace deltacast
