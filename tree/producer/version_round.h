#pragma once
// One version attempt's joint commit, as the producer decides it (docs/protocol.md, "Joint
// commit" and "Delegated commit"): a pure state machine. No sockets, no threads, no clock: the
// producer feeds it what members say, the members it lost and the time (tick), and it answers with
// Actions (what to broadcast or send, whom to fail). Unit tests: tests/unit/tree/test_version_round.cpp.
//
// The rule, in one place:
//  * The attempt's members are the live ranks when it started. A member that is lost leaves
//    the attempt (member_lost); the rest decide it.
//  * sending: data goes out; ACKs and NACKs of this attempt are recorded as they come.
//  * sealed(): everything was sent and the expected digest is known.
//     - Delegated (option, not a dry run, a root of tree 0 to delegate to): the commit is
//       authorised first (RecordCommit: a producer state file), DELEGATE goes out and the
//       delegate decides. The producer takes the decision back when the delegate is lost before
//       deciding, when a member refused or acked another digest (the producer aborts), or when
//       every member acked and the delegate stayed silent for delegate_grace (it commits).
//       Past the deadline, silent members are failed, never counted as refusals: a delegate may
//       have committed what they acked to it, and an ABORT could cross that COMMIT.
//     - Otherwise (collecting): once every member answered, or at the deadline (silent members
//       count as refusals then, unless a DELEGATE went out), the producer decides: COMMIT
//       when every member acked the expected digest (and it is not a dry run), ABORT otherwise,
//       naming the first reason.
//  * deciding: COMMIT or ABORT is out; every member must answer ACTIVE at the version it now
//    holds (the new one, or the committed one after an abort). A NACK of the COMMIT or an ACTIVE
//    at another version fails that member. When ACTIVEs do not all come by the later of the
//    deadline and decision + active_grace, the round ends timed out.
//  * done.
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "tree/protocol.h"

namespace deltacast::tree {

class VersionRound {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Phase { sending, collecting, delegated, deciding, done };
  enum class Answer { none, verified, refused };

  struct Params {
    uint64_t version = 0;  // the version this attempt tries to create
    uint64_t attempt = 0;
    uint64_t committed_version = 0;  // what members hold again after an abort
    std::vector<uint32_t> ranks;     // the attempt's members: live when it started
    bool delegate_commit = false;    // options.delegate_commit
    bool dry_run = false;            // verify everywhere, commit nowhere
    Clock::time_point deadline;      // the version timeout, from the attempt's start
    // How long the producer waits for a silent delegate once every member acked.
    std::chrono::milliseconds delegate_grace{1000};
    // ACTIVE may come until max(deadline, the decision + active_grace).
    std::chrono::milliseconds active_grace{10000};
  };

  // ---- actions: what the producer must do, in order ----
  struct Broadcast {  // to every live member
    Message message;
  };
  struct SendTo {  // to one member
    uint32_t rank = 0;
    Message message;
  };
  struct FailMember {  // drop it from the live set (the producer repairs the trees); then member_lost()
    uint32_t rank = 0;
    FailureCause cause = FailureCause::refused;
    std::string detail;
  };
  struct RecordCommit {  // the version is authorised to commit: record it durably before it is out
    uint64_t version = 0;
    uint64_t digest = 0;
  };
  struct Warn {  // worth a warning in the log
    std::string text;
  };
  using Action = std::variant<Broadcast, SendTo, FailMember, RecordCommit, Warn>;
  using Actions = std::vector<Action>;

  explicit VersionRound(Params params);

  // ---- events ----
  // A member's ACK, NACK, ACTIVE; the delegate's DECIDED. Messages of another version or
  // attempt, from ranks outside the attempt, or duplicates are ignored.
  Actions ack(uint32_t rank, const Ack& ack);
  Actions nack(uint32_t rank, const Nack& nack);
  Actions active(uint32_t rank, const Active& active);
  Actions decided(uint32_t from, const Decided& decided);
  // `rank` is no longer live (the producer failed it, for whatever reason).
  Actions member_lost(uint32_t rank);
  // Everything of the attempt was sent; `expected_digest` is the digest members must ack.
  // `delegate` is the root of tree 0 (absent: none live). `state_digest`: the version's combined
  // StateDigest when members ack another digest (a RAW bootstrap acks its pieces' hash sum): what
  // RecordCommit records and record_digest() says (absent: expected_digest). Then ticks.
  Actions sealed(uint64_t expected_digest, std::optional<uint32_t> delegate, Clock::time_point now,
                 std::optional<uint64_t> state_digest = std::nullopt);
  // The time: decisions, deadlines and graces are taken here.
  Actions tick(Clock::time_point now);
  // The producer stopped the attempt (an error while sending): the ABORT to broadcast, when one
  // cannot cross a decision (no COMMIT, ABORT or DELEGATE out yet). Ends the round.
  std::optional<Abort> stop(const std::string& reason);

  // ---- the outcome ----
  Phase phase() const noexcept { return phase_; }
  bool done() const noexcept { return phase_ == Phase::done; }
  bool committed() const noexcept { return committed_; }
  bool timed_out() const noexcept { return timed_out_; }  // done without every ACTIVE
  // Whether COMMIT, ABORT or DELEGATE went out (an abort now could cross a commit).
  bool decision_out() const noexcept { return delegated_ || phase_ == Phase::deciding || phase_ == Phase::done; }
  const std::string& abort_reason() const noexcept { return abort_reason_; }
  uint32_t receivers() const noexcept { return receivers_; }
  uint32_t verified_receivers() const noexcept { return verified_; }
  uint32_t commit_delegate() const noexcept { return delegate_; }  // 0: the producer decides
  uint64_t want_active() const noexcept { return want_active_; }   // the version ACTIVE must name
  uint64_t expected_digest() const noexcept { return expected_digest_; }
  // The digest the version is recorded under (its StateDigest; sealed()'s state_digest).
  uint64_t record_digest() const noexcept { return record_digest_; }
  const Params& params() const noexcept { return params_; }
  Answer answer(uint32_t rank) const;
  std::vector<uint32_t> members() const;  // the attempt's members still live

 private:
  Actions tick_delegated(Clock::time_point now);
  Actions tick_collecting(Clock::time_point now);
  Actions decide(Clock::time_point now);
  bool pending() const;
  void refuse(uint32_t rank, const std::string& why);

  Params params_;
  Phase phase_ = Phase::sending;
  std::map<uint32_t, Answer> answers_;        // the attempt's live members
  std::map<uint32_t, uint64_t> ack_digests_;  // what each verified member acked
  std::set<uint32_t> active_;                 // answered ACTIVE (here, or to the delegate)
  uint64_t expected_digest_ = 0;
  uint64_t record_digest_ = 0;
  bool delegated_ = false;  // DELEGATE went out
  uint32_t delegate_ = 0;   // the delegate while it decides (0: the producer)
  bool decided_by_delegate_ = false;
  std::optional<Clock::time_point> all_acked_at_;  // delegated: since when every member acked
  Clock::time_point active_deadline_;
  uint64_t want_active_ = 0;
  bool committed_ = false;
  bool timed_out_ = false;
  std::string abort_reason_;
  uint32_t receivers_ = 0;
  uint32_t verified_ = 0;
};

}  // namespace deltacast::tree
