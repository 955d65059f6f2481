#include "tools/checkpoint/delta_file.h"

#include <set>
#include <string>

#include "tools/checkpoint/files.h"
#include "util/error.h"

namespace deltacast::tools {

DeltaFile read_delta_file(const std::filesystem::path& path) {
  DeltaFile d;
  d.bytes = read_file(path);
  const std::string where = "delta file " + path.string() + ": ";
  if (d.bytes.empty()) throw Error(Errc::corrupt_frame, where + "empty");
  std::vector<std::span<const std::byte>> spans;
  try {
    spans = codec::split_frames(d.bytes);
    for (size_t i = 0; i < spans.size(); ++i) d.frames.push_back(codec::parse_frame(spans[i]));
  } catch (const Error& e) {
    throw Error(e.code(), where + "frame " + std::to_string(d.frames.size()) + ": " + e.what());
  }
  const auto& h0 = d.frames.front().header;
  size_t seals = 0;
  std::set<uint32_t> chunks;
  for (const auto& f : d.frames) {
    const auto& h = f.header;
    if (h.manifest_digest != h0.manifest_digest || h.base_version != h0.base_version ||
        h.base_digest != h0.base_digest || h.new_version != h0.new_version) {
      throw Error(Errc::corrupt_frame, where + "frames of different versions or models are mixed");
    }
    if (h.kind == codec::FrameKind::seal) {
      ++seals;
    } else if (!chunks.insert(h.chunk_index).second) {
      throw Error(Errc::corrupt_frame, where + "chunk " + std::to_string(h.chunk_index) + " appears twice");
    }
  }
  if (seals != 1) throw Error(Errc::corrupt_frame, where + "expected one seal frame, found " + std::to_string(seals));
  for (const auto& f : d.frames) {
    if (f.header.kind == codec::FrameKind::seal && f.header.chunk_count != chunks.size()) {
      throw Error(Errc::corrupt_frame, where + "seal announces " + std::to_string(f.header.chunk_count) +
                                           " chunks but the file holds " + std::to_string(chunks.size()));
    }
  }
  return d;
}

}  // namespace deltacast::tools
