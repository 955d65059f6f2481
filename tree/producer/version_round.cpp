// The joint commit of one version attempt: the rules of version_round.h's top comment.
#include "tree/producer/version_round.h"

#include "util/error.h"

#include <algorithm>

namespace deltacast::tree {

VersionRound::VersionRound(Params params) : params_(std::move(params)) {
  for (uint32_t r : params_.ranks) answers_[r] = Answer::none;
  want_active_ = params_.committed_version;
}

VersionRound::Answer VersionRound::answer(uint32_t rank) const {
  const auto it = answers_.find(rank);
  return it == answers_.end() ? Answer::none : it->second;
}

std::vector<uint32_t> VersionRound::members() const {
  std::vector<uint32_t> out;
  for (const auto& [rank, answer] : answers_) out.push_back(rank);
  return out;
}

bool VersionRound::pending() const {
  return std::any_of(answers_.begin(), answers_.end(), [](const auto& a) { return a.second == Answer::none; });
}

void VersionRound::refuse(uint32_t rank, const std::string& why) {
  answers_[rank] = Answer::refused;
  if (abort_reason_.empty()) abort_reason_ = "rank " + std::to_string(rank) + ": " + why;
}

VersionRound::Actions VersionRound::ack(uint32_t rank, const Ack& ack) {
  if (ack.version != params_.version || ack.attempt != params_.attempt) return {};
  const auto it = answers_.find(rank);
  if (it == answers_.end() || it->second != Answer::none) return {};
  it->second = Answer::verified;
  ack_digests_[rank] = ack.digest;
  return {};
}

VersionRound::Actions VersionRound::nack(uint32_t rank, const Nack& nack) {
  if (nack.version != params_.version || nack.attempt != params_.attempt || !answers_.count(rank)) return {};
  if (phase_ == Phase::deciding || phase_ == Phase::done)  // it could not apply the COMMIT
    return {FailMember{rank, FailureCause::refused,
                       "could not commit version " + std::to_string(params_.version) + ": " + nack.message}};
  refuse(rank, std::string(errc_name(static_cast<Errc>(nack.errc))) + ": " + nack.message);
  return {};
}

VersionRound::Actions VersionRound::active(uint32_t rank, const Active& active) {
  if (phase_ != Phase::deciding || !answers_.count(rank)) return {};
  if (active.version != want_active_)
    return {FailMember{
        rank, FailureCause::refused,
        "active at version " + std::to_string(active.version) + ", expected " + std::to_string(want_active_)}};
  active_.insert(rank);
  return {};
}

VersionRound::Actions VersionRound::decided(uint32_t from, const Decided& decided) {
  if (!delegated_ || delegate_ == 0 || from != delegate_ || decided.attempt != params_.attempt ||
      decided.version != params_.version || phase_ != Phase::delegated)
    return {};
  decided_by_delegate_ = true;
  for (uint32_t r : decided.active)
    if (answers_.count(r)) active_.insert(r);
  return {};
}

VersionRound::Actions VersionRound::member_lost(uint32_t rank) {
  answers_.erase(rank);
  ack_digests_.erase(rank);
  active_.erase(rank);
  if (delegate_ != rank || decided_by_delegate_) return {};
  // The delegate is out before it decided: the producer decides, from the answers it has itself
  // (members send them here too). A COMMIT the delegate sent meanwhile is the same.
  delegate_ = 0;
  return {Warn{"the commit delegate (rank " + std::to_string(rank) + ") failed before deciding version " +
               std::to_string(params_.version) + "; the producer decides"}};
}

VersionRound::Actions VersionRound::sealed(uint64_t expected_digest, std::optional<uint32_t> delegate,
                                           Clock::time_point now, std::optional<uint64_t> state_digest) {
  if (phase_ != Phase::sending) return {};
  expected_digest_ = expected_digest;
  record_digest_ = state_digest.value_or(expected_digest);
  phase_ = Phase::collecting;
  Actions out;
  if (params_.delegate_commit && !params_.dry_run && delegate && !answers_.empty()) {
    // The commit is authorised now: what every live member verifies may be committed without
    // another word from the producer, so the version is recorded first.
    out.emplace_back(RecordCommit{params_.version, record_digest_});
    delegated_ = true;
    delegate_ = *delegate;
    phase_ = Phase::delegated;
    out.emplace_back(Broadcast{Delegate{params_.version, params_.attempt, expected_digest, delegate_, members()}});
  }
  for (auto& a : tick(now)) out.push_back(std::move(a));
  return out;
}

VersionRound::Actions VersionRound::tick(Clock::time_point now) {
  switch (phase_) {
    case Phase::sending:
    case Phase::done:
      return {};
    case Phase::delegated:
      return tick_delegated(now);
    case Phase::collecting:
      return tick_collecting(now);
    case Phase::deciding:
      break;
  }
  const bool all_active =
      std::all_of(answers_.begin(), answers_.end(), [&](const auto& a) { return active_.count(a.first) > 0; });
  if (all_active) {
    phase_ = Phase::done;
  } else if (now > active_deadline_) {
    phase_ = Phase::done;
    timed_out_ = true;
  }
  return {};
}

VersionRound::Actions VersionRound::tick_delegated(Clock::time_point now) {
  if (decided_by_delegate_) return decide(now);
  Actions out;
  const auto take_back = [&] {
    phase_ = Phase::collecting;
    for (auto& a : tick_collecting(now)) out.push_back(std::move(a));
    return out;
  };
  if (delegate_ == 0 || answers_.empty()) return take_back();  // the delegate failed: the producer decides
  bool every = true;
  for (const auto& [rank, answer] : answers_) {
    const bool wrong_digest = answer == Answer::verified && ack_digests_[rank] != expected_digest_;
    if (answer == Answer::refused || wrong_digest) return take_back();  // the producer aborts
    every = every && answer == Answer::verified;
  }
  // Every member acked and the delegate stays silent (an answer did not reach it): after the
  // grace the producer commits itself, which is always safe once every member acked (the
  // delegate only ever commits the same attempt).
  if (!every) {
    all_acked_at_.reset();
  } else if (!all_acked_at_) {
    all_acked_at_ = now;
  } else if (now - *all_acked_at_ > params_.delegate_grace) {
    out.emplace_back(Warn{"no word from the commit delegate (rank " + std::to_string(delegate_) + ") " +
                          std::to_string(params_.delegate_grace.count()) + " ms after every member acked version " +
                          std::to_string(params_.version) + "; the producer commits it"});
    delegate_ = 0;
    return take_back();
  }
  if (now > params_.deadline)
    for (const auto& [rank, answer] : answers_)
      if (answer == Answer::none)
        out.emplace_back(
            FailMember{rank, FailureCause::silent,
                       "no answer to version " + std::to_string(params_.version) + " within the version timeout"});
  return out;
}

VersionRound::Actions VersionRound::tick_collecting(Clock::time_point now) {
  if (pending() && !answers_.empty()) {
    if (now <= params_.deadline) return {};
    Actions out;
    for (const auto& [rank, answer] : answers_) {
      if (answer != Answer::none) continue;
      if (delegated_)  // a delegate may have committed what it acked there: fail it, never abort
        out.emplace_back(
            FailMember{rank, FailureCause::silent,
                       "no answer to version " + std::to_string(params_.version) + " within the version timeout"});
      else
        refuse(rank, "no ack within the version timeout");
    }
    if (delegated_) return out;
  }
  return decide(now);
}

VersionRound::Actions VersionRound::decide(Clock::time_point now) {
  const bool by_delegate = decided_by_delegate_;
  bool all = !answers_.empty();
  verified_ = 0;
  if (by_delegate) {  // the delegate checked every member's digest
    verified_ = static_cast<uint32_t>(answers_.size());
  } else {
    for (auto& [rank, answer] : answers_) {
      if (answer == Answer::verified && ack_digests_[rank] != expected_digest_)
        refuse(rank, "acked a digest that differs from the producer's");
      if (answer == Answer::verified)
        ++verified_;
      else
        all = false;
    }
  }
  if (answers_.empty() && abort_reason_.empty()) abort_reason_ = "every receiver failed";
  receivers_ = static_cast<uint32_t>(answers_.size());
  committed_ = all && !params_.dry_run;
  if (all && params_.dry_run) abort_reason_ = "dry run";
  phase_ = Phase::deciding;
  want_active_ = committed_ ? params_.version : params_.committed_version;
  active_deadline_ = std::max(params_.deadline, now + params_.active_grace);
  Actions out;
  if (committed_) {
    // Recorded before any member can hold it; delegated, before the DELEGATE went out.
    if (!delegated_) out.emplace_back(RecordCommit{params_.version, record_digest_});
    const Commit commit{params_.version, params_.attempt, expected_digest_};
    if (by_delegate) {
      for (const auto& [rank, answer] : answers_)  // members the delegate did not see active
        if (!active_.count(rank)) out.emplace_back(SendTo{rank, commit});
    } else {
      out.emplace_back(Broadcast{commit});
    }
  } else {
    out.emplace_back(Broadcast{Abort{params_.version, params_.attempt, abort_reason_}});
  }
  return out;
}

std::optional<Abort> VersionRound::stop(const std::string& reason) {
  const bool safe = !decision_out();
  phase_ = Phase::done;
  if (!safe) return std::nullopt;
  if (abort_reason_.empty()) abort_reason_ = reason;
  return Abort{params_.version, params_.attempt, reason};
}

}  // namespace deltacast::tree
