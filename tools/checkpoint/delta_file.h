#pragma once
// A .dcx file (concatenated frames as written by `deltacast diff`), read and validated as a whole:
// every frame parsed and checked for consistency before anything is applied.
#include <cstddef>
#include <filesystem>
#include <vector>

#include "codec/frame.h"

namespace deltacast::tools {

struct DeltaFile {
  std::vector<std::byte> bytes;          // the whole file
  std::vector<codec::FrameView> frames;  // parsed, spans into `bytes`
  const codec::FrameHeader& first_header() const { return frames.front().header; }
};

// Reads and parses every frame. Throws Error(io) when unreadable, Error(corrupt_frame) for an
// empty or truncated file, a frame failing parse_frame, frames of different versions, bases or
// models, a missing or duplicated seal, or a chunk count that does not match the seal's.
// (DeltaFile is returned by value: its spans point into the moved vector's heap buffer.)
DeltaFile read_delta_file(const std::filesystem::path& path);

}  // namespace deltacast::tools
