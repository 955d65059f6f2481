#include "codec/encoder.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "codec/chunk_plan.h"
#include "codec/frame_writer.h"
#include "codec/location_coding.h"
#include "codec/scan.h"
#include "codec/value_coding.h"
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
  bool sealed = false;
  // No base digest given: each chunk adds its base slices' digest contributions while their bytes
  // are in cache from the scan (one pass over the data instead of two), and the chunk frames carry
  // a placeholder base digest until patch_base_digest.
  bool scan_base = false;
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> base_parts;  // per chunk: (tensor, part)

  ClassSpec pick_classes(const TensorInfo& info, const void* o, const void* nw, uint64_t n) const {
    if (!options.allow_classed || !dtype_codes_as_float(info.dtype) || n < 4096) return {};
    std::vector<uint64_t> all, changed;
    // About 16 Ki sampled elements per segment (1 in `stride` blocks of 64; at least 1 in 8 blocks
    // of a small segment) are enough to rank exponents by change rate; the exact cost comparison
    // after the scan guards the choice.
    const uint64_t samples = std::min<uint64_t>(8192, std::max<uint64_t>(4096, n / 8));
    const unsigned stride = static_cast<unsigned>(std::max<uint64_t>(1, n / samples));
    sample_exponents(static_cast<unsigned>(dtype_unit_size(info.dtype)), abs_mask_of(info.dtype),
                     dtype_mantissa_bits(info.dtype), o, nw, n, stride, all, changed);
    return choose_classes(all, changed, dtype_mantissa_bits(info.dtype));
  }
};

DeltaEncoder::DeltaEncoder(const ConstWeights& base, const ConstWeights& next, VersionIds ids, EncodeOptions options)
    : DeltaEncoder(base, next, StateDigest(std::vector<uint64_t>(base.manifest ? base.manifest->size() : 0, 0)), ids,
                   std::move(options)) {
  impl_->scan_base = true;
  impl_->base_parts.resize(impl_->chunks.size());
}

DeltaEncoder::DeltaEncoder(const ConstWeights& base, const ConstWeights& next, const StateDigest& base_digest,
                           VersionIds ids, EncodeOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_weights(base);
  check_weights(next);
  if (base.manifest->digest() != next.manifest->digest())
    throw Error(Errc::version_mismatch, "encode: base and new weights have different manifests");
  const auto& m = *base.manifest;
  if (base_digest.per_tensor().size() != m.size())
    throw Error(Errc::invalid_argument, "encode: base digest has the wrong number of tensors");
  if (!options.overwrite_tensors.empty() && options.overwrite_tensors.size() != m.size())
    throw Error(Errc::invalid_argument, "encode: overwrite_tensors must have one entry per tensor");
  if (ids.new_version == ids.base_version) throw Error(Errc::invalid_argument, "encode: new version equals base version");
  auto& im = *impl_;
  im.base = base;
  im.next = next;
  im.manifest = &m;
  im.base_digest = base_digest;
  im.ids = ids;
  im.options = std::move(options);
  im.chunks = plan_chunks(m, im.options.chunk_bytes);
  if (im.chunks.size() >= UINT32_MAX) throw Error(Errc::invalid_argument, "encode: too many chunks");
  im.digest_deltas.resize(im.chunks.size());
  im.encoded.assign(im.chunks.size(), 0);
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
  DeltaStats local;
  auto& deltas = im.digest_deltas[index];
  deltas.clear();
  for (const Slice& s : im.chunks[index]) {
    const auto& info = m.at(s.tensor);
    const unsigned w = static_cast<unsigned>(dtype_unit_size(info.dtype));
    const bool is_float = dtype_codes_as_float(info.dtype);
    const std::byte* o = im.base.tensors[s.tensor].data() + s.begin * w;
    const std::byte* nw = im.next.tensors[s.tensor].data() + s.begin * w;
    const bool overwrite = !im.options.overwrite_tensors.empty() && im.options.overwrite_tensors[s.tensor];
    const ValueMode mode = overwrite ? ValueMode::overwrite : im.options.xor_safe_mode;
    // Classes come from the receiver's base bits, which overwrite tensors do not promise.
    const ClassSpec classes = overwrite ? ClassSpec{} : im.pick_classes(info, o, nw, s.count);
    scan.clear();
    // One pass: the base's digest is taken stretch by stretch right behind the scan, while the
    // stretch is still in the cache (a digest of the whole slice after it would read it again).
    BaseDigestTap digest{s.tensor, info.dtype, o, s.begin, w};
    const ScanTap tap = im.scan_base ? digest.tap() : ScanTap{};
    scan_changes(w, abs_mask_of(info.dtype), o, nw, s.count, classes.count > 1 ? &classes : nullptr, scan, tap);
    if (im.scan_base) im.base_parts[index].emplace_back(s.tensor, digest.sum);
    const LocationPlan plan = encode_locations(SegmentChanges{s.count, &scan, classes}, locations);
    const size_t c = scan.positions.size();
    // The digest delta does not depend on the order: one sequential pass in position order. The
    // values follow the coding order (class by class for classed locations).
    const uint64_t digest_delta = changes_digest_delta(s.tensor, s.begin, scan.positions.data(), scan.old_bits.data(),
                                                       scan.new_bits.data(), c);
    values.add(mode, w, is_float, scan.old_bits.data(), scan.new_bits.data(),
               plan.order.empty() ? nullptr : plan.order.data(), c);
    if (c) deltas.emplace_back(s.tensor, digest_delta);
    segments.push_back(SegmentInfo{s.tensor, info.dtype, mode, plan.coding, s.begin, s.count, c});
    local.elements += s.count;
    local.checkpoint_bytes += s.count * w;
    local.changes += c;
    ++local.segments_by_coding[static_cast<int>(plan.coding)];
  }
  std::vector<std::pair<StreamId, std::vector<std::byte>>> streams;
  if (!locations.empty()) streams.emplace_back(StreamId::locations, std::move(locations));
  for (auto& s : values.finish()) streams.push_back(std::move(s));
  FrameHeader h;
  h.manifest_digest = m.digest();
  h.base_version = im.ids.base_version;
  h.base_digest = im.scan_base ? 0 : im.base_digest.combined();  // scan_base: patched after seal
  h.new_version = im.ids.new_version;
  h.chunk_index = index;
  h.chunk_count = chunk_count();
  SectionSizes sizes;
  auto frame = build_chunk_frame(h, segments, std::move(streams), im.options.zstd_level, &sizes);
  local.frame_bytes = frame.size();
  local.location_bytes = sizes.location_bytes;
  local.value_bytes = sizes.value_bytes;
  if (stats) stats->add(local);
  im.encoded[index] = 1;
  return frame;
}

std::vector<std::byte> DeltaEncoder::seal() {
  auto& im = *impl_;
  for (size_t i = 0; i < im.encoded.size(); ++i)
    if (!im.encoded[i]) throw Error(Errc::state, "seal: chunk " + std::to_string(i) + " was not encoded");
  if (im.scan_base) {
    std::vector<uint64_t> base(im.manifest->size(), 0);
    for (const auto& chunk : im.base_parts)
      for (const auto& [t, part] : chunk) base[t] += part;
    im.base_digest = StateDigest(std::move(base));
  }
  auto per = im.base_digest.per_tensor();
  for (const auto& chunk : im.digest_deltas)
    for (const auto& [t, d] : chunk) per[t] += d;
  im.new_digest = StateDigest(std::move(per));
  im.sealed = true;
  FrameHeader h;
  h.manifest_digest = im.manifest->digest();
  h.base_version = im.ids.base_version;
  h.base_digest = im.base_digest.combined();
  h.new_version = im.ids.new_version;
  h.chunk_count = chunk_count();
  return build_seal_frame(h, im.new_digest.per_tensor());
}

const StateDigest& DeltaEncoder::base_digest() const {
  if (impl_->scan_base && !impl_->sealed) throw Error(Errc::state, "base_digest: the version is not sealed yet");
  return impl_->base_digest;
}

const StateDigest& DeltaEncoder::new_digest() const {
  if (!impl_->sealed) throw Error(Errc::state, "new_digest: the version is not sealed yet");
  return impl_->new_digest;
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

}  // namespace

EncodedDelta encode_delta(const ConstWeights& base, const ConstWeights& next, const StateDigest& base_digest,
                          VersionIds ids, const EncodeOptions& options) {
  DeltaEncoder encoder(base, next, base_digest, ids, options);
  return encode_all(encoder, options);
}

EncodedDelta encode_delta(const ConstWeights& base, const ConstWeights& next, VersionIds ids,
                          const EncodeOptions& options) {
  DeltaEncoder encoder(base, next, ids, options);
  EncodedDelta out = encode_all(encoder, options);
  const uint64_t combined = out.base_digest.combined();
  for (size_t i = 0; i + 1 < out.frames.size(); ++i) patch_base_digest(out.frames[i], combined);
  return out;
}

}  // namespace deltacast::codec
