// What the host hears of versions (tree/receiver/version_events.h): the active version, the
// callbacks, and the counts, in the order the contract gives.
#include "tree/receiver/version_events.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace deltacast::tree {
namespace {

struct Host {
  std::atomic<uint64_t> active{3};
  std::vector<std::string> heard;
  VersionEvents events{active, [this](uint64_t v) { heard.push_back("active " + std::to_string(v)); },
                       [this](uint64_t v) { heard.push_back("aborted " + std::to_string(v)); }};
};

TEST(VersionEvents, CommittedIsCountedAndActiveBeforeOnActive) {
  std::atomic<uint64_t> active{3};
  std::vector<uint64_t> heard;
  VersionEvents events(active,
                       [&](uint64_t v) {
                         EXPECT_EQ(active.load(), v);
                         EXPECT_EQ(events.committed_count(), 1u);
                         heard.push_back(v);
                       },
                       {});
  events.committed(4);
  EXPECT_EQ(active.load(), 4u);
  EXPECT_EQ(heard, std::vector<uint64_t>{4});
  EXPECT_EQ(events.aborted_count(), 0u);
}

TEST(VersionEvents, ReachedTellsOnlyANewerVersion) {
  Host h;
  h.events.reached(3);  // what the host already holds
  h.events.reached(2);
  EXPECT_TRUE(h.heard.empty());
  EXPECT_EQ(h.active.load(), 3u);
  h.events.reached(7);
  EXPECT_EQ(h.active.load(), 7u);
  EXPECT_EQ(h.heard, std::vector<std::string>{"active 7"});
  EXPECT_EQ(h.events.committed_count(), 0u);  // a catch-up commits nothing here
}

TEST(VersionEvents, AbortIsCountedBeforeTheAnswerAndTheHostHearsLast) {
  Host h;
  h.events.aborted(4, [&] {
    EXPECT_EQ(h.events.aborted_count(), 1u);  // whoever hears the answer sees the count
    h.heard.push_back("answered");
  });
  EXPECT_EQ(h.heard, (std::vector<std::string>{"answered", "aborted 4"}));
  EXPECT_EQ(h.active.load(), 3u);  // an abort leaves the active version
}

}  // namespace
}  // namespace deltacast::tree
