#pragma once
// Builds chunk and seal frames (internal to the codec; tests use it to craft frames).
#include <cstdint>
#include <utility>
#include <vector>

#include "codec/frame.h"

namespace deltacast::codec {

struct SectionSizes {
  uint64_t location_bytes = 0;  // stored bytes of the locations section
  uint64_t value_bytes = 0;     // stored bytes of all value sections
};

// Streams must be in ascending StreamId order and non-empty. Each is stored as one zstd frame at
// `zstd_level` when that is smaller, else raw. header.kind/item_count/body_size are filled in.
std::vector<std::byte> build_chunk_frame(FrameHeader header, const std::vector<SegmentInfo>& segments,
                                         std::vector<std::pair<StreamId, std::vector<std::byte>>> streams,
                                         int zstd_level, SectionSizes* sizes = nullptr);

std::vector<std::byte> build_seal_frame(FrameHeader header, const std::vector<uint64_t>& tensor_digests,
                                        const std::vector<SliceDigest>& slice_digests = {});

}  // namespace deltacast::codec
