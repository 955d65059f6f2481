#include "codec/applier.h"

#include <algorithm>
#include <cstring>
#include <condition_variable>
#include <mutex>
#include <zstd.h>

#include "codec/chunk_plan.h"
#include "codec/location_coding.h"
#include "codec/scratch.h"
#include "codec/value_coding.h"
#include "util/error.h"

namespace deltacast::codec {

namespace {

struct UndoEntry {
  uint64_t position;
  uint32_t tensor;
  uint32_t bits;
};

// The undo log: old bits of every element written since the last commit, in reservation order.
// Stored in fixed-size blocks so growing it never copies what is there, and clear() keeps the
// blocks for the next version (a receiver pays for the pages once, not on every refit). Writers
// reserve a range of slots under the applier's lock and fill it outside; rollback() and commit()
// wait for every writer to finish first.
class UndoLog {
 public:
  static constexpr size_t kBlock = size_t{1} << 16;
  // Reserves `n` slots (mu held); returns the index of the first.
  size_t reserve_slots(size_t n) {
    const size_t first = used_;
    used_ += n;
    while (blocks_.size() * kBlock < used_) blocks_.emplace_back(new UndoEntry[kBlock]);
    return first;
  }
  // The block holding slot i (mu held: the block table may grow under other reservations).
  UndoEntry* block_of(size_t i) const { return blocks_[i / kBlock].get(); }
  // Allocates and touches blocks for `entries` entries so their page faults happen now.
  void reserve(size_t entries) {
    while (blocks_.size() * kBlock < entries) {
      blocks_.emplace_back(new UndoEntry[kBlock]);
      std::memset(static_cast<void*>(blocks_.back().get()), 0, kBlock * sizeof(UndoEntry));
    }
  }
  template <class F>
  void for_each_reverse(F&& f) const {
    for (size_t i = used_; i-- > 0;) f(blocks_[i / kBlock][i % kBlock]);
  }
  void clear() noexcept { used_ = 0; }
  size_t size() const noexcept { return used_; }

 private:
  std::vector<std::unique_ptr<UndoEntry[]>> blocks_;
  size_t used_ = 0;
};


// Section bytes of one chunk frame, decompressed (into reused buffers) and size-checked.
class Sections {
 public:
  Sections(const FrameView& view, uint64_t max_raw, ScratchBuffer (&buffers)[16]) {
    for (const auto& s : view.sections) {
      if (s.raw_size > max_raw)
        throw Error(Errc::corrupt_frame, "chunk frame: a section's size is impossible for its segments");
      auto stored = view.bytes.subspan(s.offset, s.stored_size);
      auto& slot = raw_[static_cast<uint8_t>(s.stream)];
      if (s.codec == SectionCodec::raw) {
        slot = stored;
        continue;
      }
      const unsigned long long content = ZSTD_getFrameContentSize(stored.data(), stored.size());
      if (content != s.raw_size)
        throw Error(Errc::corrupt_frame, "chunk frame: zstd section size does not match its header");
      std::byte* buf = buffers[static_cast<uint8_t>(s.stream)].get(s.raw_size);
      const size_t got =
          ZSTD_decompressDCtx(ZstdContexts::local().dctx.get(), buf, s.raw_size, stored.data(), stored.size());
      if (ZSTD_isError(got) || got != s.raw_size)
        throw Error(Errc::corrupt_frame, std::string("chunk frame: zstd section does not decode: ") +
                                             (ZSTD_isError(got) ? ZSTD_getErrorName(got) : "size mismatch"));
      slot = std::span<const std::byte>(buf, s.raw_size);
    }
  }
  std::span<const std::byte> get(StreamId id) const { return raw_[static_cast<uint8_t>(id)]; }

 private:
  std::span<const std::byte> raw_[16];
};

// Per-thread decode state: apply() decodes outside the applier's lock, so several threads can
// decode chunks of the same version at once; each keeps its buffers across frames.
// One segment of a chunk, decoded and validated, ready to write: positions (relative to the
// segment start), their coding-order index (classed locations only), the old bits the decoder
// read (classed locations only) and the value tokens in coding order.
struct SegmentDecode {
  uint32_t tensor = 0;
  uint64_t element_begin = 0;
  ValueMode mode = ValueMode::ulp_delta;
  ScanVector<uint32_t> positions, coding_index, old_values, tokens;
};

struct DecodeScratch {
  ScratchBuffer section_buffers[16];
  std::vector<SegmentDecode> segments;  // the chunk's segments (capacity kept across frames)
  size_t segment_count = 0;
  size_t changes = 0;
  size_t first_slot = 0;                                   // the chunk's first reserved undo slot
  std::vector<UndoEntry*> blocks;                          // undo blocks of the reserved slots
  std::vector<std::pair<uint32_t, uint64_t>> digest_delta;  // (tensor, digest change)
  ScanVector<uint32_t> old_bits, new_bits;                  // per change of the segment being written
  static DecodeScratch& local() {
    thread_local DecodeScratch scratch;
    return scratch;
  }
};

}  // namespace

struct DeltaApplier::Impl {
  const Manifest* manifest;
  MutableWeights weights;
  uint64_t version;
  StateDigest digest;       // of the bytes currently in the buffers
  StateDigest base_digest;  // of the committed version
  uint64_t base_combined;
  // In-flight version.
  std::optional<uint64_t> pending;
  uint32_t chunk_count = 0;
  std::vector<bool> applied;
  uint32_t applied_n = 0;
  std::optional<std::vector<uint64_t>> seal_digests;
  bool verified = false;
  UndoLog undo;
  mutable std::mutex mu;
  // Chunks being decoded by some thread right now: (new version, chunk index). A second copy of
  // one of them is refused as a replay instead of being decoded twice.
  std::vector<std::pair<uint64_t, uint32_t>> decoding;
  // Chunks writing their planned changes outside the lock; rollback/commit/verify wait for 0.
  unsigned writers = 0;
  std::condition_variable writers_done;
  void wait_for_writers(std::unique_lock<std::mutex>& lock) {
    writers_done.wait(lock, [&] { return writers == 0; });
  }

  void check_base(const FrameHeader& h) const {
    if (h.manifest_digest != manifest->digest())
      throw Error(Errc::version_mismatch, "frame belongs to another model (manifest digest differs)");
    if (h.base_version != version || h.base_digest != base_combined)
      throw Error(Errc::version_mismatch,
                  "frame for " + std::to_string(h.base_version) + " -> " + std::to_string(h.new_version) +
                      " but this receiver holds version " + std::to_string(version) +
                      (h.base_version == version ? " with different bits (base digest differs)" : ""));
    if (pending && (h.new_version != *pending || h.chunk_count != chunk_count))
      throw Error(Errc::version_mismatch, "frame for version " + std::to_string(h.new_version) +
                                              " while version " + std::to_string(*pending) + " is in flight");
  }
  void begin(const FrameHeader& h) {
    if (pending) return;
    pending = h.new_version;
    chunk_count = h.chunk_count;
    applied.assign(chunk_count, false);
    applied_n = 0;
    seal_digests.reset();
    verified = false;
  }

  // Decodes every change of a chunk into sc.segments without touching the weights. Throws on
  // anything wrong. Needs no lock: it reads only the manifest and the weights of the chunk's own
  // segments, which no other chunk of a well-formed version writes (a malformed version that
  // overlaps chunks fails verify, whose digest covers every write, and is rolled back).
  void decode_chunk(const FrameView& view, DecodeScratch& sc) const {
    uint64_t max_raw = 1024;
    uint64_t prev_end_tensor = 0, prev_end = 0;
    bool first = true;
    for (const auto& s : view.segments) {
      const auto& info = manifest->at(s.tensor_index);  // throws not_found for an unknown tensor
      if (s.dtype != info.dtype)
        throw Error(Errc::corrupt_frame, "segment dtype " + std::string(dtype_name(s.dtype)) + " differs from tensor '" +
                                             info.name + "' (" + std::string(dtype_name(info.dtype)) + ")");
      if (s.element_begin > info.numel() || s.element_count > info.numel() - s.element_begin || s.element_count == 0)
        throw Error(Errc::corrupt_frame, "segment range out of bounds for tensor '" + info.name + "'");
      if (!first && (s.tensor_index < prev_end_tensor || (s.tensor_index == prev_end_tensor && s.element_begin < prev_end)))
        throw Error(Errc::corrupt_frame, "segments overlap or are out of order");
      first = false;
      prev_end_tensor = s.tensor_index;
      prev_end = s.element_begin + s.element_count;
      if (s.location_coding == LocationCoding::classed_gaps && s.value_mode == ValueMode::overwrite)
        throw Error(Errc::corrupt_frame, "overwrite segment with classed locations");
      max_raw += s.element_count / 8 + 16 * s.change_count + 128;
    }
    Sections sec(view, max_raw, sc.section_buffers);
    const std::span<const std::byte> planes[4] = {sec.get(StreamId::plane0), sec.get(StreamId::plane1),
                                                  sec.get(StreamId::plane2), sec.get(StreamId::plane3)};
    ValueDecoder values(sec.get(StreamId::sign_bits), sec.get(StreamId::mag_flags), sec.get(StreamId::mag_bytes),
                        sec.get(StreamId::mag_wide), planes);
    auto locs = sec.get(StreamId::locations);
    if (sc.segments.size() < view.segments.size()) sc.segments.resize(view.segments.size());
    sc.segment_count = view.segments.size();
    sc.changes = 0;
    for (size_t i = 0; i < view.segments.size(); ++i) {
      const auto& s = view.segments[i];
      const auto& info = manifest->at(s.tensor_index);
      const unsigned w = static_cast<unsigned>(dtype_size(info.dtype));
      const std::byte* old = weights.tensors[s.tensor_index].data() + s.element_begin * w;
      SegmentDecode& d = sc.segments[i];
      d.tensor = s.tensor_index;
      d.element_begin = s.element_begin;
      d.mode = s.value_mode;
      decode_locations(s.location_coding, s.element_count, s.change_count, w, abs_mask_of(info.dtype), old, locs,
                       d.positions, d.coding_index, d.old_values);
      const size_t n = d.positions.size();
      d.tokens.resize(n);
      values.next_tokens(s.value_mode, w, d.tokens.data(), n);
      sc.changes += n;
    }
    if (!locs.empty()) throw Error(Errc::corrupt_frame, "locations stream holds bytes past the last segment");
    values.expect_consumed();
  }

  // Writes the decoded segments of sc into the weights, recording each element's old bits in the
  // undo slots from sc.first_slot on (reserved under mu, block pointers in sc.blocks) and each
  // segment's digest change in sc.digest_delta. Runs outside mu: chunks of a version write
  // disjoint elements. Cannot fail: everything was validated by decode_chunk.
  void write(DecodeScratch& sc) const {
    size_t slot = sc.first_slot;
    for (size_t i = 0; i < sc.segment_count; ++i) {
      const SegmentDecode& d = sc.segments[i];
      switch (dtype_size(manifest->at(d.tensor).dtype)) {
        case 1: write_segment_of_width<1>(d, sc, slot); break;
        case 2: write_segment_of_width<2>(d, sc, slot); break;
        default: write_segment_of_width<4>(d, sc, slot); break;
      }
      slot += d.positions.size();
    }
  }
  // Element width and value mode as compile-time constants: no per-change switch on either.
  template <unsigned W>
  void write_segment_of_width(const SegmentDecode& d, DecodeScratch& sc, size_t first_slot) const {
    switch (d.mode) {
      case ValueMode::ulp_delta: return write_segment<ValueMode::ulp_delta, W>(d, sc, first_slot);
      case ValueMode::xor_bits: return write_segment<ValueMode::xor_bits, W>(d, sc, first_slot);
      case ValueMode::overwrite: return write_segment<ValueMode::overwrite, W>(d, sc, first_slot);
    }
  }
  template <ValueMode M, unsigned w>
  void write_segment(const SegmentDecode& d, DecodeScratch& sc, size_t first_slot) const {
    const auto dtype = manifest->at(d.tensor).dtype;
    const bool is_float = dtype_is_float(dtype);
    std::byte* base = weights.tensors[d.tensor].data() + d.element_begin * w;
    const size_t n = d.positions.size();
    const uint32_t* pos = d.positions.data();
    const uint32_t* tokens = d.tokens.data();
    const uint32_t* order = d.coding_index.empty() ? nullptr : d.coding_index.data();
    const uint32_t* olds = d.old_values.empty() ? nullptr : d.old_values.data();
    const size_t first_block = sc.first_slot / UndoLog::kBlock;
    // The old and new bits are kept for one vectorised digest pass after the writes.
    sc.old_bits.resize(n);
    sc.new_bits.resize(n);
    uint32_t* old_out = sc.old_bits.data();
    uint32_t* new_out = sc.new_bits.data();
    // Stores are prefetched a few writes ahead: the decode pass streamed through these lines
    // long before, so their misses are made to overlap.
    constexpr size_t kAhead = 16;
    for (size_t k = 0; k < n; ++k) {
      if (k + kAhead < n) __builtin_prefetch(base + uint64_t{pos[k + kAhead]} * w, 1);
      const uint32_t p = pos[k];
      const uint32_t token = tokens[order ? order[k] : k];
      const uint32_t ob = olds ? olds[k] : load_bits(base, w, p);
      const uint32_t nb = ValueDecoder::apply_token(M, w, is_float, ob, token);
      const size_t slot = first_slot + k;
      sc.blocks[slot / UndoLog::kBlock - first_block][slot % UndoLog::kBlock] =
          UndoEntry{d.element_begin + p, d.tensor, ob};
      store_bits(base, w, p, nb);
      old_out[k] = ob;
      new_out[k] = nb;
    }
    sc.digest_delta.emplace_back(d.tensor, changes_digest_delta(d.tensor, d.element_begin, pos, old_out, new_out, n));
  }
};

DeltaApplier::DeltaApplier(const Manifest& manifest, MutableWeights weights, uint64_t version, StateDigest digest)
    : impl_(std::make_unique<Impl>()) {
  if (weights.manifest == nullptr) weights.manifest = &manifest;
  check_weights(weights.as_const());
  if (weights.manifest->digest() != manifest.digest())
    throw Error(Errc::invalid_argument, "applier: weights belong to another manifest");
  if (digest.per_tensor().size() != manifest.size())
    throw Error(Errc::invalid_argument, "applier: digest has the wrong number of tensors");
  auto& im = *impl_;
  im.manifest = &manifest;
  im.weights = std::move(weights);
  im.version = version;
  im.digest = digest;
  im.base_digest = std::move(digest);
  im.base_combined = im.base_digest.combined();
}

DeltaApplier::~DeltaApplier() = default;

ApplyResult DeltaApplier::apply(std::span<const std::byte> frame) {
  return apply(parse_frame(frame));  // checksum and structure: no shared state
}

ApplyResult DeltaApplier::apply(const FrameView& view) {
  auto& im = *impl_;
  const auto& h = view.header;
  std::unique_lock lock(im.mu);
  im.check_base(h);
  if (h.kind == FrameKind::seal) {
    if (view.tensor_digests.size() != im.manifest->size())
      throw Error(Errc::corrupt_frame, "seal frame: tensor count differs from the manifest");
    if (im.pending && im.seal_digests) throw Error(Errc::replayed, "seal of version " + std::to_string(h.new_version) + " already received");
    im.begin(h);
    im.seal_digests = view.tensor_digests;
    return ApplyResult{FrameKind::seal, 0, 0};
  }
  const auto key = std::make_pair(h.new_version, h.chunk_index);
  auto refuse_replay = [&] {
    if ((im.pending && im.applied[h.chunk_index]) ||
        std::find(im.decoding.begin(), im.decoding.end(), key) != im.decoding.end())
      throw Error(Errc::replayed, "chunk " + std::to_string(h.chunk_index) + " of version " +
                                      std::to_string(h.new_version) + " was already applied");
  };
  refuse_replay();
  im.decoding.push_back(key);
  auto done_decoding = [&] { im.decoding.erase(std::find(im.decoding.begin(), im.decoding.end(), key)); };
  lock.unlock();
  DecodeScratch& sc = DecodeScratch::local();
  try {
    im.decode_chunk(view, sc);  // validates everything before any write
  } catch (...) {
    lock.lock();
    done_decoding();
    throw;
  }
  lock.lock();
  done_decoding();
  im.check_base(h);  // a commit or rollback may have happened meanwhile
  refuse_replay();
  im.begin(h);
  // Reserve undo slots and count this chunk as applied (no other copy may start), then write
  // outside the lock; rollback/commit/verify wait for the writers.
  const size_t n = sc.changes;
  const size_t first_slot = sc.first_slot = im.undo.reserve_slots(n);
  sc.blocks.clear();
  for (size_t b = first_slot / UndoLog::kBlock; n > 0 && b <= (first_slot + n - 1) / UndoLog::kBlock; ++b)
    sc.blocks.push_back(im.undo.block_of(b * UndoLog::kBlock));
  im.applied[h.chunk_index] = true;
  ++im.writers;
  lock.unlock();
  sc.digest_delta.clear();
  im.write(sc);
  lock.lock();
  auto& per = im.digest.per_tensor();
  for (const auto& [t, d] : sc.digest_delta) per[t] += d;
  ++im.applied_n;
  if (--im.writers == 0) im.writers_done.notify_all();
  return ApplyResult{FrameKind::chunk, h.chunk_index, n};
}

bool DeltaApplier::complete() const noexcept {
  std::lock_guard lock(impl_->mu);
  return impl_->pending && impl_->seal_digests && impl_->applied_n == impl_->chunk_count;
}

std::vector<bool> DeltaApplier::applied_chunks() const {
  std::lock_guard lock(impl_->mu);
  return impl_->applied;
}

uint64_t DeltaApplier::version() const noexcept { return impl_->version; }
std::optional<uint64_t> DeltaApplier::pending_version() const noexcept { return impl_->pending; }

void DeltaApplier::verify() const {
  auto& im = *impl_;
  {
    std::lock_guard lock(im.mu);
    if (!(im.pending && im.seal_digests && im.applied_n == im.chunk_count))
      throw Error(Errc::state, "verify: version is not complete (" + std::to_string(im.applied_n) + " of " +
                                   std::to_string(im.chunk_count) + " chunks" + (im.seal_digests ? "" : ", no seal") + ")");
    const auto& want = *im.seal_digests;
    const auto& have = im.digest.per_tensor();
    for (uint32_t t = 0; t < want.size(); ++t)
      if (want[t] != have[t])
        throw Error(Errc::verify_failed, "verify: tensor '" + im.manifest->at(t).name +
                                             "' differs from the producer's version " + std::to_string(*im.pending));
  }
  im.verified = true;
}

void DeltaApplier::audit(unsigned threads) const {
  const StateDigest scanned = StateDigest::full_scan(impl_->weights.as_const(), threads);
  std::lock_guard lock(impl_->mu);
  const auto& have = impl_->digest.per_tensor();
  for (uint32_t t = 0; t < have.size(); ++t)
    if (scanned.per_tensor()[t] != have[t])
      throw Error(Errc::verify_failed, "audit: tensor '" + impl_->manifest->at(t).name +
                                           "' bytes do not match the maintained digest");
}

void DeltaApplier::rollback() {
  auto& im = *impl_;
  std::unique_lock lock(im.mu);
  im.wait_for_writers(lock);
  im.undo.for_each_reverse([&](const UndoEntry& e) {
    const unsigned w = static_cast<unsigned>(dtype_size(im.manifest->at(e.tensor).dtype));
    store_bits(im.weights.tensors[e.tensor].data(), w, e.position, e.bits);
  });
  im.undo.clear();
  im.digest = im.base_digest;
  im.pending.reset();
  im.applied.clear();
  im.applied_n = 0;
  im.seal_digests.reset();
  im.verified = false;
}

void DeltaApplier::commit() {
  auto& im = *impl_;
  std::unique_lock lock(im.mu);
  im.wait_for_writers(lock);
  if (!im.pending || !im.verified) throw Error(Errc::state, "commit: no verified version to commit");
  im.version = *im.pending;
  im.base_digest = im.digest;
  im.base_combined = im.base_digest.combined();
  im.undo.clear();
  im.pending.reset();
  im.applied.clear();
  im.applied_n = 0;
  im.seal_digests.reset();
  im.verified = false;
}

void DeltaApplier::reserve(uint64_t changes) {
  std::lock_guard lock(impl_->mu);
  impl_->undo.reserve(static_cast<size_t>(changes));
}

const StateDigest& DeltaApplier::digest() const noexcept { return impl_->digest; }

}  // namespace deltacast::codec
