#pragma once
// A member's version state machine (docs/protocol.md, "Member: one version"), over the weights the
// host owns:
//
//   idle(v) --first data message of attempt a > floor--> applying(v -> v', a)
//   applying --every chunk (and the seal) held and verified--> ACK      (once)
//   applying --a refused message or a failed verify--> NACK            (once)
//   applying --COMMIT(v', a)--> idle(v'), ACTIVE(v')
//   applying --ABORT(a)--> idle(v), bits rolled back, ACTIVE(v)
//
// The attempt floor is the highest attempt id that ended here (COMMIT/ABORT): data messages of an
// attempt at or below it are stale and dropped, so a delayed frame of an aborted attempt is never
// taken for the retry's. Data lands through a VersionApplier chosen when a version starts:
// deltas through codec::DeltaApplier, the raw bootstrap (version 1 from the all-zero version 0)
// through RawBootstrap. Neither the session nor its callers branch on which one it is.
//
// Thread-safety: every member function may be called from any thread. Data calls (apply_frame,
// claim_piece/land_piece) run concurrently with each other; commit, abort and drop wait for them.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "codec/applier.h"
#include "codec/digest.h"
#include "codec/frame.h"
#include "codec/manifest.h"
#include "tree/protocol.h"
#include "tree/snapshot_serve.h"
#include "util/error.h"

namespace deltacast::tree {

using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;  // as in tree/relay_link.h

// Where one version's data lands. Implementations keep the contract of codec::DeltaApplier: on a
// refusal the weights are as before the call; rollback() restores the committed bits exactly.
class VersionApplier {
 public:
  virtual ~VersionApplier() = default;
  // Applies one chunk or seal frame; returns the elements it wrote. Concurrent. Throws Error
  // (corrupt_frame, version_mismatch, replayed); this default refuses FRAME data.
  virtual uint64_t apply_frame(const codec::FrameView& view);
  // Claims raw piece `h` and returns where its body must land. Concurrent with other pieces.
  // `bounce` is set when that is a buffer of the applier's own (a placed member), which the caller
  // keeps alive while it passes the body on; unset when the body lands in the weights. Throws
  // Error when the piece is refused; this default refuses RAW data.
  virtual std::span<std::byte> claim_piece(const RawChunkHeader& h, SharedBytes& bounce);
  // A claimed piece landed with `hash` (raw_piece_hash of its bytes), or was cut short (nullopt:
  // the claim is released and the piece may arrive again).
  virtual void land_piece(const RawChunkHeader& h, std::optional<uint64_t> hash);
  // Every chunk (and seal) of the in-flight version is held.
  virtual bool complete() const = 0;
  // The digest to acknowledge once complete(). Throws Error(verify_failed).
  virtual uint64_t verify() = 0;
  // Makes the in-flight version current; returns its combined digest.
  virtual uint64_t commit() = 0;
  // Restores the committed bits exactly; idle afterwards.
  virtual void rollback() = 0;
  // After commit(): the whole version's StateDigest when the applier learnt it on the way (a placed
  // member's bootstrap); nullopt: the session takes it from the buffers.
  virtual std::optional<codec::StateDigest> committed_state() const { return std::nullopt; }
};

class Session {
 public:
  enum class DataKind { frame, raw };

  // The host's buffers hold exactly `version` with `digest`. `weights` must outlive the session.
  // gated: deltas are staged (verified and committed without writing the buffers) and written
  // by apply_pending() at the host's safe point; the bootstrap and snapshots are never gated.
  Session(const codec::Manifest& manifest, codec::MutableWeights weights, uint64_t version,
          codec::StateDigest digest, uint32_t rank, bool gated = false);
  // A placed member (docs/placement.md): its buffers hold weights.placement's slices of `version`,
  // whose whole state's combined digest is `version_combined` (what frames name as their base).
  // Deltas go through the placed codec::DeltaApplier (checked against the seal's slice table), the
  // bootstrap lands in bounce buffers and is scattered into the held units. It serves no
  // snapshots (begin_snapshot: Error(unsupported)) and cannot rebind. Throws
  // Error(invalid_argument) for buffers that do not match the placement.
  Session(const codec::Manifest& manifest, codec::PlacedWeights weights, uint64_t version, uint64_t version_combined,
          uint32_t rank, bool gated = false);
  ~Session();

  // Whether a data message of `attempt` creating `version` belongs to the in-flight attempt
  // (starting it when idle). False: stale or foreign (drop it, do not forward it). new_layout: the
  // message's Envelope::new_layout (the attempt's version comes with a LAYOUT on the control link).
  // Data of an attempt newer than the one in flight here means the producer ended that one (it
  // starts an attempt only after the last ended), and its COMMIT or ABORT is still on its way on
  // the control link: the call waits for it up to `wait_for_end` (0: not at all), then decides.
  bool admit(DataKind kind, uint64_t attempt, uint64_t version, bool new_layout = false,
             std::chrono::milliseconds wait_for_end = std::chrono::milliseconds(0));
  // True when `attempt` is in flight and its data said that a LAYOUT comes with it: its ACK must
  // wait until the member holds that LAYOUT (docs/protocol.md, "Checkpoint layouts").
  bool awaits_layout(uint64_t attempt) const;

  // Applies a FRAME of the in-flight attempt. Returns the ACK or NACK to send, if this frame
  // completed or failed the version. A replayed chunk is counted by the caller (Errc::replayed
  // from `replayed`), never a NACK.
  struct Outcome {
    std::optional<Message> reply;
    bool replayed = false;
    bool refused = false;
  };
  Outcome apply_frame(uint64_t attempt, const codec::FrameView& view);
  // RAW: claims a piece of the in-flight attempt; the span is where its body lands, nullopt when
  // refused (the NACK, if any, is in `reply`). `bounce`, when given, is set to the owner of that
  // span when it is not the weights (a placed member): keep it alive while passing the body on,
  // and keep no reference to the span once the piece landed.
  std::optional<std::span<std::byte>> claim_piece(uint64_t attempt, const RawChunkHeader& h,
                                                  std::optional<Message>& reply, SharedBytes* bounce = nullptr);
  // RAW: the claimed piece landed (hash) or was cut short (nullopt). Returns the ACK once complete.
  std::optional<Message> land_piece(const RawChunkHeader& h, std::optional<uint64_t> hash);

  // COMMIT: makes the in-flight version current. Calls `send` with ACTIVE (or with a NACK when
  // this member has not verified that version; the same ACTIVE again when that attempt already
  // committed here: a delegated commit followed by the producer's), then does idle-time work while still holding the
  // data lock (after a bootstrap: the full-scan digest the next delta needs).
  void commit(const Commit& commit, const std::function<void(const Message&)>& send);
  // ABORT: rolls back the in-flight attempt (if it is `abort.attempt` or older); returns ACTIVE.
  Message abort(const Abort& abort);
  // Rolls back whatever is in flight (the producer was lost, or this member was fenced).
  void drop_in_flight();
  // Catch-up outside the tree (idle only): applies one frame of a replayed committed version and
  // commits that version once it is complete and verified. Returns true when it committed. On
  // Error the replayed version is rolled back (the committed bits stay). Throws Error(state)
  // while a version is in flight.
  bool replay_frame(const codec::FrameView& view);
  // Rolls back a partly replayed version (a fetch that broke off).
  void abandon_replay();
  // Catch-up by snapshot (idle only): the buffers now hold `version`, whose StateDigest is
  // `digest` (the caller checked it with a full scan). Throws Error(state) while in flight.
  void install(uint64_t version, codec::StateDigest digest);
  // The same for a placed member: its buffers now hold its slices of `version`, whose whole
  // state's combined digest is `version_combined` (the caller checked the snapshot's pieces).
  void install_placed(uint64_t version, uint64_t version_combined);
  // Whether this session holds placed buffers.
  bool placed() const noexcept { return placed_.has_value(); }

  // A consistent read of the committed version while refits go on (a snapshot served to a peer):
  // what it reads are that version's bits, whatever was applied or committed since. Before each
  // commit the session hands every open reader the base bits of the elements that version wrote
  // (those not read yet); reads patch them back, and undo a version in flight the same way.
  // Memory: 16 bytes per element changed since the snapshot began, in the parts not read yet.
  class SnapshotReader {
   public:
    ~SnapshotReader();
    uint64_t version() const noexcept { return version_; }
    uint64_t digest() const noexcept { return digest_; }
    // Copies out.size() bytes (whole elements) of tensor `tensor` from byte `offset`, as of
    // version(). Reads go forward in (tensor, offset) order: what lies before a read is forgotten.
    void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out);

   private:
    friend class Session;
    SnapshotReader(Session& session, uint64_t version, uint64_t digest)
        : session_(session), version_(version), digest_(digest) {}
    // Keeps the base bits of what `applier` wrote, beyond the cursor (state lock held).
    void record(const codec::DeltaApplier& applier);
    Session& session_;
    const uint64_t version_;
    const uint64_t digest_;
    SnapshotPatches patches_;  // state lock
  };
  // Opens a reader of the committed version (gated, with versions pending: of the version the
  // buffers hold). Throws Error(state) at version 0 (nothing to serve).
  std::unique_ptr<SnapshotReader> begin_snapshot();

  // The apply gate. Committed versions not in the buffers yet, oldest first (empty ungated).
  std::vector<uint64_t> pending() const;
  // The version the buffers hold (version() unless gated versions are pending).
  uint64_t applied_version() const;
  // The combined StateDigest of what the buffers hold (applied_version()'s).
  uint64_t applied_digest() const;
  // Its per-tensor digests (a CUDA host mirror checks its device copy against them); placed: one
  // per part of the placement.
  codec::StateDigest applied_state_digest() const;
  // Writes every pending version into the buffers, oldest first, while refits keep flowing (the
  // next version's staging waits only while the buffers are written); open snapshot readers keep
  // reading their version. Returns applied_version(). Cannot fail on data: everything written was
  // verified before it committed.
  // `observe`, when given, sees each element about to be written with the bits it holds (a CUDA
  // host mirror collects the positions to scatter to the device).
  uint64_t apply_pending(const std::function<void(uint32_t tensor, uint64_t element, uint32_t old_bits)>& observe = {});
  // The host moved tensor `tensor` to `memory`, which holds the bits the buffers hold (checked).
  // Throws Error(invalid_argument) for other bits or size, Error(state) before the bootstrap
  // committed or while an ungated version is being written (retry once it ended).
  void rebind(uint32_t tensor, std::span<std::byte> memory);

  uint64_t version() const;          // committed
  // Combined StateDigest of the committed bits. Right after a bootstrap commits, until its full
  // scan is done (idle-time work under the data lock), the pieces' hash sum stands in for it.
  uint64_t digest() const;
  uint64_t attempt_floor() const;
  std::optional<uint64_t> in_flight_version() const;
  std::optional<uint64_t> in_flight_attempt() const;
  // Exclusive access to the committed bits (no data call runs meanwhile): for snapshots.
  std::unique_lock<std::shared_mutex> lock_data();

 private:
  struct InFlight {
    uint64_t attempt = 0;
    uint64_t version = 0;
    DataKind kind = DataKind::frame;
    bool new_layout = false;
    bool acked = false;
    bool nacked = false;
    uint64_t changes = 0;
    std::chrono::steady_clock::time_point admitted_at;  // its first data message here
    // ACK's receive_us: from admitted_at to now.
    uint64_t receive_us() const;
  };
  std::optional<Message> refuse_locked(uint64_t version, const Error& e);
  VersionApplier* applier_locked(DataKind kind) const;
  void end_in_flight_locked(uint64_t attempt);

  const codec::Manifest& manifest_;
  codec::MutableWeights weights_;               // whole members
  std::optional<codec::PlacedWeights> placed_;  // placed members
  const uint32_t rank_;
  // Data calls hold it shared, commit/abort/drop exclusively (they wait for bodies still landing).
  mutable std::shared_mutex data_mutex_;
  mutable std::mutex state_mutex_;  // in_flight_, floor_, committed_digest_ (after data_mutex_)
  std::condition_variable attempt_ended_;  // in_flight_ ended (commit, abort, drop); with state_mutex_
  std::unique_ptr<VersionApplier> delta_;
  std::unique_ptr<VersionApplier> raw_;
  std::unique_ptr<codec::DeltaApplier> delta_applier_;
  const codec::DeltaApplier::Mode delta_mode_;
  // A fresh delta applier over the buffers holding `version` (data and state locks held).
  void reset_delta_locked(uint64_t version, codec::StateDigest digest);
  // The same for placed buffers: their part digests are read from them.
  void reset_placed_locked(uint64_t version, uint64_t version_combined);
  // Placed, gated: the combined digest of each committed version the buffers may still hold
  // (what applied_digest() names), from the buffers' version on (state lock).
  std::map<uint64_t, uint64_t> names_;
  void name_committed_locked(uint64_t version, uint64_t combined);
  std::optional<InFlight> in_flight_;
  uint64_t floor_ = 0;
  std::vector<SnapshotReader*> snapshots_;  // open readers (state lock)
  uint64_t committed_version_ = 0;
  uint64_t committed_digest_ = 0;
  uint64_t committed_attempt_ = 0;  // the attempt that committed committed_version_ here (0: none)
  uint64_t committed_answer_ = 0;   // the digest its ACTIVE named
};

}  // namespace deltacast::tree
