#pragma once
// Chunk frames: the unit the codec emits, the tree forwards and the applier consumes.
// Layout and field meanings: docs/frame-format.md (keep the two in step; tests/golden pins bytes).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/dtype.h"

namespace deltacast::codec {

inline constexpr uint32_t kFrameMagic = 0x46584344;  // "DCXF" little-endian
inline constexpr uint16_t kFormatVersion = 2;  // 2: 32-bit-lane digest terms (docs/frame-format.md)
inline constexpr size_t kFrameHeaderSize = 64;
inline constexpr size_t kFrameTrailerSize = 8;  // xxh3-64 of every byte before it
inline constexpr size_t kSegmentEntrySize = 32;
inline constexpr size_t kSectionEntrySize = 24;
// A frame body larger than this is refused before any allocation (memory-exhaustion guard).
inline constexpr uint64_t kMaxFrameBody = uint64_t{1} << 34;

enum class FrameKind : uint8_t { chunk = 1, seal = 2 };

// How a changed element's new bits are carried.
enum class ValueMode : uint8_t {
  xor_bits = 1,   // new ^ old: receiver must hold exactly the base bits
  ulp_delta = 2,  // key(new) - key(old) in ordered-integer space (bijective; ±1 ulp is the common case)
  overwrite = 3,  // new bits verbatim: for tensors the receiver stores differently
};

// How the positions of changed elements inside a segment are carried (smallest chosen per segment).
enum class LocationCoding : uint8_t {
  none = 0,          // no element changed
  range = 1,         // every element of the segment changed
  bitmap = 2,        // one bit per element
  gaps = 3,          // Rice-coded gaps between changed positions
  classed_gaps = 4,  // elements split into classes by the receiver's old exponent; Rice gaps per class
  gap_varint = 5,    // LEB128 varints of gaps (byte-aligned: zstd can model them)
};
inline constexpr int kLocationCodingCount = 6;
// Stable lowercase names ("classed_gaps", "ulp_delta") for tools and logs.
const char* location_coding_name(LocationCoding coding) noexcept;
const char* value_mode_name(ValueMode mode) noexcept;

// Streams (sections) of a chunk frame; each is stored raw or as one standard zstd frame.
enum class StreamId : uint8_t {
  locations = 1,
  sign_bits = 2,       // ulp_delta: one bit per change, 1 = negative
  mag_flags = 3,       // ulp_delta: one bit per change, 1 = |delta| > 1
  mag_bytes = 4,       // ulp_delta: |delta| - 2 for flagged changes, 255 = escape to mag_wide
  mag_wide = 5,        // ulp_delta: |delta| as u32 LE for escaped changes
  location_index = 6,  // optional: per segment, its locations' byte length (LEB128), so a member
                       // holding only slices skips the segments it does not hold undecoded
  plane0 = 8,          // xor_bits/overwrite: byte j of each value goes to plane j (j < element size)
  plane1 = 9,
  plane2 = 10,
  plane3 = 11,
};
enum class SectionCodec : uint8_t { raw = 0, zstd = 1 };

struct FrameHeader {
  FrameKind kind = FrameKind::chunk;
  uint16_t format_version = kFormatVersion;
  uint64_t body_size = 0;
  uint64_t manifest_digest = 0;
  uint64_t base_version = 0;
  uint64_t base_digest = 0;  // StateDigest::combined() of the base state
  uint64_t new_version = 0;
  uint32_t chunk_index = 0;  // chunk: its index; seal: 0
  uint32_t chunk_count = 0;  // chunks in this version
  uint32_t item_count = 0;   // chunk: segments; seal: tensors
};

struct SegmentInfo {
  uint32_t tensor_index = 0;
  DType dtype = DType::bf16;
  ValueMode value_mode = ValueMode::ulp_delta;
  LocationCoding location_coding = LocationCoding::none;
  uint64_t element_begin = 0;
  uint64_t element_count = 0;
  uint64_t change_count = 0;
};

struct SectionInfo {
  StreamId stream = StreamId::locations;
  SectionCodec codec = SectionCodec::raw;
  uint64_t raw_size = 0;
  uint64_t stored_size = 0;
  uint64_t offset = 0;  // from the start of the frame
};

// The digest of one slice of a canonical tensor (codec/placement.h): the sum of the digest terms
// of units [start, stop) along dimension `dim` of tensor `tensor`, every other dimension whole.
// Seals carry them for the slices members hold (docs/frame-format.md, "Seal body").
struct SliceDigest {
  uint32_t tensor = 0;
  uint32_t dim = 0;
  uint64_t start = 0;
  uint64_t stop = 0;
  uint64_t digest = 0;
  bool same_slice(const SliceDigest& o) const noexcept {
    return tensor == o.tensor && dim == o.dim && start == o.start && stop == o.stop;
  }
  bool operator==(const SliceDigest&) const = default;
};
inline constexpr size_t kSliceDigestEntrySize = 32;

// A validated, parsed frame. Spans point into the caller's bytes.
struct FrameView {
  FrameHeader header;
  std::vector<SegmentInfo> segments;    // chunk frames
  std::vector<SectionInfo> sections;    // chunk frames
  std::vector<uint64_t> tensor_digests; // seal frames: per-tensor digests of the new version
  std::vector<SliceDigest> slice_digests;  // seal frames: digests of members' slices (may be empty)
  std::span<const std::byte> bytes;     // the whole frame
};

// Total frame size from its first kFrameHeaderSize bytes (for reading frames off a stream).
// Throws Error(corrupt_frame) for a bad magic or an oversized body, Error(version_mismatch) for an
// unknown format version.
uint64_t frame_size_from_header(std::span<const std::byte> header_bytes);

// Validates magic, format version, sizes, checksum and structure (section bounds, known enums,
// segment fields) and parses. Throws Error(corrupt_frame | version_mismatch) naming the problem.
FrameView parse_frame(std::span<const std::byte> frame);

// Rewrites a frame's base digest (header offset 32) and its checksum: for an encoder that learns
// the base's digest only after its chunks were built. Throws Error(corrupt_frame) when `frame` is
// not a whole frame.
void patch_base_digest(std::span<std::byte> frame, uint64_t base_digest);

// Splits a buffer holding concatenated frames (a .dcx file) into frames. Throws on truncation.
std::vector<std::span<const std::byte>> split_frames(std::span<const std::byte> bytes);

}  // namespace deltacast::codec
