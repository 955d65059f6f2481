#pragma once
// Producer::Impl, the producer's state, shared by the files of tree/producer/ (docs/architecture.md
// lists what each does: one job a file). Private to dc_tree.
//
// One thread at a time drives everything, holding `drive`: the host thread during the public
// calls (their version loops pump one event queue fed by an acceptor thread, for HELLO and root
// JOIN connections, and by one reader thread per control link), and between calls the idle thread,
// which handles events as they come (a failure is repaired, a rejoin answered, while the trainer
// computes the next step). Nothing else touches the state below.
#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "codec/encoder.h"
#include "codec/partition.h"
#include "tree/membership.h"
#include "tree/producer.h"
#include "tree/producer/baseline_store.h"
#include "tree/producer/fleet_slices.h"
#include "tree/producer/group_admission.h"
#include "tree/producer/raw_pieces.h"
#include "tree/producer/slow_relays.h"
#include "tree/producer/version_round.h"
#include "tree/protocol.h"
#include "tree/relay_link.h"
#include "tree/snapshot_serve.h"
#include "util/log.h"
#include "util/worker_threads.h"

namespace deltacast::tree {

// How long a send on a member's control link (or reading a greeting) may take.
inline constexpr std::chrono::seconds kMemberSendTimeout{10};
// How long a root's queued sends may take to go out when a version ends (and at finish()).
inline constexpr std::chrono::seconds kRootSettleTimeout{30};

// A message for one tree's root: a FRAME, or a RAW header with its body (the caller's memory).
struct Outgoing {
  SharedBytes message;
  std::span<const std::byte> body;
};

// Something the producer's host thread must look at.
struct ProducerEvent {
  // group: a message (or the failure) of a producer group's link (control.rank: the other rank);
  // group_hello: a rank's GROUP_HELLO at the coordinator.
  enum class Kind { control, hello, root_join, group, group_hello } kind = Kind::control;
  ControlEvent control;                               // control, group
  std::shared_ptr<transport::Connection> connection;  // hello, root_join
  Hello hello;                                        // hello
  GroupHello group_hello;                             // group_hello
  Join join;                                          // root_join
  Resume resume;                                      // root_join
  uint64_t epoch = 0;                                 // root_join: the JOIN's epoch
  Clock::time_point at = Clock::now();
};

// A producer group's state (group.cpp, group_rank.cpp): both roles. docs/producer-group.md.
struct ProducerGroup {
  uint32_t rank = 0;
  uint32_t size = 1;
  codec::Partition partition;
  codec::GroupChunks chunks;  // the version's chunk numbering: rank r's are [first[r], first[r+1])
  ProducerGroup(uint32_t r, codec::Partition p, codec::GroupChunks c)
      : rank(r), size(p.ranks()), partition(std::move(p)), chunks(std::move(c)) {}
  uint32_t first_tree(int trees_per_rank) const { return rank * static_cast<uint32_t>(trees_per_rank); }

  // ---- the coordinator (rank 0) ----
  std::optional<GroupAdmission> admission;
  struct RankLink {
    std::shared_ptr<transport::Connection> connection;
    uint64_t generation = 0;
    uint64_t instance = 0;
    std::optional<GroupReady> ready;  // its trainer asked for this version
    std::optional<GroupSent> sent;    // its part of the attempt in flight is out
  };
  std::vector<RankLink> links;  // [rank] (0 unused)
  // [rank]: where the roots of its trees JOIN it (WELCOME's producer_urls; kept while it is lost).
  std::vector<std::string> data_urls;
  std::unique_ptr<ControlReaders> readers;

  // ---- a part rank (rank >= 1) ----
  std::shared_ptr<transport::Connection> coordinator;
  std::optional<GroupBegin> begin;      // the coordinator's word for the version asked
  std::optional<GroupDecided> decided;  // how it ended
  std::string coordinator_lost;         // why the link to the coordinator failed (empty: up)
  bool bye = false;                     // the coordinator ended the session
};

struct Producer::Impl {
  class GroupShare;  // group_share.h
  class DeltaShare;
  class RawShare;
  transport::Transport& transport;
  const codec::Manifest& manifest;
  ProducerOptions options;
  std::shared_ptr<spdlog::logger> log = logger("tree");
  std::unique_ptr<transport::Listener> listener;
  uint64_t max_message_bytes = 0;
  Clock::time_point session_start = Clock::now();

  // ---- membership (control.cpp, admission.cpp, repair.cpp) ----
  std::optional<Membership> membership;
  std::vector<Member> members;  // [rank]: URL and cluster (rank 0: this producer)
  struct ControlLink {
    std::shared_ptr<transport::Connection> connection;
    uint64_t generation = 0;
    uint64_t instance = 0;
    bool catching_up = false;  // connected, not yet in the live set
    bool caught_up = false;    // said READY at the committed version: admit at the next version
    uint64_t caught_up_version = 0;
    std::optional<uint64_t> last_catchup_from;  // a second plan from the same version is a snapshot
    // The layout this member was last sent (WELCOME or LAYOUT): a member catching up is sent the
    // committed one, when they differ, once it says READY at the committed version.
    std::shared_ptr<const CheckpointLayout> told_layout;
    uint64_t plan_target = 0;  // the committed version its last CATCHUP was for
    // It reached plan_target after a newer version began, and replays the rest: the next version
    // may wait for it (hold_for_chasers), at most kMaxAdmissionHolds times per catch-up.
    bool chasing = false;
    int holds = 0;
    // It says READY at a version newer than the producer's: one the receivers' delegate committed
    // (and a peer served) before the producer heard the decision. Answered once the producer is
    // at that version (admit_caught_up), not with a CATCHUP "back" to the producer's version,
    // which the member would answer at once with the same READY (a spin).
    std::optional<Ready> ahead = std::nullopt;
  };
  std::vector<ControlLink> control;          // [rank]
  std::vector<std::set<uint64_t>> replaced;  // [rank]: fenced-as-replaced instances
  uint64_t next_generation = 1;
  EventQueue<ProducerEvent> events;
  std::unique_ptr<ControlReaders> readers;
  std::thread acceptor;
  TaskThreads greeters;  // one per accepted connection reading its first message
  std::atomic<bool> stopping{false};
  std::mutex drive;                                  // held by whoever drives (see the top)
  std::thread idle;                                  // drives between public calls
  std::vector<std::shared_ptr<OutboundLink>> roots;  // [tree]
  std::vector<Clock::time_point> root_lost;          // [tree]: when the root went missing
  // A repair waits for READY from the members it moved.
  struct Repair {
    Clock::time_point detected;
    uint64_t epoch = 0;
    std::set<uint32_t> waiting;
  };
  std::vector<Repair> repairs;
  std::vector<FailedMember> failures;                       // not yet reported
  double repair_seconds = 0;                                // finished repairs not yet reported
  std::map<uint32_t, Clock::time_point> child_trouble;      // rank -> last REPORT about its child
  std::map<uint32_t, Clock::time_point> stall_accusations;  // rank -> when its parent said stalled
  std::map<uint64_t, uint64_t> history;                     // committed version -> combined digest
  // The committed version's checkpoint layout (a new object each time it changes).
  std::shared_ptr<const CheckpointLayout> layout;
  uint64_t zero_digest = 0;  // combined digest of the all-zero version 0
  // start(): what each rank said at HELLO ([rank]). A rank refused at start counts as answered:
  // it does not hold up the start, and is not in the initial live set.
  struct StartHello {
    uint64_t held_version = 0;
    uint64_t held_digest = 0;
    uint64_t attempt_floor = 0;
    bool refused = false;
    std::string why;  // refused
  };
  std::vector<StartHello> start_hellos;
  // The placed members' slices and the seals' slice table (docs/placement.md); in a producer group,
  // the coordinator's (GROUP_BEGIN carries the plan to the ranks).
  FleetSlices fleet_slices{manifest};

  // ---- a producer group (group.cpp, group_rank.cpp); absent for one producer ----
  std::optional<ProducerGroup> group;
  bool coordinator() const noexcept { return group && group->rank == 0; }
  bool part_rank() const noexcept { return group && group->rank > 0; }
  // Whether tree `tree` is this producer's to feed (one producer: every tree).
  bool feeds(int tree) const;

  // ---- versions (delivery.cpp, refit.cpp) ----
  // The committed version's bits (before start(): version 0's zeros); a group rank's part only.
  std::unique_ptr<BaselineStore> baseline;
  std::unique_ptr<WorkerThreads> encoders;
  uint64_t version = 0;
  uint64_t attempt = 0;  // last attempt id used
  bool finished = false;
  struct InFlight {
    uint64_t version = 0;
    uint64_t attempt = 0;
    uint32_t keys = 0;  // data messages: chunks (+ the seal for deltas)
    // The version's layout when it differs from the committed one's (null: unchanged): sent as
    // LAYOUT before the data, whose envelopes say so (envelope()); committed with the version.
    std::shared_ptr<const CheckpointLayout> layout;
    Envelope envelope(uint32_t route) const { return Envelope{attempt, route, layout != nullptr}; }
    std::function<Outgoing(uint32_t key, uint32_t route)> make;  // deterministic re-encoding
    std::function<int(uint32_t key)> tree_of;
    std::vector<bool> sent;
    std::deque<std::pair<uint32_t, uint32_t>> resends;  // (key, route)
    // A group's version: rank r's data keys are [rank_first[r], rank_first[r + 1]); keys past the
    // last (the seal) are the coordinator's. Empty: one producer's version.
    std::vector<uint32_t> rank_first;
    // The rank that sends `key` (0 for one producer).
    uint32_t owner(uint32_t key) const {
      if (rank_first.empty() || key >= rank_first.back()) return 0;
      return static_cast<uint32_t>(std::upper_bound(rank_first.begin(), rank_first.end(), key) - rank_first.begin()) -
             1;
    }
    // Set by a RAW bootstrap's send_all: the version's combined StateDigest, which it is recorded
    // under (members ack the pieces' hash sum).
    std::optional<uint64_t> state_digest;
    // The joint commit: who answered what, the decision, the ACTIVEs (set when the attempt starts).
    std::optional<VersionRound> round;
    bool remembered = false;  // the committed version went into `history`
    RefitReport* report = nullptr;
    Clock::time_point start;
    // Laggards (fail_laggards): when each member was first seen verified, when everything was
    // sent, and when the forest last changed during the attempt.
    std::map<uint32_t, Clock::time_point> verified_at;
    // Each member's ACK's receive_us of this attempt, ms (slow_relays).
    std::map<uint32_t, double> receive_ms;
    // (tree, root rank) -> when the producer's link to that root was first seen with nothing in
    // flight: a root has the version from then on, not from the posting of its last piece.
    std::map<std::pair<int, uint32_t>, Clock::time_point> root_drained_at;
    Clock::time_point sealed_at;
    uint64_t epoch_seen = 0;
    Clock::time_point epoch_changed_at;
  };
  std::optional<InFlight> in_flight;

  Impl(transport::Transport& t, const codec::Manifest& m, ProducerOptions o);
  ~Impl();

  uint64_t epoch() const { return membership ? membership->epoch() : 0; }
  std::vector<uint32_t> live_ranks() const { return membership ? membership->live_ranks() : std::vector<uint32_t>{}; }

  // Edge reports wait a moment: a peer that died is usually declared dead by its control link
  // meanwhile, which makes the report moot (no needless move).
  struct EdgeReport {
    uint32_t from = 0;
    Report report;
    Clock::time_point at;
  };
  std::vector<EdgeReport> edge_reports;
  double last_version_seconds = 0;

  // ---- control.cpp: threads, control links, the event pump ----
  void start_acceptor();
  void idle_loop();
  void stop_threads();
  void greet(const std::shared_ptr<transport::Connection>& connection);
  // Handles queued events for up to `wait` (0: only what is queued now).
  void pump(std::chrono::milliseconds wait);
  // finish(), before BYE: pumps until every member catching up holds the committed version (it
  // said READY at it), for up to options.join_timeout; warns about each that did not.
  void wait_for_catch_ups();
  void handle(ProducerEvent& event);
  // What control readers hand over: each message (or failure) queued as an event of `kind`.
  std::function<void(ControlEvent)> event_sink(ProducerEvent::Kind kind);
  void handle_control(const ControlEvent& event);
  void broadcast(const Message& message, bool include_catching_up = false);
  bool send_to(uint32_t rank, const Message& message);
  void close_control(uint32_t rank);

  // ---- admission.cpp: who holds what, and getting into the live set ----
  void remember_version(uint64_t v, uint64_t digest);
  // The committed version's combined digest (version 0: the all-zero state's).
  uint64_t committed_digest() const;
  // Why a member holding (held_version, held_digest) cannot join this producer at all (it holds a
  // newer version, or bits that differ from the producer's record of its version): empty when it
  // can, live or after catching up.
  std::pair<Errc, std::string> refusal_for(uint64_t held_version, uint64_t held_digest) const;
  // start(), once every rank said HELLO: builds the membership, leaves out of the live set every
  // member that does not hold the committed version (refused or catching up), raises the attempt
  // id above every member's floor. Throws Error(state), after refusing every member, when no
  // member holds the committed version.
  StartReport place_members_at_start();
  void handle_hello(ProducerEvent& event);
  // PLACED: the member's slices, stated after its HELLO (checked as HELLO's are; a refusal fails
  // it, or ends its catch-up).
  void handle_placed(uint32_t rank, const Placed& placed, Clock::time_point at);
  // Why a member stating `slices` cannot be served (empty: it can; they are recorded).
  std::string record_slices(uint32_t rank, const std::vector<HeldSlice>& slices);
  void handle_root_join(ProducerEvent& event);
  void handle_ready(uint32_t rank, const Ready& ready, uint64_t epoch);
  // Tells a member that is not live how to reach the committed version from `held` (CATCHUP).
  bool send_catchup(uint32_t rank, uint64_t held);
  // Sends a member that is not live the committed version's layout (LAYOUT, attempt 0) unless it
  // was told that one already. False when the send failed.
  bool tell_committed_layout(uint32_t rank);
  void admit_caught_up();
  // Before a version starts: a member that reached its target just after a newer version began
  // (chasing) replays that one version now. When versions follow each other faster than it can,
  // it would chase the producer for ever: this waits for it (pumping events) for up to
  // admission_hold(), then admits whoever caught up. A member that dies or freezes meanwhile is
  // not waited for past its link's failure or the bound.
  void hold_for_chasers();
  // The bound of one hold: twice the last version's time, at least 1 s, at most the peer timeout.
  std::chrono::milliseconds admission_hold() const;

  // ---- repair.cpp: failures ----
  void handle_report(uint32_t from, const Report& report, Clock::time_point at);
  void review_edge_reports();
  void review_stalls();
  // Drops `rank` from the live set (fencing it), repairs the forest and tells every member.
  void fail(uint32_t rank, FailureCause cause, const std::string& detail, Clock::time_point at);
  void reparent(uint32_t rank, int tree, const std::string& why, Clock::time_point at);
  void announce(const EpochUpdate& update, std::vector<TreeEdge> moves, Clock::time_point detected);

  // ---- delivery.cpp: one attempt on the wire and its joint commit ----
  void settle_roots() noexcept;
  void flush_resends();
  // Posts to tree `tree`'s root once it has room, handling events meanwhile (a lost root is
  // replaced, re-sends go out). Throws Error(state) when no member is live.
  void deliver(int tree, const Outgoing& outgoing);
  RefitReport run_version(InFlight flight, const std::function<void(InFlight&)>& send_all,
                          const std::function<uint64_t()>& expected_digest, bool dry_run,
                          const std::function<void()>& on_commit);
  // Does what the in-flight VersionRound asks (nothing when no version is in flight).
  void execute(const VersionRound::Actions& actions);
  // Once everything of the attempt is out: runs its VersionRound (the joint commit) to the end,
  // pumping events meanwhile. on_commit runs once the version is committed, even when waiting
  // for the ACTIVEs fails (Error(timeout)).
  void joint_commit(RefitReport& report, uint64_t expected_digest, const std::function<void()>& on_commit = {});
  // Before the decision: fails (cause stalled) every member that has not verified the attempt
  // timeouts.peer + min(1 s, timeouts.peer / 2) after all it needs reached its parents (each of its
  // parents verified, or the producer sent everything, and the forest last changed). A relay whose
  // process lives but stopped forwarding is caught so even when its parent's sends all fit in
  // socket buffers (docs/protocol.md, "Detection"); a frozen member's silence is seen first.
  void fail_laggards(InFlight& f);
  // Straggler relays, after a committed version (find_slow_relays, tree/producer/slow_relays.h):
  // those to fail (they rejoin as leaves, where their egress holds nobody back), each with the
  // reason; keeps each relay's window in slow_history.
  std::vector<SlowRelay> slow_relays(const InFlight& f);
  // When `rank`'s parent in `tree` can have forwarded it the version (the laggard rule's start
  // of patience, apart from the parent's own verification): the start plus the root's time
  // times the parent's children (cut-through through one egress), or the latest sibling's
  // verification when one has it sooner. f.start when the root has not verified.
  Clock::time_point forwarded_by(const InFlight& f, uint32_t rank, uint32_t parent, int tree) const;
  // Each verified member's verification after the sealing, ms.
  static std::map<uint32_t, double> verified_after_sealing(const InFlight& f);
  std::map<uint32_t, uint32_t> slow_history;

  // ---- refit.cpp ----
  // The layout of a refit: null when `wanted` is absent or equal to the committed one. Throws
  // Error(invalid_argument) when it does not pass check_layout.
  std::shared_ptr<const CheckpointLayout> changed_layout(const std::optional<CheckpointLayout>& wanted) const;
  // The encoder's options for the next delta (fleet_slices: the placed members' cuts and the
  // slice table of the committed version, scanning a slice it lacks).
  codec::EncodeOptions refit_encode_options(const RefitOptions& refit_options);
  // Throws Error(state) before start(), or once the baseline was lost (baseline.lost()).
  void check_can_refit() const;
  // refit(ConstWeights) with the drive lock held: a delta from the baseline to `next` (whole
  // buffers of the manifest), which becomes the baseline once committed.
  RefitReport refit_bits(const codec::ConstWeights& next, const RefitOptions& refit_options);
  // publish()/forward(): sends pre-encoded frames as `new_version`; `sent` (when given) runs once
  // they are sent, before the joint commit (what it throws aborts the version); `committed` runs
  // when it commits.
  RefitReport publish_frames(const std::vector<std::vector<std::byte>>& frames, uint64_t new_version,
                             uint64_t expected_digest, const RefitOptions& refit_options,
                             const std::function<void()>& sent, const std::function<void()>& committed);
  // refit's common part: sends what `encoder` encodes as version+1 (with `new_layout` when it
  // changes) and runs the joint commit; once committed, adopt(version, digest) makes the new
  // version the baseline.
  RefitReport refit_with(codec::DeltaEncoder& encoder, std::shared_ptr<const CheckpointLayout> new_layout,
                         const RefitOptions& refit_options,
                         const std::function<void(uint64_t, codec::StateDigest)>& adopt);

  // ---- group.cpp: the coordinator's side of a producer group ----
  // The group's admission and rank links, made at the first GROUP_HELLO or at start().
  void ensure_admission();
  // Sends `message` on rank `rank`'s group link (a failed send loses the rank).
  void tell_rank(uint32_t rank, const Message& message);
  // A resumed coordinator's version before its committed one (ProducerResume::previous), until
  // start() decided whether the group steps back to it.
  std::optional<ProducerResume::Previous> previous;
  // group_resume.cpp, from wait_for_ranks once every rank is in: when the ranks hold the previous
  // version, steps the group back to it (every rank does, no receiver holds the committed one) or
  // throws Error(version_mismatch) naming the ranks and receivers that make it impossible.
  void step_back_if_undecided();
  // start(): waits (pumping) until every rank said GROUP_HELLO and was admitted and their parts
  // add up to the committed version. Throws Error(timeout) naming the missing ranks, Error(state)
  // when the parts do not add up.
  void wait_for_ranks(Clock::time_point deadline);
  void handle_group_hello(ProducerEvent& event);
  void handle_group_event(const ControlEvent& event);
  // A rank's link failed or said something that is not its part of the protocol: its part is
  // missing (an attempt in flight is stopped: ABORT everywhere) until it says GROUP_HELLO again.
  void lose_rank(uint32_t rank, const std::string& why);
  // Sends `message` to every rank's group link (a failed send loses the rank).
  void tell_ranks(const Message& message);
  // The coordinator's version of a group (a delta, or version 1's RAW pieces: `share`): every rank
  // ready the same way, GROUP_BEGIN, its own part, every rank's GROUP_SENT, the seal from the
  // parts' digests (a delta), the joint commit, GROUP_DECIDED.
  RefitReport group_version(GroupShare& share, std::shared_ptr<const CheckpointLayout> new_layout,
                            const RefitOptions& refit_options);
  // What the coordinator (rank 0) says to a rank or a member: the session's shape.
  Welcome make_welcome() const;
  // A group's data URLs, rank 0's first (Welcome::producer_urls).
  std::vector<std::string> producer_urls() const;
  // The missing ranks, or an empty string when every rank is in.
  std::string missing_ranks() const;

  // ---- group_share.cpp: one rank's share of a group version (group_share.h) ----
  // The delta of this rank's part from its baseline to `next` (which must outlive the share).
  std::unique_ptr<GroupShare> delta_share(const codec::WeightsReader& next, const RefitOptions& refit_options);
  // Version 1: this rank's part of `full` (its part's tensors whole; outliving the share) as RAW
  // pieces.
  std::unique_ptr<GroupShare> raw_share(const codec::ConstWeights& full);

  // ---- group_rank.cpp: a part rank (rank >= 1) ----
  StartReport rank_start(Clock::time_point deadline);
  void handle_coordinator(const ControlEvent& event);
  // A part rank's version (a delta, or version 1's RAW pieces: `share`): GROUP_READY, GROUP_BEGIN,
  // its part down its trees, GROUP_SENT, the coordinator's GROUP_DECIDED.
  RefitReport rank_version(GroupShare& share);
  // A group rank's weights (refit or bootstrap): one buffer per tensor, whole for every tensor of
  // its part (the others may be empty). Throws Error(invalid_argument) naming the tensor.
  void check_part_weights(const codec::ConstWeights& weights) const;
  void rank_finish();

  // ---- refit.cpp: a version's chunks on the wire (one producer, and each rank of a group) ----
  struct SentChunks {
    uint32_t chunks = 0;
    uint64_t frame_bytes = 0;  // the frames' bytes (without message headers)
    codec::DeltaStats stats;
    double encode_seconds = 0;  // summed over the encoding threads
    // The codec frames, in chunk order, when options.on_committed_delta wants them (else empty).
    std::vector<std::vector<std::byte>> frames;
  };
  // Encodes every chunk of `encoder` on the encoding threads (in index order) and delivers chunk i
  // as key first_key + i to tree f.tree_of(key) as soon as it and every earlier one are ready.
  SentChunks send_chunks(InFlight& f, codec::DeltaEncoder& encoder, uint32_t first_key);
  // RAW pieces (version 1: one producer's every tensor, or a group rank's part). Piece i of
  // `pieces` is key first_key + i of a version of `total` pieces; its body is sent from `full`.
  struct RawSend {
    const std::vector<RawPiece>* pieces = nullptr;
    uint32_t first_key = 0;
    uint32_t total = 0;
    codec::ConstWeights full;
  };
  // Piece `key` of in_flight (route: a re-send's member): the RAW header and its body in `full`.
  Outgoing raw_piece(const RawSend& raw, uint32_t key, uint32_t route) const;
  struct SentPieces {
    uint64_t hash_sum = 0;  // the sum of the pieces' raw_piece_hash: what the members ack
    uint64_t bytes = 0;
    codec::StateDigest digest;  // of `ranges` of `full`
  };
  // Delivers every piece of `raw` to tree f.tree_of(key), taking meanwhile, on a second thread,
  // the StateDigest of `ranges` of raw.full (the wire, not the scan, is the bound).
  SentPieces send_pieces(InFlight& f, const RawSend& raw, const std::vector<codec::PartRange>& ranges);
  // A group rank's chunk `key` (the version's numbering) encoded again for in_flight (a re-send):
  // Error(internal) for a key outside this rank's part.
  Outgoing part_chunk(codec::DeltaEncoder& encoder, uint32_t key, uint32_t route);

  // ---- snapshot.cpp ----
  // A rejoining member's FETCH on the producer's listener, when no peer could serve it: a
  // snapshot of the baseline (the committed version), streamed while refits go on. Replays are
  // refused (the producer keeps no frames of committed versions).
  void serve_fetch(std::shared_ptr<transport::Connection> connection, const Fetch& fetch);
};

}  // namespace deltacast::tree
