// Round trips and refusals of the relay-tree protocol messages (tree/protocol.h).
#include <cstring>

#include <gtest/gtest.h>

#include "tree/protocol.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

template <typename T>
T round_trip(const T& message) {
  auto bytes = encode_message(message);
  auto decoded = decode_message(bytes);
  EXPECT_TRUE(std::holds_alternative<T>(decoded));
  return std::get<T>(decoded);
}

TEST(Protocol, WelcomeRoundTripsMembershipAndManifest) {
  Welcome w;
  w.session = 0x1122334455667788ull;
  w.topology = "double_binary";
  w.max_message_bytes = 9 << 20;
  w.members = {{0, "tcp://127.0.0.1:5000", ""}, {1, "tcp://127.0.0.1:5001", "east"}};
  w.tensors = {{"a.weight", codec::DType::bf16, {4, 8}}, {"b", codec::DType::f32, {}}};
  Welcome back = round_trip(w);
  EXPECT_EQ(back.session, w.session);
  EXPECT_EQ(back.topology, w.topology);
  EXPECT_EQ(back.max_message_bytes, w.max_message_bytes);
  ASSERT_EQ(back.members.size(), 2u);
  EXPECT_EQ(back.members[1].url, "tcp://127.0.0.1:5001");
  EXPECT_EQ(back.members[1].cluster, "east");
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[0].name, "a.weight");
  EXPECT_EQ(back.tensors[0].shape, (std::vector<uint64_t>{4, 8}));
  EXPECT_EQ(back.tensors[1].dtype, codec::DType::f32);
  EXPECT_TRUE(back.tensors[1].shape.empty());
}

TEST(Protocol, SmallMessagesRoundTrip) {
  Hello h = round_trip(Hello{3, "loop://r3", "west", 7, 99});
  EXPECT_EQ(h.rank, 3u);
  EXPECT_EQ(h.data_url, "loop://r3");
  EXPECT_EQ(h.cluster, "west");
  EXPECT_EQ(h.held_version, 7u);
  EXPECT_EQ(h.held_digest, 99u);
  Ack a = round_trip(Ack{2, 5, 0xdeadbeef, 1234});
  EXPECT_EQ(a.version, 5u);
  EXPECT_EQ(a.digest, 0xdeadbeefu);
  EXPECT_EQ(a.applied_changes, 1234u);
  Nack n = round_trip(Nack{4, 6, 3, "wrong base"});
  EXPECT_EQ(n.errc, 3u);
  EXPECT_EQ(n.message, "wrong base");
  EXPECT_EQ(round_trip(Commit{8, 77}).digest, 77u);
  EXPECT_EQ(round_trip(Abort{8, "dry run"}).reason, "dry run");
  EXPECT_EQ(round_trip(Active{1, 8, 77}).version, 8u);
  EXPECT_EQ(round_trip(Join{5, 1}).tree, 1u);
  EXPECT_EQ(round_trip(Ready{5}).rank, 5u);
  EXPECT_EQ(round_trip(HaveRequest{9}).version, 9u);
  EXPECT_TRUE(std::holds_alternative<Bye>(decode_message(encode_message(Bye{}))));
}

TEST(Protocol, BitmapsRoundTripAtOddLengths) {
  std::vector<bool> bits(13);
  bits[0] = bits[7] = bits[8] = bits[12] = true;
  Have have = round_trip(Have{1, 4, bits});
  EXPECT_EQ(have.chunks, bits);
  Resume resume = round_trip(Resume{2, 4, bits});
  EXPECT_EQ(resume.have, bits);
}

TEST(Protocol, FrameMessageCarriesTheFrameVerbatim) {
  std::vector<std::byte> frame(100);
  for (size_t i = 0; i < frame.size(); ++i) frame[i] = static_cast<std::byte>(i * 7);
  auto message = encode_frame_message(frame);
  EXPECT_EQ(message_type(message), MessageType::frame);
  auto payload = frame_payload(message);
  ASSERT_EQ(payload.size(), frame.size());
  EXPECT_EQ(0, std::memcmp(payload.data(), frame.data(), frame.size()));
  try {
    decode_message(message);
    FAIL() << "a FRAME decoded as a control message";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_frame);
  }
}

TEST(Protocol, RawHeaderRoundTripsAndRefusesBadPrefixes) {
  const RawChunkHeader h{1, 6, 9, 3, 4096, 1234};
  auto message = encode_raw_message(h);
  EXPECT_EQ(message_type(message), MessageType::raw);
  EXPECT_EQ(message.size(), kMessageHeaderSize + kRawPrefixSize);
  const RawChunkHeader d = decode_raw_message(message);
  EXPECT_EQ(d.version, h.version);
  EXPECT_EQ(d.chunk_index, h.chunk_index);
  EXPECT_EQ(d.chunk_count, h.chunk_count);
  EXPECT_EQ(d.tensor, h.tensor);
  EXPECT_EQ(d.byte_offset, h.byte_offset);
  EXPECT_EQ(d.byte_count, h.byte_count);
  auto expect_refused = [](std::span<const std::byte> bytes, const char* what) {
    try {
      decode_raw_message(bytes);
      FAIL() << what << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::corrupt_frame) << what;
    }
  };
  // A chunk index outside the count.
  expect_refused(encode_raw_message({1, 9, 9, 0, 0, 2}), "chunk index == chunk count");
  // A prefix with bytes after it (the old layout carried the body inline).
  auto longer = message;
  longer.push_back(std::byte{7});
  longer[8] = static_cast<std::byte>(kRawPrefixSize + 1);
  expect_refused(longer, "a RAW prefix with trailing bytes");
  expect_refused(encode_message(Ready{2}), "a READY read as RAW");
}

TEST(Protocol, RawPieceHashDependsOnBytesAndPlace) {
  std::vector<std::byte> bytes(4096);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 31 + 7);
  const RawChunkHeader h{1, 0, 4, 2, 8192, bytes.size()};
  const uint64_t base = raw_piece_hash(h, bytes);
  EXPECT_EQ(base, raw_piece_hash(h, bytes));  // deterministic; chunk index and count do not matter
  EXPECT_EQ(base, raw_piece_hash({1, 3, 7, 2, 8192, bytes.size()}, bytes));
  EXPECT_NE(base, raw_piece_hash({1, 0, 4, 3, 8192, bytes.size()}, bytes)) << "other tensor";
  EXPECT_NE(base, raw_piece_hash({1, 0, 4, 2, 8194, bytes.size()}, bytes)) << "other offset";
  bytes[4095] ^= std::byte{0x80};
  EXPECT_NE(base, raw_piece_hash(h, bytes)) << "one flipped bit";
}

void expect_corrupt(std::span<const std::byte> bytes, const char* what) {
  try {
    decode_message(bytes);
    FAIL() << what << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_frame) << what;
  }
}

TEST(Protocol, MalformedMessagesAreRefused) {
  auto good = encode_message(Nack{4, 6, 3, "wrong base"});
  expect_corrupt(std::span(good).first(10), "a message shorter than its header");
  auto bad_magic = good;
  bad_magic[0] ^= std::byte{1};
  expect_corrupt(bad_magic, "a bad magic");
  auto bad_type = good;
  bad_type[4] = std::byte{200};
  expect_corrupt(bad_type, "an unknown type");
  auto truncated = good;
  truncated.resize(good.size() - 3);
  expect_corrupt(truncated, "a message shorter than its body size");
  // Body size consistent with the buffer but a string length running past the end.
  auto lying = good;
  lying[kMessageHeaderSize + 4 + 8 + 4] = std::byte{0xff};
  expect_corrupt(lying, "a string longer than the body");
  // Trailing bytes after a complete body.
  auto trailing = encode_message(Ready{1});
  trailing.push_back(std::byte{0});
  trailing[8] = static_cast<std::byte>(5);
  expect_corrupt(trailing, "trailing bytes");
}

}  // namespace
}  // namespace deltacast::tree
