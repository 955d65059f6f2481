#include "codec/applier.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <zstd.h>

#include "codec/chunk_plan.h"
#include "codec/location_coding.h"
#include "codec/scratch.h"
#include "codec/value_coding.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::codec {

namespace {

// One element's base bits, at a position relative to its segment's first element.
struct UndoEntry {
  uint32_t position;
  uint32_t bits;
};
// The undo entries of one segment's writes (segment elements [element_begin, element_end)).
struct UndoSegment {
  uint32_t tensor;
  uint64_t element_begin;
  const UndoEntry* entries;
  size_t count;
  uint64_t element_end;
};

// Staged mode: one committed version not yet written into the buffers. `segments` are its
// segments sorted by (tensor, element_begin) (disjoint: the chunks of a version cover disjoint
// elements); their entries point into `entries` and hold (position, new bits).
struct StagedVersion {
  uint64_t version = 0;
  std::vector<UndoSegment> segments;
  std::vector<UndoEntry> entries;
  StateDigest digest;  // of the buffers once this version is written
};

uint32_t load_bits(const std::byte* base, unsigned width, uint32_t position) noexcept {
  switch (width) {
    case 1:
      return load_unit<uint8_t>(base, position);
    case 2:
      return load_unit<uint16_t>(base, position);
    default:
      return load_unit<uint32_t>(base, position);
  }
}
void store_bits(std::byte* base, unsigned width, uint32_t position, uint32_t bits) noexcept {
  switch (width) {
    case 1:
      return store_unit(base, position, static_cast<uint8_t>(bits));
    case 2:
      return store_unit(base, position, static_cast<uint16_t>(bits));
    default:
      return store_unit(base, position, bits);
  }
}

// Puts back entries[count-1], ..., entries[0] into the segment starting at `base`.
template <class T>
void restore_entries_of(std::byte* base, const UndoEntry* entries, size_t count) noexcept {
  for (size_t k = count; k-- > 0;) store_unit(base, entries[k].position, static_cast<T>(entries[k].bits));
}
void restore_entries(std::byte* base, unsigned width, const UndoEntry* entries, size_t count) noexcept {
  switch (width) {
    case 1:
      return restore_entries_of<uint8_t>(base, entries, count);
    case 2:
      return restore_entries_of<uint16_t>(base, entries, count);
    default:
      return restore_entries_of<uint32_t>(base, entries, count);
  }
}

// The undo log: base bits of every element written since the last commit. Each chunk reserves one
// contiguous run of entries (under the applier's lock) and fills it outside the lock while it
// writes; a segment record names the tensor range of each part of the run. Runs live in large
// pages that growing never moves, and clear() keeps the pages for the next version (a receiver
// pays for them once, not on every refit). rollback() and commit() wait for every writer first.
class UndoLog {
 public:
  static constexpr size_t kPage = size_t{1} << 18;  // entries per page (2 MiB)
  // A run of n entries (mu held).
  UndoEntry* reserve_run(size_t n) {
    while (page_ < pages_.size() && pages_[page_].capacity - used_ < n) {
      ++page_;
      used_ = 0;
    }
    if (page_ == pages_.size()) add_page(std::max(kPage, n), false);
    UndoEntry* run = pages_[page_].entries.get() + used_;
    used_ += n;
    return run;
  }
  // Records a segment written into a reserved run; returns its index (mu held).
  size_t add_segment(const UndoSegment& s) {
    segments_.push_back(s);
    return segments_.size() - 1;
  }
  // A placed receiver's segment wrote only `count` of its reserved entries (mu held).
  void set_count(size_t segment, size_t count) { segments_[segment].count = count; }
  // Forgets segments [first, first + n): their writes were undone by their writer (mu held).
  void drop_segments(size_t first, size_t n) {
    for (size_t i = first; i < first + n; ++i) segments_[i].count = 0;
  }
  // Allocates and touches pages for `entries` more entries so their page faults happen now.
  void reserve(size_t entries) {
    size_t room = page_ < pages_.size() ? pages_[page_].capacity - used_ : 0;
    for (size_t p = page_ + 1; p < pages_.size(); ++p) room += pages_[p].capacity;
    while (room < entries + kPage) {  // one page of slack: a run that does not fit skips a page's tail
      add_page(kPage, true);
      room += kPage;
    }
  }
  template <class F>
  void for_each_segment_reverse(F&& f) const {
    for (size_t i = segments_.size(); i-- > 0;) f(segments_[i]);
  }
  void clear() noexcept {
    segments_.clear();
    page_ = 0;
    used_ = 0;
  }

 private:
  struct Page {
    std::unique_ptr<UndoEntry[]> entries;
    size_t capacity;
  };
  void add_page(size_t capacity, bool touch) {
    pages_.push_back(Page{std::make_unique_for_overwrite<UndoEntry[]>(capacity), capacity});
    if (touch) std::memset(static_cast<void*>(pages_.back().entries.get()), 0, capacity * sizeof(UndoEntry));
  }
  std::vector<Page> pages_;
  size_t page_ = 0;  // the page runs are taken from
  size_t used_ = 0;  // entries of that page already taken
  std::vector<UndoSegment> segments_;
};

// What one segment's writer reports to (a ChangeLog's context): the segment's undo entries and
// its digest change.
struct SegmentLog {
  UndoEntry* undo = nullptr;  // the segment's part of the chunk's run
  size_t written = 0;
  uint32_t tensor = 0;
  uint64_t first = 0;   // index of the segment's first element
  uint64_t digest = 0;  // sum of the digest changes so far
  static void flush(void* ctx, const uint32_t* positions, const uint32_t* old_bits, const uint32_t* new_bits,
                    size_t count) noexcept {
    auto& log = *static_cast<SegmentLog*>(ctx);
    UndoEntry* u = log.undo + log.written;
    for (size_t k = 0; k < count; ++k) u[k] = UndoEntry{positions[k], old_bits[k]};
    log.written += count;
    log.digest += changes_digest_delta(log.tensor, log.first, positions, old_bits, new_bits, count);
  }
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

// One segment of a chunk, decoded and validated, ready to write: its locations (class ranks or
// positions) and value tokens in coding order.
struct SegmentDecode {
  uint32_t tensor = 0;
  uint64_t element_begin = 0;
  uint64_t element_count = 0;
  uint64_t changes = 0;
  unsigned width = 0;
  uint32_t abs_mask = 0;
  bool is_float = false;
  ValueMode mode = ValueMode::ulp_delta;
  DecodedLocations locations;
  ScanVector<uint32_t> tokens;
};

// Per-thread decode state: apply() decodes outside the applier's lock, so several threads can
// decode chunks of the same version at once; each keeps its buffers across frames.
struct DecodeScratch {
  ScratchBuffer section_buffers[16];
  std::vector<SegmentDecode> segments;  // the chunk's segments (capacity kept across frames)
  size_t segment_count = 0;
  size_t changes = 0;
  UndoEntry* undo = nullptr;  // the chunk's run of undo entries (reserved under the lock)
  size_t first_undo_segment = 0;
  std::vector<std::pair<uint32_t, uint64_t>> digest_delta;  // (tensor, digest change)
  ScratchBuffer staged_base;  // staged mode: the segment's base bits, written instead of the buffers
  std::vector<PlacedRun> runs;   // placed: the runs of the segment being checked or written
  std::vector<size_t> written;   // placed: undo entries each segment wrote (<= its changes)
  std::vector<UndoEntry> order;  // placed, staged: a segment's undo entries by position
  static DecodeScratch& local() {
    thread_local DecodeScratch scratch;
    return scratch;
  }
};

// Writes a segment whose coding carries positions: position k takes token k.
template <class T>
void write_positions(const ScanVector<uint32_t>& positions, const SegmentWrite& w) noexcept {
  ChangeBatch batch;
  with_value_mode(w.mode, w.is_float, [&]<ValueMode M, bool kFloat>() {
    SegmentWriter<T, M, kFloat> writer(w, batch);
    const uint32_t* pos = positions.data();
    const size_t n = positions.size();
    constexpr size_t kAhead = 16;  // stores prefetched a few writes ahead, so their misses overlap
    for (size_t k = 0; k < n; ++k) {
      if (k + kAhead < n) __builtin_prefetch(writer.elements + pos[k + kAhead], 1);
      writer.write(pos[k], writer.elements[pos[k]], static_cast<uint32_t>(k));
    }
    writer.flush();
  });
}

}  // namespace

struct DeltaApplier::Impl {
  const Manifest* manifest;
  MutableWeights weights;
  // A placed receiver (PlacedWeights): its placement and buffers; `digest` is then per flat part.
  std::shared_ptr<const Placement> placement;
  std::vector<std::span<std::byte>> buffers;
  Mode mode = Mode::in_place;
  // Staged mode: committed versions not in the buffers yet (oldest first), and what the buffers
  // hold. Guarded by buffers_mu, which writers of the buffers hold exclusively (apply_next_staged,
  // rebind) and readers of them (staging a chunk) shared; never taken before mu is released
  // except by commit and rebind, which hold mu with no writer running.
  std::deque<StagedVersion> staged;
  std::vector<StagedVersion> spare;  // written versions whose storage the next ones reuse
  uint64_t buffers_version = 0;
  StateDigest buffers_digest;
  mutable std::shared_mutex buffers_mu;
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
  std::vector<SliceDigest> seal_slices;  // the seal's slice table (what a placed receiver checks)
  bool verified = false;
  UndoLog undo;
  mutable std::mutex mu;
  // Chunks being decoded by some thread right now: (new version, chunk index). A second copy of
  // one of them is refused as a replay instead of being decoded twice.
  std::vector<std::pair<uint64_t, uint32_t>> decoding;
  // Element ranges the in-flight version's chunks write: (tensor, first element) -> end. Chunks of
  // a version must cover disjoint elements (their undo entries then restore the base exactly in
  // any order, and concurrent writers never meet); a chunk that overlaps another is refused.
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> covered;
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
    covered.clear();
    applied.assign(chunk_count, false);
    applied_n = 0;
    seal_digests.reset();
    verified = false;
  }

  // Decodes every segment of a chunk (sections, locations, value tokens) into sc.segments without
  // reading or touching the weights. Throws on anything the frame alone shows wrong; the one check
  // left to write() is that each class rank lies within its class. Needs no lock: it reads only
  // the manifest.
  void decode_chunk(const FrameView& view, DecodeScratch& sc) const {
    uint64_t max_raw = 1024;
    uint64_t prev_end_tensor = 0, prev_end = 0;
    bool first = true;
    for (const auto& s : view.segments) {
      const auto& info = manifest->at(s.tensor_index);  // throws not_found for an unknown tensor
      if (s.dtype != info.dtype)
        throw Error(Errc::corrupt_frame, "segment dtype " + std::string(dtype_name(s.dtype)) + " differs from tensor '" +
                                             info.name + "' (" + std::string(dtype_name(info.dtype)) + ")");
      if (s.element_begin > info.units() || s.element_count > info.units() - s.element_begin || s.element_count == 0)
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
    // A placed receiver with the producer's location index skips the segments it holds nothing of
    // without decoding their locations (their values are still read: the streams are sequential).
    const auto index_bytes = sec.get(StreamId::location_index);
    ByteReader index(index_bytes, "location index");
    const bool indexed = !index_bytes.empty();
    if (sc.segments.size() < view.segments.size()) sc.segments.resize(view.segments.size());
    sc.segment_count = view.segments.size();
    sc.changes = 0;
    for (size_t i = 0; i < view.segments.size(); ++i) {
      const auto& s = view.segments[i];
      const auto& info = manifest->at(s.tensor_index);
      SegmentDecode& d = sc.segments[i];
      d.tensor = s.tensor_index;
      d.element_begin = s.element_begin;
      d.element_count = s.element_count;
      d.changes = s.change_count;
      d.width = static_cast<unsigned>(dtype_unit_size(info.dtype));
      d.abs_mask = abs_mask_of(info.dtype);
      d.is_float = dtype_codes_as_float(info.dtype);
      d.mode = s.value_mode;
      const uint64_t length = indexed ? index.leb128() : 0;
      d.tokens.resize(s.change_count);
      if (indexed && placement &&
          !placement->holds_any(s.tensor_index, s.element_begin, s.element_begin + s.element_count)) {
        if (length > locs.size()) throw Error(Errc::corrupt_frame, "location index: a segment reaches past the stream");
        locs = locs.subspan(length);
        values.next_tokens(s.value_mode, d.width, d.tokens.data(), s.change_count);
        d.changes = 0;  // nothing here is held: nothing to write
        d.locations.coding = LocationCoding::none;
        continue;
      }
      const size_t before = locs.size();
      decode_locations(s.location_coding, s.element_count, s.change_count, d.abs_mask, locs, d.locations);
      if (indexed && before - locs.size() != length)
        throw Error(Errc::corrupt_frame, "location index: a segment's length differs from its locations");
      values.next_tokens(s.value_mode, d.width, d.tokens.data(), s.change_count);
      sc.changes += s.change_count;
    }
    if (indexed && !index.at_end())
      throw Error(Errc::corrupt_frame, "location index holds entries past the last segment");
    if (!locs.empty()) throw Error(Errc::corrupt_frame, "locations stream holds bytes past the last segment");
    values.expect_consumed();
    if (placement)
      for (size_t i = 0; i < sc.segment_count; ++i) check_placed_classes(sc.segments[i], sc.runs);
  }

  // A placed receiver: whether it holds any element a chunk's segments cover.
  bool holds_any(const FrameView& view) const {
    return std::any_of(view.segments.begin(), view.segments.end(), [&](const SegmentInfo& s) {
      return placement->holds_any(s.tensor_index, s.element_begin, s.element_begin + s.element_count);
    });
  }
  // A chunk a placed receiver holds nothing of: its segments as ranges without changes (so the
  // overlap and replay checks still see them), nothing decoded.
  void skip_chunk(const FrameView& view, DecodeScratch& sc) const {
    if (sc.segments.size() < view.segments.size()) sc.segments.resize(view.segments.size());
    sc.segment_count = view.segments.size();
    sc.changes = 0;
    for (size_t i = 0; i < view.segments.size(); ++i) {
      const auto& s = view.segments[i];
      const auto& info = manifest->at(s.tensor_index);  // throws not_found for an unknown tensor
      if (s.element_begin > info.units() || s.element_count > info.units() - s.element_begin || s.element_count == 0)
        throw Error(Errc::corrupt_frame, "segment range out of bounds for tensor '" + info.name + "'");
      SegmentDecode& d = sc.segments[i];
      d.tensor = s.tensor_index;
      d.element_begin = s.element_begin;
      d.element_count = s.element_count;
      d.changes = 0;
    }
  }
  // A placed receiver: the runs of segment d it holds, in `runs` (cleared first).
  void collect_runs(const SegmentDecode& d, std::vector<PlacedRun>& runs) const {
    runs.clear();
    placement->for_each_run(d.tensor, d.element_begin, d.element_begin + d.element_count,
                            [&](const PlacedRun& r) { runs.push_back(r); });
  }
  // A run holding all of segment d, or null.
  static const PlacedRun* whole_run(const SegmentDecode& d, const std::vector<PlacedRun>& runs) {
    for (const PlacedRun& r : runs)
      if (r.unit == d.element_begin && r.count == d.element_count) return &r;
    return nullptr;
  }
  // A segment coded by class needs the old bits of all its elements: refused when this placed
  // receiver holds some of them but no buffer holds all (the producer did not know its placement).
  void check_placed_classes(const SegmentDecode& d, std::vector<PlacedRun>& runs) const {
    if (d.locations.coding != LocationCoding::classed_gaps || !placement->needs(d.tensor)) return;
    collect_runs(d, runs);
    if (!runs.empty() && whole_run(d, runs) == nullptr)
      throw Error(Errc::unsupported, "segment of tensor '" + manifest->at(d.tensor).name + "' units [" +
                                         std::to_string(d.element_begin) + ", " +
                                         std::to_string(d.element_begin + d.element_count) +
                                         ") is coded by class, and this receiver holds only part of it: the producer "
                                         "does not know its placement");
  }

  // Writes the decoded segments of sc into the weights, recording each element's base bits in the
  // chunk's undo run sc.undo (reserved under mu) and each segment's digest change in
  // sc.digest_delta. Runs outside mu: chunks of a version write disjoint elements. Classed
  // segments are selected and written in one pass over the base bits; the one error it can meet
  // (a class rank beyond its class) shows only there, so on that error every element this chunk
  // wrote is restored before the exception leaves: the weights hold what they held before.
  // In staged mode the segment is written into a copy of its base bits (sc.staged_base) instead,
  // the buffers are only read, and each undo entry ends up holding the element's new bits.
  void write(DecodeScratch& sc) const {
    UndoEntry* run = sc.undo;
    size_t i = 0;
    SegmentLog log;
    if (placement) return write_placed(sc);
    if (mode == Mode::staged) {
      for (; i < sc.segment_count; ++i) {
        const SegmentDecode& d = sc.segments[i];
        log = SegmentLog{run, 0, d.tensor, d.element_begin, 0};
        std::byte* base = stage_base(d, sc.staged_base);
        write_segment(d, log, base);  // an error leaves only the copy written
        for (size_t k = 0; k < log.written; ++k) run[k].bits = load_bits(base, d.width, run[k].position);
        sc.digest_delta.emplace_back(d.tensor, log.digest);
        run += d.changes;
      }
      return;
    }
    try {
      for (; i < sc.segment_count; ++i) {
        const SegmentDecode& d = sc.segments[i];
        log = SegmentLog{run, 0, d.tensor, d.element_begin, 0};
        write_segment(d, log, segment_base(d));
        sc.digest_delta.emplace_back(d.tensor, log.digest);
        run += d.changes;
      }
    } catch (...) {
      restore_entries(segment_base(sc.segments[i]), sc.segments[i].width, log.undo, log.written);
      for (size_t j = i; j-- > 0;) {
        run -= sc.segments[j].changes;
        restore_entries(segment_base(sc.segments[j]), sc.segments[j].width, run, sc.segments[j].changes);
      }
      throw;
    }
  }
  // write() for a placed receiver (in place): each segment's changes that fall in its buffers,
  // its undo entries (canonical positions, written once per element even when two buffers hold
  // it) counted in sc.written, digest changes per part. On an error every write of the chunk is
  // undone, as in write().
  void write_placed(DecodeScratch& sc) const {
    if (mode == Mode::staged) return write_placed_staged(sc);
    UndoEntry* run = sc.undo;
    sc.written.assign(sc.segment_count, 0);
    size_t i = 0;
    SegmentLog log;
    try {
      for (; i < sc.segment_count; ++i) {
        const SegmentDecode& d = sc.segments[i];
        log = SegmentLog{run, 0, d.tensor, d.element_begin, 0};
        write_placed_segment(d, log, sc);
        sc.written[i] = log.written;
        run += d.changes;
      }
    } catch (...) {
      restore_placed(sc.segments[i].tensor, sc.segments[i].element_begin, log.undo, log.written);
      for (size_t j = i; j-- > 0;) {
        run -= sc.segments[j].changes;
        restore_placed(sc.segments[j].tensor, sc.segments[j].element_begin, run, sc.written[j]);
      }
      throw;
    }
  }
  // write() for a placed receiver in staged mode: each segment is written into a canonical copy of
  // the units it holds as the buffers will hold them once every staged version is written (its
  // runs gathered from the buffers, then each staged version's changes); the buffers are only
  // read. Undo entries (canonical positions, once per element) end up holding the new bits; each
  // part's digest moves by the changes in its runs. An error (a class rank beyond its class)
  // leaves only the copy written.
  void write_placed_staged(DecodeScratch& sc) const {
    UndoEntry* run = sc.undo;
    sc.written.assign(sc.segment_count, 0);
    for (size_t i = 0; i < sc.segment_count; ++i) {
      const SegmentDecode& d = sc.segments[i];
      SegmentLog log{run, 0, d.tensor, d.element_begin, 0};
      run += d.changes;
      if (d.changes == 0 || !placement->needs(d.tensor)) continue;
      collect_runs(d, sc.runs);
      if (sc.runs.empty()) continue;
      std::byte* base = stage_base_placed(d, sc);
      const PlacedRun* whole = whole_run(d, sc.runs);
      if (whole != nullptr) {
        write_segment(d, log, base);  // every change is held: today's writers, classed included
        sc.digest_delta.emplace_back(whole->part, log.digest);
      } else {
        // Held partly: positions ascend; each held position once, whichever runs hold it.
        const auto& positions = d.locations.positions;
        size_t ri = 0;
        std::vector<PlacedRun>& runs = sc.runs;
        std::sort(runs.begin(), runs.end(), [](const PlacedRun& a, const PlacedRun& b) { return a.unit < b.unit; });
        uint64_t covered_end = 0;  // end of the union of the runs started so far
        for (size_t k = 0; k < positions.size(); ++k) {
          const uint64_t u = d.element_begin + positions[k];
          for (; ri < runs.size() && runs[ri].unit <= u; ++ri)
            covered_end = std::max(covered_end, runs[ri].unit + runs[ri].count);
          if (u >= covered_end) continue;
          const uint32_t old_bits = load_bits(base, d.width, positions[k]);
          store_bits(base, d.width, positions[k],
                     apply_value_token(d.mode, d.width, d.is_float, old_bits, d.tokens[k]));
          log.undo[log.written++] = {positions[k], old_bits};
        }
      }
      // Every other run's part: the digest change of the changes in the run. Entries ascend by
      // position unless written class by class; those are sorted (a copy) to find each run's.
      const UndoEntry* entries = log.undo;
      if (whole != nullptr && sc.runs.size() > 1 && d.locations.coding == LocationCoding::classed_gaps) {
        sc.order.assign(log.undo, log.undo + log.written);
        std::sort(sc.order.begin(), sc.order.end(),
                  [](const UndoEntry& a, const UndoEntry& b) { return a.position < b.position; });
        entries = sc.order.data();
      }
      const UndoEntry* const entries_end = entries + log.written;
      for (const PlacedRun& r : sc.runs) {
        if (&r == whole) continue;
        const uint32_t first = static_cast<uint32_t>(r.unit - d.element_begin);
        const UndoEntry* k = std::lower_bound(entries, entries_end, first,
                                              [](const UndoEntry& e, uint32_t p) { return e.position < p; });
        ChangeBatch batch;
        uint64_t delta = 0;
        size_t count = 0;
        for (; k != entries_end && k->position < first + r.count; ++k) {
          batch.positions[count] = k->position;
          batch.old_bits[count] = k->bits;
          batch.new_bits[count] = load_bits(base, d.width, k->position);
          if (++count == kChangeBatch) {
            delta +=
                changes_digest_delta(d.tensor, d.element_begin, batch.positions, batch.old_bits, batch.new_bits, count);
            count = 0;
          }
        }
        delta +=
            changes_digest_delta(d.tensor, d.element_begin, batch.positions, batch.old_bits, batch.new_bits, count);
        sc.digest_delta.emplace_back(r.part, delta);
      }
      for (size_t k = 0; k < log.written; ++k) log.undo[k].bits = load_bits(base, d.width, log.undo[k].position);
      sc.written[i] = log.written;
    }
  }
  // Staged mode, placed: segment d's units as the buffers will hold them once every staged
  // version is written, at their canonical offsets (units no run holds are left unset).
  std::byte* stage_base_placed(const SegmentDecode& d, DecodeScratch& sc) const {
    std::byte* out = sc.staged_base.get(d.element_count * d.width);
    const uint64_t end = d.element_begin + d.element_count;
    std::shared_lock lock(buffers_mu);
    for (const PlacedRun& r : sc.runs)
      std::memcpy(out + (r.unit - d.element_begin) * d.width, run_base(r, d.width), r.count * d.width);
    overlay_staged(d.tensor, d.element_begin, end, d.width, out);
    return out;
  }
  // Writes each staged version's changes to units [begin, end) of `tensor` into `out` (which holds
  // unit `begin` first), oldest first (buffers_mu held).
  void overlay_staged(uint32_t tensor, uint64_t begin, uint64_t end, unsigned width, std::byte* out) const {
    for (const StagedVersion& v : staged) {
      auto it = std::lower_bound(v.segments.begin(), v.segments.end(), std::make_pair(tensor, begin),
                                 [](const UndoSegment& s, const std::pair<uint32_t, uint64_t>& x) {
                                   return s.tensor != x.first ? s.tensor < x.first : s.element_end <= x.second;
                                 });
      for (; it != v.segments.end() && it->tensor == tensor && it->element_begin < end; ++it)
        for (size_t k = 0; k < it->count; ++k) {
          const uint64_t element = it->element_begin + it->entries[k].position;
          if (element >= begin && element < end)
            store_bits(out, width, static_cast<uint32_t>(element - begin), it->entries[k].bits);
        }
    }
  }
  std::byte* run_base(const PlacedRun& r, unsigned width) const {
    return buffers[r.buffer].data() + r.buffer_unit * width;
  }
  void write_placed_segment(const SegmentDecode& d, SegmentLog& log, DecodeScratch& sc) const {
    if (d.changes == 0 || !placement->needs(d.tensor)) return;
    collect_runs(d, sc.runs);
    if (sc.runs.empty()) return;
    if (const PlacedRun* whole = whole_run(d, sc.runs)) {
      // One buffer holds the whole segment: today's writers (classed included), based there; then
      // any other copy takes the same new bits.
      write_segment(d, log, run_base(*whole, d.width));
      sc.digest_delta.emplace_back(whole->part, log.digest);
      for (const PlacedRun& r : sc.runs)
        if (&r != whole) mirror_run(d, log, *whole, r, sc);
      return;
    }
    // Held partly (decode refused a classed coding): positions ascend, so each run's changes are
    // one stretch of them.
    if (placement->parts_of(d.tensor) == 1) {  // one part: its runs ascend
      switch (d.width) {
        case 1:
          write_runs<uint8_t>(d, log, sc.runs);
          break;
        case 2:
          write_runs<uint16_t>(d, log, sc.runs);
          break;
        default:
          write_runs<uint32_t>(d, log, sc.runs);
          break;
      }
      sc.digest_delta.emplace_back(sc.runs.front().part, log.digest);
      return;
    }
    const uint32_t* positions = d.locations.positions.data();
    const size_t n = d.locations.positions.size();
    ChangeBatch batch;
    for (size_t ri = 0; ri < sc.runs.size(); ++ri) {
      const PlacedRun& r = sc.runs[ri];
      const uint64_t first = r.unit - d.element_begin;
      size_t k = static_cast<size_t>(std::lower_bound(positions, positions + n, first) - positions);
      std::byte* base = run_base(r, d.width);
      uint64_t delta = 0;
      size_t count = 0;
      for (; k < n && positions[k] < first + r.count; ++k) {
        const uint32_t p = positions[k];
        const uint32_t at = static_cast<uint32_t>(p - first);
        const uint32_t old_bits = load_bits(base, d.width, at);
        const uint32_t new_bits = apply_value_token(d.mode, d.width, d.is_float, old_bits, d.tokens[k]);
        store_bits(base, d.width, at, new_bits);
        batch.positions[count] = p;
        batch.old_bits[count] = old_bits;
        batch.new_bits[count] = new_bits;
        if (!held_by_earlier_part(sc.runs, ri, d.element_begin + p)) log.undo[log.written++] = {p, old_bits};
        if (++count == kChangeBatch) {
          delta +=
              changes_digest_delta(d.tensor, d.element_begin, batch.positions, batch.old_bits, batch.new_bits, count);
          count = 0;
        }
      }
      delta += changes_digest_delta(d.tensor, d.element_begin, batch.positions, batch.old_bits, batch.new_bits, count);
      sc.digest_delta.emplace_back(r.part, delta);
    }
  }
  // The changes of positions-coded segment d that fall in `runs` (ascending, of one part), written
  // where the runs lie; undo entries and digest through `log`.
  template <class T>
  void write_runs(const SegmentDecode& d, SegmentLog& log, const std::vector<PlacedRun>& runs) const noexcept {
    ChangeBatch batch;
    with_value_mode(d.mode, d.is_float, [&]<ValueMode M, bool kFloat>() {
      const ChangeLog cl{&SegmentLog::flush, &log};
      const uint32_t* positions = d.locations.positions.data();
      const size_t n = d.locations.positions.size();
      size_t count = 0, k = 0;
      for (const PlacedRun& r : runs) {
        const uint64_t first = r.unit - d.element_begin, end = first + r.count;
        while (k < n && positions[k] < first) ++k;
        T* elements = reinterpret_cast<T*>(run_base(r, sizeof(T)));  // aligned: check_placed_buffers
        for (; k < n && positions[k] < end; ++k) {
          const uint32_t p = positions[k];
          T& e = elements[p - first];
          const uint32_t old_bits = e;
          const uint32_t new_bits = apply_value_token(M, sizeof(T), kFloat, old_bits, d.tokens[k]);
          e = static_cast<T>(new_bits);
          batch.positions[count] = p;
          batch.old_bits[count] = old_bits;
          batch.new_bits[count] = new_bits;
          if (++count == kChangeBatch) {
            cl.flush(cl.ctx, batch.positions, batch.old_bits, batch.new_bits, count);
            count = 0;
          }
        }
        if (k == n) break;
      }
      if (count > 0) cl.flush(cl.ctx, batch.positions, batch.old_bits, batch.new_bits, count);
    });
  }
  // Whether a run before runs[ri], of another part, holds canonical unit u (a tensor placed twice).
  static bool held_by_earlier_part(const std::vector<PlacedRun>& runs, size_t ri, uint64_t u) {
    for (size_t j = 0; j < ri; ++j)
      if (runs[j].part != runs[ri].part && u >= runs[j].unit && u < runs[j].unit + runs[j].count) return true;
    return false;
  }
  // Copies into run `to` the new bits of the changes `from` (which holds the whole segment) took,
  // with its own digest change.
  void mirror_run(const SegmentDecode& d, const SegmentLog& log, const PlacedRun& from, const PlacedRun& to,
                  DecodeScratch& sc) const {
    const std::byte* src = run_base(from, d.width);
    std::byte* dst = run_base(to, d.width);
    const uint64_t first = to.unit - d.element_begin;
    ChangeBatch batch;
    uint64_t delta = 0;
    size_t count = 0;
    for (size_t k = 0; k < log.written; ++k) {
      const uint32_t p = log.undo[k].position;
      if (p < first || p >= first + to.count) continue;
      const uint32_t at = static_cast<uint32_t>(p - first);
      batch.positions[count] = p;
      batch.old_bits[count] = load_bits(dst, d.width, at);
      batch.new_bits[count] = load_bits(src, d.width, p);
      store_bits(dst, d.width, at, batch.new_bits[count]);
      if (++count == kChangeBatch) {
        delta +=
            changes_digest_delta(d.tensor, d.element_begin, batch.positions, batch.old_bits, batch.new_bits, count);
        count = 0;
      }
    }
    delta += changes_digest_delta(d.tensor, d.element_begin, batch.positions, batch.old_bits, batch.new_bits, count);
    sc.digest_delta.emplace_back(to.part, delta);
  }
  // Puts back entries[count-1], ..., entries[0] of a placed segment into every buffer holding them.
  void restore_placed(uint32_t tensor, uint64_t element_begin, const UndoEntry* entries, size_t count) const {
    const unsigned width = static_cast<unsigned>(dtype_unit_size(manifest->at(tensor).dtype));
    for (size_t k = count; k-- > 0;)
      placement->for_each_place(tensor, element_begin + entries[k].position, [&](const PlacedUnit& at) {
        store_bits(buffers[at.buffer].data() + at.unit * width, width, 0, entries[k].bits);
      });
  }
  std::byte* segment_base(const SegmentDecode& d) const {
    return weights.tensors[d.tensor].data() + d.element_begin * d.width;
  }
  std::byte* segment_base(const UndoSegment& s) const {
    return weights.tensors[s.tensor].data() + s.element_begin * dtype_unit_size(manifest->at(s.tensor).dtype);
  }
  // Staged mode: a copy of segment d's elements as the buffers will hold them once every staged
  // version is written (the buffers' bits, then each staged version's changes, oldest first).
  std::byte* stage_base(const SegmentDecode& d, ScratchBuffer& scratch) const {
    std::byte* out = scratch.get(d.element_count * d.width);
    std::shared_lock lock(buffers_mu);
    std::memcpy(out, segment_base(d), d.element_count * d.width);
    overlay_staged(d.tensor, d.element_begin, d.element_begin + d.element_count, d.width, out);
    return out;
  }
  void write_segment(const SegmentDecode& d, SegmentLog& log, std::byte* base) const {
    // The writers go through pointers to the width's unsigned type: a segment of a tensor that
    // starts at an odd byte offset (a safetensors file need not align its tensors) is written in
    // an aligned copy, which goes back in place afterwards (also when the write throws).
    if (reinterpret_cast<uintptr_t>(base) % d.width != 0) {
      const size_t bytes = d.element_count * d.width;
      std::vector<uint64_t> aligned((bytes + 7) / 8);
      std::memcpy(aligned.data(), base, bytes);
      struct CopyBack {
        std::byte* to;
        const void* from;
        size_t bytes;
        ~CopyBack() { std::memcpy(to, from, bytes); }
      } copy_back{base, aligned.data(), bytes};
      return write_segment(d, log, reinterpret_cast<std::byte*>(aligned.data()));
    }
    const SegmentWrite w{base, d.mode, d.is_float, d.tokens.data(), ChangeLog{&SegmentLog::flush, &log}};
    if (d.locations.coding == LocationCoding::classed_gaps)
      return select_and_write(d.width, d.abs_mask, d.element_count, d.locations.classes, d.locations.ranks, w);
    switch (d.width) {
      case 1: return write_positions<uint8_t>(d.locations.positions, w);
      case 2: return write_positions<uint16_t>(d.locations.positions, w);
      default: return write_positions<uint32_t>(d.locations.positions, w);
    }
  }
  // Throws corrupt_frame when a segment of sc overlaps elements another chunk of the in-flight
  // version covers (mu held).
  void check_disjoint(const DecodeScratch& sc, const FrameHeader& h) const {
    if (!pending) return;
    for (size_t i = 0; i < sc.segment_count; ++i) {
      const SegmentDecode& d = sc.segments[i];
      const uint64_t end = d.element_begin + d.element_count;
      const auto next = covered.lower_bound({d.tensor, d.element_begin});
      const bool into_next = next != covered.end() && next->first.first == d.tensor && next->first.second < end;
      const bool into_prev = next != covered.begin() && std::prev(next)->first.first == d.tensor &&
                             std::prev(next)->second > d.element_begin;
      if (into_next || into_prev)
        throw Error(Errc::corrupt_frame, "chunk " + std::to_string(h.chunk_index) + " of version " +
                                             std::to_string(h.new_version) + " covers elements of tensor '" +
                                             manifest->at(d.tensor).name + "' that another of its chunks covers");
    }
  }
  void set_covered(const DecodeScratch& sc, bool on) {
    for (size_t i = 0; i < sc.segment_count; ++i) {
      const SegmentDecode& d = sc.segments[i];
      if (on)
        covered.emplace(std::make_pair(d.tensor, d.element_begin), d.element_begin + d.element_count);
      else
        covered.erase({d.tensor, d.element_begin});
    }
  }
  // Staged mode, at commit (mu held, no writer running): the in-flight version's changes, kept from
  // the undo log (which holds new bits in this mode), join the staged queue.
  void stage_version() {
    StagedVersion v;
    {
      std::unique_lock lock(buffers_mu);
      if (!spare.empty()) {  // storage of a version already written: no fresh page faults
        v = std::move(spare.back());
        spare.pop_back();
      }
    }
    v.segments.clear();
    v.entries.clear();
    size_t total = 0;
    undo.for_each_segment_reverse([&](const UndoSegment& s) { total += s.count; });
    v.entries.reserve(total);
    v.version = *pending;
    v.digest = digest;
    undo.for_each_segment_reverse([&](const UndoSegment& s) {
      if (s.count == 0) return;
      v.segments.push_back(s);
      v.entries.insert(v.entries.end(), s.entries, s.entries + s.count);
    });
    size_t at = 0;
    for (auto& s : v.segments) {
      s.entries = v.entries.data() + at;  // now into v.entries (a vector that moves with v)
      at += s.count;
    }
    std::sort(v.segments.begin(), v.segments.end(), [](const UndoSegment& a, const UndoSegment& b) {
      return a.tensor != b.tensor ? a.tensor < b.tensor : a.element_begin < b.element_begin;
    });
    std::unique_lock lock(buffers_mu);
    staged.push_back(std::move(v));
  }
  // Writes staged.front() into the buffers and drops it (buffers_mu held exclusively).
  uint64_t write_front_staged(const std::function<void(uint32_t, uint64_t, uint32_t)>& before) {
    StagedVersion& v = staged.front();
    for (const UndoSegment& s : v.segments) {
      const unsigned width = static_cast<unsigned>(dtype_unit_size(manifest->at(s.tensor).dtype));
      if (placement) {  // every copy of each element
        for (size_t k = 0; k < s.count; ++k) {
          const uint64_t element = s.element_begin + s.entries[k].position;
          bool first = true;
          placement->for_each_place(s.tensor, element, [&](const PlacedUnit& place) {
            std::byte* at = buffers[place.buffer].data() + place.unit * width;
            if (first && before) before(s.tensor, element, load_bits(at, width, 0));
            first = false;
            store_bits(at, width, 0, s.entries[k].bits);
          });
        }
        continue;
      }
      std::byte* base = segment_base(s);
      for (size_t k = 0; k < s.count; ++k) {
        if (before) before(s.tensor, s.element_begin + s.entries[k].position, load_bits(base, width, s.entries[k].position));
        store_bits(base, width, s.entries[k].position, s.entries[k].bits);
      }
    }
    buffers_version = v.version;
    buffers_digest = std::move(v.digest);
    if (spare.size() < 2) spare.push_back(std::move(v));  // its vectors keep their capacity
    staged.pop_front();
    return buffers_version;
  }

  // A placed receiver's verify (mu held): each part's digest against the seal's slice table.
  void verify_parts() const {
    const auto& have = digest.per_tensor();
    for (uint32_t q = 0; q < placement->part_count(); ++q) {
      const SliceDigest& key = placement->slice(q);
      const auto it =
          std::find_if(seal_slices.begin(), seal_slices.end(), [&](const SliceDigest& s) { return s.same_slice(key); });
      const std::string what = "slice " + std::to_string(key.start) + ":" + std::to_string(key.stop) + " along dim " +
                               std::to_string(key.dim) + " of tensor '" + manifest->at(key.tensor).name + "'";
      if (it == seal_slices.end())
        throw Error(Errc::verify_failed, "verify: the seal of version " + std::to_string(*pending) +
                                             " carries no digest of " + what +
                                             " (the producer does not know this receiver's placement)");
      if (it->digest != have[q])
        throw Error(Errc::verify_failed,
                    "verify: " + what + " differs from the producer's version " + std::to_string(*pending));
    }
  }
  // After a failed write (mu held): the chunk's undo segments are void (their writer restored
  // them), the chunk is not applied, and a version this chunk began with nothing else in it is
  // abandoned, so the applier is in the state it was in before the frame.
  void forget_failed_write(const DecodeScratch& sc, uint32_t chunk_index) {
    undo.drop_segments(sc.first_undo_segment, sc.segment_count);
    set_covered(sc, false);
    applied[chunk_index] = false;
    // (A chunk still writing counts as applied, so none applied also means no other writer.)
    if (!seal_digests && std::none_of(applied.begin(), applied.end(), [](bool a) { return a; })) {
      pending.reset();
      applied.clear();
      undo.clear();
    }
  }
};

DeltaApplier::DeltaApplier(const Manifest& manifest, MutableWeights weights, uint64_t version, StateDigest digest,
                           Mode mode)
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
  im.mode = mode;
  im.version = version;
  im.buffers_version = version;
  im.buffers_digest = digest;
  im.digest = digest;
  im.base_digest = std::move(digest);
  im.base_combined = im.base_digest.combined();
}

DeltaApplier::DeltaApplier(const Manifest& manifest, PlacedWeights weights, uint64_t version, uint64_t version_combined,
                           std::vector<uint64_t> part_digests, Mode mode)
    : impl_(std::make_unique<Impl>()) {
  if (!weights.placement) throw Error(Errc::invalid_argument, "applier: placed weights without a placement");
  check_placed_buffers(*weights.placement, weights.buffers);
  if (part_digests.size() != weights.placement->part_count())
    throw Error(Errc::invalid_argument, "applier: " + std::to_string(part_digests.size()) + " part digests for " +
                                            std::to_string(weights.placement->part_count()) + " parts");
  auto& im = *impl_;
  im.manifest = &manifest;
  im.weights.manifest = &manifest;
  im.placement = std::move(weights.placement);
  im.buffers = std::move(weights.buffers);
  im.mode = mode;
  im.version = version;
  im.buffers_version = version;
  im.digest = StateDigest(std::move(part_digests));
  im.buffers_digest = im.digest;
  im.base_digest = im.digest;
  im.base_combined = version_combined;
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
    im.seal_slices = view.slice_digests;
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
    if (im.placement && !im.holds_any(view))
      im.skip_chunk(view, sc);  // nothing to write here: its bytes were checksummed, and are relayed
    else
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
  im.check_disjoint(sc, h);
  im.begin(h);
  im.set_covered(sc, true);
  // Reserve the chunk's undo run and count it as applied (no other copy may start), then write
  // outside the lock; rollback/commit/verify wait for the writers.
  const size_t n = sc.changes;
  sc.undo = im.undo.reserve_run(n);
  const UndoEntry* run = sc.undo;
  for (size_t i = 0; i < sc.segment_count; ++i) {
    const SegmentDecode& d = sc.segments[i];
    const size_t index =
        im.undo.add_segment(UndoSegment{d.tensor, d.element_begin, run, d.changes, d.element_begin + d.element_count});
    if (i == 0) sc.first_undo_segment = index;
    run += d.changes;
  }
  im.applied[h.chunk_index] = true;
  ++im.writers;
  lock.unlock();
  sc.digest_delta.clear();
  try {
    im.write(sc);
  } catch (...) {
    lock.lock();
    im.forget_failed_write(sc, h.chunk_index);
    if (--im.writers == 0) im.writers_done.notify_all();
    throw;
  }
  lock.lock();
  auto& per = im.digest.per_tensor();
  for (const auto& [t, d] : sc.digest_delta) per[t] += d;  // placed: t is a part
  size_t written = n;
  if (im.placement) {
    written = 0;
    for (size_t i = 0; i < sc.segment_count; ++i) {
      im.undo.set_count(sc.first_undo_segment + i, sc.written[i]);
      written += sc.written[i];
    }
  }
  ++im.applied_n;
  if (--im.writers == 0) im.writers_done.notify_all();
  return ApplyResult{FrameKind::chunk, h.chunk_index, written};
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
    if (im.placement) im.verify_parts();
    for (uint32_t t = 0; !im.placement && t < want.size(); ++t)
      if (want[t] != have[t])
        throw Error(Errc::verify_failed, "verify: tensor '" + im.manifest->at(t).name +
                                             "' differs from the producer's version " + std::to_string(*im.pending));
  }
  im.verified = true;
}

void DeltaApplier::audit(unsigned threads) const {
  // The applier's lock order, as in commit() and rebind(): mu, then buffers_mu (audit took them the
  // other way round: a commit and an audit on two threads could deadlock; found by TSan).
  std::lock_guard lock(impl_->mu);
  std::shared_lock buffers(impl_->buffers_mu);
  if (impl_->placement) {
    const auto& have = (impl_->mode == Mode::staged ? impl_->buffers_digest : impl_->digest).per_tensor();
    if (placed_part_digests(*impl_->manifest, *impl_->placement, impl_->buffers) != have)
      throw Error(Errc::verify_failed, "audit: the placed buffers do not match the maintained digests");
    return;
  }
  const StateDigest scanned = StateDigest::full_scan(impl_->weights.as_const(), threads);
  const auto& have = (impl_->mode == Mode::staged ? impl_->buffers_digest : impl_->digest).per_tensor();
  for (uint32_t t = 0; t < have.size(); ++t)
    if (scanned.per_tensor()[t] != have[t])
      throw Error(Errc::verify_failed, "audit: tensor '" + impl_->manifest->at(t).name +
                                           "' bytes do not match the maintained digest");
}

void DeltaApplier::for_each_written(
    const std::function<void(uint32_t tensor, uint64_t element, uint32_t base_bits)>& visit) const {
  auto& im = *impl_;
  std::unique_lock lock(im.mu);
  im.wait_for_writers(lock);
  if (im.mode == Mode::staged) return;  // nothing was written into the buffers
  im.undo.for_each_segment_reverse([&](const UndoSegment& s) {
    for (size_t k = 0; k < s.count; ++k) visit(s.tensor, s.element_begin + s.entries[k].position, s.entries[k].bits);
  });
}

void DeltaApplier::rollback() {
  auto& im = *impl_;
  std::unique_lock lock(im.mu);
  im.wait_for_writers(lock);
  if (im.mode == Mode::staged) {
    // nothing was written into the buffers (the undo entries hold new bits)
  } else if (im.placement)
    im.undo.for_each_segment_reverse(
        [&](const UndoSegment& s) { im.restore_placed(s.tensor, s.element_begin, s.entries, s.count); });
  else
    im.undo.for_each_segment_reverse([&](const UndoSegment& s) {
      restore_entries(im.segment_base(s), static_cast<unsigned>(dtype_unit_size(im.manifest->at(s.tensor).dtype)),
                      s.entries, s.count);
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
  if (im.mode == Mode::staged) im.stage_version();
  im.version = *im.pending;
  im.base_digest = im.digest;
  // The whole state's name: the seal's digests (verify proved them ours; placed, our parts').
  im.base_combined = StateDigest(*im.seal_digests).combined();
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

DeltaApplier::Mode DeltaApplier::mode() const noexcept { return impl_->mode; }

uint64_t DeltaApplier::version_combined() const {
  std::lock_guard lock(impl_->mu);
  return impl_->base_combined;
}

uint64_t DeltaApplier::pending_combined() const {
  std::lock_guard lock(impl_->mu);
  if (!impl_->seal_digests) throw Error(Errc::state, "pending_combined: no seal of an in-flight version");
  return StateDigest(*impl_->seal_digests).combined();
}

bool DeltaApplier::placed() const noexcept { return impl_->placement != nullptr; }

std::vector<uint64_t> DeltaApplier::staged_versions() const {
  std::shared_lock lock(impl_->buffers_mu);
  std::vector<uint64_t> out;
  for (const auto& v : impl_->staged) out.push_back(v.version);
  return out;
}

uint64_t DeltaApplier::buffers_version() const {
  if (impl_->mode == Mode::in_place) return impl_->version;
  std::shared_lock lock(impl_->buffers_mu);
  return impl_->buffers_version;
}

StateDigest DeltaApplier::buffers_digest() const {
  std::shared_lock lock(impl_->buffers_mu);
  return impl_->mode == Mode::staged ? impl_->buffers_digest : impl_->base_digest;
}

std::optional<uint64_t> DeltaApplier::apply_next_staged(
    const std::function<void(uint32_t tensor, uint64_t element, uint32_t old_bits)>& before) {
  std::unique_lock lock(impl_->buffers_mu);
  if (impl_->staged.empty()) return std::nullopt;
  return impl_->write_front_staged(before);
}

void DeltaApplier::rebind(uint32_t tensor, std::span<std::byte> memory) {
  auto& im = *impl_;
  std::unique_lock lock(im.mu);
  im.wait_for_writers(lock);
  if (im.placement) throw Error(Errc::unsupported, "rebind: placed buffers cannot be re-pointed yet");
  if (im.pending && im.mode == Mode::in_place)
    throw Error(Errc::state, "rebind: version " + std::to_string(*im.pending) + " is being written into the buffers");
  const auto& info = im.manifest->at(tensor);
  if (memory.size() != info.nbytes())
    throw Error(Errc::invalid_argument, "rebind: tensor '" + info.name + "' needs " + std::to_string(info.nbytes()) +
                                            " bytes, the new buffer has " + std::to_string(memory.size()));
  std::unique_lock buffers(im.buffers_mu);
  const auto& want = (im.mode == Mode::staged ? im.buffers_digest : im.digest).per_tensor()[tensor];
  if (tensor_digest(tensor, info.dtype, memory) != want)
    throw Error(Errc::invalid_argument, "rebind: the new buffer of tensor '" + info.name +
                                            "' does not hold the bits of version " + std::to_string(im.buffers_version));
  im.weights.tensors[tensor] = memory;
}

}  // namespace deltacast::codec
