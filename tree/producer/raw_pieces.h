#pragma once
// A full checkpoint as RAW pieces (docs/protocol.md, "RAW"): version 1 sent as bare bytes, each
// piece whole elements of one tensor, at most chunk_bytes. One producer sends every tensor; a
// producer group's rank r sends the pieces of its part's ranges, numbered after the pieces of
// ranks 0..r-1 (every rank computes every part's count from the partition: no exchange). Pure.
// Unit tests: tests/unit/tree/test_raw_pieces.cpp.
#include <cstdint>
#include <vector>

#include "codec/manifest.h"
#include "codec/partition.h"

namespace deltacast::tree {

struct RawPiece {
  uint32_t tensor = 0;
  uint64_t offset = 0;  // bytes into the tensor
  uint64_t size = 0;    // bytes, whole elements, > 0
  bool operator==(const RawPiece&) const = default;
};

// The pieces of `ranges` (units of the manifest's tensors, codec/partition.h) in order: each range
// sliced into pieces of the largest whole number of elements within chunk_bytes (at least one
// element). Throws Error(invalid_argument) for a range outside its tensor or one that splits an
// element.
std::vector<RawPiece> raw_pieces(const codec::Manifest& manifest, const std::vector<codec::PartRange>& ranges,
                                 uint64_t chunk_bytes);
// Every non-empty tensor, whole: one producer's bootstrap.
std::vector<codec::PartRange> whole_tensors(const codec::Manifest& manifest);

// A group bootstrap's numbering: rank r's pieces are [first[r], first[r + 1]) of first.back().
std::vector<uint32_t> raw_group_first(const codec::Manifest& manifest, const codec::Partition& partition,
                                      uint64_t chunk_bytes);

}  // namespace deltacast::tree
