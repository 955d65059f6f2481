// Placement files (config/placement_file.h): the list and mapping forms in YAML and JSON, a round
// trip through placement_yaml (a vLLM-style TP placement, padding, stacking, `at`), and each kind
// of bad input refused with its line:column.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "../codec/placement_reference.h"
#include "codec/manifest.h"
#include "codec/placement.h"
#include "codec/tp_placement.h"
#include "config/placement_file.h"
#include "util/error.h"

namespace deltacast::config {
namespace {

using codec::BufferPlacement;
using codec::DType;
using codec::PlacementPart;

void expect_same(const std::vector<BufferPlacement>& a, const std::vector<BufferPlacement>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].name);
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].stack, b[i].stack);
    EXPECT_EQ(a[i].shape, b[i].shape);
    EXPECT_EQ(a[i].bytes, b[i].bytes);
    ASSERT_EQ(a[i].parts.size(), b[i].parts.size());
    for (size_t k = 0; k < a[i].parts.size(); ++k) {
      const PlacementPart &p = a[i].parts[k], &q = b[i].parts[k];
      EXPECT_EQ(p.tensor, q.tensor);
      EXPECT_EQ(p.dim, q.dim);
      EXPECT_EQ(p.start, q.start);
      EXPECT_EQ(p.stop, q.stop);
      EXPECT_EQ(p.at, q.at);
    }
  }
}

// The message of the Error(config) that parsing `text` throws ("" when it parses).
std::string refusal(const std::string& text) {
  try {
    parse_placement(text, "p.yaml");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
    return e.what();
  }
  return "";
}

// What the documents below describe.
std::vector<BufferPlacement> expected() {
  return {
      {"qkv", {{"q", 0, 0, 4, {}}, {"k", 0, 2, 4, {}}}, false, {}, 0},
      {"embed", {{"e", 0, 64, 100, 0}}, false, {64, 8}, uint64_t{64} * 8 * 2},
      {"experts", {{"x0", 1, 0, 3, {}}, {"x1", 1, 0, 3, {}}}, true, {}, 0},
  };
}

TEST(PlacementFile, ReadsTheListAndMappingFormsInYamlAndJson) {
  const std::string yaml_text = R"(# a receiver's buffers
qkv:
  - [q, 0, 0, 4]
  - [k, 0, 2, 4]
embed:
  parts: [{tensor: e, dim: 0, start: 64, stop: 100, at: 0}]
  shape: [64, 8]
  bytes: 1024
experts:
  stack: true
  parts:
    - [x0, 1, 0, 3]
    - {tensor: x1, stop: 3, start: 0, dim: 1}
)";
  expect_same(parse_placement(yaml_text, "p.yaml"), expected());
  // What Python's json.dumps({buffer: [(tensor, dim, start, stop), ...]}) writes, options beside.
  const std::string json_text = R"({"qkv": [["q", 0, 0, 4], ["k", 0, 2, 4]],)"
                                R"( "embed": {"parts": [["e", 0, 64, 100, 0]], "shape": [64, 8], "bytes": 1024},)"
                                R"( "experts": {"parts": [["x0", 1, 0, 3], ["x1", 1, 0, 3]], "stack": true}})";
  expect_same(parse_placement(json_text, "p.json"), expected());
}

TEST(PlacementFile, WritesWhatItReadsBack) {
  expect_same(parse_placement(placement_yaml(expected()), "written"), expected());
  // A vLLM-style TP rank of a small Llama-like manifest: fused, split by rows and columns, padded.
  const codec::Manifest m = codec::testing::tiny_llama_manifest();
  for (uint32_t rank : {0u, 1u}) {
    const auto placement = codec::llama_tp_placement(m, rank, 2);
    const auto text = placement_yaml(placement);
    const auto back = parse_placement(text, "tp.yaml");
    expect_same(back, placement);
    const auto a = codec::Placement::compile(m, placement);
    const auto b = codec::Placement::compile(m, back);
    ASSERT_EQ(a.part_count(), b.part_count());
    for (uint32_t t = 0; t < m.size(); ++t)
      for (uint64_t u = 0; u < m.at(t).units(); ++u) ASSERT_EQ(a.locate(t, u), b.locate(t, u));
  }
}

TEST(PlacementFile, RefusesBadInputNamingTheLine) {
  EXPECT_NE(refusal("qkv: [[q, 0, 0, 4]\n").find("p.yaml:"), std::string::npos);
  EXPECT_NE(refusal("qkv: [[q, 0, 0, 4]\n").find("malformed"), std::string::npos);
  EXPECT_NE(refusal("- [q, 0, 0, 4]\n").find("p.yaml:1:1: a placement is a mapping"), std::string::npos);
  EXPECT_EQ(refusal(""), "p.yaml: the placement is empty");
  EXPECT_EQ(refusal("# nothing\n"), "p.yaml: the placement is empty");
  EXPECT_NE(refusal("a:\n  - [q, 0, 0, 4]\nb:\n  - [q, 0, 4]\n").find("p.yaml:4:5: buffer 'b' part 0: a part is"),
            std::string::npos);
  EXPECT_NE(refusal("a:\n  - [q, 0, -1, 4]\n")
                .find("p.yaml:2:12: buffer 'a' part 0 start expects a non-negative integer, got '-1'"),
            std::string::npos);
  EXPECT_NE(refusal("a:\n  - [q, 0, 1.5, 4]\n").find("got '1.5'"), std::string::npos);
  EXPECT_NE(refusal("a:\n  - [q, x, 0, 4]\n").find("dim expects a non-negative integer"), std::string::npos);
  EXPECT_NE(refusal("a:\n  - [[q], 0, 0, 4]\n").find("tensor expects a tensor name"), std::string::npos);
  EXPECT_NE(
      refusal("a:\n  - {tensor: q, dim: 0, start: 0}\n").find("p.yaml:2:5: buffer 'a' part 0: the part lacks 'stop'"),
      std::string::npos);
  EXPECT_NE(refusal("a:\n  - {tensor: q, dim: 0, start: 0, stop: 4, end: 5}\n").find("p.yaml:2:44: unknown key 'end'"),
            std::string::npos);
  EXPECT_NE(refusal("a:\n  parts: [[q, 0, 0, 4]]\n  shard: 1\n").find("p.yaml:3:3: unknown key 'a.shard'"),
            std::string::npos);
  EXPECT_NE(refusal("a:\n  shape: [4]\n").find("p.yaml:2:3: buffer 'a' has no parts"), std::string::npos);
  EXPECT_NE(refusal("a: []\n").find("buffer 'a' has no parts"), std::string::npos);
  EXPECT_NE(refusal("a: q\n").find("p.yaml:1:4: buffer 'a' expects a list of parts"), std::string::npos);
  EXPECT_NE(refusal("a:\n  parts: [[q, 0, 0, 4]]\n  stack: yes please\n").find("stack expects true or false"),
            std::string::npos);
  EXPECT_NE(refusal("a:\n  parts: [[q, 0, 0, 4]]\n  shape: 4\n").find("shape expects a list"), std::string::npos);
  EXPECT_NE(refusal("a: [[q, 0, 0, 4]]\na: [[k, 0, 0, 4]]\n").find("p.yaml:2:1: buffer 'a' is named twice"),
            std::string::npos);
  EXPECT_NE(refusal("a: [[q\xf8\xf8, 0, 0, 4]]\n").find("p.yaml:1:6: buffer 'a' part 0 tensor is not UTF-8"),
            std::string::npos);
  EXPECT_NE(refusal("\xc3(: [[q, 0, 0, 4]]\n").find("p.yaml:1:1: buffer names must be UTF-8"), std::string::npos);
  EXPECT_EQ(refusal("a: [[q, 0, 0, 4]]\n"), "");
  EXPECT_EQ(refusal("\xc3\xa9: [[\xc3\xa9, 0, 0, 4]]\n"), "") << "UTF-8 names are names";
}

TEST(PlacementFile, LoadsAFileAndNamesOneItCannotRead) {
  const auto path = std::filesystem::temp_directory_path() / ("placement_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << placement_yaml(expected());
  }
  expect_same(load_placement_file(path.string()), expected());
  std::filesystem::remove(path);
  try {
    load_placement_file(path.string());
    FAIL() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
}

}  // namespace
}  // namespace deltacast::config
