// The rules of a delegated commit (tree/delegated_commit.h), without a network: what a delegate
// sends, to whom and when, and what it never does (commit without every live member's ACK with
// the producer's digest; commit an attempt the producer ended).
#include "tree/delegated_commit.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace deltacast::tree {
namespace {

constexpr uint64_t kVersion = 7, kAttempt = 42, kDigest = 0xd16e57;

// Records what a DelegatedCommit sends through its hooks.
struct Wire {
  std::set<uint32_t> dead;
  std::vector<std::pair<uint32_t, Message>> to_delegate;
  std::vector<std::pair<uint32_t, Message>> to_member;
  std::vector<Message> to_producer;
  std::vector<Commit> committed_here;

  DelegatedCommit::Hooks hooks(uint32_t self) {
    DelegatedCommit::Hooks h;
    h.live = [this](uint32_t r) { return !dead.count(r); };
    h.to_delegate = [this](uint32_t d, const Message& m) { to_delegate.emplace_back(d, m); };
    h.to_member = [this](uint32_t r, const Message& m) { to_member.emplace_back(r, m); };
    h.to_producer = [this](const Message& m) { to_producer.push_back(m); };
    h.commit_here = [this, self](const Commit& c) -> Message {
      committed_here.push_back(c);
      return Active{self, c.version, kDigest};
    };
    return h;
  }
  std::set<uint32_t> commits_sent() const {
    std::set<uint32_t> ranks;
    for (const auto& [r, m] : to_member)
      if (const auto* c = std::get_if<Commit>(&m)) {
        EXPECT_EQ(c->version, kVersion);
        EXPECT_EQ(c->attempt, kAttempt);
        EXPECT_EQ(c->digest, kDigest);
        ranks.insert(r);
      }
    return ranks;
  }
};

Delegate delegate_to(uint32_t delegate, std::vector<uint32_t> ranks, uint64_t attempt = kAttempt) {
  return Delegate{kVersion, attempt, kDigest, delegate, std::move(ranks)};
}
Ack ack(uint32_t rank, uint64_t digest = kDigest, uint64_t attempt = kAttempt) {
  return Ack{rank, kVersion, digest, 10, attempt};
}

TEST(DelegatedCommit, CommitsOnceEveryMemberAckedThenReportsTheActiveOnes) {
  Wire w;
  DelegatedCommit d(1, w.hooks(1));
  d.delegate(delegate_to(1, {1, 2, 3}));
  d.own_answer(ack(1));
  d.from_member(2, ack(2));
  EXPECT_FALSE(d.committed());
  EXPECT_TRUE(w.committed_here.empty());
  d.from_member(3, ack(3));
  ASSERT_TRUE(d.committed());
  EXPECT_EQ(w.commits_sent(), (std::set<uint32_t>{2, 3}));
  ASSERT_EQ(w.committed_here.size(), 1u);
  EXPECT_TRUE(w.to_producer.empty()) << "DECIDED before every ACTIVE";
  d.from_member(2, Active{2, kVersion, kDigest});
  EXPECT_TRUE(w.to_producer.empty());
  d.from_member(3, Active{3, kVersion, kDigest});
  ASSERT_EQ(w.to_producer.size(), 1u);
  const auto& decided = std::get<Decided>(w.to_producer[0]);
  EXPECT_EQ(decided.rank, 1u);
  EXPECT_EQ(decided.version, kVersion);
  EXPECT_EQ(decided.attempt, kAttempt);
  EXPECT_EQ(decided.active, (std::vector<uint32_t>{1, 2, 3}));
  // Nothing more: a second copy of an answer commits nothing twice.
  d.from_member(3, ack(3));
  EXPECT_EQ(w.committed_here.size(), 1u);
  EXPECT_EQ(w.to_producer.size(), 1u);
}

TEST(DelegatedCommit, NeverCommitsOverANackOrAnotherDigest) {
  for (bool nack : {true, false}) {
    Wire w;
    DelegatedCommit d(1, w.hooks(1));
    d.delegate(delegate_to(1, {1, 2, 3}));
    d.own_answer(ack(1));
    d.from_member(2, ack(2));
    if (nack)
      d.from_member(3, Nack{3, kVersion, 4, "refused", kAttempt});
    else
      d.from_member(3, ack(3, kDigest + 1));
    EXPECT_FALSE(d.committed()) << (nack ? "NACK" : "digest");
    EXPECT_TRUE(w.to_member.empty());
    EXPECT_TRUE(w.committed_here.empty());
    EXPECT_TRUE(w.to_producer.empty()) << "the delegate never aborts: the producer does";
  }
}

TEST(DelegatedCommit, AnswersOfAnotherAttemptDoNotCount) {
  Wire w;
  DelegatedCommit d(1, w.hooks(1));
  d.delegate(delegate_to(1, {1, 2}));
  d.own_answer(ack(1));
  d.from_member(2, ack(2, kDigest, kAttempt - 1));  // a late ACK of an aborted attempt
  EXPECT_FALSE(d.committed());
  d.from_member(2, ack(2));
  EXPECT_TRUE(d.committed());
}

TEST(DelegatedCommit, AMemberThatLeftIsNotWaitedFor) {
  Wire w;
  DelegatedCommit d(1, w.hooks(1));
  d.delegate(delegate_to(1, {1, 2, 3}));
  d.own_answer(ack(1));
  d.from_member(2, ack(2));
  EXPECT_FALSE(d.committed());
  w.dead.insert(3);  // the producer's EPOCH: rank 3 is out
  d.membership_changed();
  ASSERT_TRUE(d.committed());
  EXPECT_EQ(w.commits_sent(), (std::set<uint32_t>{2}));
  // Rank 2 dies before its ACTIVE: DECIDED goes out without it (the producer commits the rest).
  w.dead.insert(2);
  d.membership_changed();
  ASSERT_EQ(w.to_producer.size(), 1u);
  EXPECT_EQ(std::get<Decided>(w.to_producer[0]).active, (std::vector<uint32_t>{1}));
}

TEST(DelegatedCommit, ALostLinkOrANackedCommitLeavesThatMemberToTheProducer) {
  Wire w;
  DelegatedCommit d(1, w.hooks(1));
  d.delegate(delegate_to(1, {1, 2, 3}));
  d.own_answer(ack(1));
  d.from_member(2, ack(2));
  d.from_member(3, ack(3));
  ASSERT_TRUE(d.committed());
  d.link_lost(2);
  EXPECT_TRUE(w.to_producer.empty());
  d.from_member(3, Nack{3, kVersion, 9, "COMMIT for a version this member has not verified", kAttempt});
  ASSERT_EQ(w.to_producer.size(), 1u);
  EXPECT_EQ(std::get<Decided>(w.to_producer[0]).active, (std::vector<uint32_t>{1}));
}

TEST(DelegatedCommit, AnAttemptTheProducerEndedIsNeverCommitted) {
  Wire w;
  DelegatedCommit d(1, w.hooks(1));
  d.delegate(delegate_to(1, {1, 2}));
  d.own_answer(ack(1));
  d.ended(kAttempt);  // the producer's ABORT reached this member
  d.from_member(2, ack(2));
  EXPECT_FALSE(d.committed());
  EXPECT_TRUE(w.committed_here.empty());
  // An older DELEGATE arriving late changes nothing either.
  d.delegate(delegate_to(1, {1, 2}, kAttempt - 1));
  d.from_member(2, ack(2, kDigest, kAttempt - 1));
  EXPECT_TRUE(w.committed_here.empty());
}

TEST(DelegatedCommit, AMemberSendsItsAnswerToTheDelegateOnceWhicheverCameFirst) {
  {
    Wire w;  // the answer first, then DELEGATE
    DelegatedCommit m(2, w.hooks(2));
    m.own_answer(ack(2));
    EXPECT_TRUE(w.to_delegate.empty());
    m.delegate(delegate_to(1, {1, 2}));
    ASSERT_EQ(w.to_delegate.size(), 1u);
    EXPECT_EQ(w.to_delegate[0].first, 1u);
    EXPECT_EQ(std::get<Ack>(w.to_delegate[0].second).rank, 2u);
    m.delegate(delegate_to(1, {1, 2}));  // repeated
    EXPECT_EQ(w.to_delegate.size(), 1u);
  }
  {
    Wire w;  // DELEGATE first, then the answer (a NACK goes too)
    DelegatedCommit m(2, w.hooks(2));
    m.delegate(delegate_to(1, {1, 2}));
    EXPECT_TRUE(w.to_delegate.empty());
    m.own_answer(Nack{2, kVersion, 4, "refused", kAttempt});
    ASSERT_EQ(w.to_delegate.size(), 1u);
    EXPECT_TRUE(std::holds_alternative<Nack>(w.to_delegate[0].second));
    EXPECT_TRUE(w.committed_here.empty()) << "a member never commits on its own";
  }
  {
    Wire w;  // an answer of an older attempt is not sent
    DelegatedCommit m(2, w.hooks(2));
    m.own_answer(ack(2, kDigest, kAttempt - 1));
    m.delegate(delegate_to(1, {1, 2}));
    EXPECT_TRUE(w.to_delegate.empty());
  }
}

TEST(DelegatedCommit, AnswersThatArriveBeforeTheDelegateKnowsAreKept) {
  // The members' DELEGATE came first and they answered before the delegate read its own.
  Wire w;
  DelegatedCommit d(1, w.hooks(1));
  d.from_member(2, ack(2));
  d.from_member(3, ack(3));
  d.own_answer(ack(1));
  EXPECT_FALSE(d.committed());
  d.delegate(delegate_to(1, {1, 2, 3}));
  EXPECT_TRUE(d.committed());
  EXPECT_EQ(w.commits_sent(), (std::set<uint32_t>{2, 3}));
  // Early answers of an older attempt are dropped when its DELEGATE is a later one.
  Wire w2;
  DelegatedCommit d2(1, w2.hooks(1));
  d2.from_member(2, ack(2, kDigest, kAttempt - 1));
  d2.own_answer(ack(1));
  d2.delegate(delegate_to(1, {1, 2}));
  EXPECT_FALSE(d2.committed());
}

TEST(DelegatedCommit, AMemberAckingAfterTheCommitIsCommittedToo) {
  // Rank 3 was out in the delegate's epoch when it committed, and its ACK comes late: it gets
  // the COMMIT (the version is decided; its bits are the same).
  Wire w;
  DelegatedCommit d(1, w.hooks(1));
  w.dead.insert(3);
  d.delegate(delegate_to(1, {1, 2, 3}));
  d.own_answer(ack(1));
  d.from_member(2, ack(2));
  ASSERT_TRUE(d.committed());
  d.from_member(3, ack(3));
  EXPECT_EQ(w.commits_sent(), (std::set<uint32_t>{2, 3}));
}

}  // namespace
}  // namespace deltacast::tree
