// The rules of a member's checkpoint layouts (tree/receiver/layout_tracker.h), without a network:
// a LAYOUT before or after its version's data, the parked ACK it releases, an abort that forgets,
// a catch-up that adopts, a new producer that restarts.
#include "tree/receiver/layout_tracker.h"

#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "util/error.h"

namespace deltacast::tree {
namespace {

constexpr size_t kTensors = 2;
constexpr uint64_t kAttempt = 42;

// A valid layout for kTensors tensors, told apart by its shard's file name.
CheckpointLayout layout_named(const std::string& file) {
  CheckpointLayout layout;
  layout.sharded = true;
  layout.shards.push_back(ShardLayout{file, {0, 1}, {}});
  return layout;
}
std::shared_ptr<const CheckpointLayout> shared_layout(const std::string& file) {
  return std::make_shared<const CheckpointLayout>(layout_named(file));
}
LayoutUpdate update(uint64_t version, uint64_t attempt, const std::string& file) {
  return LayoutUpdate{version, attempt, layout_named(file)};
}
Ack ack(uint64_t version, uint64_t attempt) { return Ack{3, version, 0xd16e57, 10, attempt}; }
std::string file_of(const std::shared_ptr<const CheckpointLayout>& layout) {
  return layout ? layout->shards.at(0).file : "(none)";
}
// Session::awaits_layout of a member whose in-flight attempt `attempt` announced a LAYOUT.
auto announced_by(uint64_t attempt) {
  return [attempt](uint64_t a) { return a == attempt; };
}
const auto announced_nothing = [](uint64_t) { return false; };

// Each test but the first starts at version 4, the producer's committed version too.
class LayoutTracking : public ::testing::Test {
 protected:
  void SetUp() override { t.restart(shared_layout("v4"), 4, 4); }
  LayoutTracker t;
};

TEST(LayoutTracker, FirstWelcomeIsCurrentAtOnceEvenWhenBehind) {
  LayoutTracker t;
  EXPECT_EQ(t.current(), nullptr);
  t.restart(shared_layout("v9"), 9, 0);  // a first join: no layout yet
  EXPECT_EQ(file_of(t.current()), "v9");
  EXPECT_TRUE(t.pending().empty());
}

TEST_F(LayoutTracking, LayoutBeforeItsDataLetsTheAckLeaveAndIsAdoptedOnCommit) {
  EXPECT_FALSE(t.take(update(5, kAttempt, "v5"), kTensors, 0));
  EXPECT_EQ(file_of(t.current()), "v4");  // not committed yet
  EXPECT_TRUE(t.ack_may_leave(ack(5, kAttempt), announced_by(kAttempt)));
  EXPECT_FALSE(t.parked());
  t.adopt(5);
  EXPECT_EQ(file_of(t.current()), "v5");
  EXPECT_TRUE(t.pending().empty());
}

TEST_F(LayoutTracking, AckWithoutAnnouncedLayoutNeverWaits) {
  EXPECT_TRUE(t.ack_may_leave(ack(5, kAttempt), announced_nothing));
  EXPECT_FALSE(t.parked());
  t.adopt(5);  // a version without a LAYOUT keeps the layout it had
  EXPECT_EQ(file_of(t.current()), "v4");
}

TEST_F(LayoutTracking, AckBeforeItsLayoutIsParkedAndReleasedByIt) {
  EXPECT_FALSE(t.ack_may_leave(ack(5, kAttempt), announced_by(kAttempt)));
  ASSERT_TRUE(t.parked());
  EXPECT_EQ(t.parked()->attempt, kAttempt);
  // Another attempt's LAYOUT does not release it.
  EXPECT_FALSE(t.take(update(6, kAttempt + 1, "v6"), kTensors, 0));
  EXPECT_TRUE(t.parked());
  auto released = t.take(update(5, kAttempt, "v5"), kTensors, 0);
  ASSERT_TRUE(released);
  EXPECT_EQ(released->version, 5u);
  EXPECT_EQ(released->attempt, kAttempt);
  EXPECT_FALSE(t.parked());  // released once
  EXPECT_FALSE(t.take(update(5, kAttempt, "v5"), kTensors, 0));
  EXPECT_EQ(file_of(t.current()), "v4");  // the ACK left, the version is not committed yet
  t.adopt(5);
  EXPECT_EQ(file_of(t.current()), "v5");
}

TEST_F(LayoutTracking, AbortForgetsItsLayoutAndParkedAckButKeepsTheCommittedOnes) {
  EXPECT_FALSE(t.take(update(6, 0, "v6-committed"), kTensors, 0));  // for a catch-up
  EXPECT_FALSE(t.take(update(5, kAttempt, "v5"), kTensors, 0));
  EXPECT_FALSE(t.take(update(7, kAttempt + 1, "v7"), kTensors, 0));
  t.forget(kAttempt);
  EXPECT_EQ(t.pending(), (std::map<uint64_t, uint64_t>{{6, 0}, {7, kAttempt + 1}}));
  EXPECT_EQ(file_of(t.current()), "v4");  // an abort leaves the held version's layout

  EXPECT_FALSE(t.ack_may_leave(ack(8, kAttempt + 2), announced_by(kAttempt + 2)));
  t.forget(kAttempt + 2);
  EXPECT_FALSE(t.parked());
  EXPECT_FALSE(t.take(update(8, kAttempt + 2, "v8"), kTensors, 0));  // nothing left to release
}

TEST_F(LayoutTracking, ForgetEverythingInFlightKeepsCommittedVersionsLayouts) {
  EXPECT_FALSE(t.take(update(6, 0, "v6"), kTensors, 0));
  EXPECT_FALSE(t.take(update(5, kAttempt, "v5"), kTensors, 0));
  EXPECT_FALSE(t.ack_may_leave(ack(7, kAttempt + 1), announced_by(kAttempt + 1)));
  t.forget(std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(t.pending(), (std::map<uint64_t, uint64_t>{{6, 0}}));
  EXPECT_FALSE(t.parked());
}

TEST_F(LayoutTracking, LayoutOfAnAttemptThatEndedHereIsIgnored) {
  EXPECT_FALSE(t.ack_may_leave(ack(5, kAttempt), announced_by(kAttempt)));
  EXPECT_FALSE(t.take(update(5, kAttempt, "v5"), kTensors, /*attempt_floor=*/kAttempt));
  EXPECT_TRUE(t.pending().empty());
  EXPECT_TRUE(t.parked());  // not released by a LAYOUT it ignored
  // A committed version's LAYOUT (attempt 0) is never below the floor.
  EXPECT_FALSE(t.take(update(5, 0, "v5"), kTensors, kAttempt));
  EXPECT_EQ(t.pending(), (std::map<uint64_t, uint64_t>{{5, 0}}));
}

TEST_F(LayoutTracking, LayoutThatDoesNotFitTheManifestIsCorrupt) {
  try {
    t.take(update(5, kAttempt, "v5"), /*tensors=*/3, 0);  // tensor 2 is in no shard
    FAIL() << "took a layout that misses a tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_frame);
    EXPECT_NE(std::string(e.what()).find("LAYOUT of version 5"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(t.pending().empty());
}

TEST_F(LayoutTracking, CatchUpAdoptsTheNewestLayoutAtOrBelowTheVersionReached) {
  // A rejoin: the new producer committed version 9; the member holds 4 and catches up.
  t.restart(shared_layout("v9"), 9, 4);
  EXPECT_EQ(file_of(t.current()), "v4");
  EXPECT_EQ(t.pending(), (std::map<uint64_t, uint64_t>{{9, 0}}));
  EXPECT_FALSE(t.take(update(6, 0, "v6"), kTensors, 0));
  EXPECT_FALSE(t.take(update(11, kAttempt, "v11"), kTensors, 0));
  t.adopt(7);  // the catch-up reached only version 7 so far
  EXPECT_EQ(file_of(t.current()), "v6");
  EXPECT_EQ(t.pending(), (std::map<uint64_t, uint64_t>{{9, 0}, {11, kAttempt}}));
  EXPECT_FALSE(t.take(update(8, 0, "v8"), kTensors, 0));
  t.adopt(10);  // ... then 10: the newest at or below it is 9's, not 8's
  EXPECT_EQ(file_of(t.current()), "v9");
  EXPECT_EQ(t.pending(), (std::map<uint64_t, uint64_t>{{11, kAttempt}}));
}

TEST_F(LayoutTracking, WelcomeDropsWhatAnEarlierProducerAnnounced) {
  EXPECT_FALSE(t.take(update(5, kAttempt, "v5"), kTensors, 0));
  EXPECT_FALSE(t.ack_may_leave(ack(6, kAttempt + 1), announced_by(kAttempt + 1)));
  t.restart(shared_layout("v4-again"), 4, 4);  // the member holds the new producer's version
  EXPECT_EQ(file_of(t.current()), "v4-again");
  EXPECT_TRUE(t.pending().empty());
  EXPECT_FALSE(t.parked());
}

}  // namespace
}  // namespace deltacast::tree
