// fuzz_placement: a placement file (config/placement_file.h) read, written back, and compiled
// against a small fixed model (codec/placement.h).
//
// Input: the YAML or JSON text.
// Oracles:
//   * parse_placement throws nothing but Error(config), whose message starts with
//     "fuzz.yaml:LINE:COL: " (from 1), or is "fuzz.yaml: the placement is empty";
//   * what parses is written back by placement_yaml into text that parses to the same buffers;
//   * Placement::compile against the model throws nothing but Error(invalid_argument); a placement
//     that compiles maps every canonical unit to places inside its buffers, no buffer unit is
//     held twice, locate() and for_each_run() agree, and holds_any() is true exactly where a run is.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "codec/placement.h"
#include "config/placement_file.h"
#include "fuzz_common.h"
#include "util/error.h"

namespace deltacast::fuzz {
namespace {

constexpr const char* kSource = "fuzz.yaml";

bool same(const std::vector<codec::BufferPlacement>& a, const std::vector<codec::BufferPlacement>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].stack != b[i].stack || a[i].shape != b[i].shape || a[i].bytes != b[i].bytes ||
        a[i].parts.size() != b[i].parts.size())
      return false;
    for (size_t k = 0; k < a[i].parts.size(); ++k) {
      const auto &p = a[i].parts[k], &q = b[i].parts[k];
      if (p.tensor != q.tensor || p.dim != q.dim || p.start != q.start || p.stop != q.stop || p.at != q.at)
        return false;
    }
  }
  return true;
}

// Small tensors of the kinds engines slice (the fuzzer's dictionary names them).
const codec::Manifest& model() {
  static const codec::Manifest m({{"q", codec::DType::bf16, {8, 4}},
                                  {"k", codec::DType::bf16, {4, 4}},
                                  {"o", codec::DType::bf16, {4, 8}},
                                  {"e0", codec::DType::f32, {3, 2, 5}},
                                  {"e1", codec::DType::f32, {3, 2, 5}},
                                  {"d", codec::DType::f64, {6}},
                                  {"n", codec::DType::bf16, {4}}});
  return m;
}

void check_mapping(const codec::Placement& p) {
  const codec::Manifest& m = model();
  std::vector<std::vector<char>> taken(p.buffers().size());
  for (uint32_t b = 0; b < p.buffers().size(); ++b) taken[b].assign(p.buffer_units(b), 0);
  for (uint32_t t = 0; t < m.size(); ++t) {
    const uint64_t units = m.at(t).units();
    std::vector<std::vector<codec::PlacedUnit>> located(units);
    for (uint64_t u = 0; u < units; ++u) {
      located[u] = p.locate(t, u);
      for (const auto& at : located[u]) {
        FUZZ_CHECK(at.buffer < p.buffers().size() && at.unit < p.buffer_units(at.buffer),
                   "locate() outside the buffers");
        FUZZ_CHECK(!taken[at.buffer][at.unit], "a buffer unit holds two canonical units");
        taken[at.buffer][at.unit] = 1;
      }
    }
    std::vector<std::vector<codec::PlacedUnit>> from_runs(units);
    p.for_each_run(t, 0, units, [&](const codec::PlacedRun& r) {
      FUZZ_CHECK(r.count > 0 && r.unit + r.count <= units, "a run outside its tensor");
      for (uint64_t i = 0; i < r.count; ++i) from_runs[r.unit + i].push_back({r.buffer, r.buffer_unit + i});
    });
    for (uint64_t u = 0; u < units; ++u) {
      std::sort(from_runs[u].begin(), from_runs[u].end());
      FUZZ_CHECK(from_runs[u] == located[u], "for_each_run and locate disagree");
      FUZZ_CHECK(p.holds_any(t, u, u + 1) == !located[u].empty(), "holds_any disagrees with locate");
    }
  }
}

}  // namespace
}  // namespace deltacast::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltacast;
  fuzz::quiet_logs();
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<codec::BufferPlacement> buffers;
  try {
    buffers = config::parse_placement(text, fuzz::kSource);
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == Errc::config, std::string("parse_placement threw ") + e.what());
    FUZZ_CHECK(fuzz::has_source_location(e.what(), fuzz::kSource) ||
                   std::string(e.what()) == std::string(fuzz::kSource) + ": the placement is empty",
               std::string("message without SOURCE:LINE:COL: ") + e.what());
    return 0;
  }
  FUZZ_CHECK(!buffers.empty(), "a placement without buffers parsed");
  FUZZ_CHECK(fuzz::same(config::parse_placement(config::placement_yaml(buffers), "written"), buffers),
             "placement_yaml did not read back the same buffers");
  std::optional<codec::Placement> compiled;
  try {
    compiled.emplace(codec::Placement::compile(fuzz::model(), buffers));
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == Errc::invalid_argument, std::string("compile threw ") + e.what());
    return 0;
  }
  fuzz::check_mapping(*compiled);
  return 0;
}
