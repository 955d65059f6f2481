#pragma once
// tree::Producer: the trainer side of the relay tree, as a library object. It keeps the baseline
// (the bits of the last committed version, ~1x the checkpoint in host memory), encodes each new
// version against it, sends every frame once to the root of each tree, and commits only when
// every receiver acked "applied and verified" (joint commit); otherwise it aborts and receivers
// roll back. Version 0 is the all-zero state; the first refit (version 1) is the full checkpoint
// as a delta from zero. Protocol: docs/protocol.md.
//
// Life cycle: Producer p(transport, manifest, options); p.start(); p.refit(w) ...; p.finish();
// A restarted producer sets options.resume (its last committed version and bits) and goes on
// with refit() after start(): no bootstrap.
// Thread-safety: one host thread drives it; url() and version() are safe from any thread.
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codec/digest.h"
#include "codec/encoder.h"
#include "codec/manifest.h"
#include "codec/partition.h"
#include "transport/transport.h"
#include "tree/protocol.h"
#include "tree/topology.h"

namespace deltacast::tree {

// A producer restarted from its state (`deltacast run --resume`, docs/protocol.md "Producer
// loss"): it continues the version chain at `version` instead of starting at the all-zero
// version 0. Its members kept that version through the producer's loss.
struct ProducerResume {
  uint64_t version = 0;                  // the last committed version (>= 1)
  // Its bits; copied by the constructor (need not outlive it). A group rank copies its part only:
  // the spans of tensors outside its part may be empty; the group checks that its ranks' parts
  // add up to the committed version (GroupAdmission::check_sum) before anything is sent.
  codec::ConstWeights baseline;
  uint64_t attempt = 0;  // the last attempt id the previous producer used (group: rank 0's)
  // Committed version -> combined StateDigest; holds `version` (a group rank >= 1: may be empty).
  std::map<uint64_t, uint64_t> history;
  // A group's coordinator (rank 0) only; ignored elsewhere. The committed version before `version`
  // (history holds its digest), which the group steps back to in start() when every part rank says
  // GROUP_HELLO holding it and no receiver holds `version`: the coordinator was lost after deciding
  // `version` (before_commit wrote its state) and before any COMMIT or GROUP_DECIDED went out, so
  // nobody else has it. load() gives the coordinator's part of that version and its checkpoint
  // layout; start() calls it at most once and copies what it returns. Without it such ranks are
  // refused (they hold another version). docs/producer-group.md, "Failure".
  struct Previous {
    uint64_t version = 0;
    std::function<std::pair<codec::ConstWeights, CheckpointLayout>()> load;
  };
  std::optional<Previous> previous;
};

// A producer group (docs/producer-group.md): M processes, each the producer of its part of every
// version. Rank 0, the coordinator, is what receivers say HELLO to (ProducerOptions::receivers,
// listen_url); ranks 1..M-1 say GROUP_HELLO to it and root their own trees. Every rank computes
// the same partition from the manifest and M (or takes the trainer's `parts`), keeps the baseline
// of its part only and reads, diffs and sends only its part. A version commits only when every
// rank's part reached every member (one joint commit, the coordinator's).
struct ProducerGroupOptions {
  uint32_t rank = 0;            // 0: the coordinator; 1..size-1: a part rank
  uint32_t size = 1;            // M (1: one producer, no group)
  std::string coordinator_url;  // ranks >= 1: the coordinator's listen URL
  // The trainer's own layout (codec::Partition::from_parts): parts[r] the ranges rank r sends.
  // Empty: codec::Partition::balanced(manifest, size). Every rank must give the same.
  std::vector<std::vector<codec::PartRange>> parts;
};

struct ProducerOptions {
  std::string listen_url = "tcp://127.0.0.1:0";  // rendezvous address for HELLO and root JOINs
  uint32_t receivers = 1;                        // members expected at HELLO (ranks 1..N)
  TopologyKind topology = TopologyKind::binary;
  // The producer's own cluster label (config producer_cluster). When members carry the same label,
  // every tree is rooted in that cluster (tree/topology.h); empty: a cluster of its own.
  std::string cluster;
  codec::EncodeOptions encode;                   // chunk_bytes, threads, ...
  size_t max_inflight_bytes_per_root = size_t{64} << 20;
  std::chrono::milliseconds join_timeout{120'000};    // all HELLOs + READYs; a new root's JOIN
  std::chrono::milliseconds version_timeout{600'000}; // all acks for one version
  // A member whose control link stays silent this long is failed (timeouts.peer); the transport's
  // heartbeats enforce it, this bounds what the tree waits for on top (a root that drains nothing).
  std::chrono::milliseconds peer_timeout{10'000};
  // Committed versions whose digests the producer remembers, so a rejoining member holding one of
  // them can catch up by replaying deltas from a peer (members keep the same number of versions'
  // frames: retain_versions).
  uint32_t retain_versions = 4;
  // Progress callback: (chunks sent, chunk count) after each frame leaves. Optional.
  std::function<void(uint32_t, uint32_t)> on_progress;
  // Start at a committed version instead of version 0 (see ProducerResume). The attempt ids go on
  // above every one a member saw: max(resume->attempt, every HELLO's attempt_floor) + 1.
  std::optional<ProducerResume> resume;
  // Start even though listen_url is reachable from other machines and the transport has no
  // shared secret (config allow_insecure; docs/security.md). Off: refused before listening.
  bool allow_insecure = false;
  // Called on the driving thread once every live member verified `version` and the producer
  // decided to commit it, right before COMMIT goes out (history() already holds it): the moment to
  // persist "version is committed" (`deltacast run`'s state file). A producer that dies after this
  // call resumes at `version`; members that never got the COMMIT catch up to it. With
  // delegate_commit it runs earlier, before the DELEGATE goes out (history() does not hold the
  // version yet, and a NACK may still abort it: a producer lost then resumes at it all the same,
  // and every member catches up to it). Optional.
  std::function<void(uint64_t version, uint64_t digest)> before_commit;
  // Called on the driving thread in finish(), right before BYE goes out to the members (the one
  // producer's, a group's coordinator's; not a part rank's): the moment to persist "the members
  // were told to leave", so that a producer lost after it is not resumed to wait for them.
  // Optional.
  std::function<void()> before_bye;
  // Delegated commit (config `commit: delegated`; docs/protocol.md "Delegated commit"): a member
  // next to the receivers (tree 0's root) takes each version's commit decision, so that a refit
  // across a WAN costs one round trip, not three. before_commit then runs when the version's last
  // data message is posted (the producer authorises the commit of what every live member will
  // verify). Aborts stay with the producer; a member that does not answer within version_timeout
  // is failed instead of aborting the version. Dry runs are never delegated.
  bool delegate_commit = false;
  // How the committed version's checkpoint lies on disk (members that write what they hold use
  // it: `output.checkpoint_dir`): the bootstrap's on a fresh start, resume->version's on a resume.
  // WELCOME carries the committed version's layout; a refit that changes it says so in
  // RefitOptions::layout. Empty: no files. Must pass check_layout for the manifest
  // (Error(invalid_argument) otherwise).
  CheckpointLayout layout;
  // Called on the driving thread once a delta version committed (one producer, not a group; not
  // the bootstrap, nor publish/forward), with its codec frames as encoded (every chunk in order,
  // then the seal): what a producer also publishes to an object store (docs/object-storage.md).
  // It should return quickly (queue the work). Optional; without it no frame is kept.
  std::function<void(uint64_t version, uint64_t base_version, uint64_t digest,
                     std::vector<std::vector<std::byte>> frames)>
      on_committed_delta;
  // A producer group's rank (size 1: one producer). A rank >= 1 ignores receivers, topology,
  // cluster, delegate_commit and layout: the coordinator's WELCOME says them.
  ProducerGroupOptions group;
};

// A member as start() found it: what it held at HELLO and what start() made of it.
struct MemberAtStart {
  enum class Role {
    live,         // held the committed version with its digest: in the initial live set
    catching_up,  // held another version: WELCOME + CATCHUP, admitted once it caught up
    refused,      // held a version the producer cannot continue from (REFUSED was sent)
  };
  uint32_t rank = 0;
  uint64_t held_version = 0;
  Role role = Role::live;
  std::string detail;  // refused: why
};

struct StartReport {
  uint64_t version = 0;                // the committed version the session starts at
  std::vector<MemberAtStart> members;  // ranks 1..N in order
  uint32_t count(MemberAtStart::Role role) const {
    uint32_t n = 0;
    for (const auto& m : members) n += m.role == role;
    return n;
  }
};

struct RefitOptions {
  // Deliver and verify everywhere, then abort instead of committing: receivers roll back, the
  // baseline stays. For validation runs and for exercising the abort path.
  bool dry_run = false;
  // Value mode for XOR-safe tensors; default: EncodeOptions::xor_safe_mode, except xor_bits when
  // the base is the all-zero version 0 (an XOR against zero is the value itself).
  std::optional<codec::ValueMode> value_mode;
  // How the new version lies on disk (docs/protocol.md, "Checkpoint layouts"). nullopt, or equal to
  // the committed version's layout: unchanged, nothing extra is sent. Otherwise every live member
  // gets it as LAYOUT before any data of the version, holds back its ACK until it has it, and
  // takes it as its layout when the version commits (an abort keeps the committed one's). Must
  // pass check_layout for the manifest: Error(invalid_argument) before anything is sent.
  std::optional<CheckpointLayout> layout;
};

// A member that left the live set during a version (or between versions: reported with the next).
struct FailedMember {
  uint32_t rank = 0;             // job rank
  std::string cause;             // failure_cause_name(): link_closed, silent, stalled, replaced, ...
  double detected_at_s = 0;      // when the producer knew: seconds since start()
  // The silence that made the verdict: timeouts.peer for a silent or stalled member (its link
  // carried nothing, heartbeats included, that long; not measured here), 0 for a closed link.
  // Detection measured from a fault: bench/recovery (the harness knows when it struck).
  double detection_seconds = 0;
  double detected_at_unix = 0;  // the verdict's wall-clock time (seconds since the epoch)
};

struct RefitReport {
  uint64_t version = 0;            // the version this refit tried to create
  bool committed = false;
  std::string abort_reason;        // why it was aborted (empty when committed)
  uint32_t chunks = 0;
  uint64_t frames_bytes = 0;       // payload: sum of frame sizes sent (once) by the producer
  uint64_t changes = 0;            // changed elements
  uint64_t elements = 0;           // elements in the checkpoint
  uint64_t checkpoint_bytes = 0;
  uint32_t receivers = 0;          // receivers asked
  uint32_t verified_receivers = 0; // receivers that acked with the expected digest
  double encode_seconds = 0;       // summed encode time of all chunks (may overlap sending)
  double refit_seconds = 0;        // first encode to every receiver active (the producer adopts
                                   // its new baseline after that, before refit() returns)
  // Failures and their repair.
  std::vector<FailedMember> failed_members;
  uint64_t epoch = 0;              // membership epoch at the end of the version
  double repair_seconds = 0;       // summed: detection until the repaired subtrees had rejoined
  uint32_t resent_chunks = 0;      // chunks the producer encoded and sent again after a repair
  // Who decided the commit: the delegate's rank, or 0 when the producer did (not delegated, or the
  // delegate failed and the producer took over).
  uint32_t commit_delegate = 0;
  // A producer group's coordinator: the version aborted because a producer rank was lost before
  // its part was out (the group waits for it: the same version can be sent again once it is back).
  bool producer_rank_lost = false;
};

class Producer {
 public:
  // base_manifest must outlive the producer. Starts listening. Throws what listen throws, and
  // Error(invalid_argument) for receivers == 0.
  Producer(transport::Transport& transport, const codec::Manifest& manifest, ProducerOptions options);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  // The URL receivers rendezvous at (real port).
  std::string url() const;
  // Waits for every receiver's HELLO, sends WELCOME (membership, topology, manifest), accepts
  // the root JOINs and waits for every READY. Members holding the committed version (0 on a fresh
  // start) with its digest are the initial live set; members holding an older version catch up
  // from live peers (CATCHUP) and are admitted at a version boundary; a member holding a newer
  // version, or a digest that differs from the producer's record of its version, is refused (it
  // does not hold up the start). Throws Error(timeout | connection | corrupt_frame), and
  // Error(state) naming what each member holds when no member holds the committed version (a
  // resumed producer cannot continue the chain without one).
  // `timeout` replaces options.join_timeout for this wait.
  // A producer group: the coordinator also waits for every rank's GROUP_HELLO (Error(timeout)
  // naming the missing ranks; Error(verify_failed) when their parts do not add up to the committed
  // version); a part rank says GROUP_HELLO and returns once the coordinator's WELCOME came
  // (Error(<its code>) with the coordinator's reason when refused; its StartReport lists no members).
  // refit() then runs on every rank at once: each returns when the coordinator decided the version.
  StartReport start(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Encodes `next` against the baseline as version()+1, sends it, and commits or aborts.
  // Throws Error(invalid_argument) when next does not match the manifest or options.layout does
  // not pass check_layout, Error(connection) when a root link died. A refused/failed version is
  // not an exception: see RefitReport::committed.
  RefitReport refit(const codec::ConstWeights& next, const RefitOptions& options = {});
  // The same with the new version read (Checkpoint::reader(): pread of a trainer's checkpoint, in
  // cache-sized pieces, whatever folio sizes the page cache holds it in) instead of mapped. Once
  // the version commits the baseline is read from `next` again, in pieces. A read that fails then
  // (a file truncated under the producer) leaves the members at the new version and the producer
  // without a baseline: Error(io) here, Error(state) from every later refit, and no snapshots
  // from the producer; a new producer resumes the chain (ProducerOptions::resume). `next` must
  // outlive the call; its manifest must have the producer's manifest's digest (else
  // Error(invalid_argument)).
  RefitReport refit(const codec::WeightsReader& next, const RefitOptions& options = {});
  // Sends a full checkpoint as version 1 to receivers that hold the all-zero version 0: raw
  // bytes in RAW messages of at most chunk_bytes (whole elements), forwarded through the tree
  // like frames. Each receiver copies them into its buffers, digests each piece as it lands and
  // acks the sum; the expected digest is computed on a helper thread while sending. Joint commit
  // as for deltas. Why raw and not a delta from zero: zero-based XOR masks do not compress (BF16 weights
  // shrink ~1.28x under zstd) and a delta applier keeps an undo record per element, several times
  // the checkpoint in memory; raw bytes cost a memcpy, rollback is a memset. This is also the
  // full-checkpoint reference time. Requires version() == 0 (throws Error(state)); throws like
  // refit() otherwise.
  RefitReport bootstrap(const codec::ConstWeights& full);
  // Sends pre-encoded frames (chunk frames then the seal) as version `new_version` and runs the
  // joint commit. `expected_digest` is the combined digest every receiver must ack. On commit the
  // baseline is NOT updated (the producer does not know the bits): use for tests and tools that
  // replay .dcx files. Frames are sent in the given order, duplicates included.
  RefitReport publish(const std::vector<std::vector<std::byte>>& frames, uint64_t new_version, uint64_t expected_digest,
                      const RefitOptions& options = {});
  // The relay's own copy of a forwarded version: its bits (the relay's buffers, read until the
  // version commits) and their StateDigest.
  struct RelayCopy {
    codec::ConstWeights bits;
    codec::StateDigest digest;
  };
  // publish() for a relay of another producer's versions (a store gateway, docs/object-storage.md
  // "Hybrid"), sent on while the relay applies them itself: `own_copy` becomes ready once the
  // relay's own copy holds `new_version` (applied and verified from the same frames, e.g. on
  // another thread meanwhile). The producer sends the frames, then handles its members' messages
  // until the copy is ready, and only then can the version commit. An exception in the copy
  // aborts the version in the tree (every member rolls back) and comes out of forward(); so does a
  // copy whose combined digest is not `expected_digest` (Error(verify_failed)). Once the version
  // commits, the copy becomes the baseline (copied), so the producer serves snapshots of it to
  // members that rejoin. With placed members (docs/placement.md) the frames, not cut for their
  // placements, are not sent: the version is encoded again from the copy once it is ready (a
  // refit of it; `new_version` must be version() + 1). Throws like publish();
  // Error(invalid_argument) when the bits do not match the manifest, Error(state) before start()
  // or in a group.
  RefitReport forward(const std::vector<std::vector<std::byte>>& frames, uint64_t new_version, uint64_t expected_digest,
                      const std::shared_future<RelayCopy>& own_copy);
  // Sends BYE to every receiver and closes the links.
  void finish();

  // The committed version's checkpoint layout (ProducerOptions::layout, then each committed
  // RefitOptions::layout). Host thread, between calls.
  const CheckpointLayout& layout() const;
  uint64_t version() const noexcept;            // last committed version
  // The bytes this process sends of every version: a group rank's part, else the whole manifest.
  uint64_t part_bytes() const;
  // Its digest; a group rank's: its part's (per tensor, the sums over its ranges). history() holds
  // the whole version's combined digests on every rank (a part rank learns them from GROUP_DECIDED).
  const codec::StateDigest& digest() const;
  // For the producer's state file (ProducerResume): the last attempt id used, and the combined
  // digests of the committed versions it remembers (the last retain_versions, and `version()`).
  // Host thread, between calls (not from on_progress).
  uint64_t attempt() const noexcept;
  std::map<uint64_t, uint64_t> history() const;
  // When start() began (steady clock): FailedMember::detected_at_s counts from it.
  std::chrono::steady_clock::time_point session_start() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltacast::tree
