#include "codec/frame.h"

#include <zstd.h>

#include "codec/frame_writer.h"
#include "codec/scratch.h"
#include "codec/xxh3.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::codec {

namespace {

void write_header(std::vector<std::byte>& out, const FrameHeader& h) {
  ByteWriter w(out);
  w.u32(kFrameMagic);
  w.u16(h.format_version);
  w.u8(static_cast<uint8_t>(h.kind));
  w.u8(0);
  w.u64(h.body_size);
  w.u64(h.manifest_digest);
  w.u64(h.base_version);
  w.u64(h.base_digest);
  w.u64(h.new_version);
  w.u32(h.chunk_index);
  w.u32(h.chunk_count);
  w.u32(h.item_count);
  w.u32(0);
  DC_ASSERT(out.size() == kFrameHeaderSize);
}

void seal_trailer(std::vector<std::byte>& out) {
  ByteWriter(out).u64(XXH3_64bits(out.data(), out.size()));
}

FrameHeader read_header(std::span<const std::byte> bytes) {
  ByteReader r(bytes.first(std::min(bytes.size(), kFrameHeaderSize)), "frame header");
  if (bytes.size() < kFrameHeaderSize)
    throw Error(Errc::corrupt_frame, "frame header: truncated (" + std::to_string(bytes.size()) + " of " +
                                         std::to_string(kFrameHeaderSize) + " bytes)");
  FrameHeader h;
  if (r.get<uint32_t>() != kFrameMagic) throw Error(Errc::corrupt_frame, "frame header: bad magic (not a deltacast frame)");
  h.format_version = r.get<uint16_t>();
  if (h.format_version != kFormatVersion)
    throw Error(Errc::version_mismatch, "frame header: format version " + std::to_string(h.format_version) +
                                            " is not supported (this build reads version " +
                                            std::to_string(kFormatVersion) + ")");
  const uint8_t kind = r.get<uint8_t>();
  if (kind != static_cast<uint8_t>(FrameKind::chunk) && kind != static_cast<uint8_t>(FrameKind::seal))
    throw Error(Errc::corrupt_frame, "frame header: unknown frame kind " + std::to_string(kind));
  h.kind = static_cast<FrameKind>(kind);
  if (r.get<uint8_t>() != 0) throw Error(Errc::corrupt_frame, "frame header: reserved flags set");
  h.body_size = r.get<uint64_t>();
  if (h.body_size > kMaxFrameBody) throw Error(Errc::corrupt_frame, "frame header: body size over the limit");
  h.manifest_digest = r.get<uint64_t>();
  h.base_version = r.get<uint64_t>();
  h.base_digest = r.get<uint64_t>();
  h.new_version = r.get<uint64_t>();
  h.chunk_index = r.get<uint32_t>();
  h.chunk_count = r.get<uint32_t>();
  h.item_count = r.get<uint32_t>();
  if (r.get<uint32_t>() != 0) throw Error(Errc::corrupt_frame, "frame header: reserved field set");
  return h;
}

bool known_stream(uint8_t id) {
  return (id >= static_cast<uint8_t>(StreamId::locations) && id <= static_cast<uint8_t>(StreamId::location_index)) ||
         (id >= static_cast<uint8_t>(StreamId::plane0) && id <= static_cast<uint8_t>(StreamId::plane3));
}

}  // namespace

const char* location_coding_name(LocationCoding coding) noexcept {
  switch (coding) {
    case LocationCoding::none: return "none";
    case LocationCoding::range: return "range";
    case LocationCoding::bitmap: return "bitmap";
    case LocationCoding::gaps: return "gaps";
    case LocationCoding::classed_gaps: return "classed_gaps";
    case LocationCoding::gap_varint: return "gap_varint";
  }
  return "unknown";
}

const char* value_mode_name(ValueMode mode) noexcept {
  switch (mode) {
    case ValueMode::xor_bits: return "xor_bits";
    case ValueMode::ulp_delta: return "ulp_delta";
    case ValueMode::overwrite: return "overwrite";
  }
  return "unknown";
}

uint64_t frame_size_from_header(std::span<const std::byte> header_bytes) {
  const FrameHeader h = read_header(header_bytes);
  return kFrameHeaderSize + h.body_size + kFrameTrailerSize;
}

FrameView parse_frame(std::span<const std::byte> frame) {
  FrameView v;
  v.header = read_header(frame);
  const uint64_t expected = kFrameHeaderSize + v.header.body_size + kFrameTrailerSize;
  if (frame.size() != expected)
    throw Error(Errc::corrupt_frame, "frame: size " + std::to_string(frame.size()) + " does not match the header's " +
                                         std::to_string(expected) + (frame.size() < expected ? " (truncated)" : ""));
  const uint64_t stored = load_le<uint64_t>(frame.data() + frame.size() - kFrameTrailerSize);
  if (XXH3_64bits(frame.data(), frame.size() - kFrameTrailerSize) != stored)
    throw Error(Errc::corrupt_frame, "frame: checksum mismatch (chunk " + std::to_string(v.header.chunk_index) +
                                         " of version " + std::to_string(v.header.new_version) + " is corrupt)");
  v.bytes = frame;
  const auto body = frame.subspan(kFrameHeaderSize, v.header.body_size);
  ByteReader r(body, "frame body");
  if (v.header.kind == FrameKind::seal) {
    // Per-tensor digests, then (optional) a slice table: u32 count, u32 0, count entries.
    const uint64_t tensors_size = uint64_t{v.header.item_count} * 8;
    const uint64_t table_size = v.header.body_size > tensors_size ? v.header.body_size - tensors_size : 0;
    if (v.header.body_size < tensors_size || (table_size != 0 && table_size < 8))
      throw Error(Errc::corrupt_frame, "seal frame: body size does not match its tensor count");
    v.tensor_digests.resize(v.header.item_count);
    for (auto& d : v.tensor_digests) d = r.get<uint64_t>();
    if (table_size == 0) return v;
    const uint32_t count = r.get<uint32_t>();
    if (r.get<uint32_t>() != 0 || table_size != 8 + uint64_t{count} * kSliceDigestEntrySize)
      throw Error(Errc::corrupt_frame, "seal frame: slice digest table does not match its count");
    v.slice_digests.resize(count);
    for (auto& d : v.slice_digests) {
      d.tensor = r.get<uint32_t>();
      d.dim = r.get<uint32_t>();
      d.start = r.get<uint64_t>();
      d.stop = r.get<uint64_t>();
      d.digest = r.get<uint64_t>();
      if (d.tensor >= v.header.item_count || d.start >= d.stop)
        throw Error(Errc::corrupt_frame, "seal frame: a slice digest names no slice of a tensor of this model");
    }
    return v;
  }
  if (v.header.chunk_index >= v.header.chunk_count)
    throw Error(Errc::corrupt_frame, "chunk frame: index " + std::to_string(v.header.chunk_index) +
                                         " is not below the chunk count " + std::to_string(v.header.chunk_count));
  if (uint64_t{v.header.item_count} * kSegmentEntrySize > body.size())
    throw Error(Errc::corrupt_frame, "chunk frame: segment table larger than the body");
  v.segments.resize(v.header.item_count);
  for (auto& s : v.segments) {
    s.tensor_index = r.get<uint32_t>();
    const auto dtype = dtype_from_wire(r.get<uint8_t>());
    if (!dtype) throw Error(Errc::corrupt_frame, "chunk frame: segment with an unknown dtype");
    s.dtype = *dtype;
    const uint8_t mode = r.get<uint8_t>();
    if (mode < 1 || mode > 3) throw Error(Errc::corrupt_frame, "chunk frame: segment with an unknown value mode");
    s.value_mode = static_cast<ValueMode>(mode);
    const uint8_t loc = r.get<uint8_t>();
    if (loc >= kLocationCodingCount) throw Error(Errc::corrupt_frame, "chunk frame: segment with an unknown location coding");
    s.location_coding = static_cast<LocationCoding>(loc);
    if (r.get<uint8_t>() != 0) throw Error(Errc::corrupt_frame, "chunk frame: segment reserved byte set");
    s.element_begin = r.get<uint64_t>();
    s.element_count = r.get<uint64_t>();
    s.change_count = r.get<uint64_t>();
    if (s.change_count > s.element_count || s.element_count >= (uint64_t{1} << 32))
      throw Error(Errc::corrupt_frame, "chunk frame: segment counts out of range");
  }
  const uint32_t n_sections = r.get<uint32_t>();
  if (r.get<uint32_t>() != 0) throw Error(Errc::corrupt_frame, "chunk frame: reserved field set");
  if (uint64_t{n_sections} * kSectionEntrySize > r.remaining())
    throw Error(Errc::corrupt_frame, "chunk frame: section table larger than the body");
  v.sections.resize(n_sections);
  int last_id = -1;
  for (auto& s : v.sections) {
    const uint8_t id = r.get<uint8_t>();
    if (!known_stream(id) || id <= last_id)
      throw Error(Errc::corrupt_frame, "chunk frame: unknown or repeated section id " + std::to_string(id));
    last_id = id;
    s.stream = static_cast<StreamId>(id);
    const uint8_t codec = r.get<uint8_t>();
    if (codec > 1) throw Error(Errc::corrupt_frame, "chunk frame: unknown section codec");
    s.codec = static_cast<SectionCodec>(codec);
    if (r.get<uint16_t>() != 0 || r.get<uint32_t>() != 0) throw Error(Errc::corrupt_frame, "chunk frame: reserved field set");
    s.raw_size = r.get<uint64_t>();
    s.stored_size = r.get<uint64_t>();
    if (s.codec == SectionCodec::raw && s.raw_size != s.stored_size)
      throw Error(Errc::corrupt_frame, "chunk frame: raw section with differing sizes");
  }
  uint64_t offset = kFrameHeaderSize + r.position();
  for (auto& s : v.sections) {
    if (s.stored_size > frame.size() - kFrameTrailerSize - offset)
      throw Error(Errc::corrupt_frame, "chunk frame: section extends past the body");
    s.offset = offset;
    offset += s.stored_size;
  }
  if (offset != frame.size() - kFrameTrailerSize)
    throw Error(Errc::corrupt_frame, "chunk frame: trailing bytes after the last section");
  return v;
}

void patch_base_digest(std::span<std::byte> frame, uint64_t base_digest) {
  if (frame.size() < kFrameHeaderSize + kFrameTrailerSize || frame_size_from_header(frame) != frame.size())
    throw Error(Errc::corrupt_frame, "patch_base_digest: not a whole frame");
  constexpr size_t kBaseDigestOffset = 32;
  store_le(frame.data() + kBaseDigestOffset, base_digest);
  store_le(frame.data() + frame.size() - kFrameTrailerSize,
           static_cast<uint64_t>(XXH3_64bits(frame.data(), frame.size() - kFrameTrailerSize)));
}

std::vector<std::span<const std::byte>> split_frames(std::span<const std::byte> bytes) {
  std::vector<std::span<const std::byte>> frames;
  size_t at = 0;
  while (at < bytes.size()) {
    const auto rest = bytes.subspan(at);
    const uint64_t size = frame_size_from_header(rest);
    if (size > rest.size())
      throw Error(Errc::corrupt_frame, "delta file: frame " + std::to_string(frames.size()) + " truncated (" +
                                           std::to_string(rest.size()) + " of " + std::to_string(size) + " bytes)");
    frames.push_back(rest.first(size));
    at += size;
  }
  return frames;
}

std::vector<std::byte> build_chunk_frame(FrameHeader header, const std::vector<SegmentInfo>& segments,
                                         std::vector<std::pair<StreamId, std::vector<std::byte>>> streams,
                                         int zstd_level, SectionSizes* sizes) {
  // A section is stored compressed when zstd makes it smaller; its bytes live either in the
  // stream's own vector (raw) or in `packed` (zstd) until the frame is assembled.
  struct Stored {
    StreamId id;
    SectionCodec codec;
    uint64_t raw_size;
    size_t packed_offset;
    uint64_t stored_size;
  };
  thread_local ScratchBuffer packed_scratch;
  size_t bound = 0;
  for (const auto& st : streams) bound += ZSTD_compressBound(st.second.size());
  std::byte* packed = packed_scratch.get(bound);
  size_t packed_used = 0;
  std::vector<Stored> stored;
  stored.reserve(streams.size());
  auto* cctx = ZstdContexts::local().cctx.get();
  for (auto& [id, raw] : streams) {
    DC_ASSERT(!raw.empty());
    const size_t z = ZSTD_compressCCtx(cctx, packed + packed_used, bound - packed_used, raw.data(), raw.size(), zstd_level);
    if (!ZSTD_isError(z) && z < raw.size()) {
      stored.push_back({id, SectionCodec::zstd, raw.size(), packed_used, z});
      packed_used += z;
    } else {
      stored.push_back({id, SectionCodec::raw, raw.size(), 0, raw.size()});
    }
    if (sizes)
      (id == StreamId::locations || id == StreamId::location_index ? sizes->location_bytes : sizes->value_bytes) +=
          stored.back().stored_size;
  }
  uint64_t body = segments.size() * kSegmentEntrySize + 8 + stored.size() * kSectionEntrySize;
  for (const auto& s : stored) body += s.stored_size;
  header.kind = FrameKind::chunk;
  header.item_count = static_cast<uint32_t>(segments.size());
  header.body_size = body;
  std::vector<std::byte> out;
  out.reserve(kFrameHeaderSize + body + kFrameTrailerSize);
  write_header(out, header);
  ByteWriter w(out);
  for (const auto& s : segments) {
    w.u32(s.tensor_index);
    w.u8(static_cast<uint8_t>(s.dtype));
    w.u8(static_cast<uint8_t>(s.value_mode));
    w.u8(static_cast<uint8_t>(s.location_coding));
    w.u8(0);
    w.u64(s.element_begin);
    w.u64(s.element_count);
    w.u64(s.change_count);
  }
  w.u32(static_cast<uint32_t>(stored.size()));
  w.u32(0);
  for (const auto& s : stored) {
    w.u8(static_cast<uint8_t>(s.id));
    w.u8(static_cast<uint8_t>(s.codec));
    w.u16(0);
    w.u32(0);
    w.u64(s.raw_size);
    w.u64(s.stored_size);
  }
  for (size_t i = 0; i < stored.size(); ++i) {
    const auto& s = stored[i];
    if (s.codec == SectionCodec::zstd)
      out.insert(out.end(), packed + s.packed_offset, packed + s.packed_offset + s.stored_size);
    else
      out.insert(out.end(), streams[i].second.begin(), streams[i].second.end());
  }
  seal_trailer(out);
  return out;
}

std::vector<std::byte> build_seal_frame(FrameHeader header, const std::vector<uint64_t>& tensor_digests,
                                        const std::vector<SliceDigest>& slice_digests) {
  header.kind = FrameKind::seal;
  header.chunk_index = 0;
  header.item_count = static_cast<uint32_t>(tensor_digests.size());
  header.body_size = tensor_digests.size() * 8;
  if (!slice_digests.empty()) header.body_size += 8 + slice_digests.size() * kSliceDigestEntrySize;
  std::vector<std::byte> out;
  out.reserve(kFrameHeaderSize + header.body_size + kFrameTrailerSize);
  write_header(out, header);
  ByteWriter w(out);
  for (uint64_t d : tensor_digests) w.u64(d);
  if (!slice_digests.empty()) {
    w.u32(static_cast<uint32_t>(slice_digests.size()));
    w.u32(0);
    for (const SliceDigest& d : slice_digests) {
      w.u32(d.tensor);
      w.u32(d.dim);
      w.u64(d.start);
      w.u64(d.stop);
      w.u64(d.digest);
    }
  }
  seal_trailer(out);
  return out;
}

}  // namespace deltacast::codec
