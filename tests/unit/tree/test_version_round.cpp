// The producer's joint commit of one version attempt (tree/producer/version_round.h), without a
// network or a clock: what it broadcasts, sends, records and fails for each answer, loss and tick,
// collecting, delegated and deciding, and what it never does (commit without every member's ACK of
// the expected digest; abort once a decision or a DELEGATE is out; count a silent member of a
// delegated attempt as a refusal).
#include "tree/producer/version_round.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "util/error.h"

namespace deltacast::tree {

// Readable names in failure messages (found by argument-dependent lookup, so not in the
// anonymous namespace).
[[maybe_unused]] static void PrintTo(VersionRound::Phase phase, std::ostream* os) {
  static const char* const names[] = {"sending", "collecting", "delegated", "deciding", "done"};
  *os << names[static_cast<int>(phase)];
}
[[maybe_unused]] static void PrintTo(VersionRound::Answer answer, std::ostream* os) {
  static const char* const names[] = {"none", "verified", "refused"};
  *os << names[static_cast<int>(answer)];
}

namespace {

using namespace std::chrono_literals;
using Phase = VersionRound::Phase;
using Answer = VersionRound::Answer;
using Strings = std::vector<std::string>;

constexpr uint64_t kVersion = 8, kAttempt = 5, kCommitted = 7, kDigest = 77, kOtherDigest = 66;

// Fixed time points: the round never reads the clock.
VersionRound::Clock::time_point at(int64_t ms) {
  return VersionRound::Clock::time_point{} + std::chrono::milliseconds(ms);
}
// The version timeout ends here; ACTIVE may come until max(kDeadline, decision + 10 s).
constexpr int64_t kDeadline = 5000;

VersionRound::Params params(std::vector<uint32_t> ranks = {1, 2, 3}) {
  VersionRound::Params p;
  p.version = kVersion;
  p.attempt = kAttempt;
  p.committed_version = kCommitted;
  p.ranks = std::move(ranks);
  p.deadline = at(kDeadline);
  p.delegate_grace = 1000ms;
  p.active_grace = 10000ms;
  return p;
}
VersionRound::Params delegating(std::vector<uint32_t> ranks = {1, 2, 3}) {
  auto p = params(std::move(ranks));
  p.delegate_commit = true;
  return p;
}

Ack ack(uint32_t rank, uint64_t digest = kDigest, uint64_t version = kVersion, uint64_t attempt = kAttempt) {
  return Ack{rank, version, digest, 10, attempt};
}
Nack nack(uint32_t rank, Errc errc, std::string message, uint64_t attempt = kAttempt) {
  return Nack{rank, kVersion, static_cast<uint32_t>(errc), std::move(message), attempt};
}
Active active(uint32_t rank, uint64_t version) { return Active{rank, version, kDigest}; }
Decided decided(uint32_t delegate, std::vector<uint32_t> active_ranks, uint64_t attempt = kAttempt,
                uint64_t version = kVersion) {
  return Decided{delegate, version, attempt, kDigest, std::move(active_ranks)};
}

std::string cause_name(FailureCause cause) {
  switch (cause) {
    case FailureCause::refused:
      return "refused";
    case FailureCause::silent:
      return "silent";
    default:
      return "cause " + std::to_string(static_cast<int>(cause));
  }
}
std::string describe(const Message& m) {
  if (const auto* c = std::get_if<Commit>(&m))
    return "COMMIT v" + std::to_string(c->version) + " a" + std::to_string(c->attempt) + " d" +
           std::to_string(c->digest);
  if (const auto* a = std::get_if<Abort>(&m))
    return "ABORT v" + std::to_string(a->version) + " a" + std::to_string(a->attempt) + " (" + a->reason + ")";
  if (const auto* d = std::get_if<Delegate>(&m)) {
    std::string ranks;
    for (uint32_t r : d->ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    return "DELEGATE v" + std::to_string(d->version) + " a" + std::to_string(d->attempt) + " d" +
           std::to_string(d->digest) + " to " + std::to_string(d->delegate) + " of " + ranks;
  }
  return "another message (index " + std::to_string(m.index()) + ")";
}
// One line per action, every field in it, so that a test compares the whole answer at once.
Strings describe(const VersionRound::Actions& actions) {
  Strings out;
  for (const auto& action : actions) {
    if (const auto* b = std::get_if<VersionRound::Broadcast>(&action))
      out.push_back("broadcast " + describe(b->message));
    else if (const auto* s = std::get_if<VersionRound::SendTo>(&action))
      out.push_back("send " + std::to_string(s->rank) + " " + describe(s->message));
    else if (const auto* f = std::get_if<VersionRound::FailMember>(&action))
      out.push_back("fail " + std::to_string(f->rank) + " " + cause_name(f->cause) + ": " + f->detail);
    else if (const auto* r = std::get_if<VersionRound::RecordCommit>(&action))
      out.push_back("record v" + std::to_string(r->version) + " d" + std::to_string(r->digest));
    else if (const auto* w = std::get_if<VersionRound::Warn>(&action))
      out.push_back("warn: " + w->text);
  }
  return out;
}

constexpr const char* kBroadcastCommit = "broadcast COMMIT v8 a5 d77";
constexpr const char* kRecordLine = "record v8 d77";
constexpr const char* kDelegateLine = "broadcast DELEGATE v8 a5 d77 to 1 of 1,2,3";
std::string abort_line(const std::string& reason) { return "broadcast ABORT v8 a5 (" + reason + ")"; }

// A round whose members 1..3 all acked kDigest and that decided to commit at t=100.
VersionRound committed_round() {
  VersionRound round(params());
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  const auto out = round.sealed(kDigest, std::nullopt, at(100));
  EXPECT_EQ(describe(out), (Strings{kRecordLine, kBroadcastCommit}));
  EXPECT_EQ(round.phase(), Phase::deciding);
  return round;
}
// A delegated round (delegate: rank 1) of members 1..3, DELEGATE out at t=100, no answer yet.
VersionRound delegated_round(VersionRound::Params p = delegating()) {
  VersionRound round(std::move(p));
  const auto out = round.sealed(kDigest, 1u, at(100));
  EXPECT_EQ(describe(out), (Strings{kRecordLine, kDelegateLine}));
  EXPECT_EQ(round.phase(), Phase::delegated);
  return round;
}

// ---------------------------------------------------------------- collecting

TEST(VersionRound, ACommitNeedsEveryMembersAckOfTheExpectedDigest) {
  VersionRound round(params());
  EXPECT_EQ(round.phase(), Phase::sending);
  EXPECT_FALSE(round.decision_out());
  EXPECT_EQ(round.want_active(), kCommitted);
  // ACKs count while data still goes out.
  EXPECT_TRUE(round.ack(1, ack(1)).empty());
  EXPECT_EQ(round.answer(1), Answer::verified);
  EXPECT_TRUE(round.sealed(kDigest, std::nullopt, at(100)).empty()) << "ranks 2 and 3 have not answered";
  EXPECT_EQ(round.phase(), Phase::collecting);
  EXPECT_EQ(round.expected_digest(), kDigest);
  EXPECT_TRUE(round.ack(2, ack(2)).empty());
  EXPECT_TRUE(round.tick(at(200)).empty());
  EXPECT_FALSE(round.decision_out());
  EXPECT_TRUE(round.ack(3, ack(3)).empty());
  // The version is recorded before the COMMIT can reach anyone.
  EXPECT_EQ(describe(round.tick(at(300))), (Strings{kRecordLine, kBroadcastCommit}));
  EXPECT_EQ(round.phase(), Phase::deciding);
  EXPECT_TRUE(round.decision_out());
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.abort_reason(), "");
  EXPECT_EQ(round.receivers(), 3u);
  EXPECT_EQ(round.verified_receivers(), 3u);
  EXPECT_EQ(round.commit_delegate(), 0u);
  EXPECT_EQ(round.want_active(), kVersion);
  // Every member must now say ACTIVE at the new version.
  EXPECT_TRUE(round.active(1, active(1, kVersion)).empty());
  EXPECT_TRUE(round.active(2, active(2, kVersion)).empty());
  EXPECT_TRUE(round.tick(at(400)).empty());
  EXPECT_EQ(round.phase(), Phase::deciding);
  EXPECT_TRUE(round.active(3, active(3, kVersion)).empty());
  EXPECT_TRUE(round.tick(at(500)).empty());
  EXPECT_TRUE(round.done());
  EXPECT_TRUE(round.committed());
  EXPECT_FALSE(round.timed_out());
  // Done: nothing more happens.
  EXPECT_TRUE(round.tick(at(600)).empty());
  EXPECT_TRUE(round.done());
}

TEST(VersionRound, ARawBootstrapIsAckedByItsPiecesSumAndRecordedUnderItsStateDigest) {
  constexpr uint64_t kState = 4242;
  for (bool delegating_round : {false, true}) {
    SCOPED_TRACE(delegating_round ? "delegated" : "the producer decides");
    VersionRound round(delegating_round ? delegating() : params());
    for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
    const auto out =
        round.sealed(kDigest, delegating_round ? std::optional<uint32_t>(1u) : std::nullopt, at(100), kState);
    // Members ack (and COMMIT or DELEGATE name) the pieces' sum; the record is the StateDigest,
    // the digest a member holding the version says at HELLO.
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(describe(out)[0], "record v8 d4242");
    EXPECT_EQ(describe(out)[1], delegating_round ? kDelegateLine : kBroadcastCommit);
    EXPECT_EQ(round.expected_digest(), kDigest);
    EXPECT_EQ(round.record_digest(), kState);
  }
  VersionRound plain(params());
  plain.sealed(kDigest, std::nullopt, at(100));
  EXPECT_EQ(plain.record_digest(), kDigest) << "a delta's ack digest is its StateDigest";
}

TEST(VersionRound, NothingIsDecidedWhileDataIsStillGoingOut) {
  VersionRound round(params());
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  EXPECT_TRUE(round.tick(at(kDeadline + 1)).empty());
  EXPECT_EQ(round.phase(), Phase::sending);
  EXPECT_FALSE(round.decision_out());
  // Sealed once every answer is in: the decision comes at once.
  EXPECT_EQ(describe(round.sealed(kDigest, std::nullopt, at(kDeadline + 2))), (Strings{kRecordLine, kBroadcastCommit}));
  EXPECT_TRUE(round.committed());
  // A second seal changes nothing.
  EXPECT_TRUE(round.sealed(kDigest, std::nullopt, at(kDeadline + 3)).empty());
  EXPECT_EQ(round.phase(), Phase::deciding);
}

TEST(VersionRound, AnAckOfAnotherDigestAbortsNamingTheRank) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  round.ack(1, ack(1));
  round.ack(2, ack(2, kOtherDigest));
  round.ack(3, ack(3));
  const std::string reason = "rank 2: acked a digest that differs from the producer's";
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{abort_line(reason)})) << "no RecordCommit, no COMMIT";
  EXPECT_EQ(round.phase(), Phase::deciding);
  EXPECT_TRUE(round.decision_out());
  EXPECT_FALSE(round.committed());
  EXPECT_EQ(round.abort_reason(), reason);
  EXPECT_EQ(round.answer(2), Answer::refused);
  EXPECT_EQ(round.receivers(), 3u);
  EXPECT_EQ(round.verified_receivers(), 2u);
  // After an abort, members hold the committed version again.
  EXPECT_EQ(round.want_active(), kCommitted);
  for (uint32_t r : {1u, 2u, 3u}) EXPECT_TRUE(round.active(r, active(r, kCommitted)).empty());
  EXPECT_TRUE(round.tick(at(300)).empty());
  EXPECT_TRUE(round.done());
  EXPECT_FALSE(round.committed());
  EXPECT_FALSE(round.timed_out());
}

TEST(VersionRound, ANackAbortsNamingTheRankTheErrcAndTheMessageOnceEveryMemberAnswered) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  EXPECT_TRUE(round.nack(2, nack(2, Errc::verify_failed, "bits differ")).empty());
  EXPECT_EQ(round.answer(2), Answer::refused);
  const std::string reason = "rank 2: verify_failed: bits differ";
  EXPECT_EQ(round.abort_reason(), reason);
  // The others are still waited for.
  EXPECT_TRUE(round.tick(at(200)).empty());
  EXPECT_EQ(round.phase(), Phase::collecting);
  EXPECT_FALSE(round.decision_out());
  round.ack(1, ack(1));
  round.ack(3, ack(3));
  EXPECT_EQ(describe(round.tick(at(300))), (Strings{abort_line(reason)}));
  EXPECT_FALSE(round.committed());
  EXPECT_EQ(round.verified_receivers(), 2u);
  EXPECT_EQ(round.want_active(), kCommitted);
}

TEST(VersionRound, TheFirstReasonWins) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  round.ack(1, ack(1, kOtherDigest));  // a digest is judged at the decision, after the NACKs
  round.nack(3, nack(3, Errc::io, "disk full"));
  round.nack(2, nack(2, Errc::verify_failed, "bits differ"));
  const std::string reason = "rank 3: io: disk full";
  EXPECT_EQ(round.abort_reason(), reason);
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{abort_line(reason)}));
  EXPECT_EQ(round.abort_reason(), reason);
  EXPECT_EQ(round.verified_receivers(), 0u);
  EXPECT_EQ(round.answer(1), Answer::refused) << "the other digest is a refusal too";
}

TEST(VersionRound, ANackAfterAnAckStillRefuses) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  for (uint32_t r : {1u, 2u}) round.ack(r, ack(r));
  round.nack(2, nack(2, Errc::state, "rolled back"));
  EXPECT_EQ(round.answer(2), Answer::refused);
  round.ack(3, ack(3));
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{abort_line("rank 2: state: rolled back")}));
}

TEST(VersionRound, ADryRunVerifiesEverywhereAndCommitsNowhere) {
  auto p = params();
  p.dry_run = true;
  VersionRound round(p);
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  EXPECT_EQ(describe(round.sealed(kDigest, std::nullopt, at(100))), (Strings{abort_line("dry run")}));
  EXPECT_FALSE(round.committed());
  EXPECT_EQ(round.abort_reason(), "dry run");
  EXPECT_EQ(round.verified_receivers(), 3u);
  EXPECT_EQ(round.want_active(), kCommitted);

  // A refusal in a dry run keeps its own reason.
  VersionRound refused(p);
  refused.nack(1, nack(1, Errc::verify_failed, "bits differ"));
  for (uint32_t r : {2u, 3u}) refused.ack(r, ack(r));
  EXPECT_EQ(describe(refused.sealed(kDigest, std::nullopt, at(100))),
            (Strings{abort_line("rank 1: verify_failed: bits differ")}));
}

TEST(VersionRound, ASilentMemberCountsAsARefusalAtTheDeadline) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  round.ack(1, ack(1));
  round.ack(2, ack(2));
  EXPECT_TRUE(round.tick(at(kDeadline)).empty()) << "the deadline itself is still in time";
  const std::string reason = "rank 3: no ack within the version timeout";
  EXPECT_EQ(describe(round.tick(at(kDeadline + 1))), (Strings{abort_line(reason)})) << "refused, never failed";
  EXPECT_EQ(round.answer(3), Answer::refused);
  EXPECT_EQ(round.abort_reason(), reason);
  EXPECT_FALSE(round.committed());
  EXPECT_EQ(round.receivers(), 3u);
  EXPECT_EQ(round.verified_receivers(), 2u);
  EXPECT_EQ(round.members(), (std::vector<uint32_t>{1, 2, 3}));
}

TEST(VersionRound, AMemberLostWhileCollectingLeavesTheAttemptToTheRest) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  round.ack(1, ack(1));
  round.ack(2, ack(2));
  EXPECT_TRUE(round.member_lost(3).empty());
  EXPECT_EQ(round.members(), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{kRecordLine, kBroadcastCommit}));
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.receivers(), 2u);
  EXPECT_EQ(round.verified_receivers(), 2u);
  // A lost member's answers no longer count.
  EXPECT_TRUE(round.ack(3, ack(3)).empty());
  EXPECT_EQ(round.answer(3), Answer::none);
  round.active(1, active(1, kVersion));
  round.active(2, active(2, kVersion));
  round.tick(at(300));
  EXPECT_TRUE(round.done());
  EXPECT_FALSE(round.timed_out());
}

TEST(VersionRound, ALostMembersRefusalNoLongerCountsButItsReasonStays) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  round.nack(3, nack(3, Errc::io, "disk full"));
  round.member_lost(3);
  round.ack(1, ack(1));
  round.ack(2, ack(2));
  // The rest decide: they all acked, the attempt commits. The reason the NACK gave stays
  // (the original joint_commit reported it with the commit all the same).
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{kRecordLine, kBroadcastCommit}));
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.receivers(), 2u);
  EXPECT_EQ(round.abort_reason(), "rank 3: io: disk full");
}

TEST(VersionRound, WhenEveryMemberIsLostTheAttemptAborts) {
  VersionRound round(params());
  round.ack(1, ack(1));
  for (uint32_t r : {1u, 2u, 3u}) EXPECT_TRUE(round.member_lost(r).empty());
  EXPECT_TRUE(round.members().empty());
  EXPECT_EQ(describe(round.sealed(kDigest, std::nullopt, at(100))), (Strings{abort_line("every receiver failed")}));
  EXPECT_FALSE(round.committed());
  EXPECT_EQ(round.abort_reason(), "every receiver failed");
  EXPECT_EQ(round.receivers(), 0u);
  EXPECT_EQ(round.verified_receivers(), 0u);
  // No ACTIVE to wait for.
  EXPECT_TRUE(round.tick(at(200)).empty());
  EXPECT_TRUE(round.done());
  EXPECT_FALSE(round.timed_out());

  // Lost while collecting, the same.
  VersionRound later(params());
  later.sealed(kDigest, std::nullopt, at(100));
  for (uint32_t r : {1u, 2u, 3u}) later.member_lost(r);
  EXPECT_EQ(describe(later.tick(at(200))), (Strings{abort_line("every receiver failed")}));
}

TEST(VersionRound, LateAcksOfAnotherAttemptOrVersionAreIgnored) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  round.ack(1, ack(1));
  round.ack(2, ack(2));
  EXPECT_TRUE(round.ack(3, ack(3, kDigest, kVersion, kAttempt - 1)).empty());  // the aborted attempt's
  EXPECT_TRUE(round.ack(3, ack(3, kDigest, kVersion - 1, kAttempt)).empty());  // another version's
  EXPECT_TRUE(round.nack(3, nack(3, Errc::io, "old", kAttempt - 1)).empty());
  EXPECT_EQ(round.answer(3), Answer::none);
  EXPECT_EQ(round.abort_reason(), "");
  EXPECT_TRUE(round.tick(at(200)).empty()) << "rank 3 is still waited for";
  EXPECT_EQ(round.phase(), Phase::collecting);
  round.ack(3, ack(3));
  EXPECT_EQ(describe(round.tick(at(300))), (Strings{kRecordLine, kBroadcastCommit}));
}

TEST(VersionRound, OnlyTheFirstAnswerOfAMemberCounts) {
  // A second ACK does not replace the first one's digest.
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  round.ack(1, ack(1, kOtherDigest));
  EXPECT_TRUE(round.ack(1, ack(1)).empty());
  round.ack(2, ack(2));
  round.ack(3, ack(3));
  EXPECT_EQ(describe(round.tick(at(200))),
            (Strings{abort_line("rank 1: acked a digest that differs from the producer's")}));

  // An ACK after a NACK does not flip it.
  VersionRound nacked(params());
  nacked.sealed(kDigest, std::nullopt, at(100));
  nacked.nack(1, nack(1, Errc::verify_failed, "bits differ"));
  EXPECT_TRUE(nacked.ack(1, ack(1)).empty());
  EXPECT_EQ(nacked.answer(1), Answer::refused);
  nacked.ack(2, ack(2));
  nacked.ack(3, ack(3));
  EXPECT_EQ(describe(nacked.tick(at(200))), (Strings{abort_line("rank 1: verify_failed: bits differ")}));
}

TEST(VersionRound, AnswersFromRanksOutsideTheAttemptAreIgnored) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  EXPECT_TRUE(round.ack(9, ack(9, kOtherDigest)).empty());
  EXPECT_TRUE(round.nack(9, nack(9, Errc::io, "not a member")).empty());
  EXPECT_EQ(round.answer(9), Answer::none);
  EXPECT_EQ(round.members(), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(round.abort_reason(), "");
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{kRecordLine, kBroadcastCommit}));
  EXPECT_EQ(round.receivers(), 3u);
  // Nor does its ACTIVE, of whatever version, count or fail anyone.
  EXPECT_TRUE(round.active(9, active(9, kCommitted)).empty());
  EXPECT_TRUE(round.nack(9, nack(9, Errc::io, "not a member")).empty());
}

// ---------------------------------------------------------------- deciding

TEST(VersionRound, AnActiveBeforeTheDecisionIsIgnored) {
  VersionRound round(params());
  round.sealed(kDigest, std::nullopt, at(100));
  EXPECT_TRUE(round.active(1, active(1, kCommitted)).empty()) << "no version is wanted yet: nobody fails";
  EXPECT_TRUE(round.active(1, active(1, kVersion)).empty());
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  round.tick(at(200));
  round.active(2, active(2, kVersion));
  round.active(3, active(3, kVersion));
  round.tick(at(300));
  EXPECT_EQ(round.phase(), Phase::deciding) << "rank 1's early ACTIVE does not count";
  round.active(1, active(1, kVersion));
  round.tick(at(400));
  EXPECT_TRUE(round.done());
}

TEST(VersionRound, ANackOfTheCommitFailsTheMember) {
  VersionRound round = committed_round();
  EXPECT_EQ(describe(round.nack(2, nack(2, Errc::io, "no space left"))),
            (Strings{"fail 2 refused: could not commit version 8: no space left"}));
  EXPECT_TRUE(round.committed()) << "the version stays committed";
  EXPECT_EQ(round.abort_reason(), "");
  // A NACK of another attempt fails nobody.
  EXPECT_TRUE(round.nack(3, nack(3, Errc::io, "old", kAttempt - 1)).empty());
  // The producer fails it: it is no longer awaited.
  EXPECT_TRUE(round.member_lost(2).empty());
  round.active(1, active(1, kVersion));
  round.active(3, active(3, kVersion));
  round.tick(at(200));
  EXPECT_TRUE(round.done());
  EXPECT_FALSE(round.timed_out());
  EXPECT_TRUE(round.committed());
}

TEST(VersionRound, AnActiveAtAnotherVersionFailsTheMember) {
  VersionRound round = committed_round();
  EXPECT_EQ(describe(round.active(2, active(2, kCommitted))),
            (Strings{"fail 2 refused: active at version 7, expected 8"}));
  round.active(1, active(1, kVersion));
  round.active(3, active(3, kVersion));
  round.tick(at(200));
  EXPECT_EQ(round.phase(), Phase::deciding) << "rank 2 is awaited until it is lost";
  round.member_lost(2);
  round.tick(at(300));
  EXPECT_TRUE(round.done());
  EXPECT_FALSE(round.timed_out());

  // After an abort, ACTIVE must name the committed version.
  VersionRound aborted(params());
  aborted.nack(1, nack(1, Errc::io, "disk full"));
  aborted.ack(2, ack(2));
  aborted.ack(3, ack(3));
  aborted.sealed(kDigest, std::nullopt, at(100));
  ASSERT_FALSE(aborted.committed());
  EXPECT_EQ(describe(aborted.active(3, active(3, kVersion))),
            (Strings{"fail 3 refused: active at version 8, expected 7"}));
  EXPECT_TRUE(aborted.active(2, active(2, kCommitted)).empty());
}

TEST(VersionRound, AnActiveFromALostMemberIsIgnored) {
  VersionRound round = committed_round();
  round.member_lost(2);
  EXPECT_TRUE(round.active(2, active(2, kCommitted)).empty()) << "not failed again";
  EXPECT_TRUE(round.active(2, active(2, kVersion)).empty());
  EXPECT_EQ(round.members(), (std::vector<uint32_t>{1, 3}));
  round.active(1, active(1, kVersion));
  round.tick(at(200));
  EXPECT_EQ(round.phase(), Phase::deciding) << "rank 3 is still awaited";
}

TEST(VersionRound, AMemberLostWhileDecidingIsNoLongerAwaited) {
  VersionRound round = committed_round();
  round.active(1, active(1, kVersion));
  round.active(3, active(3, kVersion));
  EXPECT_TRUE(round.tick(at(200)).empty());
  EXPECT_EQ(round.phase(), Phase::deciding);
  EXPECT_TRUE(round.member_lost(2).empty());
  EXPECT_TRUE(round.tick(at(300)).empty());
  EXPECT_TRUE(round.done());
  EXPECT_FALSE(round.timed_out());
  EXPECT_TRUE(round.committed());
}

TEST(VersionRound, WithoutEveryActiveTheRoundEndsTimedOutAtTheDecisionPlusTheGrace) {
  VersionRound round = committed_round();  // decided at t=100: ACTIVEs until 100 + 10000
  round.active(1, active(1, kVersion));
  round.active(2, active(2, kVersion));
  EXPECT_TRUE(round.tick(at(kDeadline + 1)).empty());
  EXPECT_TRUE(round.tick(at(10100)).empty());
  EXPECT_EQ(round.phase(), Phase::deciding);
  EXPECT_FALSE(round.timed_out());
  EXPECT_TRUE(round.tick(at(10101)).empty());
  EXPECT_TRUE(round.done());
  EXPECT_TRUE(round.timed_out());
  EXPECT_TRUE(round.committed()) << "a COMMIT that went out stays committed";
  EXPECT_EQ(round.want_active(), kVersion);
}

TEST(VersionRound, WithoutEveryActiveTheRoundEndsTimedOutAtTheDeadlineWhenThatIsLater) {
  auto p = params();
  p.active_grace = 1000ms;
  VersionRound round(p);
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  round.sealed(kDigest, std::nullopt, at(100));  // decided at t=100: ACTIVEs until the deadline
  ASSERT_EQ(round.phase(), Phase::deciding);
  round.tick(at(1101));
  EXPECT_FALSE(round.done());
  round.tick(at(kDeadline));
  EXPECT_FALSE(round.done());
  round.tick(at(kDeadline + 1));
  EXPECT_TRUE(round.done());
  EXPECT_TRUE(round.timed_out());

  // An abort decided at the deadline: ACTIVEs until decision + grace.
  VersionRound late(p);
  late.sealed(kDigest, std::nullopt, at(100));
  late.ack(1, ack(1));
  EXPECT_EQ(describe(late.tick(at(6000))), (Strings{abort_line("rank 2: no ack within the version timeout")}));
  late.tick(at(7000));
  EXPECT_FALSE(late.done());
  late.tick(at(7001));
  EXPECT_TRUE(late.done());
  EXPECT_TRUE(late.timed_out());
  EXPECT_FALSE(late.committed());
}

// ---------------------------------------------------------------- delegated

TEST(VersionRound, ADelegatedAttemptIsRecordedBeforeTheDelegateIsNamed) {
  VersionRound round = delegated_round();  // RecordCommit, then DELEGATE (checked there)
  EXPECT_TRUE(round.decision_out()) << "an ABORT now could cross the delegate's COMMIT";
  EXPECT_EQ(round.commit_delegate(), 1u);
  EXPECT_FALSE(round.committed());
  EXPECT_TRUE(round.tick(at(200)).empty());

  // DELEGATE names the members still live.
  VersionRound fewer(delegating({1, 2, 3, 4}));
  fewer.member_lost(3);
  EXPECT_EQ(describe(fewer.sealed(kDigest, 4u, at(100))),
            (Strings{kRecordLine, "broadcast DELEGATE v8 a5 d77 to 4 of 1,2,4"}));
  EXPECT_EQ(fewer.commit_delegate(), 4u);
}

TEST(VersionRound, TheDelegatesDecisionCommitsAndCommitGoesOnlyWhereNoActiveWasSeen) {
  VersionRound round = delegated_round();
  round.ack(2, ack(2));  // answers here may be partial: the delegate saw them all
  EXPECT_TRUE(round.decided(1, decided(1, {1, 3, 9})).empty());
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{"send 2 COMMIT v8 a5 d77"})) << "recorded at the DELEGATE already";
  EXPECT_EQ(round.phase(), Phase::deciding);
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.abort_reason(), "");
  EXPECT_EQ(round.commit_delegate(), 1u);
  EXPECT_EQ(round.receivers(), 3u);
  EXPECT_EQ(round.verified_receivers(), 3u) << "the delegate checked every member's digest";
  EXPECT_EQ(round.want_active(), kVersion);
  // Ranks 1 and 3 are active already (DECIDED said so); rank 2 answers the producer's COMMIT.
  EXPECT_TRUE(round.tick(at(300)).empty());
  EXPECT_EQ(round.phase(), Phase::deciding);
  round.active(2, active(2, kVersion));
  round.tick(at(400));
  EXPECT_TRUE(round.done());
  EXPECT_FALSE(round.timed_out());
  // A second DECIDED is ignored.
  EXPECT_TRUE(round.decided(1, decided(1, {1, 2, 3})).empty());
}

TEST(VersionRound, EveryMemberActiveAtTheDelegateNeedsNoCommitFromTheProducer) {
  VersionRound round = delegated_round();
  round.member_lost(3);
  round.decided(1, decided(1, {1, 2, 3}));  // rank 3 is no member now
  EXPECT_TRUE(round.tick(at(200)).empty());
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.receivers(), 2u);
  round.tick(at(300));
  EXPECT_TRUE(round.done());
}

TEST(VersionRound, DecidedFromAnotherRankAttemptOrVersionIsIgnored) {
  VersionRound round = delegated_round();
  EXPECT_TRUE(round.decided(2, decided(2, {1, 2, 3})).empty());
  EXPECT_TRUE(round.decided(1, decided(1, {1, 2, 3}, kAttempt - 1)).empty());
  EXPECT_TRUE(round.decided(1, decided(1, {1, 2, 3}, kAttempt, kVersion - 1)).empty());
  EXPECT_TRUE(round.tick(at(200)).empty());
  EXPECT_EQ(round.phase(), Phase::delegated);
  EXPECT_FALSE(round.committed());
  // Nor before a delegate was named.
  VersionRound plain(params());
  EXPECT_TRUE(plain.decided(1, decided(1, {1, 2, 3})).empty());
  plain.sealed(kDigest, std::nullopt, at(100));
  EXPECT_TRUE(plain.decided(1, decided(1, {1, 2, 3})).empty());
  EXPECT_TRUE(plain.tick(at(200)).empty());
  EXPECT_FALSE(plain.committed());
  EXPECT_EQ(plain.phase(), Phase::collecting);
}

TEST(VersionRound, ADelegateLostBeforeDecidingLeavesTheDecisionToTheProducer) {
  VersionRound round = delegated_round();
  round.ack(2, ack(2));
  EXPECT_EQ(describe(round.member_lost(1)),
            (Strings{"warn: the commit delegate (rank 1) failed before deciding version 8; the producer decides"}));
  EXPECT_EQ(round.commit_delegate(), 0u);
  EXPECT_TRUE(round.decision_out()) << "the DELEGATE is out all the same";
  EXPECT_TRUE(round.tick(at(200)).empty()) << "rank 3 is waited for";
  EXPECT_FALSE(round.committed());
  // The delegate's DECIDED, if it comes anyway, is not taken.
  EXPECT_TRUE(round.decided(1, decided(1, {1, 2, 3})).empty());
  round.ack(3, ack(3));
  EXPECT_EQ(describe(round.tick(at(300))), (Strings{kBroadcastCommit})) << "recorded once, before the DELEGATE";
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.receivers(), 2u);
  EXPECT_EQ(round.verified_receivers(), 2u);
  EXPECT_EQ(round.commit_delegate(), 0u);
}

TEST(VersionRound, ADelegateLostAfterItDecidedChangesNothing) {
  VersionRound round = delegated_round();
  round.decided(1, decided(1, {1, 2, 3}));
  EXPECT_TRUE(round.member_lost(1).empty()) << "no warning: it decided";
  EXPECT_EQ(round.commit_delegate(), 1u);
  EXPECT_TRUE(round.tick(at(200)).empty()) << "every member is active at the delegate";
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.receivers(), 2u);
}

TEST(VersionRound, AMemberRefusingADelegatedAttemptMakesTheProducerAbort) {
  VersionRound round = delegated_round();
  round.ack(1, ack(1));
  round.nack(2, nack(2, Errc::verify_failed, "bits differ"));
  EXPECT_TRUE(round.tick(at(200)).empty()) << "rank 3 is still waited for";
  round.ack(3, ack(3));
  const std::string reason = "rank 2: verify_failed: bits differ";
  EXPECT_EQ(describe(round.tick(at(300))), (Strings{abort_line(reason)}));
  EXPECT_FALSE(round.committed());
  EXPECT_EQ(round.abort_reason(), reason);
  EXPECT_EQ(round.want_active(), kCommitted);
  EXPECT_EQ(round.verified_receivers(), 2u);

  // Another digest, the same.
  VersionRound digest = delegated_round();
  digest.ack(1, ack(1));
  digest.ack(2, ack(2));
  digest.ack(3, ack(3, kOtherDigest));
  EXPECT_EQ(describe(digest.tick(at(200))),
            (Strings{abort_line("rank 3: acked a digest that differs from the producer's")}));
  EXPECT_FALSE(digest.committed());
}

TEST(VersionRound, AfterARefusalOfADelegatedAttemptSilentMembersAreFailedNotRefused) {
  VersionRound round = delegated_round();
  round.ack(1, ack(1));
  round.nack(2, nack(2, Errc::verify_failed, "bits differ"));
  round.tick(at(200));
  EXPECT_EQ(describe(round.tick(at(kDeadline + 1))),
            (Strings{"fail 3 silent: no answer to version 8 within the version timeout"}));
  EXPECT_EQ(round.answer(3), Answer::none);
  EXPECT_EQ(round.phase(), Phase::collecting) << "the round keeps waiting";
  EXPECT_EQ(round.abort_reason(), "rank 2: verify_failed: bits differ");
  round.member_lost(3);
  EXPECT_EQ(describe(round.tick(at(kDeadline + 20))), (Strings{abort_line("rank 2: verify_failed: bits differ")}));
}

TEST(VersionRound, EveryMemberAckedAndTheDelegateSilentTheProducerCommitsAfterTheGrace) {
  VersionRound round = delegated_round();
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  EXPECT_TRUE(round.tick(at(200)).empty()) << "the grace starts";
  EXPECT_TRUE(round.tick(at(1200)).empty()) << "the grace is not over";
  EXPECT_EQ(round.phase(), Phase::delegated);
  EXPECT_EQ(describe(round.tick(at(1201))),
            (Strings{"warn: no word from the commit delegate (rank 1) 1000 ms after every member acked version 8; "
                     "the producer commits it",
                     kBroadcastCommit}))
      << "no second RecordCommit";
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.commit_delegate(), 0u);
  EXPECT_EQ(round.verified_receivers(), 3u);
  EXPECT_EQ(round.phase(), Phase::deciding);
  // The delegate's DECIDED, late, changes nothing.
  EXPECT_TRUE(round.decided(1, decided(1, {1, 2, 3})).empty());
  EXPECT_TRUE(round.tick(at(1300)).empty());
  EXPECT_EQ(round.phase(), Phase::deciding);
}

TEST(VersionRound, TheGraceStartsOnceEveryRemainingMemberAcked) {
  VersionRound round(delegating({1, 2, 3, 4}));
  EXPECT_EQ(describe(round.sealed(kDigest, 1u, at(100))),
            (Strings{kRecordLine, "broadcast DELEGATE v8 a5 d77 to 1 of 1,2,3,4"}));
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  EXPECT_TRUE(round.tick(at(200)).empty());
  EXPECT_TRUE(round.tick(at(2000)).empty()) << "rank 4 has not acked: no grace runs";
  round.member_lost(4);
  EXPECT_TRUE(round.tick(at(2100)).empty()) << "the grace starts here";
  EXPECT_TRUE(round.tick(at(3100)).empty());
  EXPECT_FALSE(round.committed());
  const auto out = describe(round.tick(at(3101)));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1], kBroadcastCommit);
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.receivers(), 3u);
}

TEST(VersionRound, PastTheDeadlineSilentMembersOfADelegatedAttemptAreFailedNeverRefused) {
  VersionRound round = delegated_round();
  round.ack(1, ack(1));
  round.ack(2, ack(2));
  EXPECT_TRUE(round.tick(at(kDeadline)).empty());
  const Strings fail3{"fail 3 silent: no answer to version 8 within the version timeout"};
  EXPECT_EQ(describe(round.tick(at(kDeadline + 1))), fail3);
  EXPECT_EQ(round.phase(), Phase::delegated) << "the round keeps waiting";
  EXPECT_EQ(round.abort_reason(), "");
  EXPECT_EQ(round.answer(3), Answer::none);
  // Until the producer fails it, every tick asks again.
  EXPECT_EQ(describe(round.tick(at(kDeadline + 20))), fail3);
  round.member_lost(3);
  EXPECT_TRUE(round.tick(at(kDeadline + 40)).empty()) << "the delegate decides";
  EXPECT_EQ(round.phase(), Phase::delegated);
  round.decided(1, decided(1, {1, 2}));
  EXPECT_TRUE(round.tick(at(kDeadline + 60)).empty());
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.receivers(), 2u);
}

TEST(VersionRound, EveryMemberOfADelegatedAttemptLostItAborts) {
  VersionRound round = delegated_round();
  EXPECT_EQ(describe(round.member_lost(1)).size(), 1u) << "the delegate's warning";
  EXPECT_TRUE(round.member_lost(2).empty());
  EXPECT_TRUE(round.member_lost(3).empty());
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{abort_line("every receiver failed")}));
  EXPECT_FALSE(round.committed());
  EXPECT_EQ(round.receivers(), 0u);
}

TEST(VersionRound, AnAttemptWithoutMembersIsNeverDelegated) {
  VersionRound round(delegating());
  for (uint32_t r : {1u, 2u, 3u}) round.member_lost(r);
  EXPECT_EQ(describe(round.sealed(kDigest, 1u, at(100))), (Strings{abort_line("every receiver failed")}))
      << "no RecordCommit, no DELEGATE";
  EXPECT_EQ(round.commit_delegate(), 0u);
}

TEST(VersionRound, TheDelegatesDecisionStandsOverARefusalThatCameAfterIt) {
  VersionRound round = delegated_round();
  round.decided(1, decided(1, {1, 2, 3}));
  round.nack(2, nack(2, Errc::io, "late"));  // DECIDED came first: the delegate had rank 2's ACK
  EXPECT_TRUE(round.tick(at(200)).empty());
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.phase(), Phase::deciding);
}

TEST(VersionRound, NoDelegateInADryRun) {
  auto p = delegating();
  p.dry_run = true;
  VersionRound round(p);
  EXPECT_TRUE(round.sealed(kDigest, 1u, at(100)).empty()) << "no RecordCommit, no DELEGATE";
  EXPECT_EQ(round.phase(), Phase::collecting);
  EXPECT_EQ(round.commit_delegate(), 0u);
  EXPECT_FALSE(round.decision_out());
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{abort_line("dry run")}));
  // A silent member is a refusal: nothing was delegated.
  VersionRound silent(p);
  silent.sealed(kDigest, 1u, at(100));
  silent.ack(1, ack(1));
  silent.ack(2, ack(2));
  EXPECT_EQ(describe(silent.tick(at(kDeadline + 1))),
            (Strings{abort_line("rank 3: no ack within the version timeout")}));
}

TEST(VersionRound, NoDelegateWithoutARootOfTreeZero) {
  VersionRound round(delegating());
  EXPECT_TRUE(round.sealed(kDigest, std::nullopt, at(100)).empty());
  EXPECT_EQ(round.phase(), Phase::collecting);
  EXPECT_EQ(round.commit_delegate(), 0u);
  EXPECT_FALSE(round.decision_out());
  for (uint32_t r : {1u, 2u, 3u}) round.ack(r, ack(r));
  EXPECT_EQ(describe(round.tick(at(200))), (Strings{kRecordLine, kBroadcastCommit}));
  EXPECT_TRUE(round.committed());
}

// The producer's joint_commit before VersionRound chose "silent members are failed, not refused"
// by the option (delegate_commit && !dry_run), not by whether a DELEGATE went out: with the option
// on and no root of tree 0 to delegate to, a silent member was failed and the rest committed.
// With no root to delegate to, no DELEGATE went out, so nothing can have committed behind the
// producer's back: a silent member counts as a refusal at the deadline, as without the option.
TEST(VersionRound, WithTheDelegateOptionButNoRootSilentMembersRefuseAtTheDeadline) {
  VersionRound round(delegating());
  round.sealed(kDigest, std::nullopt, at(100));
  round.ack(1, ack(1));
  round.ack(2, ack(2));
  EXPECT_TRUE(round.tick(at(kDeadline)).empty());
  EXPECT_EQ(describe(round.tick(at(kDeadline + 1))),
            (Strings{abort_line("rank 3: no ack within the version timeout")}));
  EXPECT_EQ(round.phase(), Phase::deciding);
  EXPECT_FALSE(round.committed());
}

// ---------------------------------------------------------------- stop

TEST(VersionRound, StopAbortsWhileNoDecisionIsOut) {
  const std::string reason = "the producer stopped this version";
  VersionRound sending(params());
  const auto a = sending.stop(reason);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(describe(Message{*a}), "ABORT v8 a5 (" + reason + ")");
  EXPECT_TRUE(sending.done());
  EXPECT_FALSE(sending.committed());
  EXPECT_EQ(sending.abort_reason(), reason);
  // Ended: nothing more comes of it.
  for (uint32_t r : {1u, 2u, 3u}) sending.ack(r, ack(r));
  EXPECT_TRUE(sending.sealed(kDigest, std::nullopt, at(100)).empty());
  EXPECT_TRUE(sending.tick(at(200)).empty());
  EXPECT_FALSE(sending.committed());

  VersionRound collecting(params());
  collecting.sealed(kDigest, std::nullopt, at(100));
  collecting.ack(1, ack(1));
  const auto b = collecting.stop(reason);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(describe(Message{*b}), "ABORT v8 a5 (" + reason + ")");
  EXPECT_TRUE(collecting.done());
  EXPECT_TRUE(collecting.tick(at(200)).empty());
}

TEST(VersionRound, StopSendsNothingOnceADelegateIsNamed) {
  VersionRound round = delegated_round();
  EXPECT_FALSE(round.stop("the producer stopped this version").has_value());
  EXPECT_TRUE(round.done());
  // Taken back by the producer, still not: the DELEGATE is out.
  VersionRound taken_back = delegated_round();
  taken_back.member_lost(1);
  taken_back.tick(at(200));
  EXPECT_EQ(taken_back.phase(), Phase::collecting);
  EXPECT_FALSE(taken_back.stop("the producer stopped this version").has_value());
}

TEST(VersionRound, StopSendsNothingOnceTheDecisionIsOut) {
  VersionRound round = committed_round();
  EXPECT_FALSE(round.stop("the producer stopped this version").has_value());
  EXPECT_TRUE(round.done());
  EXPECT_TRUE(round.committed());
  EXPECT_EQ(round.abort_reason(), "");

  VersionRound aborted(params());
  aborted.nack(1, nack(1, Errc::io, "disk full"));
  aborted.ack(2, ack(2));
  aborted.ack(3, ack(3));
  aborted.sealed(kDigest, std::nullopt, at(100));
  EXPECT_FALSE(aborted.stop("the producer stopped this version").has_value());
  EXPECT_EQ(aborted.abort_reason(), "rank 1: io: disk full");
}

}  // namespace
}  // namespace deltacast::tree
