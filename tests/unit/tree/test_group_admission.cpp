// A producer group's admission (tree/producer/group_admission.h), without a network: which
// GROUP_HELLOs the coordinator admits and which it refuses, naming the rank and the problem (a
// rank outside the group, another size, manifest or partition, two processes for one part, another
// version, other bits), the missing ranks at the join timeout, the parts' digests adding up to the
// committed version's, and a rank that comes back after its link failed.
#include "tree/producer/group_admission.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "codec/digest.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

constexpr uint64_t kManifest = 0x1111, kPartition = 0x2222;

// Rank r's part digest (three tensors); `salt` makes other bits.
std::vector<uint64_t> part(uint64_t rank, uint64_t salt = 0) { return {rank * 10 + salt, rank * 100, 7}; }

uint64_t whole_digest(uint32_t size, uint64_t salt_of_rank_2 = 0) {
  std::vector<uint64_t> sum(3, 0);
  for (uint32_t r = 0; r < size; ++r) {
    const auto p = part(r, r == 2 ? salt_of_rank_2 : 0);
    for (size_t t = 0; t < 3; ++t) sum[t] += p[t];
  }
  return codec::StateDigest(std::move(sum)).combined();
}

GroupAdmission::Params params(uint32_t size = 4, uint64_t version = 0) {
  return {size, kManifest, kPartition, version, whole_digest(size), part(0)};
}

GroupHello hello(uint32_t rank, uint32_t size = 4, uint64_t version = 0) {
  return GroupHello{rank, size, kManifest, kPartition, version, part(rank), "tcp://127.0.0.1:1", 7};
}

void expect_refused(const GroupAdmission::Decision& d, Errc errc, const std::string& says) {
  EXPECT_FALSE(d.admitted());
  EXPECT_EQ(d.errc, errc) << d.reason;
  EXPECT_NE(d.reason.find(says), std::string::npos) << d.reason;
}

TEST(GroupAdmission, EveryRankInAndTheirPartsAddUpToTheCommittedVersion) {
  GroupAdmission group(params());
  EXPECT_FALSE(group.complete());
  EXPECT_EQ(group.missing(), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(group.describe_missing(), "producer ranks 1, 2 and 3 have not said GROUP_HELLO");
  EXPECT_TRUE(group.hello(hello(2)).admitted());
  EXPECT_TRUE(group.hello(hello(1)).admitted());
  EXPECT_EQ(group.describe_missing(), "producer rank 3 has not said GROUP_HELLO");
  EXPECT_EQ(group.check_sum(), "producer rank 3 has not said GROUP_HELLO");
  EXPECT_TRUE(group.hello(hello(3)).admitted());
  EXPECT_TRUE(group.complete());
  EXPECT_EQ(group.describe_missing(), "");
  EXPECT_EQ(group.check_sum(), "");
  // One rank alone is a group too.
  EXPECT_TRUE(GroupAdmission(params(1)).complete());
  EXPECT_EQ(GroupAdmission(params(1)).check_sum(), "");
}

TEST(GroupAdmission, AHelloThatCannotBelongIsRefusedNamingTheRankAndTheProblem) {
  GroupAdmission group(params());
  expect_refused(group.hello(hello(0)), Errc::invalid_argument, "producer rank 0: outside the group of 4 ranks");
  expect_refused(group.hello(hello(4)), Errc::invalid_argument, "producer rank 4: outside the group of 4 ranks");
  expect_refused(group.hello(hello(1, 3)), Errc::invalid_argument,
                 "producer rank 1: counts a group of 3 ranks; the coordinator's has 4");
  GroupHello other_manifest = hello(2);
  other_manifest.manifest_digest = 0x3333;
  expect_refused(group.hello(other_manifest), Errc::version_mismatch,
                 "producer rank 2: its manifest (digest 0000000000003333) differs from the coordinator's "
                 "(0000000000001111)");
  GroupHello other_partition = hello(2);
  other_partition.partition = 0x4444;
  expect_refused(group.hello(other_partition), Errc::version_mismatch, "producer rank 2: its partition");
  GroupHello short_digest = hello(3);
  short_digest.held_digest.pop_back();
  expect_refused(group.hello(short_digest), Errc::corrupt_frame, "producer rank 3: its part's digest has 2 tensors");
  expect_refused(group.hello(hello(3, 4, 5)), Errc::version_mismatch,
                 "producer rank 3: holds version 5, the group's committed version is 0");
  // None of these let a rank in.
  EXPECT_EQ(group.missing(), (std::vector<uint32_t>{1, 2, 3}));
}

TEST(GroupAdmission, TwoProcessesClaimingOnePartAreRefused) {
  GroupAdmission group(params());
  EXPECT_TRUE(group.hello(hello(2)).admitted());
  expect_refused(group.hello(hello(2)), Errc::state, "producer rank 2: already in the group: two processes claim");
  EXPECT_TRUE(group.in(2));
}

TEST(GroupAdmission, PartsThatDoNotAddUpToTheCommittedVersionStopTheGroup) {
  GroupAdmission group(params());
  GroupHello drifted = hello(2);
  drifted.held_digest = part(2, 5);  // rank 2 holds other bits: at the first start only the sum shows it
  EXPECT_TRUE(group.hello(hello(1)).admitted());
  EXPECT_TRUE(group.hello(drifted).admitted());
  EXPECT_TRUE(group.hello(hello(3)).admitted());
  const std::string why = group.check_sum();
  EXPECT_NE(why.find("the 4 ranks' parts add up to digest"), std::string::npos) << why;
  EXPECT_NE(why.find("not version 0's"), std::string::npos) << why;
}

TEST(GroupAdmission, ARankThatComesBackIsCheckedAgainstTheRecordOfItsPart) {
  GroupAdmission group(params());
  for (uint32_t r = 1; r < 4; ++r) ASSERT_TRUE(group.hello(hello(r)).admitted());
  // Version 1 commits: every rank reported its new part.
  std::vector<std::vector<uint64_t>> parts;
  std::vector<uint64_t> sum(3, 0);
  for (uint32_t r = 0; r < 4; ++r) {
    parts.push_back(part(r, 1000 + r));
    for (size_t t = 0; t < 3; ++t) sum[t] += parts.back()[t];
  }
  group.committed(1, codec::StateDigest(sum).combined(), parts);
  // Rank 2's link fails; it is missing until it comes back.
  group.lost(2);
  EXPECT_EQ(group.missing(), (std::vector<uint32_t>{2}));
  EXPECT_FALSE(group.complete());
  // Back at the old version: refused; with other bits: refused, naming the rank; with its part of
  // version 1: in, and the sum holds.
  expect_refused(group.hello(hello(2)), Errc::version_mismatch, "producer rank 2: holds version 0");
  GroupHello other_bits = hello(2, 4, 1);
  other_bits.held_digest = part(2, 7);
  expect_refused(group.hello(other_bits), Errc::verify_failed, "producer rank 2: its part is not version 1's");
  GroupHello back = hello(2, 4, 1);
  back.held_digest = parts[2];
  EXPECT_TRUE(group.hello(back).admitted());
  EXPECT_TRUE(group.complete());
  EXPECT_EQ(group.check_sum(), "");
  EXPECT_EQ(group.committed_version(), 1u);
  EXPECT_THROW(group.committed(2, 0, {}), Error);
  // The coordinator cannot be lost from its own group.
  group.lost(0);
  EXPECT_TRUE(group.in(0));
}

// A coordinator resumed at version 5 that knows version 4 (it was lost after deciding 5, before any
// rank heard so): ranks holding 4 are in until the caller decides; every rank at 4: the group steps
// back to 4, checked by the sum like any start, and from then on only 4 is admitted.
TEST(GroupAdmission, EveryRankAtThePreviousVersionStepsTheGroupBack) {
  GroupAdmission::Params p = params(4, 5);
  p.committed_digest = 0xabcd;  // version 5's: no rank holds it
  p.own_digest = part(0, 500);  // the coordinator's part of version 5
  p.previous_version = 4;
  GroupAdmission group(p);
  for (uint32_t r = 1; r < 4; ++r) ASSERT_TRUE(group.hello(hello(r, 4, 4)).admitted()) << r;
  EXPECT_TRUE(group.complete());
  EXPECT_EQ(group.at_previous(), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(group.check_sum(), "producer ranks 1, 2 and 3 hold version 4, not the committed version 5");
  EXPECT_THROW(group.sum(), Error);
  group.step_back(whole_digest(4), part(0));
  EXPECT_EQ(group.committed_version(), 4u);
  EXPECT_TRUE(group.at_previous().empty());
  EXPECT_EQ(group.check_sum(), "");
  ASSERT_NE(group.record(2), nullptr);
  EXPECT_EQ(*group.record(2), part(2));
  // A rank that comes back later: at version 4 with its part, in; at 5 or with other bits, refused.
  group.lost(2);
  expect_refused(group.hello(hello(2, 4, 5)), Errc::version_mismatch,
                 "producer rank 2: holds version 5, the group's committed version is 4");
  GroupHello other_bits = hello(2, 4, 4);
  other_bits.held_digest = part(2, 9);
  expect_refused(group.hello(other_bits), Errc::verify_failed, "producer rank 2: its part is not version 4's");
  EXPECT_TRUE(group.hello(hello(2, 4, 4)).admitted());
  EXPECT_EQ(group.check_sum(), "");
}

// Ranks 1 and 2 at the previous version, rank 3 at the committed one (the coordinator was lost
// after rank 3 heard the commit): the group cannot step back (named); once settled, the ranks at
// the previous version are out and refused as holding another version.
TEST(GroupAdmission, RanksSplitBetweenTwoVersionsCannotStepBack) {
  GroupAdmission::Params p = params(4, 5);
  p.previous_version = 4;
  GroupAdmission group(p);
  ASSERT_TRUE(group.hello(hello(1, 4, 4)).admitted());
  ASSERT_TRUE(group.hello(hello(2, 4, 4)).admitted());
  ASSERT_TRUE(group.hello(hello(3, 4, 5)).admitted());
  EXPECT_EQ(group.at_previous(), (std::vector<uint32_t>{1, 2}));
  try {
    group.step_back(whole_digest(4), part(0));
    FAIL() << "stepped back with rank 3 at version 5";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("producer rank 3 does not hold version 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(group.committed_version(), 5u);
  group.settle();
  EXPECT_EQ(group.missing(), (std::vector<uint32_t>{1, 2}));
  expect_refused(group.hello(hello(1, 4, 4)), Errc::version_mismatch,
                 "producer rank 1: holds version 4, the group's committed version is 5");
  // Without a previous version, a rank at 4 is refused from the start.
  GroupAdmission plain(params(4, 5));
  expect_refused(plain.hello(hello(1, 4, 4)), Errc::version_mismatch, "holds version 4");
}

}  // namespace
}  // namespace deltacast::tree
