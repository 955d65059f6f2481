#include "codec/encoder.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "codec/chunk_plan.h"
#include "codec/frame_writer.h"
#include "codec/location_coding.h"
#include "codec/scan.h"
#include "codec/value_coding.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::codec {

void DeltaStats::add(const DeltaStats& o) {
  elements += o.elements;
  checkpoint_bytes += o.checkpoint_bytes;
  changes += o.changes;
  frame_bytes += o.frame_bytes;
  location_bytes += o.location_bytes;
  value_bytes += o.value_bytes;
  for (int i = 0; i < kLocationCodingCount; ++i) segments_by_coding[i] += o.segments_by_coding[i];
}

namespace {
// Segments shorter than this are not coded by class (the classes' thresholds would not pay).
constexpr uint64_t kClassedMinElements = 4096;

// A chunk's slices cut where a member's long run of held units begins or ends (a TP row slice's
// edges): each piece is then held wholly or not at all by such a member, so it keeps its classed
// coding, and a member skips writing what it does not hold. Short runs (a column slice's rows)
// cut nothing: their segments are coded by positions (HeldSlices::splits).
std::vector<Slice> cut_at_held_runs(const std::vector<Slice>& chunk, const HeldSlices& held) {
  std::vector<Slice> out;
  for (const Slice& s : chunk) {
    uint64_t at = s.begin;
    for (const uint64_t cut : held.cuts(s.tensor, s.begin, s.begin + s.count, kClassedMinElements)) {
      out.push_back({s.tensor, at, cut - at});
      at = cut;
    }
    out.push_back({s.tensor, at, s.begin + s.count - at});
  }
  return out;
}

// The digest of a base slice, summed over the stretches the scan reports (digest terms add, so the
// sum equals slice_digest of the whole slice, whatever the stretches).
struct BaseDigestTap {
  uint32_t tensor;
  DType dtype;
  const std::byte* data;  // the slice's first element
  uint64_t first;         // its index in the tensor
  unsigned width;
  uint64_t sum = 0;
  ScanTap tap() { return ScanTap{&BaseDigestTap::add, this}; }
  static void add(void* context, uint64_t at, uint64_t count) noexcept {
    auto& d = *static_cast<BaseDigestTap*>(context);
    d.sum += slice_digest(d.tensor, d.dtype, d.first + at, std::span(d.data + at * d.width, count * d.width));
  }
};
}  // namespace

struct DeltaEncoder::Impl {
  ConstWeights base, next;
  const Manifest* manifest;
  StateDigest base_digest;
  VersionIds ids;
  EncodeOptions options;
  std::vector<std::vector<Slice>> chunks;
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> digest_deltas;  // per chunk: (tensor, delta)
  std::vector<char> encoded;
  StateDigest new_digest;
  // The members' slices (options.base_slice_digests): per chunk, the digest deltas of its changes
  // in each slice; the new table once every chunk is in.
  SliceDigestDeltas slices;
  std::vector<SliceDigestDeltas::Deltas> slice_deltas;
  std::vector<SliceDigest> new_slices;
  bool sealed = false;
  // No base digest given: each chunk adds its base slices' digest contributions while their bytes
  // are in cache from the scan (one pass over the data instead of two), and the chunk frames carry
  // a placeholder base digest until patch_base_digest.
  bool scan_base = false;
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> base_parts;  // per chunk: (tensor, part)
  // A group's part: its chunks only (EncodePart).
  std::optional<EncodePart> group_part;

  // Set by the reader constructors: slices of the new version are read piece by piece (scan_read)
  // instead of spans; the base is read too (base_reader), or is in memory (base).
  const WeightsReader* base_reader = nullptr;
  const WeightsReader* next_reader = nullptr;

  // Copies base bytes [offset, offset + out.size()) of tensor t into out.
  void read_base(uint32_t t, uint64_t offset, std::span<std::byte> out) const {
    if (base_reader != nullptr) return base_reader->read(t, offset, out);
    if (!out.empty()) std::memcpy(out.data(), base.tensors[t].data() + offset, out.size());
  }
  // The same bytes in place when the base is in memory (no copy), else read into `buf`.
  std::span<const std::byte> base_piece(uint32_t t, uint64_t offset, std::span<std::byte> buf) const {
    if (base_reader == nullptr) return base.tensors[t].subspan(offset, buf.size());
    base_reader->read(t, offset, buf);
    return buf;
  }

  void init(const Manifest& m, const Manifest& next_manifest, const StateDigest& digest, VersionIds version_ids,
            EncodeOptions opts) {
    if (m.digest() != next_manifest.digest())
      throw Error(Errc::version_mismatch, "encode: base and new weights have different manifests");
    if (digest.per_tensor().size() != m.size())
      throw Error(Errc::invalid_argument, "encode: base digest has the wrong number of tensors");
    if (!opts.overwrite_tensors.empty() && opts.overwrite_tensors.size() != m.size())
      throw Error(Errc::invalid_argument, "encode: overwrite_tensors must have one entry per tensor");
    if (version_ids.new_version == version_ids.base_version)
      throw Error(Errc::invalid_argument, "encode: new version equals base version");
    manifest = &m;
    base_digest = digest;
    ids = version_ids;
    options = std::move(opts);
    chunks = group_part ? plan_chunks(m, group_part->ranges, options.chunk_bytes) : plan_chunks(m, options.chunk_bytes);
    if (options.held_slices && !options.held_slices->empty())
      for (auto& chunk : chunks) chunk = cut_at_held_runs(chunk, *options.held_slices);
    if (chunks.size() >= UINT32_MAX) throw Error(Errc::invalid_argument, "encode: too many chunks");
    if (group_part && (group_part->first_chunk > group_part->total_chunks ||
                       chunks.size() > group_part->total_chunks - group_part->first_chunk))
      throw Error(Errc::invalid_argument, "encode: the part's " + std::to_string(chunks.size()) + " chunks from " +
                                              std::to_string(group_part->first_chunk) + " do not fit a version of " +
                                              std::to_string(group_part->total_chunks));
    digest_deltas.resize(chunks.size());
    if (!options.base_slice_digests.empty()) slices = SliceDigestDeltas(m, options.base_slice_digests);
    slice_deltas.resize(chunks.size());
    encoded.assign(chunks.size(), 0);
  }

  // No base digest given: computed by the scans (scan_base).
  void scan_base_digest() {
    scan_base = true;
    base_parts.resize(chunks.size());
  }

  // Whether the slice's classes are worth sampling for (float codes, not an ablation, not tiny),
  // and with which stride (about 16 Ki sampled elements per segment, 1 in `stride` blocks of 64;
  // at least 1 in 8 blocks of a small segment, enough to rank exponents by change rate; the exact
  // cost comparison after the scan guards the choice). 0: no classes.
  unsigned class_stride(const TensorInfo& info, uint64_t n) const {
    if (!options.allow_classed || !dtype_codes_as_float(info.dtype) || n < kClassedMinElements) return 0;
    const uint64_t samples = std::min<uint64_t>(8192, std::max<uint64_t>(4096, n / 8));
    return static_cast<unsigned>(std::max<uint64_t>(1, n / samples));
  }

  // Classes from 1 in `stride` blocks of the n elements at o / nw (stride 0: class_stride's).
  ClassSpec pick_classes(const TensorInfo& info, const void* o, const void* nw, uint64_t n, unsigned stride = 0) const {
    if (stride == 0) stride = class_stride(info, n);
    if (stride == 0) return {};
    std::vector<uint64_t> all, changed;
    sample_exponents(static_cast<unsigned>(dtype_unit_size(info.dtype)), abs_mask_of(info.dtype),
                     dtype_mantissa_bits(info.dtype), o, nw, n, stride, all, changed);
    return choose_classes(all, changed, dtype_mantissa_bits(info.dtype));
  }

  // pick_classes over the readers: reads only the runs sample_exponents examines, one after the
  // other into one buffer, and samples that whole (stride 1: the same elements, the same counts).
  ClassSpec pick_classes_read(const TensorInfo& info, const Slice& s) const {
    const unsigned stride = class_stride(info, s.count);
    if (stride == 0) return {};
    const unsigned w = static_cast<unsigned>(dtype_unit_size(info.dtype));
    thread_local std::vector<std::byte> o, nw;
    o.clear();
    nw.clear();
    for (uint64_t at = 0; at < s.count; at += kSampleRun * stride) {
      const uint64_t len = std::min(kSampleRun, s.count - at), filled = o.size();
      o.resize(filled + len * w);
      nw.resize(filled + len * w);
      read_base(s.tensor, (s.begin + at) * w, std::span(o).subspan(filled));
      next_reader->read(s.tensor, (s.begin + at) * w, std::span(nw).subspan(filled));
    }
    return pick_classes(info, o.data(), nw.data(), o.size() / w, 1);
  }

  // scan_changes over slice s read in pieces of kReadPieceBytes per version, each scanned (and,
  // scanning the base's digest, its base digest added to *base_sum) while it is in the cache.
  // `out` ends equal to a scan of the whole slice: positions offset by the piece's start, ranks by
  // the class sizes of the pieces before it.
  void scan_read(const TensorInfo& info, const Slice& s, const ClassSpec* classes, ScanOutput& out,
                 uint64_t* base_sum) const {
    const unsigned w = static_cast<unsigned>(dtype_unit_size(info.dtype));
    const uint64_t piece = kReadPieceBytes / w;
    thread_local std::vector<std::byte> o_buf, nw_buf;
    thread_local ScanOutput part;
    o_buf.resize(kReadPieceBytes);
    nw_buf.resize(kReadPieceBytes);
    out.clear();
    for (uint64_t at = 0; at < s.count; at += piece) {
      const uint64_t len = std::min(piece, s.count - at);
      const auto o = base_piece(s.tensor, (s.begin + at) * w, std::span(o_buf.data(), len * w));
      next_reader->read(s.tensor, (s.begin + at) * w, std::span(nw_buf.data(), len * w));
      scan_changes(w, abs_mask_of(info.dtype), o.data(), nw_buf.data(), len, classes, part);
      if (scan_base) *base_sum += slice_digest(s.tensor, info.dtype, s.begin + at, o);
      append_part(part, static_cast<uint32_t>(at), classes != nullptr, out);
    }
  }

  // Every chunk encoded: the base's digest (scanned, or given) and the new version's. `what`
  // names the call in the error when a chunk was not encoded.
  void finish_digests(const char* what);

  // Appends a piece's scan starting at element `at` of the slice to the slice's `out`.
  static void append_part(const ScanOutput& part, uint32_t at, bool classed, ScanOutput& out) {
    const size_t before = out.positions.size(), c = part.positions.size();
    out.positions.resize(before + c);
    for (size_t i = 0; i < c; ++i) out.positions[before + i] = part.positions[i] + at;
    out.old_bits.insert(out.old_bits.end(), part.old_bits.begin(), part.old_bits.end());
    out.new_bits.insert(out.new_bits.end(), part.new_bits.begin(), part.new_bits.end());
    if (!classed) return;
    out.change_class.insert(out.change_class.end(), part.change_class.begin(), part.change_class.end());
    out.change_rank.resize(before + c);
    for (size_t i = 0; i < c; ++i)
      out.change_rank[before + i] = part.change_rank[i] + static_cast<uint32_t>(out.class_sizes[part.change_class[i]]);
    for (unsigned k = 0; k < kMaxClasses; ++k) out.class_sizes[k] += part.class_sizes[k];
  }
};

DeltaEncoder::DeltaEncoder(const ConstWeights& base, const ConstWeights& next, VersionIds ids, EncodeOptions options)
    : DeltaEncoder(base, next, StateDigest(std::vector<uint64_t>(base.manifest ? base.manifest->size() : 0, 0)), ids,
                   std::move(options)) {
  impl_->scan_base_digest();
}

DeltaEncoder::DeltaEncoder(const ConstWeights& base, const ConstWeights& next, const StateDigest& base_digest,
                           VersionIds ids, EncodeOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_weights(base);
  check_weights(next);
  impl_->init(*base.manifest, *next.manifest, base_digest, ids, std::move(options));
  impl_->base = base;
  impl_->next = next;
}

DeltaEncoder::DeltaEncoder(const WeightsReader& base, const WeightsReader& next, VersionIds ids, EncodeOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(base.manifest(), next.manifest(), StateDigest(std::vector<uint64_t>(base.manifest().size(), 0)), ids,
              std::move(options));
  impl_->base_reader = &base;
  impl_->next_reader = &next;
  impl_->scan_base_digest();
}

DeltaEncoder::DeltaEncoder(const ConstWeights& base, const WeightsReader& next, const StateDigest& base_digest,
                           VersionIds ids, EncodeOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_weights(base);
  impl_->init(*base.manifest, next.manifest(), base_digest, ids, std::move(options));
  impl_->base = base;
  impl_->next_reader = &next;
}

DeltaEncoder::DeltaEncoder(const WeightsReader& base, const WeightsReader& next, EncodePart part, VersionIds ids,
                           EncodeOptions options)
    : impl_(std::make_unique<Impl>()) {
  for (const auto& r : part.ranges)
    if (r.tensor >= base.manifest().size() || r.begin > r.end || r.end > base.manifest().at(r.tensor).units())
      throw Error(Errc::invalid_argument, "encode: a part's range lies outside the manifest");
  const bool known = !part.base_digest.empty();
  StateDigest digest(known ? std::move(part.base_digest) : std::vector<uint64_t>(base.manifest().size(), 0));
  impl_->group_part = std::move(part);
  impl_->init(base.manifest(), next.manifest(), digest, ids, std::move(options));
  impl_->base_reader = &base;
  impl_->next_reader = &next;
  if (!known) impl_->scan_base_digest();
}

DeltaEncoder::~DeltaEncoder() = default;

uint32_t DeltaEncoder::chunk_count() const noexcept { return static_cast<uint32_t>(impl_->chunks.size()); }

std::vector<std::byte> DeltaEncoder::encode_chunk(uint32_t index, DeltaStats* stats) {
  auto& im = *impl_;
  if (index >= im.chunks.size()) throw Error(Errc::invalid_argument, "encode: chunk index out of range");
  const auto& m = *im.manifest;
  thread_local ScanOutput scan;
  ValueEncoder values;
  std::vector<std::byte> locations;
  std::vector<SegmentInfo> segments;
  // Members hold slices: each segment's location bytes are indexed, so they skip what they lack.
  const bool indexed = im.options.held_slices && !im.options.held_slices->empty();
  std::vector<std::byte> location_index;
  DeltaStats local;
  auto& deltas = im.digest_deltas[index];
  deltas.clear();
  auto& slice_deltas = im.slice_deltas[index];
  slice_deltas.clear();
  for (const Slice& s : im.chunks[index]) {
    const auto& info = m.at(s.tensor);
    const unsigned w = static_cast<unsigned>(dtype_unit_size(info.dtype));
    const bool is_float = dtype_codes_as_float(info.dtype);
    const bool overwrite = !im.options.overwrite_tensors.empty() && im.options.overwrite_tensors[s.tensor];
    const ValueMode mode = overwrite ? ValueMode::overwrite : im.options.xor_safe_mode;
    // Classes come from the receiver's base bits of the whole segment, which overwrite tensors do
    // not promise and a member holding the segment partly lacks.
    const bool classed =
        !overwrite && !(im.options.held_slices && im.options.held_slices->splits(s.tensor, s.begin, s.begin + s.count));
    ClassSpec classes;
    if (im.next_reader != nullptr) {
      if (classed) classes = im.pick_classes_read(info, s);
      uint64_t base_sum = 0;
      im.scan_read(info, s, classes.count > 1 ? &classes : nullptr, scan, &base_sum);
      if (im.scan_base) im.base_parts[index].emplace_back(s.tensor, base_sum);
    } else {
      const std::byte* o = im.base.tensors[s.tensor].data() + s.begin * w;
      const std::byte* nw = im.next.tensors[s.tensor].data() + s.begin * w;
      if (classed) classes = im.pick_classes(info, o, nw, s.count);
      scan.clear();
      // One pass: the base's digest is taken stretch by stretch right behind the scan, while the
      // stretch is still in the cache (a digest of the whole slice after it would read it again).
      BaseDigestTap digest{s.tensor, info.dtype, o, s.begin, w};
      const ScanTap tap = im.scan_base ? digest.tap() : ScanTap{};
      scan_changes(w, abs_mask_of(info.dtype), o, nw, s.count, classes.count > 1 ? &classes : nullptr, scan, tap);
      if (im.scan_base) im.base_parts[index].emplace_back(s.tensor, digest.sum);
    }
    const size_t locations_before = locations.size();
    const LocationPlan plan = encode_locations(SegmentChanges{s.count, &scan, classes}, locations);
    if (indexed) ByteWriter(location_index).leb128(locations.size() - locations_before);
    const size_t c = scan.positions.size();
    // The digest delta does not depend on the order: one sequential pass in position order. The
    // values follow the coding order (class by class for classed locations).
    const uint64_t digest_delta =
        changes_digest_delta(s.tensor, s.begin, scan.positions.data(), scan.old_bits.data(), scan.new_bits.data(), c);
    values.add(mode, w, is_float, scan.old_bits.data(), scan.new_bits.data(),
               plan.order.empty() ? nullptr : plan.order.data(), c);
    if (c) deltas.emplace_back(s.tensor, digest_delta);
    if (!im.slices.empty())
      im.slices.add_segment(s.tensor, s.begin, scan.positions.data(), scan.old_bits.data(), scan.new_bits.data(), c,
                            slice_deltas);
    segments.push_back(SegmentInfo{s.tensor, info.dtype, mode, plan.coding, s.begin, s.count, c});
    local.elements += s.count;
    local.checkpoint_bytes += s.count * w;
    local.changes += c;
    ++local.segments_by_coding[static_cast<int>(plan.coding)];
  }
  std::vector<std::pair<StreamId, std::vector<std::byte>>> streams;
  if (!locations.empty()) streams.emplace_back(StreamId::locations, std::move(locations));
  for (auto& s : values.finish()) streams.push_back(std::move(s));
  if (indexed && !streams.empty() && streams.front().first == StreamId::locations) {
    streams.emplace_back(StreamId::location_index, std::move(location_index));
    std::stable_sort(streams.begin(), streams.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  }
  FrameHeader h;
  h.manifest_digest = m.digest();
  h.base_version = im.ids.base_version;
  // scan_base: patched after seal, unless the group gave it (a part)
  h.base_digest = im.group_part ? im.group_part->base_combined : im.scan_base ? 0 : im.base_digest.combined();
  h.new_version = im.ids.new_version;
  h.chunk_index = im.group_part ? im.group_part->first_chunk + index : index;
  h.chunk_count = im.group_part ? im.group_part->total_chunks : chunk_count();
  SectionSizes sizes;
  auto frame = build_chunk_frame(h, segments, std::move(streams), im.options.zstd_level, &sizes);
  local.frame_bytes = frame.size();
  local.location_bytes = sizes.location_bytes;
  local.value_bytes = sizes.value_bytes;
  if (stats) stats->add(local);
  im.encoded[index] = 1;
  return frame;
}

void DeltaEncoder::Impl::finish_digests(const char* what) {
  for (size_t i = 0; i < encoded.size(); ++i)
    if (!encoded[i]) throw Error(Errc::state, std::string(what) + ": chunk " + std::to_string(i) + " was not encoded");
  if (scan_base) {
    std::vector<uint64_t> sums(manifest->size(), 0);
    for (const auto& chunk : base_parts)
      for (const auto& [t, sum] : chunk) sums[t] += sum;
    base_digest = StateDigest(std::move(sums));
  }
  auto per = base_digest.per_tensor();
  for (const auto& chunk : digest_deltas)
    for (const auto& [t, d] : chunk) per[t] += d;
  new_digest = StateDigest(std::move(per));
  if (!slices.empty()) new_slices = slices.advance(slice_deltas);
  sealed = true;
}

std::vector<std::byte> DeltaEncoder::seal() {
  auto& im = *impl_;
  if (im.group_part) throw Error(Errc::state, "seal: a part encoder does not seal (the group's coordinator does)");
  im.finish_digests("seal");
  return seal_frame(*im.manifest, im.ids, im.base_digest.combined(), chunk_count(), im.new_digest, im.new_slices);
}

DeltaEncoder::PartDigests DeltaEncoder::part_digests() {
  auto& im = *impl_;
  if (!im.group_part) throw Error(Errc::state, "part_digests: not a part encoder");
  im.finish_digests("part_digests");
  return {im.base_digest, im.new_digest, im.slices.totals(im.slice_deltas)};
}

std::vector<std::byte> seal_frame(const Manifest& manifest, VersionIds ids, uint64_t base_combined,
                                  uint32_t chunk_count, const StateDigest& new_digest,
                                  const std::vector<SliceDigest>& slice_digests) {
  if (new_digest.per_tensor().size() != manifest.size())
    throw Error(Errc::invalid_argument, "seal: the digest has the wrong number of tensors");
  for (const SliceDigest& d : slice_digests)
    if (d.tensor >= manifest.size() || d.start >= d.stop)
      throw Error(Errc::invalid_argument, "seal: a slice digest names no slice of this model");
  FrameHeader h;
  h.manifest_digest = manifest.digest();
  h.base_version = ids.base_version;
  h.base_digest = base_combined;
  h.new_version = ids.new_version;
  h.chunk_count = chunk_count;
  return build_seal_frame(h, new_digest.per_tensor(), slice_digests);
}

GroupChunks group_chunks(const Manifest& manifest, const Partition& partition, uint64_t chunk_bytes) {
  GroupChunks out;
  out.first.push_back(0);
  uint64_t total = 0;
  for (uint32_t r = 0; r < partition.ranks(); ++r) {
    total += plan_chunks(manifest, partition.part(r), chunk_bytes).size();
    if (total >= UINT32_MAX) throw Error(Errc::invalid_argument, "encode: too many chunks");
    out.first.push_back(static_cast<uint32_t>(total));
  }
  return out;
}

EncodePart GroupChunks::part(const Partition& partition, uint32_t rank, uint64_t base_combined) const {
  if (rank + 1 >= first.size()) throw Error(Errc::invalid_argument, "group_chunks: no rank " + std::to_string(rank));
  return EncodePart{partition.part(rank), first[rank], total(), base_combined, {}};
}

const StateDigest& DeltaEncoder::base_digest() const {
  if (impl_->scan_base && !impl_->sealed) throw Error(Errc::state, "base_digest: the version is not sealed yet");
  return impl_->base_digest;
}

const StateDigest& DeltaEncoder::new_digest() const {
  if (!impl_->sealed) throw Error(Errc::state, "new_digest: the version is not sealed yet");
  return impl_->new_digest;
}

const std::vector<SliceDigest>& DeltaEncoder::new_slice_digests() const {
  if (!impl_->sealed) throw Error(Errc::state, "new_slice_digests: the version is not sealed yet");
  return impl_->new_slices;
}

namespace {

// Encodes every chunk with options.threads threads, then seals.
EncodedDelta encode_all(DeltaEncoder& encoder, const EncodeOptions& options) {
  const uint32_t n = encoder.chunk_count();
  EncodedDelta out;
  out.frames.resize(n);
  unsigned threads = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::max(1u, std::min<unsigned>(threads, n));
  std::vector<DeltaStats> stats(threads);
  std::atomic<uint32_t> next_chunk{0};
  std::exception_ptr failure;
  std::mutex failure_mu;
  auto worker = [&](unsigned id) {
    try {
      for (uint32_t i; (i = next_chunk.fetch_add(1)) < n;) out.frames[i] = encoder.encode_chunk(i, &stats[id]);
    } catch (...) {
      std::lock_guard lock(failure_mu);
      if (!failure) failure = std::current_exception();
      next_chunk = n;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
  for (const auto& s : stats) out.stats.add(s);
  out.frames.push_back(encoder.seal());
  out.stats.frame_bytes += out.frames.back().size();
  out.base_digest = encoder.base_digest();
  out.new_digest = encoder.new_digest();
  return out;
}

// encode_all for an encoder that scans the base's digest: its chunk frames get it once sealed.
EncodedDelta encode_all_patched(DeltaEncoder& encoder, const EncodeOptions& options) {
  EncodedDelta out = encode_all(encoder, options);
  const uint64_t combined = out.base_digest.combined();
  for (size_t i = 0; i + 1 < out.frames.size(); ++i) patch_base_digest(out.frames[i], combined);
  return out;
}

}  // namespace

EncodedDelta encode_delta(const ConstWeights& base, const ConstWeights& next, const StateDigest& base_digest,
                          VersionIds ids, const EncodeOptions& options) {
  DeltaEncoder encoder(base, next, base_digest, ids, options);
  return encode_all(encoder, options);
}

EncodedDelta encode_delta(const ConstWeights& base, const ConstWeights& next, VersionIds ids,
                          const EncodeOptions& options) {
  DeltaEncoder encoder(base, next, ids, options);
  return encode_all_patched(encoder, options);
}

EncodedDelta encode_delta(const WeightsReader& base, const WeightsReader& next, VersionIds ids,
                          const EncodeOptions& options) {
  DeltaEncoder encoder(base, next, ids, options);
  return encode_all_patched(encoder, options);
}

EncodedDelta encode_delta(const ConstWeights& base, const WeightsReader& next, const StateDigest& base_digest,
                          VersionIds ids, const EncodeOptions& options) {
  DeltaEncoder encoder(base, next, base_digest, ids, options);
  return encode_all(encoder, options);
}

std::vector<SliceDigest> slice_digests(const ConstWeights& weights, std::span<const SliceDigest> slices) {
  check_weights(weights);
  std::vector<SliceDigest> out(slices.begin(), slices.end());
  for (SliceDigest& d : out) {
    slice_stripes(*weights.manifest, d);  // refuses a tensor index outside the model before it is used
    d.digest = canonical_slice_digest(*weights.manifest, d, weights.tensors[d.tensor]);
  }
  return out;
}

}  // namespace deltacast::codec
