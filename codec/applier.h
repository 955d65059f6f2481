#pragma once
// Applies chunk frames in place into the receiver's buffers, exactly once per (version, chunk),
// keeping an undo log so a partially applied version can be rolled back to its base bit-exactly,
// and maintaining the additive digest so verification costs time proportional to the changes.
//
// State machine (one in-flight version at a time):
//   idle(version v) --chunk/seal frame with base v--> applying(v -> v')
//   applying --all chunks + seal, verify() ok--> verified --commit()--> idle(v')
//   applying|verified --rollback()--> idle(v)   (bits are exactly v's again)
// The host must not expose the buffers to its users from the start of the first apply() call of a
// version until commit/rollback (or must apply into a shadow copy): even a frame that is refused
// may write, and restore, elements while the call runs. The applier never leaves a half-written
// element, nor a refused frame's writes, behind.
//
// Two modes:
//  * in_place (the default): frames write into the buffers as they are applied (above).
//  * staged (the apply gate): the buffers are only read until the host asks for the writes. Each
//    chunk is decoded and written into a copy of its segments' base bits (the buffers' bits plus
//    the changes of the versions already staged), so verify() proves the version exactly as in
//    place; commit() then queues the version's changes (8 bytes per changed element) and
//    apply_next_staged() writes the oldest queued version into the buffers. That write was fully
//    validated before the version could commit: it cannot fail. version() and digest() are the
//    committed version's, buffers_version() and buffers_digest() what the buffers hold.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "codec/digest.h"
#include "codec/frame.h"
#include "codec/manifest.h"
#include "codec/placement.h"

namespace deltacast::codec {

// A receiver that holds only slices of the canonical tensors (codec/placement.h,
// docs/placement.md): buffers[k] holds placement buffer k.
struct PlacedWeights {
  std::shared_ptr<const Placement> placement;
  std::vector<std::span<std::byte>> buffers;
};

struct ApplyResult {
  FrameKind kind = FrameKind::chunk;
  uint32_t chunk_index = 0;
  uint64_t changes = 0;  // elements written by this frame
};

class DeltaApplier {
 public:
  // weights: the receiver's buffers, holding exactly `version`; digest: their StateDigest (from
  // StateDigest::full_scan or carried over from the previous commit). Buffers must outlive this.
  enum class Mode { in_place, staged };
  DeltaApplier(const Manifest& manifest, MutableWeights weights, uint64_t version,
               StateDigest digest, Mode mode = Mode::in_place);
  // A placed receiver: it holds only weights.placement's slices, at `version`, whose whole state's
  // combined digest (StateDigest::combined, as frames name their base) is `version_combined`;
  // part_digests: placed_part_digests of the buffers (or carried over from the last commit). It
  // decodes every frame but writes only the changes that fall in its buffers (each copy of a tensor
  // placed twice), keeps one digest per part (digest(): per flat part, not per tensor), and
  // verify() checks each against the seal's slice table. A segment coded by class that it holds
  // only partly is refused (Error(unsupported), nothing written): the producer must know its
  // placement (EncodeOptions::held_slices). Mode::staged works as for whole buffers (each segment
  // staged in a canonical copy of the units it holds; apply_next_staged writes every copy);
  // rebind() is Error(unsupported) for now. Throws Error(invalid_argument) for buffers that do not
  // match the placement (count, byte size, alignment) or a digest count that is not the part count.
  DeltaApplier(const Manifest& manifest, PlacedWeights weights, uint64_t version, uint64_t version_combined,
               std::vector<uint64_t> part_digests, Mode mode = Mode::in_place);
  ~DeltaApplier();
  DeltaApplier(const DeltaApplier&) = delete;
  DeltaApplier& operator=(const DeltaApplier&) = delete;

  // Validates the frame (checksum, manifest digest, base version and digest, bounds, dtype,
  // replay) and decodes it before touching any weight; then writes. The one check only the write
  // can make (a class rank beyond its class in the receiver's base bits) makes the frame undo its
  // own writes before throwing. On Error the weights and the applier's state are as before the
  // call. Errors: corrupt_frame (also for a chunk overlapping another chunk of its version),
  // version_mismatch (wrong base, other manifest, or a frame of a
  // different in-flight version), replayed (chunk already applied or being applied), not_found
  // (a segment names a tensor index the manifest lacks).
  // Thread-safe, and concurrent: several threads may apply different chunks at once (parsing,
  // decoding and the writes themselves run outside the applier's lock; chunks of a version cover
  // disjoint elements). rollback() and commit() wait for writes in flight.
  ApplyResult apply(std::span<const std::byte> frame);
  // The same for a frame the caller already parsed (parse_frame checked its checksum), so a
  // relay that parsed it to route it does not checksum it twice. The frame's bytes must outlive
  // the call.
  ApplyResult apply(const FrameView& view);

  // True once the seal and every chunk it announces have been applied.
  bool complete() const noexcept;
  // Which chunks of the in-flight version are applied (empty when idle). For resume after
  // re-parenting.
  std::vector<bool> applied_chunks() const;
  uint64_t version() const noexcept;                 // last committed version
  std::optional<uint64_t> pending_version() const noexcept;  // in-flight version, if any

  // Proves the bits equal the producer's: compares the incrementally maintained per-tensor digests
  // with the seal's (placed: each part's with the seal's slice table). Requires complete(). Throws
  // Error(verify_failed) naming the first differing tensor or part, or a slice the seal lacks
  // (state unchanged: the caller decides to roll back).
  void verify() const;
  // Full-scan audit: recomputes the digest from the bytes and compares with the maintained one.
  // Throws Error(verify_failed).
  void audit(unsigned threads = 1) const;
  // Calls visit(tensor, element, base bits) for every element written since the last commit (each
  // once: the chunks of a version cover disjoint elements), with the bits it had at version().
  // For a reader that must see the committed bits while a version is in flight, or across a
  // commit (a snapshot being served). Waits for writes in flight; thread-safe.
  void for_each_written(const std::function<void(uint32_t tensor, uint64_t element, uint32_t base_bits)>& visit) const;
  // Restores every element written since the last commit; the applier is idle at version().
  void rollback();
  // Requires a successful verify() of the complete version; makes it current and drops the undo
  // log. Throws Error(state) otherwise.
  void commit();

  // Digests of the bits in the buffers (in place), or of the committed version plus the in-flight
  // version's changes so far (staged).
  const StateDigest& digest() const noexcept;
  Mode mode() const noexcept;
  // The combined StateDigest that names the committed version (what frames name as their base):
  // whole, digest().combined() of that version; placed, the whole version's (given at
  // construction, then each committed seal's). Thread-safe.
  uint64_t version_combined() const;
  // The combined StateDigest of the in-flight version as its seal names it (what an ACK carries).
  // Throws Error(state) before the seal arrived. Thread-safe.
  uint64_t pending_combined() const;
  // Whether this applier holds placed buffers (PlacedWeights).
  bool placed() const noexcept;

  // Staged mode. Committed versions whose changes are not in the buffers yet, oldest first (always
  // empty in place). Thread-safe.
  std::vector<uint64_t> staged_versions() const;
  // The version the buffers hold, and its digest (in place: version() and its digest). Thread-safe.
  uint64_t buffers_version() const;
  StateDigest buffers_digest() const;
  // Writes the oldest staged version into the buffers; returns it, or nullopt when none is staged.
  // `before`, when given, sees each element about to be written with the bits it holds (for
  // readers that must keep seeing the previous version). Runs concurrently with apply() of the
  // next version (whose staging waits while the buffers are written). Cannot fail.
  std::optional<uint64_t> apply_next_staged(
      const std::function<void(uint32_t tensor, uint64_t element, uint32_t old_bits)>& before = {});
  // Re-points tensor `tensor` at `memory` (the host reallocated it), which must already hold the
  // bits the buffers hold (checked by the tensor's digest). Only while no version is being written
  // in place. Throws Error(invalid_argument) for a wrong size or other bits, Error(state) while a
  // version is in flight. Thread-safe; the old memory is not read afterwards.
  void rebind(uint32_t tensor, std::span<std::byte> memory);
  // Pre-allocates (and touches) undo space for `changes` written elements, so a host can pay for
  // it while idle instead of during its first refit. Memory: 8 bytes per change. Thread-safe.
  void reserve(uint64_t changes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast::codec
