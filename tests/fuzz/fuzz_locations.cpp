// fuzz_locations: one segment's location stream through codec::decode_locations
// (codec/location_coding.h), then the decoded positions re-encoded by encode_locations.
//
// Input: u8 coding (any byte: unknown codings included), u8 dtype wire byte (its abs_mask; an
// unknown byte picks BF16's), u32 element count (taken modulo 2^20: a frame's segments are bounded
// by the manifest before their locations are decoded), u32 change count, then the stream.
// Oracles:
//   * only Error(corrupt_frame) escapes; the stream cursor only moves forward, inside the stream;
//   * accepted: exactly `change count` locations; positions strictly increasing and below the
//     element count; classed_gaps: 2..8 classes, thresholds strictly ascending within abs_mask,
//     ranks strictly increasing per class and below the element count;
//   * encode_locations of what was decoded, decoded again, gives the same positions (classed
//     ranks are laid out as class-major positions of a synthetic segment, so the encoder may
//     choose any coding), consumes exactly the encoded bytes, and codes the changes in an order
//     that is a permutation.
#include <algorithm>
#include <numeric>
#include <vector>

#include "codec/chunk_plan.h"
#include "codec/location_coding.h"
#include "fuzz_common.h"
#include "util/error.h"

namespace deltacast::fuzz {
namespace {

using codec::DecodedLocations;
using codec::LocationCoding;
using codec::ScanVector;

constexpr uint64_t kMaxElements = uint64_t{1} << 20;

void check_ascending(const ScanVector<uint32_t>& v, uint64_t limit, const char* what) {
  for (size_t i = 0; i < v.size(); ++i) {
    FUZZ_CHECK(v[i] < limit, std::string(what) + " at or past the segment end");
    FUZZ_CHECK(i == 0 || v[i - 1] < v[i], std::string(what) + " not strictly increasing");
  }
}

// Decodes `stream` whole; the cursor must stay inside it.
DecodedLocations decode(LocationCoding coding, uint64_t n, uint64_t changes, uint32_t abs_mask,
                        std::span<const std::byte> stream, size_t* consumed) {
  DecodedLocations out;
  auto cursor = stream;
  codec::decode_locations(coding, n, changes, abs_mask, cursor, out);
  FUZZ_CHECK(cursor.data() >= stream.data() && cursor.data() + cursor.size() == stream.data() + stream.size(),
             "the cursor left the stream");
  *consumed = stream.size() - cursor.size();
  return out;
}

void check_decoded(const DecodedLocations& d, uint64_t n, uint64_t changes, uint32_t abs_mask) {
  if (d.coding != LocationCoding::classed_gaps) {
    FUZZ_CHECK(d.positions.size() == changes, "position count differs from the announced changes");
    check_ascending(d.positions, n, "position");
    return;
  }
  const unsigned k = d.classes.count;
  FUZZ_CHECK(k >= 2 && k <= codec::kMaxClasses, "class count out of range");
  for (unsigned j = 0; j + 1 < k; ++j) {
    FUZZ_CHECK(d.classes.thresholds[j] <= abs_mask, "class threshold beyond abs_mask");
    FUZZ_CHECK(j == 0 || d.classes.thresholds[j - 1] < d.classes.thresholds[j], "class thresholds not ascending");
  }
  FUZZ_CHECK(d.ranks.size() >= k, "fewer rank lists than classes");
  uint64_t total = 0;
  for (unsigned j = 0; j < k; ++j) {
    check_ascending(d.ranks[j], n, "class rank");
    total += d.ranks[j].size();
  }
  FUZZ_CHECK(total == changes, "class ranks do not add up to the announced changes");
}

// The decoded changes as an encoder input. Classed: class j's elements occupy a block of
// max rank + 1 positions, blocks in class order, so ranks and positions agree.
struct Reencoding {
  codec::ScanOutput scan;
  codec::SegmentChanges changes;
};
void build_input(const DecodedLocations& d, uint64_t n, Reencoding& r) {
  r.changes.scan = &r.scan;
  if (d.coding != LocationCoding::classed_gaps) {
    r.scan.positions = d.positions;
    r.changes.element_count = n;
    return;
  }
  r.changes.classes = d.classes;
  uint64_t offset = 0;
  for (unsigned j = 0; j < d.classes.count; ++j) {
    for (uint32_t rank : d.ranks[j]) {
      r.scan.positions.push_back(static_cast<uint32_t>(offset + rank));
      r.scan.change_class.push_back(static_cast<uint8_t>(j));
      r.scan.change_rank.push_back(rank);
    }
    const uint64_t size = d.ranks[j].empty() ? 0 : uint64_t{d.ranks[j].back()} + 1;
    r.scan.class_sizes[j] = size;
    offset += size;
  }
  r.changes.element_count = offset;
}

void reencode(const DecodedLocations& d, uint64_t n, uint32_t abs_mask) {
  Reencoding r;
  build_input(d, n, r);
  std::vector<std::byte> bytes;
  const codec::LocationPlan plan = codec::encode_locations(r.changes, bytes);
  const uint64_t c = r.scan.positions.size();
  if (!plan.order.empty()) {
    FUZZ_CHECK(plan.order.size() == c, "the coding order does not cover every change");
    std::vector<uint32_t> order(plan.order.begin(), plan.order.end());
    std::sort(order.begin(), order.end());
    for (size_t i = 0; i < order.size(); ++i) FUZZ_CHECK(order[i] == i, "the coding order is not a permutation");
  }
  size_t consumed = 0;
  DecodedLocations again;
  try {
    again = decode(plan.coding, r.changes.element_count, c, abs_mask, bytes, &consumed);
  } catch (const Error& e) {
    FUZZ_CHECK(false, std::string("re-encoded locations were refused: ") + e.what());
  }
  FUZZ_CHECK(consumed == bytes.size(), "the decoder did not consume exactly the encoded bytes");
  if (again.coding != LocationCoding::classed_gaps) {
    FUZZ_CHECK(again.positions == r.scan.positions, "re-encoded positions differ");
    return;
  }
  FUZZ_CHECK(again.classes.count == d.classes.count && again.classes.thresholds == d.classes.thresholds,
             "re-encoded classes differ");
  for (unsigned j = 0; j < d.classes.count; ++j) FUZZ_CHECK(again.ranks[j] == d.ranks[j], "re-encoded ranks differ");
}

}  // namespace
}  // namespace deltacast::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltacast;
  fuzz::FuzzInput in(data, size);
  const auto coding = static_cast<codec::LocationCoding>(in.get<uint8_t>());
  const auto dtype = codec::dtype_from_wire(in.get<uint8_t>()).value_or(codec::DType::bf16);
  const uint32_t abs_mask = codec::abs_mask_of(dtype);
  const uint64_t n = in.get<uint32_t>() % fuzz::kMaxElements;
  const uint64_t changes = in.get<uint32_t>();
  const auto stream = in.rest();
  const std::vector<std::byte> owned(stream.begin(), stream.end());  // exactly sized for ASan
  codec::DecodedLocations decoded;
  size_t consumed = 0;
  try {
    decoded = fuzz::decode(coding, n, changes, abs_mask, owned, &consumed);
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == Errc::corrupt_frame, std::string("decode threw ") + e.what());
    return 0;
  }
  fuzz::check_decoded(decoded, n, changes, abs_mask);
  fuzz::reencode(decoded, n, abs_mask);
  return 0;
}
