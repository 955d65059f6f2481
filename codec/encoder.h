#pragma once
// Diff + encode: compares new weights against the producer's baseline copy and emits chunk frames.
// A chunk covers a contiguous run of the canonical coordinate space (checkpoint order): a slice of
// one large tensor, or several small tensors together. Chunks are independent: they can be encoded
// in parallel, sent in any order, and applied in any order.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "codec/digest.h"
#include "codec/frame.h"
#include "codec/manifest.h"
#include "codec/partition.h"
#include "codec/placement.h"
#include "codec/slice_digest_delta.h"

namespace deltacast::codec {

struct EncodeOptions {
  // Checkpoint bytes covered by one chunk (the last chunk of a tensor may be smaller; small
  // tensors are packed together up to this size).
  uint64_t chunk_bytes = uint64_t{16} << 20;
  // Value mode for tensors the receiver stores bit-identically ("XOR-safe").
  ValueMode xor_safe_mode = ValueMode::ulp_delta;
  // Per tensor (manifest order): true = the receiver does not store the base bits, so values are
  // sent as overwrite. Empty means every tensor is XOR-safe.
  std::vector<bool> overwrite_tensors;
  int zstd_level = 1;
  // Allow LocationCoding::classed_gaps (the receiver-side context model). Off for ablations.
  bool allow_classed = true;
  // The members' placements (docs/placement.md): a segment some member holds only partly is not
  // coded by class. Null: every member holds every tensor whole.
  std::shared_ptr<const HeldSlices> held_slices;
  // The base version's slice table (digests included; frame.h, SliceDigest): the slices members
  // hold. The seal then carries the new version's, kept up to date from the changes the scans find
  // (codec/slice_digest_delta.h: no scan of the slices). Empty: the seal has no slice table.
  std::vector<SliceDigest> base_slice_digests;
  // Threads used by encode_delta (0 = hardware concurrency).
  unsigned threads = 1;
};

// Bytes of each version read per piece by an encoder over WeightsReaders: both pieces (512 KiB)
// stay in a core's L2 between the read and the scan.
inline constexpr uint64_t kReadPieceBytes = uint64_t{256} << 10;

struct VersionIds {
  uint64_t base_version = 0;
  uint64_t new_version = 1;
};

// Counters for reports and benchmarks.
struct DeltaStats {
  uint64_t elements = 0;       // elements covered
  uint64_t checkpoint_bytes = 0;
  uint64_t changes = 0;        // changed elements
  uint64_t frame_bytes = 0;    // sum of frame sizes (what goes on the wire)
  uint64_t location_bytes = 0; // stored size of location sections
  uint64_t value_bytes = 0;    // stored size of value sections
  uint64_t segments_by_coding[kLocationCodingCount] = {};  // indexed by LocationCoding
  void add(const DeltaStats& other);
};

// One producer rank's share of a version in a producer group (partition.h, docs/protocol.md
// "Producer group"): the encoder covers the chunks of `ranges` only, numbered from `first_chunk` in
// a version of `total_chunks` chunks (group_chunks() gives both), and its frames carry the group's
// base digest. The group's coordinator seals the version (seal_frame) with the sum of every part's
// digests.
struct EncodePart {
  std::vector<PartRange> ranges;
  uint32_t first_chunk = 0;
  uint32_t total_chunks = 0;
  uint64_t base_combined = 0;  // StateDigest::combined() of the whole base version
  // The part's own digest of the base (per tensor, the sums over its ranges) when the rank keeps
  // it (BaselineStore::digest()): the scan then does not take it again. Empty: taken by the scan.
  std::vector<uint64_t> base_digest;
};

// The chunk numbering of a group's version: part r's chunks are [first[r], first[r+1]); the
// version has first.back() chunks. Every rank computes the same from (manifest, partition,
// chunk_bytes). With one rank it is the plan of a single producer.
struct GroupChunks {
  std::vector<uint32_t> first;  // ranks + 1 entries
  uint32_t total() const noexcept { return first.back(); }
  EncodePart part(const Partition& partition, uint32_t rank, uint64_t base_combined) const;
};
GroupChunks group_chunks(const Manifest& manifest, const Partition& partition, uint64_t chunk_bytes);

// The seal frame of a version of `chunk_count` chunks whose new state has `new_digest`, on a base
// whose combined digest is `base_combined` (what a single encoder's seal() returns; a group's
// coordinator builds it from the sum of the parts' digests).
// `slice_digests`: the seal's slice table (frame.h, SliceDigest), for members that hold slices.
std::vector<std::byte> seal_frame(const Manifest& manifest, VersionIds ids, uint64_t base_combined,
                                  uint32_t chunk_count, const StateDigest& new_digest,
                                  const std::vector<SliceDigest>& slice_digests = {});

// The slice table of `slices` (their digest fields ignored) over the version `weights` holds: a
// scan of each slice's bytes. Throws Error(invalid_argument) for a slice outside its tensor.
std::vector<SliceDigest> slice_digests(const ConstWeights& weights, std::span<const SliceDigest> slices);

class DeltaEncoder {
 public:
  // base: bits every receiver holds at ids.base_version; next: the new weights; base_digest: the
  // StateDigest of base. All must outlive the encoder. Throws Error(invalid_argument) when the
  // weights do not match the manifest or options are inconsistent.
  DeltaEncoder(const ConstWeights& base, const ConstWeights& next, const StateDigest& base_digest,
               VersionIds ids, EncodeOptions options);
  // The same without the base's digest: each chunk adds its base slices' digest in the same pass
  // as its scan (kScanTapSpan elements at a time, right behind it: read once). Its chunk frames carry base digest 0
  // until the caller patches them (patch_base_digest with base_digest().combined(), after seal()); the seal frame is
  // whole.
  DeltaEncoder(const ConstWeights& base, const ConstWeights& next, VersionIds ids, EncodeOptions options);
  // The same over readers (a diff of two checkpoint files with pread): each slice is read in
  // pieces of kReadPieceBytes per version and each piece scanned, and its base digest taken, while
  // it is in the cache; class thresholds come from reading only the sampled runs. The frames are
  // byte-identical to those of the constructor above over the same bytes. The readers must outlive
  // the encoder; encode_chunk throws their Error(io).
  DeltaEncoder(const WeightsReader& base, const WeightsReader& next, VersionIds ids, EncodeOptions options);
  // The base in memory with its digest given, the new version read (a producer's baseline against a
  // trainer's new checkpoint file): the new version is read in pieces as above and the base's
  // pieces are scanned where they lie. The same frames as the span constructor with base_digest.
  DeltaEncoder(const ConstWeights& base, const WeightsReader& next, const StateDigest& base_digest, VersionIds ids,
               EncodeOptions options);
  // A group's part (EncodePart): both versions read, only within part.ranges (a rank holds nothing
  // else); the base's part digest taken by the scan unless part.base_digest gives it.
  // chunk_count() and encode_chunk() count the part's chunks; the frames carry the group's
  // numbering and base digest, whole (no patching). seal() is refused (Error(state)): call
  // part_digests() and let the coordinator seal.
  DeltaEncoder(const WeightsReader& base, const WeightsReader& next, EncodePart part, VersionIds ids,
               EncodeOptions options);
  ~DeltaEncoder();
  DeltaEncoder(const DeltaEncoder&) = delete;
  DeltaEncoder& operator=(const DeltaEncoder&) = delete;

  uint32_t chunk_count() const noexcept;
  // Encodes chunk `index` (< chunk_count()). Safe to call concurrently for distinct indexes.
  std::vector<std::byte> encode_chunk(uint32_t index, DeltaStats* stats = nullptr);
  // The seal frame (per-tensor digests of the new version). Requires every chunk to have been
  // encoded exactly once; throws Error(state) otherwise.
  std::vector<std::byte> seal();
  // A part encoder, once every chunk of its part was encoded: per tensor, the sums over the part's
  // ranges of the base's digest terms (given or scanned) and of the new version's. A whole version's
  // StateDigest is the sum of its parts' (digest.h: the terms add).
  struct PartDigests {
    StateDigest base;
    StateDigest next;
    // Per slice of options.base_slice_digests: the digest change of the part's changes inside it
    // (the group's new table: the base's plus every part's). Empty without a slice table.
    std::vector<uint64_t> slice_deltas;
  };
  PartDigests part_digests();
  // Digest of the new version; valid after seal().
  const StateDigest& new_digest() const;
  // The new version's slice table (options.base_slice_digests advanced by the changes); valid
  // after seal(), empty without a base table.
  const std::vector<SliceDigest>& new_slice_digests() const;
  // Digest of the base: the one given, or (scanning) the one computed, valid after seal().
  const StateDigest& base_digest() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct EncodedDelta {
  std::vector<std::vector<std::byte>> frames;  // chunk frames in chunk order, then the seal frame
  StateDigest base_digest;
  StateDigest new_digest;
  DeltaStats stats;
};

// Encodes a whole version with options.threads threads.
EncodedDelta encode_delta(const ConstWeights& base, const ConstWeights& next,
                          const StateDigest& base_digest, VersionIds ids,
                          const EncodeOptions& options);
// The same when the base's digest is not known: it is computed in the same pass over the data as
// the diff (one read of each checkpoint instead of two of the base), returned in base_digest, and
// written into every frame. The frames are byte-identical to encode_delta's given that digest.
EncodedDelta encode_delta(const ConstWeights& base, const ConstWeights& next, VersionIds ids,
                          const EncodeOptions& options);
// The same over readers (see DeltaEncoder): the same frames and digests.
EncodedDelta encode_delta(const WeightsReader& base, const WeightsReader& next, VersionIds ids,
                          const EncodeOptions& options);
// The base in memory, its digest given, the new version read (see DeltaEncoder): the same frames.
EncodedDelta encode_delta(const ConstWeights& base, const WeightsReader& next, const StateDigest& base_digest,
                          VersionIds ids, const EncodeOptions& options);

}  // namespace deltacast::codec
