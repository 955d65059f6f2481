#pragma once
// tree::Receiver: one rollout-side member of the relay tree, as a library object. The host (the
// CLI today, the C API later) owns the weight buffers; the receiver writes refits into them.
//
// Life cycle (docs/protocol.md):
//   Receiver r(transport, options);   // starts listening for children
//   const Manifest& m = r.join();     // HELLO/WELCOME with the producer: membership + manifest
//   r.attach(weights, 0);             // host buffers holding version 0 (all zeros) or later
//   RunSummary s = r.run();           // builds the tree edges, then serves versions until BYE
// Frames arriving from a parent are forwarded verbatim to this member's children of that tree
// before being applied (cut-through), with at most max_inflight_bytes_per_child unsent per child:
// a slow child stops this receiver reading from its parent. Versions are applied by
// codec::DeltaApplier (exactly once, verified, joint commit / rollback on the producer's word).
//
// Thread-safety: join/attach/run are called by one host thread in that order; stats() and
// version() may be called from any thread at any time. run() uses one extra thread per tree.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/digest.h"
#include "codec/manifest.h"
#include "codec/placement.h"
#include "transport/transport.h"
#include "tree/protocol.h"

namespace deltacast::tree {

struct ReceiverOptions {
  uint32_t rank = 1;               // 1..N (0 is the producer)
  std::string producer_url;        // rendezvous address (the producer's listener)
  std::string listen_url;          // where children connect, e.g. "tcp://127.0.0.1:0"
  std::string cluster;             // cluster label reported at HELLO
  size_t max_inflight_bytes_per_child = size_t{64} << 20;
  size_t retain_bytes = size_t{64} << 20;  // frames of the in-flight version kept for RESUME
  // Committed versions whose frames are kept to serve a rejoining peer's replay (retain_versions).
  uint32_t retain_versions = 4;
  std::chrono::milliseconds connect_timeout{30'000};   // one connection attempt (timeouts.connect)
  // Reaching the producer at start (and WELCOME): retried, with a message every few seconds,
  // until this passes (timeouts.join).
  std::chrono::milliseconds join_timeout{120'000};
  // A child that drains nothing for this long is reported to the producer and dropped
  // (timeouts.peer; the transport's heartbeats fail a silent link on the same bound).
  std::chrono::milliseconds peer_timeout{10'000};
  // After the producer's link fails: how long to keep the committed version and retry reaching a
  // (restarted) producer before run() gives up with Error(connection) (timeouts.producer_loss).
  std::chrono::milliseconds producer_loss_timeout{60'000};
  std::chrono::milliseconds idle_timeout{1'800'000};   // silence from the producer ends run()
  // The apply gate (docs/embedding.md): refits are verified, acked and committed without writing
  // the host's buffers; committed versions queue until the host calls apply_pending() at a safe
  // point. The bootstrap and catch-up snapshots are written at once (nothing is served yet).
  bool gated = false;
  // Start even though listen_url or producer_url is reachable from other machines and the
  // transport has no shared secret (config allow_insecure; docs/security.md). Off: refused.
  bool allow_insecure = false;
  // A placed member whose placement is known before join() (docs/placement.md): HELLO states its
  // distinct slices at once. attach_placed() must then be given the same placement. Empty: the
  // placement, if any, comes with attach_placed() (stated to the producer by PLACED before this
  // member's first READY).
  std::vector<codec::BufferPlacement> placement;
  // Called on the control thread after a version became active: committed, or reached by catching
  // up (a snapshot and/or replayed versions) when this member rejoined; layout() is already that
  // version's. Optional.
  std::function<void(uint64_t version)> on_active;
  // Called on the control thread after a version was aborted and rolled back (the buffers hold
  // the committed version again). Optional.
  std::function<void(uint64_t version)> on_aborted;
  // Called on a relay thread after each data message (FRAME or RAW piece) of `version` was
  // handled, with how many data messages of that version this member handled so far. For fault
  // injection (`deltacast run --fault`); optional.
  std::function<void(uint64_t version, uint64_t handled)> on_data;
};

struct ReceiverStats {
  uint64_t frames_received = 0;
  uint64_t frames_forwarded = 0;   // sends posted to children
  uint64_t frames_replayed = 0;    // duplicates refused by the applier
  uint64_t frames_refused = 0;     // wrong base, corrupt, ...
  uint64_t versions_committed = 0;
  uint64_t versions_aborted = 0;
  uint64_t payload_bytes = 0;      // frame bytes received
  uint64_t snapshots_taken = 0;    // whole versions taken on catch-up (from a peer or the producer)
  int64_t last_snapshot_source = -1;  // the rank that served the last of them (0: the producer; -1: none)
  // Committed delta versions kept for a rejoining peer's replay (at most retain_versions): now and
  // the most ever (FrameStore::Retained; 0 before attach()).
  uint32_t retained_versions = 0;
  uint64_t retained_bytes = 0;
  uint32_t retained_versions_peak = 0;
  uint64_t retained_bytes_peak = 0;
  uint64_t retained_largest_version_bytes = 0;
};

struct RunSummary {
  uint64_t version = 0;  // active version at BYE
  uint64_t digest = 0;   // its combined StateDigest
  ReceiverStats stats;
};

class Receiver {
 public:
  // Starts listening on options.listen_url. Throws what Transport::listen throws.
  Receiver(transport::Transport& transport, ReceiverOptions options);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  // Connects to the producer (retrying, with a message every few seconds, for join_timeout),
  // sends HELLO, waits for WELCOME. Returns the manifest the host must allocate buffers for.
  // held_version/held_digest: what the host's buffers hold when it kept them (a restarted server
  // that still holds a committed version, with its combined StateDigest); the producer checks the
  // digest against its own record of that version and refuses a mismatch (Error(verify_failed)),
  // before anything is written. attach() must then be given that version. Throws
  // Error(connection | timeout | auth | corrupt_frame), or the producer's refusal.
  const codec::Manifest& join(uint64_t held_version = 0, uint64_t held_digest = 0);
  // Gives the receiver the host's buffers, which hold exactly `version` (version 0: all zeros).
  // `digest` is their StateDigest; when absent it is computed by a full scan. Throws
  // Error(invalid_argument) when the buffers do not match the manifest, Error(state) before join().
  void attach(codec::MutableWeights weights, uint64_t version,
              std::optional<codec::StateDigest> digest = std::nullopt);
  // A placed member (docs/placement.md): gives the receiver the host's buffers, which hold only
  // the slices `placement` names (buffers[k]: placement buffer k) of `version` (version 0: the
  // held units are zeroed here, as version 0 is all zeros; padding is never written),
  // whose whole state's combined digest is `version_digest` (what digest() said when that version
  // was committed here; ignored at version 0). The placement is compiled against the manifest
  // first: Error(invalid_argument) naming the buffer and the part (an unknown tensor, a slice out
  // of range, parts that do not fit side by side, a dtype mismatch, overlapping parts, a buffer of
  // the wrong size, a placement other than options.placement), and nothing is written.
  // Error(state) before join() or after an attach. The member applies only the changes in its
  // slices and checks them against the seals' slice table; it relays every frame, serves replays
  // but no snapshots, and catches up by snapshot from a whole peer or the producer. reattach() is
  // not supported.
  void attach_placed(std::vector<codec::BufferPlacement> placement, std::vector<std::span<std::byte>> buffers,
                     uint64_t version, uint64_t version_digest = 0);
  // The compiled placement (null before attach_placed()).
  std::shared_ptr<const codec::Placement> placement() const;
  // Before attach(): turns the apply gate (options.gated) on or off. A host that learns only at
  // attach time that it needs the gate (CUDA tensors served through host mirrors) sets it here.
  // Error(state) after attach().
  void set_gated(bool gated);
  // Connects to parents, accepts children, reports READY and serves versions until the producer
  // says BYE. Throws Error(connection) when the producer or a parent link fails, Error(timeout),
  // Error(state) when called before attach().
  RunSummary run();

  // Leaves: from any thread, makes a running run() return (its summary as for BYE) after closing
  // this member's links; the producer sees the member gone and repairs the tree around it. A
  // version in flight here is rolled back; the committed version stays in the buffers.
  void stop();

  // The apply gate (options.gated). Committed versions not yet written into the buffers, oldest
  // first; always empty ungated. Any thread.
  std::vector<uint64_t> pending() const;
  // The version the buffers hold (version() unless versions are pending). Any thread.
  uint64_t applied_version() const;
  // The combined StateDigest of what the buffers hold (applied_version()'s; 0 before attach()).
  // Stable while nothing applies: read it from the thread that calls apply_pending().
  uint64_t applied_digest() const;
  // Its per-tensor digests (empty before attach()); same stability rule.
  codec::StateDigest applied_state_digest() const;
  // Writes every pending version into the buffers, in order, and returns applied_version(). Call
  // it at the host's safe point (nothing reads the buffers meanwhile); refits keep flowing. Never
  // fails on data: what it writes was verified before commit. Error(state) before attach().
  // `observe`, when given, sees every element about to be written with the bits it holds, on
  // the calling thread (a host mirror of CUDA tensors collects what to scatter to the device).
  uint64_t apply_pending(const std::function<void(uint32_t tensor, uint64_t element, uint32_t old_bits)>& observe = {});
  // The host moved tensor `tensor` (manifest index) to `memory`, which already holds the bits the
  // buffers hold (checked against their digest). From then on refits land there and the old
  // memory is never read again. Error(invalid_argument): other bits or size; Error(state): before
  // the bootstrap committed, or while an ungated version is being written (retry after it ends).
  void reattach(uint32_t tensor, std::span<std::byte> memory);

  // How the committed version this member holds lies on the trainer's disk (empty when the
  // producer has no files): WELCOME's, then, as versions commit here, the layout each one came with
  // (LAYOUT; docs/protocol.md "Checkpoint layouts"); an aborted version leaves it as it was. While a
  // rejoining member catches up it stays its held version's until it reached the producer's (on
  // the first join: WELCOME's at once). Inside on_active it is that version's. Any thread (a
  // snapshot: the object never changes); Error(state) before join().
  std::shared_ptr<const CheckpointLayout> layout() const;

  // The URL children connect to (with the real port).
  std::string listen_url() const;
  uint64_t version() const noexcept { return active_version_.load(); }
  // The combined StateDigest of the committed version (0 before attach()). Any thread.
  uint64_t digest() const;
  ReceiverStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> active_version_{0};
};

}  // namespace deltacast::tree
