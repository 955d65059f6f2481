#pragma once
// Delegated commit (docs/protocol.md, "Delegated commit"): one attempt's joint-commit decision
// taken next to the receivers, so that a cross-region refit costs one round trip instead of
// three. One object per member, driven by the member's control thread alone; the network is
// behind Hooks, so the rules are tested without it (tests/unit/tree/test_delegated_commit.cpp).
//
//  * Every member: once it knows the attempt is delegated (DELEGATE), its ACK or NACK of that
//    attempt goes to the delegate too (it always goes to the producer as well).
//  * The delegate: commits the attempt once every rank of the DELEGATE's list that is still live
//    in its epoch acked that attempt with the DELEGATE's digest: COMMIT to each of them, its own
//    commit, then DECIDED to the producer once each one answered ACTIVE (or left, or its link
//    failed: the producer commits those itself). It never aborts: only the producer does, on a
//    NACK, and a member acks or nacks an attempt, never both, so a delegate's commit and a
//    producer's abort can never both happen.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "tree/protocol.h"

namespace deltacast::tree {

class DelegatedCommit {
 public:
  struct Hooks {
    // Whether `rank` is live in this member's current epoch.
    std::function<bool(uint32_t rank)> live;
    // Member side: sends an answer to the delegate (opening the link as needed).
    std::function<void(uint32_t delegate, const Message&)> to_delegate;
    // Delegate side: sends to a member over the link its answer came on.
    std::function<void(uint32_t rank, const Message&)> to_member;
    std::function<void(const Message&)> to_producer;
    // Delegate side: commits the attempt here; returns the answer (ACTIVE, or a NACK).
    std::function<Message(const Commit&)> commit_here;
  };
  DelegatedCommit(uint32_t rank, Hooks hooks) : rank_(rank), hooks_(std::move(hooks)) {}

  // DELEGATE from the producer (an older attempt than the current one is ignored).
  void delegate(const Delegate& d);
  // This member's own ACK or NACK, of any attempt.
  void own_answer(const Message& answer);
  // Delegate side: a message on a member's link (ACK, NACK, ACTIVE, or a NACK of the COMMIT). An
  // answer ahead of this member's DELEGATE is kept until the DELEGATE comes.
  void from_member(uint32_t rank, const Message& message);
  // Delegate side: the link from `rank` failed (it will not answer ACTIVE here).
  void link_lost(uint32_t rank);
  // The live set changed (an EPOCH): ranks no longer live are not waited for.
  void membership_changed();
  // The attempt ended by the producer's word here (its COMMIT or ABORT): forget it, unless this
  // delegate committed it and still collects ACTIVEs.
  void ended(uint64_t attempt);

  // For tests and logs.
  std::optional<Delegate> current() const { return current_; }
  bool committed() const noexcept { return committed_; }
  bool decided() const noexcept { return decided_; }

 private:
  bool is_delegate() const { return current_ && current_->delegate == rank_; }
  void record(uint32_t rank, const Message& answer);
  void evaluate();
  void evaluate_decided();
  static uint64_t attempt_of(const Message& answer);

  const uint32_t rank_;
  Hooks hooks_;
  std::optional<Delegate> current_;
  std::optional<Message> own_;           // this member's latest answer
  bool own_sent_ = false;                // ... sent to the current delegate
  std::map<uint32_t, Message> answers_;  // delegate: ACK/NACK of the current attempt, by rank
  std::map<uint32_t, Message> early_;    // answers of a later attempt than the current DELEGATE's
  std::set<uint32_t> committing_;        // delegate: sent COMMIT, ACTIVE awaited
  std::set<uint32_t> active_;            // delegate: answered ACTIVE
  bool committed_ = false;
  bool decided_ = false;
};

}  // namespace deltacast::tree
