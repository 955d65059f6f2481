// Malformed safetensors files: each must be refused with the right Errc and a message naming the
// file and the problem.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "checkpoint/safetensors.h"
#include "test_files.h"
#include "util/error.h"

namespace deltacast::checkpoint {
namespace {

std::string with_length(uint64_t header_len, const std::string& rest) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header_len >> (8 * i)) & 0xff);
  return out + rest;
}

std::string file_of(const std::string& json, const std::string& data) {
  return with_length(json.size(), json + data);
}

class Malformed : public ::testing::Test {
 protected:
  // Writes `bytes` and expects open() to throw `code` with `needle` in the message.
  void expect_refused(const std::string& bytes, Errc code, const std::string& needle) {
    const auto path = dir_.path() / "bad.safetensors";
    test::write_raw(path, bytes);
    try {
      (void)SafetensorsFile::open(path);
      FAIL() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      const std::string msg = e.what();
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
      EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
      if (code == Errc::invalid_argument) {
        EXPECT_NE(msg.find("not a safetensors file"), std::string::npos) << msg;
      }
    }
  }
  test::TempDir dir_;
};

const std::string kGood = R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";

TEST_F(Malformed, TheGoodBaselineOpens) {
  const auto path = dir_.path() / "good.safetensors";
  test::write_raw(path, file_of(kGood, "abcd"));
  EXPECT_EQ(SafetensorsFile::open(path).manifest().size(), 1u);
}

TEST_F(Malformed, MissingFileIsAnIoError) {
  try {
    (void)SafetensorsFile::open(dir_.path() / "absent.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos);
  }
}

// A FIFO is refused at once: opening it for reading used to wait for a writer, forever.
TEST_F(Malformed, AFifoIsRefusedNotWaitedOn) {
  const auto path = dir_.path() / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  try {
    (void)SafetensorsFile::open(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

TEST_F(Malformed, DirectoryIsAnIoError) {
  try {
    (void)SafetensorsFile::open(dir_.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
  }
}

TEST_F(Malformed, EmptyFile) { expect_refused("", Errc::invalid_argument, "shorter than the 8-byte header"); }

TEST_F(Malformed, TruncatedLength) { expect_refused("\x10\0\0", Errc::invalid_argument, "shorter than the 8-byte"); }

TEST_F(Malformed, TruncatedData) {
  expect_refused(file_of(kGood, "abc"), Errc::invalid_argument, "tensors cover 4 bytes of a 3-byte data region");
}

TEST_F(Malformed, TrailingBytesAfterTheLastTensor) {
  expect_refused(file_of(kGood, "abcde"), Errc::invalid_argument, "tensors cover 4 bytes of a 5-byte");
}

TEST_F(Malformed, HeaderLengthLargerThanFile) {
  expect_refused(with_length(1000, kGood + "abcd"), Errc::invalid_argument, "larger than the");
}

TEST_F(Malformed, HeaderLengthAboveLimit) {
  expect_refused(with_length(kMaxHeaderBytes + 1, kGood), Errc::invalid_argument, "exceeds the limit");
}

TEST_F(Malformed, NotASafetensorsFileAtAll) {
  expect_refused("#!/bin/sh\necho hello, this is a shell script\n", Errc::invalid_argument, "header");
}

TEST_F(Malformed, BadJson) {
  expect_refused(file_of(R"({"a":{"dtype":"BF16",)", ""), Errc::invalid_argument, "not valid JSON");
}

// Nesting parses without recursion but copying or dumping it recurses: refused at parse.
TEST_F(Malformed, JsonNestedTooDeeply) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_refused(file_of(R"({"__metadata__":{"a":)" + deep + "}}", ""), Errc::invalid_argument, "nested deeper than");
}

TEST_F(Malformed, JsonNotAnObject) { expect_refused(file_of("[1, 2]", ""), Errc::invalid_argument, "start with '{'"); }

TEST_F(Malformed, DuplicateTensorName) {
  expect_refused(file_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", "xy"),
                 Errc::invalid_argument, "names 'a' twice");
}

TEST_F(Malformed, OverlappingOffsets) {
  expect_refused(file_of(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "abcd"),
                 Errc::invalid_argument, "(overlap)");
}

TEST_F(Malformed, GapBetweenTensors) {
  expect_refused(file_of(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})", "abcde"),
                 Errc::invalid_argument, "(gap)");
}

TEST_F(Malformed, WrongSizeForShape) {
  expect_refused(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"), Errc::invalid_argument,
                 "spans 4 bytes but F32 shape [2] needs 8");
}

TEST_F(Malformed, EndBeforeBegin) {
  expect_refused(file_of(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", "abcd"), Errc::invalid_argument,
                 "before begin");
}

TEST_F(Malformed, UnknownDtypeNamesTensorAndDtype) {
  expect_refused(file_of(R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", "abcdefgh"),
                 Errc::invalid_argument, "tensor 'w' has dtype 'C64'");
}

TEST_F(Malformed, NegativeOrFractionalShape) {
  expect_refused(file_of(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", ""), Errc::invalid_argument,
                 "not a non-negative integer");
  expect_refused(file_of(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})", ""), Errc::invalid_argument,
                 "not a non-negative integer");
}

TEST_F(Malformed, ShapeOverflow) {
  expect_refused(file_of(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
                 Errc::invalid_argument, "overflows");
}

TEST_F(Malformed, MissingFields) {
  expect_refused(file_of(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", "x"), Errc::invalid_argument, "no dtype");
  expect_refused(file_of(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", "x"), Errc::invalid_argument, "no shape");
  expect_refused(file_of(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "x"), Errc::invalid_argument,
                 "no data_offsets");
  expect_refused(file_of(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}})", "x"),
                 Errc::invalid_argument, "unknown field 'extra'");
}

TEST_F(Malformed, MetadataMustMapStringsToStrings) {
  expect_refused(file_of(R"({"__metadata__":{"step":3}})", ""), Errc::invalid_argument, "is not a string");
  expect_refused(file_of(R"({"__metadata__":[]})", ""), Errc::invalid_argument, "__metadata__ is not an object");
}

TEST_F(Malformed, EmptyTensorNameIsRefused) {
  expect_refused(file_of(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"), Errc::invalid_argument, "");
}

}  // namespace
}  // namespace deltacast::checkpoint
