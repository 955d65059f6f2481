// FrameStore: first sight per attempt, the in-flight byte budget, RESUME plans (by tree, by the
// child's have-bitmap, RAW pieces by whether they landed), and the archive of committed versions
// that a rejoining peer replays.
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tree/frame_store.h"
#include "tree/protocol.h"

namespace deltacast::tree {
namespace {

// A FRAME message of exactly `size` bytes (a stand-in payload: the store does not parse frames).
SharedBytes frame_message(size_t size, uint64_t attempt, uint8_t fill = 0) {
  const size_t overhead = kMessageHeaderSize + kEnvelopeSize;
  EXPECT_GE(size, overhead);
  std::vector<std::byte> payload(size - overhead, std::byte{fill});
  auto bytes = encode_frame_message(payload, Envelope{attempt, 0});
  EXPECT_EQ(bytes.size(), size);
  return std::make_shared<const std::vector<std::byte>>(std::move(bytes));
}

SharedBytes raw_message(uint64_t attempt, uint32_t chunk, uint32_t count) {
  const RawChunkHeader h{{attempt, 0}, 1, chunk, count, 0, uint64_t{chunk} * 8, 8};
  return std::make_shared<const std::vector<std::byte>>(encode_raw_message(h));
}

std::vector<uint32_t> chunks_of(const std::vector<StoredMessage>& sent) {
  std::vector<uint32_t> out;
  for (const auto& s : sent) out.push_back(s.chunk);
  return out;
}

using Chunks = std::vector<uint32_t>;
constexpr size_t kBig = size_t{1} << 30;

// Sees chunks 0..k-1 and the seal (chunk k) of `version` under `attempt`, on tree 0; returns them.
std::vector<SharedBytes> see_version(FrameStore& store, uint64_t attempt, uint64_t version, uint32_t k) {
  std::vector<SharedBytes> messages;
  for (uint32_t c = 0; c <= k; ++c) messages.push_back(frame_message(64 + c, attempt, static_cast<uint8_t>(version)));
  // Out of order: the seal first, then the chunks backwards.
  for (uint32_t c = k + 1; c-- > 0;) EXPECT_TRUE(store.first_sight(attempt, version, c, 0, messages[c]));
  return messages;
}

TEST(FrameStore, FirstSightIsTrueOncePerChunkOfAnAttempt) {
  FrameStore store(kBig, 4);
  auto m0 = frame_message(64, 1), m1 = frame_message(64, 1);
  EXPECT_TRUE(store.first_sight(1, 2, 0, 0, m0));
  EXPECT_FALSE(store.first_sight(1, 2, 0, 0, m0));
  EXPECT_FALSE(store.first_sight(1, 2, 0, 1, m0)) << "the same chunk on another tree is not new";
  EXPECT_TRUE(store.first_sight(1, 2, 1, 1, m1));
  EXPECT_FALSE(store.first_sight(1, 2, 1, 0, m1));
}

TEST(FrameStore, ANewAttemptForgetsTheOldOne) {
  FrameStore store(kBig, 4);
  EXPECT_TRUE(store.first_sight(1, 2, 0, 0, frame_message(64, 1)));
  EXPECT_TRUE(store.first_sight(1, 2, 3, 0, frame_message(64, 1)));
  // The retry of version 2 under attempt 2: every chunk is new again.
  EXPECT_TRUE(store.first_sight(2, 2, 0, 0, frame_message(64, 2)));
  auto state = store.resume_state();
  EXPECT_EQ(state.attempt, 2u);
  EXPECT_EQ(state.version, 2u);
  EXPECT_EQ(state.have, (std::vector<bool>{true}));
  auto plan = store.plan_resume(0, 0, {});
  EXPECT_EQ(chunks_of(plan.send), Chunks{0});
  EXPECT_TRUE(plan.gaps.empty());
  EXPECT_EQ(plan.attempt, 2u);
  EXPECT_EQ(plan.version, 2u);
  // What the old attempt saw no longer counts, nor do its landings and forgets.
  EXPECT_TRUE(store.first_sight(2, 2, 3, 0, frame_message(64, 2)));
  store.forget(1, 3);
  EXPECT_FALSE(store.first_sight(2, 2, 3, 0, frame_message(64, 2)));
}

TEST(FrameStore, ResumeStateIsABitmapOfTheChunksSeen) {
  FrameStore store(kBig, 4);
  EXPECT_EQ(store.resume_state().attempt, 0u);
  EXPECT_TRUE(store.resume_state().have.empty());
  for (uint32_t c : {5u, 0u, 2u}) store.first_sight(7, 9, c, c % 2, frame_message(64, 7));
  const auto state = store.resume_state();
  EXPECT_EQ(state.version, 9u);
  EXPECT_EQ(state.attempt, 7u);
  EXPECT_EQ(state.have, (std::vector<bool>{true, false, true, false, false, true}));
}

TEST(FrameStore, MessagesOverTheBudgetAreSeenButNotKeptAndBecomeGaps) {
  FrameStore store(250, 4);  // room for three 80-byte messages
  std::vector<SharedBytes> ms;
  for (uint32_t c = 0; c < 5; ++c) {
    ms.push_back(frame_message(80, 3));
    EXPECT_TRUE(store.first_sight(3, 4, c, 0, ms.back())) << c;
  }
  for (uint32_t c = 0; c < 5; ++c) EXPECT_FALSE(store.first_sight(3, 4, c, 0, ms[c])) << "seen: " << c;
  auto plan = store.plan_resume(0, 0, {});
  EXPECT_EQ(chunks_of(plan.send), (Chunks{0, 1, 2}));
  EXPECT_EQ(plan.gaps, (Chunks{3, 4}));
  for (const auto& s : plan.send) {
    EXPECT_EQ(s.message, ms[s.chunk]) << "the kept message is the one seen (shared, not copied)";
    EXPECT_TRUE(s.body.empty());
    EXPECT_FALSE(s.raw);
    EXPECT_EQ(s.tree, 0);
  }
  // Exactly at the budget is kept: forgetting a kept message frees its bytes.
  store.forget(3, 1);
  FrameStore exact(240, 4);
  for (uint32_t c = 0; c < 4; ++c) exact.first_sight(3, 4, c, 0, frame_message(80, 3));
  EXPECT_EQ(chunks_of(exact.plan_resume(0, 0, {}).send), (Chunks{0, 1, 2}));
  EXPECT_EQ(exact.plan_resume(0, 0, {}).gaps, Chunks{3});
  EXPECT_TRUE(store.first_sight(3, 4, 1, 0, ms[1])) << "a forgotten chunk is new again";
  EXPECT_TRUE(store.first_sight(3, 4, 5, 0, frame_message(80, 3)));
  plan = store.plan_resume(0, 0, {});
  EXPECT_EQ(chunks_of(plan.send), (Chunks{0, 1, 2})) << "chunk 1 kept again; chunk 5 over the budget";
  EXPECT_EQ(plan.gaps, (Chunks{3, 4, 5}));
}

TEST(FrameStore, ANewAttemptStartsWithAFreshBudget) {
  FrameStore store(100, 4);
  store.first_sight(1, 1, 0, 0, frame_message(80, 1));
  store.first_sight(1, 1, 1, 0, frame_message(80, 1));
  store.first_sight(2, 1, 0, 0, frame_message(80, 2));
  auto plan = store.plan_resume(0, 0, {});
  EXPECT_EQ(chunks_of(plan.send), Chunks{0});
  EXPECT_TRUE(plan.gaps.empty());
}

TEST(FrameStore, PlanResumeFiltersByTree) {
  FrameStore store(kBig, 4);
  for (uint32_t c = 0; c < 6; ++c) store.first_sight(4, 2, c, static_cast<int>(c % 2), frame_message(64, 4));
  auto plan0 = store.plan_resume(0, 0, {});
  auto plan1 = store.plan_resume(1, 0, {});
  EXPECT_EQ(chunks_of(plan0.send), (Chunks{0, 2, 4}));
  EXPECT_EQ(chunks_of(plan1.send), (Chunks{1, 3, 5}));
  for (const auto& s : plan1.send) EXPECT_EQ(s.tree, 1);
  EXPECT_TRUE(store.plan_resume(2, 0, {}).send.empty());
}

TEST(FrameStore, PlanResumeSkipsWhatTheChildHoldsOnlyWhenItsAttemptMatches) {
  FrameStore store(60 * 4, 4);
  for (uint32_t c = 0; c < 6; ++c) store.first_sight(4, 2, c, 0, frame_message(60, 4));  // 4 and 5: gaps
  const std::vector<bool> have = {true, false, true, false, true};  // shorter than the chunks seen
  auto same = store.plan_resume(0, 4, have);
  EXPECT_EQ(chunks_of(same.send), (Chunks{1, 3}));
  EXPECT_EQ(same.gaps, Chunks{5}) << "chunk 4 is held by the child: not a gap";
  // A child of another attempt (older, newer, or none) holds nothing of this one.
  for (uint64_t other : {0u, 3u, 5u}) {
    auto plan = store.plan_resume(0, other, have);
    EXPECT_EQ(chunks_of(plan.send), (Chunks{0, 1, 2, 3})) << other;
    EXPECT_EQ(plan.gaps, (Chunks{4, 5})) << other;
  }
  // A child holding everything gets nothing.
  auto full = store.plan_resume(0, 4, std::vector<bool>(6, true));
  EXPECT_TRUE(full.send.empty());
  EXPECT_TRUE(full.gaps.empty());
}

TEST(FrameStore, NothingInFlightPlansNothing) {
  FrameStore store(kBig, 4);
  auto plan = store.plan_resume(0, 0, {});
  EXPECT_TRUE(plan.send.empty());
  EXPECT_TRUE(plan.gaps.empty());
  EXPECT_EQ(plan.attempt, 0u);
}

TEST(FrameStore, RawPiecesAreServedOnlyOnceLandedWithTheirBody) {
  FrameStore store(kBig, 4);
  std::vector<std::byte> weights(32, std::byte{0x5A});
  auto r0 = raw_message(6, 0, 3), r1 = raw_message(6, 1, 3), r2 = raw_message(6, 2, 3);
  EXPECT_TRUE(store.first_sight(6, 1, 0, 0, r0));
  EXPECT_TRUE(store.first_sight(6, 1, 1, 0, r1));
  EXPECT_TRUE(store.first_sight(6, 1, 2, 0, r2));
  // Still landing: neither sent nor a gap (it is forwarded when it lands).
  auto plan = store.plan_resume(0, 0, {});
  EXPECT_TRUE(plan.send.empty());
  EXPECT_TRUE(plan.gaps.empty());
  // Landed (for another attempt: ignored).
  store.landed(5, 0, std::span(weights).subspan(0, 8));
  EXPECT_TRUE(store.plan_resume(0, 0, {}).send.empty());
  store.landed(6, 0, std::span(weights).subspan(0, 8));
  store.landed(6, 2, std::span(weights).subspan(16, 8));
  plan = store.plan_resume(0, 0, {});
  ASSERT_EQ(chunks_of(plan.send), (Chunks{0, 2}));
  EXPECT_TRUE(plan.gaps.empty());
  EXPECT_TRUE(plan.send[0].raw);
  EXPECT_EQ(plan.send[0].message, r0);
  EXPECT_EQ(plan.send[0].body.data(), weights.data()) << "served from where it landed";
  EXPECT_EQ(plan.send[0].body.size(), 8u);
  EXPECT_EQ(plan.send[1].message, r2);
  EXPECT_EQ(plan.send[1].body.data(), weights.data() + 16);
  // A child that has piece 0 of this attempt gets piece 2 only.
  EXPECT_EQ(chunks_of(store.plan_resume(0, 6, {true}).send), Chunks{2});
}

TEST(FrameStore, ForgetLetsARawPieceArriveAgain) {
  FrameStore store(kBig, 4);
  auto r = raw_message(6, 0, 2);
  EXPECT_TRUE(store.first_sight(6, 1, 0, 0, r));
  store.forget(5, 0);  // another attempt: ignored
  EXPECT_FALSE(store.first_sight(6, 1, 0, 0, r));
  store.forget(6, 0);  // its body was cut short
  EXPECT_EQ(store.resume_state().have, std::vector<bool>{}) << "a forgotten piece is not held";
  EXPECT_TRUE(store.first_sight(6, 1, 0, 0, r));
  store.forget(6, 9);  // never seen: no effect
  EXPECT_EQ(store.resume_state().have, std::vector<bool>{true});
}

// ---- the archive ------------------------------------------------------------------------------

TEST(FrameStore, ACommittedWholeDeltaIsArchivedChunksThenSealInOrder) {
  FrameStore store(kBig, 4);
  EXPECT_EQ(store.newest_archived(), 0u);
  const auto v3 = see_version(store, 10, 3, 4);
  store.end_attempt(10, true);
  EXPECT_EQ(store.newest_archived(), 3u);
  auto got = store.archived(2, 3);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->size(), v3.size());
  for (size_t i = 0; i < v3.size(); ++i) EXPECT_EQ((*got)[i], v3[i]) << i;
  // The attempt ended: nothing is in flight any more.
  auto plan = store.plan_resume(0, 0, {});
  EXPECT_TRUE(plan.send.empty());
  EXPECT_TRUE(plan.gaps.empty());
  EXPECT_TRUE(store.resume_state().have.empty());
  // Two consecutive versions come out as one sequence.
  const auto v4 = see_version(store, 11, 4, 2);
  store.end_attempt(11, true);
  got = store.archived(2, 4);
  ASSERT_TRUE(got);
  std::vector<SharedBytes> both = v3;
  both.insert(both.end(), v4.begin(), v4.end());
  EXPECT_EQ(*got, both);
  EXPECT_EQ(store.archived(3, 4), std::optional(v4));
  EXPECT_EQ(store.archived(4, 4), std::optional(std::vector<SharedBytes>{}));
}

TEST(FrameStore, OnlyCommittedWholeDeltasAreArchived) {
  FrameStore store(kBig, 8);
  see_version(store, 1, 1, 2);
  store.end_attempt(1, false);  // aborted
  EXPECT_FALSE(store.archived(0, 1));
  EXPECT_EQ(store.newest_archived(), 0u);

  // A RAW version (the bootstrap), committed.
  for (uint32_t c = 0; c < 3; ++c) store.first_sight(2, 1, c, 0, raw_message(2, c, 3));
  store.end_attempt(2, true);
  EXPECT_FALSE(store.archived(0, 1));

  // A delta with a message over the budget (seen, not kept).
  FrameStore small(200, 8);
  for (uint32_t c = 0; c < 4; ++c) small.first_sight(3, 2, c, 0, frame_message(64, 3));
  small.end_attempt(3, true);
  EXPECT_FALSE(small.archived(1, 2));
  EXPECT_EQ(small.newest_archived(), 0u);

  // A delta missing a chunk (forgotten), or one never seen here.
  see_version(store, 4, 2, 3);
  store.forget(4, 1);
  store.end_attempt(4, true);
  EXPECT_FALSE(store.archived(1, 2));
  store.first_sight(5, 3, 0, 0, frame_message(64, 5));
  store.first_sight(5, 3, 2, 0, frame_message(64, 5));  // chunk 1 never came
  store.end_attempt(5, true);
  EXPECT_FALSE(store.archived(2, 3));
  EXPECT_EQ(store.newest_archived(), 0u);

  // end_attempt for an attempt that is not the current one changes nothing.
  const auto v4 = see_version(store, 6, 4, 1);
  store.end_attempt(5, true);
  store.end_attempt(7, false);
  EXPECT_EQ(store.resume_state().attempt, 6u);
  EXPECT_EQ(store.resume_state().have.size(), 2u);
  store.end_attempt(6, true);
  EXPECT_EQ(store.archived(3, 4), std::optional(v4));
}

TEST(FrameStore, AtMostRetainVersionsAreKept) {
  FrameStore store(kBig, 2);
  std::vector<std::vector<SharedBytes>> versions(5);
  for (uint64_t v = 1; v <= 4; ++v) {
    versions[v] = see_version(store, 10 + v, v, 1);
    store.end_attempt(10 + v, true);
  }
  EXPECT_EQ(store.newest_archived(), 4u);
  EXPECT_FALSE(store.archived(0, 1));
  EXPECT_FALSE(store.archived(1, 2));
  EXPECT_FALSE(store.archived(1, 4)) << "version 2 was dropped";
  auto got = store.archived(2, 4);
  ASSERT_TRUE(got);
  std::vector<SharedBytes> expected = versions[3];
  expected.insert(expected.end(), versions[4].begin(), versions[4].end());
  EXPECT_EQ(*got, expected);
  EXPECT_FALSE(store.archived(2, 5)) << "version 5 does not exist";

  FrameStore none(kBig, 0);
  see_version(none, 1, 1, 1);
  none.end_attempt(1, true);
  EXPECT_FALSE(none.archived(0, 1));
  EXPECT_EQ(none.newest_archived(), 0u);
}

TEST(FrameStore, RetainedCountsTheArchiveNowAndAtItsMost) {
  FrameStore store(kBig, 2);
  EXPECT_EQ(store.retained().versions, 0u);
  EXPECT_EQ(store.retained().bytes, 0u);
  // Version v: chunks of 64 + c bytes and the seal (see_version), v chunks.
  auto bytes_of = [](uint32_t k) {
    uint64_t b = 0;
    for (uint32_t c = 0; c <= k; ++c) b += 64 + c;
    return b;
  };
  for (uint64_t v = 1; v <= 5; ++v) {
    see_version(store, 10 + v, v, static_cast<uint32_t>(6 - v));  // each version smaller than the last
    store.end_attempt(10 + v, true);
  }
  const FrameStore::Retained kept = store.retained();
  EXPECT_EQ(kept.versions, 2u);
  EXPECT_EQ(kept.bytes, bytes_of(2) + bytes_of(1));  // versions 4 and 5
  EXPECT_EQ(kept.peak_versions, 2u);
  EXPECT_EQ(kept.peak_bytes, bytes_of(5) + bytes_of(4));  // versions 1 and 2
  EXPECT_EQ(kept.largest_version_bytes, bytes_of(5));
  EXPECT_LE(kept.peak_bytes, 2 * kept.largest_version_bytes);
  // An aborted attempt, or a version not whole here, changes nothing.
  see_version(store, 20, 6, 3);
  store.end_attempt(20, false);
  EXPECT_EQ(store.retained().bytes, kept.bytes);
  FrameStore none(kBig, 0);
  see_version(none, 1, 1, 1);
  none.end_attempt(1, true);
  EXPECT_EQ(none.retained().peak_bytes, 0u);
}

TEST(FrameStore, AVersionMissingInTheMiddleMakesTheRangeMissing) {
  FrameStore store(kBig, 8);
  see_version(store, 1, 1, 1);
  store.end_attempt(1, true);
  see_version(store, 2, 2, 1);
  store.end_attempt(2, false);  // version 2 aborted ...
  const auto retry = see_version(store, 3, 2, 1);
  store.end_attempt(3, true);  // ... and committed by its retry
  see_version(store, 4, 3, 1);
  store.forget(4, 0);
  store.end_attempt(4, true);  // version 3 incomplete here
  const auto v4 = see_version(store, 5, 4, 1);
  store.end_attempt(5, true);
  EXPECT_EQ(store.archived(1, 2), std::optional(retry));
  EXPECT_FALSE(store.archived(1, 4));
  EXPECT_FALSE(store.archived(2, 3));
  EXPECT_EQ(store.archived(3, 4), std::optional(v4));
  EXPECT_EQ(store.newest_archived(), 4u);
}

}  // namespace
}  // namespace deltacast::tree
