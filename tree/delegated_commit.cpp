#include "tree/delegated_commit.h"

#include <vector>

#include "util/error.h"
#include "util/log.h"

namespace deltacast::tree {

uint64_t DelegatedCommit::attempt_of(const Message& answer) {
  if (const auto* ack = std::get_if<Ack>(&answer)) return ack->attempt;
  if (const auto* nack = std::get_if<Nack>(&answer)) return nack->attempt;
  return 0;
}

void DelegatedCommit::delegate(const Delegate& d) {
  if (current_ && d.attempt < current_->attempt) return;
  if (current_ && d.attempt == current_->attempt) return;  // already known
  current_ = d;
  answers_.clear();
  committing_.clear();
  active_.clear();
  committed_ = decided_ = false;
  own_sent_ = false;
  if (own_) own_answer(*own_);
  // Members whose DELEGATE came first may have answered before this member knew it decides.
  std::map<uint32_t, Message> early;
  early.swap(early_);
  for (const auto& [rank, answer] : early)
    if (is_delegate()) record(rank, answer);
  evaluate();
}

void DelegatedCommit::own_answer(const Message& answer) {
  own_ = answer;
  if (!current_ || attempt_of(answer) != current_->attempt) return;
  if (is_delegate()) {
    record(rank_, answer);
    evaluate();
    return;
  }
  if (own_sent_) return;
  own_sent_ = true;
  try {
    hooks_.to_delegate(current_->delegate, answer);
  } catch (const Error& e) {
    // The producer has this answer too: if the delegate is gone, the producer decides.
    logger("tree")->warn("rank {}: could not send the delegate (rank {}) this member's answer: {}", rank_,
                         current_->delegate, e.what());
  }
}

void DelegatedCommit::record(uint32_t rank, const Message& answer) {
  if (!current_ || attempt_of(answer) != current_->attempt) return;
  answers_.emplace(rank, answer);  // the first answer of a rank counts
  if (committed_ && std::holds_alternative<Ack>(answer) && !committing_.count(rank) && !active_.count(rank) &&
      rank != rank_) {
    // Acked after this delegate committed (it was not live here then): it may commit too.
    committing_.insert(rank);
    hooks_.to_member(rank, Commit{current_->version, current_->attempt, current_->digest});
  }
}

void DelegatedCommit::from_member(uint32_t rank, const Message& message) {
  const bool answer = std::holds_alternative<Ack>(message) || std::holds_alternative<Nack>(message);
  if (!current_ || attempt_of(message) > current_->attempt) {
    // Ahead of this member's DELEGATE (it travels on another link): kept until it comes.
    if (answer) early_[rank] = message;
    return;
  }
  if (!is_delegate()) return;
  if (std::holds_alternative<Ack>(message) || (std::holds_alternative<Nack>(message) && !committing_.count(rank))) {
    record(rank, message);
    evaluate();
    return;
  }
  if (!committed_ || !committing_.count(rank)) return;
  if (const auto* active = std::get_if<Active>(&message); active && active->version == current_->version)
    active_.insert(rank);
  // A NACK of the COMMIT (or ACTIVE at another version): not active; the producer deals with it.
  committing_.erase(rank);
  evaluate_decided();
}

void DelegatedCommit::link_lost(uint32_t rank) {
  if (!is_delegate()) return;
  committing_.erase(rank);
  if (!committed_) answers_.erase(rank);  // an answer may come again on a new link
  evaluate_decided();
}

void DelegatedCommit::membership_changed() {
  evaluate();
  evaluate_decided();
}

void DelegatedCommit::ended(uint64_t attempt) {
  if (!current_ || current_->attempt != attempt) return;
  if (committed_ && !decided_) return;  // still collecting ACTIVEs for the producer
  if (!committed_) current_.reset();
}

void DelegatedCommit::evaluate() {
  if (!is_delegate() || committed_) return;
  const Delegate& d = *current_;
  for (uint32_t r : d.ranks) {
    if (!hooks_.live(r)) continue;
    auto it = answers_.find(r);
    if (it == answers_.end()) return;  // still waiting
    const auto* ack = std::get_if<Ack>(&it->second);
    if (!ack || ack->version != d.version || ack->digest != d.digest) return;  // the producer aborts
  }
  committed_ = true;
  const Commit commit{d.version, d.attempt, d.digest};
  for (uint32_t r : d.ranks) {
    if (r == rank_ || !hooks_.live(r)) continue;
    committing_.insert(r);
    try {
      hooks_.to_member(r, commit);
    } catch (const Error& e) {
      committing_.erase(r);  // the producer commits it itself
      logger("tree")->warn("rank {}: could not send COMMIT to rank {}: {}", rank_, r, e.what());
    }
  }
  const Message mine = hooks_.commit_here(commit);
  if (const auto* active = std::get_if<Active>(&mine); active && active->version == d.version) active_.insert(rank_);
  evaluate_decided();
}

void DelegatedCommit::evaluate_decided() {
  if (!is_delegate() || !committed_ || decided_) return;
  for (uint32_t r : committing_)
    if (hooks_.live(r)) return;  // ACTIVE still awaited
  decided_ = true;
  Decided decided{rank_, current_->version, current_->attempt, current_->digest, {}};
  for (uint32_t r : active_)
    if (hooks_.live(r)) decided.active.push_back(r);
  try {
    hooks_.to_producer(decided);
  } catch (const Error& e) {
    logger("tree")->warn("rank {}: could not tell the producer version {} committed: {}", rank_, current_->version,
                         e.what());
  }
}

}  // namespace deltacast::tree
