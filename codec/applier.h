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
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "codec/digest.h"
#include "codec/frame.h"
#include "codec/manifest.h"

namespace deltacast::codec {

struct ApplyResult {
  FrameKind kind = FrameKind::chunk;
  uint32_t chunk_index = 0;
  uint64_t changes = 0;  // elements written by this frame
};

class DeltaApplier {
 public:
  // weights: the receiver's buffers, holding exactly `version`; digest: their StateDigest (from
  // StateDigest::full_scan or carried over from the previous commit). Buffers must outlive this.
  DeltaApplier(const Manifest& manifest, MutableWeights weights, uint64_t version,
               StateDigest digest);
  ~DeltaApplier();
  DeltaApplier(const DeltaApplier&) = delete;
  DeltaApplier& operator=(const DeltaApplier&) = delete;

  // Validates the frame (checksum, manifest digest, base version and digest, bounds, dtype,
  // replay) and decodes it before touching any weight; then writes. The one check only the write
  // can make (a class rank beyond its class in the receiver's base bits) makes the frame undo its
  // own writes before throwing. On Error the weights and the applier's state are as before the
  // call. Errors: corrupt_frame (also for a chunk overlapping another chunk of its version),
  // version_mismatch (wrong base, other manifest, or a frame of a
  // different in-flight version), replayed (chunk already applied or being applied).
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
  // with the seal's. Requires complete(). Throws Error(verify_failed) naming the first differing
  // tensor (state unchanged: the caller decides to roll back).
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

  const StateDigest& digest() const noexcept;  // digests of the bits currently in the buffers
  // Pre-allocates (and touches) undo space for `changes` written elements, so a host can pay for
  // it while idle instead of during its first refit. Memory: 8 bytes per change. Thread-safe.
  void reserve(uint64_t changes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast::codec
