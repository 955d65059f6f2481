// Round trips through write_safetensors / SafetensorsFile for every dtype, empty and scalar
// tensors, metadata, in-place updates and atomic replacement.
#include <gtest/gtest.h>
#include <algorithm>

#include <cstring>
#include <vector>

#include "checkpoint/safetensors.h"
#include "test_files.h"
#include "util/error.h"

namespace deltacast::checkpoint {
namespace {

using codec::DType;
using codec::TensorInfo;

// Owns bytes for a manifest, filled with a deterministic pattern that includes every bit value.
struct OwnedWeights {
  codec::Manifest manifest;
  std::vector<std::vector<std::byte>> data;

  explicit OwnedWeights(std::vector<TensorInfo> tensors, uint8_t salt = 0) : manifest(std::move(tensors)) {
    for (const auto& t : manifest.tensors()) {
      std::vector<std::byte> bytes(t.nbytes());
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(static_cast<uint8_t>(i * 131 + salt + t.name.size()));
      data.push_back(std::move(bytes));
    }
  }
  codec::ConstWeights view() const {
    codec::ConstWeights w{&manifest, {}};
    for (const auto& d : data) w.tensors.emplace_back(d);
    return w;
  }
};

void expect_same(const OwnedWeights& expected, const SafetensorsFile& file) {
  const auto& m = file.manifest();
  ASSERT_EQ(m.size(), expected.manifest.size());
  EXPECT_EQ(m.digest(), expected.manifest.digest());
  const auto w = file.weights();
  for (uint32_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m.at(i).name, expected.manifest.at(i).name);
    EXPECT_EQ(m.at(i).dtype, expected.manifest.at(i).dtype);
    EXPECT_EQ(m.at(i).shape, expected.manifest.at(i).shape);
    ASSERT_EQ(w.tensors[i].size(), expected.data[i].size());
    // std::equal, not memcmp: an empty tensor's vector has no storage (memcmp of null is UB).
    EXPECT_TRUE(std::equal(expected.data[i].begin(), expected.data[i].end(), w.tensors[i].begin())) << m.at(i).name;
  }
}

TEST(SafetensorsRoundTrip, EveryDtype) {
  test::TempDir dir;
  const OwnedWeights w({{"bf16", DType::bf16, {3, 5}},
                        {"f16", DType::f16, {7}},
                        {"f32", DType::f32, {2, 2, 3}},
                        {"e4m3", DType::f8_e4m3, {257}},
                        {"e5m2", DType::f8_e5m2, {1, 9}},
                        {"i8", DType::i8, {256}},
                        {"u8", DType::u8, {4, 64}}});
  const auto path = dir.path() / "all.safetensors";
  write_safetensors(path, w.view());
  const auto file = SafetensorsFile::open(path);
  expect_same(w, file);
  EXPECT_TRUE(file.metadata().empty());
  EXPECT_EQ(file.file_size(), std::filesystem::file_size(path));
}

TEST(SafetensorsRoundTrip, EmptyAndScalarTensors) {
  test::TempDir dir;
  const OwnedWeights w({{"scalar", DType::f32, {}},
                        {"empty_a", DType::bf16, {0}},
                        {"middle", DType::bf16, {4}},
                        {"empty_b", DType::u8, {3, 0, 2}},
                        {"scalar8", DType::i8, {}}});
  const auto path = dir.path() / "edge.safetensors";
  write_safetensors(path, w.view());
  const auto file = SafetensorsFile::open(path);
  expect_same(w, file);
  EXPECT_EQ(file.manifest().at(0).numel(), 1u);
  EXPECT_EQ(file.manifest().at(1).numel(), 0u);
}

TEST(SafetensorsRoundTrip, NoTensorsAtAll) {
  test::TempDir dir;
  const OwnedWeights w({});
  const auto path = dir.path() / "none.safetensors";
  write_safetensors(path, w.view(), {{"format", "pt"}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.manifest().size(), 0u);
  EXPECT_EQ(file.metadata().at("format"), "pt");
}

TEST(SafetensorsRoundTrip, Metadata) {
  test::TempDir dir;
  const OwnedWeights w({{"w", DType::bf16, {8}}});
  const Metadata meta{{"format", "pt"}, {"step", "12"}, {"quote\"d", "tab\there"}};
  const auto path = dir.path() / "meta.safetensors";
  write_safetensors(path, w.view(), meta);
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata(), meta);
  expect_same(w, file);
}

TEST(SafetensorsRoundTrip, HeaderIsPaddedToEightBytesWithSpaces) {
  const OwnedWeights w({{"abc", DType::bf16, {3}}});
  const std::string header = safetensors_header(w.manifest);
  ASSERT_EQ(header.size() % 8, 0u);
  uint64_t len = 0;
  std::memcpy(&len, header.data(), 8);  // the test host is little-endian like the format
  EXPECT_EQ(len, header.size() - 8);
  EXPECT_EQ(header[8], '{');
  const auto last_brace = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', last_brace + 1), std::string::npos);
}

TEST(SafetensorsRoundTrip, CheckpointOrderFollowsDataOffsetsNotJsonOrder) {
  test::TempDir dir;
  // Entries listed in reverse of their data order, as some writers do (sorted by name).
  const std::string json =
      R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})";
  std::string file(8, '\0');
  file[0] = static_cast<char>(json.size());
  file += json + "xyz";
  test::write_raw(dir.path() / "order.safetensors", file);
  const auto st = SafetensorsFile::open(dir.path() / "order.safetensors");
  ASSERT_EQ(st.manifest().size(), 2u);
  EXPECT_EQ(st.manifest().at(0).name, "b");
  EXPECT_EQ(st.manifest().at(1).name, "a");
  EXPECT_EQ(0, std::memcmp(st.weights().tensors[1].data(), "z", 1));
}

TEST(SafetensorsRoundTrip, InPlaceUpdateReachesTheFile) {
  test::TempDir dir;
  const OwnedWeights w({{"x", DType::f32, {16}}, {"y", DType::bf16, {5}}});
  const auto path = dir.path() / "upd.safetensors";
  write_safetensors(path, w.view());
  {
    auto file = SafetensorsFile::open_for_update(path);
    auto mw = file.mutable_weights();
    std::memset(mw.tensors[1].data(), 0xAB, mw.tensors[1].size());
    file.flush();
  }
  OwnedWeights expected({{"x", DType::f32, {16}}, {"y", DType::bf16, {5}}});
  std::fill(expected.data[1].begin(), expected.data[1].end(), std::byte{0xAB});
  expect_same(expected, SafetensorsFile::open(path));
}

TEST(SafetensorsRoundTrip, ReadOnlyFileRefusesMutableWeights) {
  test::TempDir dir;
  const OwnedWeights w({{"x", DType::u8, {1}}});
  write_safetensors(dir.path() / "r.safetensors", w.view());
  auto file = SafetensorsFile::open(dir.path() / "r.safetensors");
  try {
    (void)file.mutable_weights();
    FAIL() << "expected Error(state)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::state);
  }
}

TEST(SafetensorsRoundTrip, ReplaceIsAtomicAndLeavesNoTemporaryFiles) {
  test::TempDir dir;
  const auto path = dir.path() / "model.safetensors";
  const OwnedWeights first({{"w", DType::bf16, {100}}}, 1);
  const OwnedWeights second({{"w", DType::bf16, {100}}}, 2);
  write_safetensors(path, first.view());
  const auto old_file = SafetensorsFile::open(path);  // a reader holding the old version
  write_safetensors(path, second.view());
  expect_same(first, old_file);  // the old mapping still sees complete old bytes
  expect_same(second, SafetensorsFile::open(path));
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u);
}

TEST(SafetensorsRoundTrip, WriteRejectsWeightsThatDoNotMatchTheManifest) {
  test::TempDir dir;
  OwnedWeights w({{"w", DType::bf16, {4}}});
  w.data[0].resize(7);
  try {
    write_safetensors(dir.path() / "bad.safetensors", w.view());
    FAIL() << "expected Error(invalid_argument)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "bad.safetensors"));
}

TEST(SafetensorsRoundTrip, WriteIntoMissingDirectoryIsAnIoError) {
  test::TempDir dir;
  const OwnedWeights w({{"w", DType::u8, {1}}});
  try {
    write_safetensors(dir.path() / "no" / "such" / "x.safetensors", w.view());
    FAIL() << "expected Error(io)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
  }
}

}  // namespace
}  // namespace deltacast::checkpoint
