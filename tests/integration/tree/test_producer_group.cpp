// A producer group end to end inside one process (docs/producer-group.md): a coordinator (rank 0),
// part ranks 1..M-1 and N receivers, each with its own loopback transport (so one can be killed
// alone). Every rank holds and is given only its part: the spans of every other tensor are empty,
// so a rank that read outside its part would fail. Every check of weights is a memcmp.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codec/digest.h"
#include "codec/partition.h"
#include "tests/common/time_scale.h"
#include "tests/integration/tree/loop_cluster.h"
#include "tests/integration/tree/tree_test_model.h"
#include "transport/loopback/loopback.h"
#include "transport/transport.h"
#include "tree/producer.h"
#include "tree/protocol.h"
#include "tree/receiver.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
namespace loop = transport::loopback;

constexpr std::chrono::milliseconds kPeerTimeout{2000};

// Rank g's view of a version: the tensors of its part whole, every other span empty.
codec::ConstWeights part_view(const Model& model, const codec::Partition& partition, uint32_t g) {
  codec::ConstWeights w{&model.manifest, std::vector<std::span<const std::byte>>(model.manifest.size())};
  for (const auto& r : partition.part(g)) w.tensors[r.tensor] = std::span<const std::byte>(model.tensors[r.tensor]);
  return w;
}

// The all-zero version 0 of `model`'s manifest.
Model zeros_of(const Model& model) {
  Model zeros = model;
  for (auto& t : zeros.tensors) std::fill(t.begin(), t.end(), std::byte{0});
  return zeros;
}

// The type of a message a fault hook sees (none: a RAW piece's bare body, which has no header).
std::optional<MessageType> type_of(std::span<const std::byte> m) {
  try {
    if (m.size() >= kMessageHeaderSize) return message_header(m).type;
  } catch (const Error&) {
  }
  return std::nullopt;
}

// The process behind `transport` dies (or freezes) at its n-th data message (FRAME or RAW) from
// now on, before sending it.
void at_data_message(transport::Transport& transport, int n, loop::Fault::Kind kind) {
  auto frames = std::make_shared<std::atomic<int>>(0);
  loop::set_member_fault_hook(
      transport, std::make_shared<loop::FaultFunction>([frames, n, kind](uint64_t, std::span<const std::byte> m) {
        const auto type = type_of(m);
        if ((type == MessageType::frame || type == MessageType::raw) && ++*frames == n) return loop::Fault{kind};
        return loop::Fault{};
      }));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// M producer ranks and N receivers. start() runs the ranks' starts on threads of their own and
// the coordinator's on the caller's; refit() does the same with each rank's refit.
class Group {
 public:
  Group(uint32_t m, uint32_t n, TopologyKind kind, const Model& model,
        const std::function<void(ReceiverOptions&)>& adjust_receivers = {})
      : name_(test_name()),
        m_(m),
        n_(n),
        kind_(kind),
        manifest_(model.manifest),
        partition_(codec::Partition::balanced(model.manifest, m)),
        transports_(m),
        producers_(m),
        member_transports_(n + 1),
        receivers_(n + 1),
        threads_(n + 1),
        failures_(n + 1),
        buffers_(n + 1),
        placements_(n + 1) {
    for (uint32_t g = 0; g < m; ++g) make_rank(g, {});
    for (uint32_t r = 1; r <= n; ++r) {
      transport::TransportOptions to;
      to.peer_timeout = kPeerTimeout;
      member_transports_[r] = transport::make_transport("loop", to);
      ReceiverOptions ro;
      ro.rank = r;
      ro.producer_url = url(0);
      ro.listen_url = "loop://" + name_ + "-r" + std::to_string(r);
      ro.peer_timeout = kPeerTimeout;
      ro.connect_timeout = test_time::scaled(std::chrono::seconds(2));
      ro.join_timeout = test_time::scaled(std::chrono::seconds(20));
      ro.producer_loss_timeout = std::chrono::seconds(1);
      if (adjust_receivers) adjust_receivers(ro);
      placements_[r] = ro.placement;
      receivers_[r] = std::make_unique<Receiver>(*member_transports_[r], ro);
    }
  }
  ~Group() {
    if (started_) error_of([&] { producers_[0]->finish(); });
    for (uint32_t g = 1; g < m_; ++g)
      if (producers_[g]) error_of([&] { producers_[g]->finish(); });
    for (uint32_t r = 1; r <= n_; ++r) loop::kill(*member_transports_[r]);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    producers_.clear();
  }

  // A (new) process for rank g, holding its part of `resume` when given.
  void make_rank(uint32_t g, std::optional<std::pair<uint64_t, const Model*>> resume,
                 const std::function<void(ProducerOptions&)>& adjust = {}) {
    producers_[g].reset();  // before its transport
    transport::TransportOptions to;
    to.peer_timeout = kPeerTimeout;
    transports_[g] = transport::make_transport("loop", to);
    ProducerOptions po;
    po.listen_url = url(g);
    po.receivers = n_;
    po.topology = kind_;
    po.encode.chunk_bytes = 32 << 10;  // many chunks per part
    po.max_inflight_bytes_per_root = 256 << 10;
    po.peer_timeout = kPeerTimeout;
    po.version_timeout = 30s;
    po.join_timeout = test_time::scaled(20s);
    po.group.rank = g;
    po.group.size = m_;
    po.group.coordinator_url = g > 0 ? url(0) : "";
    if (resume) po.resume = ProducerResume{resume->first, part_view(*resume->second, partition_, g), 0, {}, {}};
    if (adjust) adjust(po);
    producers_[g] = std::make_unique<Producer>(*transports_[g], manifest_, po);
  }
  std::string url(uint32_t g) const { return "loop://" + name_ + "-p" + std::to_string(g); }

  // Receivers join; the ranks' starts run beside the coordinator's. Returns each rank's error.
  std::vector<std::string> start(uint32_t first_rank = 1) {
    for (uint32_t r = 1; r <= n_; ++r)
      threads_[r] = std::thread([this, r] {
        try {
          if (placements_[r].empty())
            join_and_serve(*receivers_[r], buffers_[r]);
          else
            join_and_serve_placed(*receivers_[r], placements_[r], buffers_[r]);
        } catch (const std::exception& e) {
          failures_[r] = e.what();
        }
      });
    return start_ranks(first_rank);
  }
  // The ranks' starts beside the coordinator's (receivers already serving: restarted ranks).
  std::vector<std::string> start_ranks(uint32_t first_rank = 1) {
    std::vector<std::string> errors(m_);
    std::vector<std::thread> ranks;
    for (uint32_t g = first_rank; g < m_; ++g)
      ranks.emplace_back([&, g] { errors[g] = error_of([&] { producers_[g]->start(); }); });
    errors[0] = error_of([&] { producers_[0]->start(); });
    started_ = errors[0].empty();
    for (auto& t : ranks) t.join();
    return errors;
  }

  // Every rank starts. False (with the failures added, naming the ranks) when one did not.
  bool start_all() {
    const auto errors = start();
    for (uint32_t g = 0; g < m_; ++g) EXPECT_EQ(errors[g], "") << "rank " << g;
    return errors == std::vector<std::string>(m_);
  }
  // Every rank starts and version 1 (`model`) commits on every receiver exactly. False (with the
  // failures added) when a rank did not start.
  bool start_at_version_1(const Model& model) {
    if (!start_all()) return false;
    bootstrap(model);
    expect_everyone_holds(model, "at version 1");
    return true;
  }

  // Every rank refits to `model` (its part) at once; reports[g] is rank g's.
  std::vector<RefitReport> refit(const Model& model, std::vector<std::string>* errors = nullptr,
                                 uint32_t first_rank = 0) {
    return send(model, false, errors, first_rank);
  }
  // Version 1: every rank sends its part of `model` as RAW pieces at once.
  std::vector<RefitReport> bootstrap(const Model& model, std::vector<std::string>* errors = nullptr,
                                     uint32_t first_rank = 0) {
    return send(model, true, errors, first_rank);
  }
  std::vector<RefitReport> send(const Model& model, bool raw, std::vector<std::string>* errors, uint32_t first_rank) {
    std::vector<RefitReport> reports(m_);
    std::vector<std::string> failed(m_);
    std::vector<std::thread> ranks;
    for (uint32_t g = first_rank; g < m_; ++g)
      ranks.emplace_back([&, g] {
        failed[g] = error_of([&] {
          const auto part = part_view(model, partition_, g);
          reports[g] = raw ? producers_[g]->bootstrap(part) : producers_[g]->refit(part);
        });
      });
    for (auto& t : ranks) t.join();
    if (errors) *errors = failed;
    for (uint32_t g = first_rank; g < m_ && !errors; ++g) EXPECT_EQ(failed[g], "") << "rank " << g;
    return reports;
  }

  // Every receiver holds `model`'s bits within `patience` (an ABORT is not acknowledged: members
  // roll back as they read it).
  void eventually_everyone_holds(const Model& model, const std::string& when,
                                 std::chrono::milliseconds patience) const {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    for (uint32_t r = 1; r <= n_; ++r)
      while (!same_bits(buffers_[r], model.weights()) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(20ms);
    expect_everyone_holds(model, when);
  }

  // Every receiver holds `model`'s bits exactly (memcmp).
  void expect_everyone_holds(const Model& model, const std::string& when) const {
    expect_survivors_hold(model, 0, when);  // receivers are 1..n
  }

  // Rank 1 was lost while the version of `reports` went out: rank 0's call returned it aborted
  // naming the rank, rank 1's call failed, the group stayed at `version`, and every receiver rolls
  // back to `held`'s bits.
  void expect_aborted_by_rank_1(const std::vector<RefitReport>& reports, const std::vector<std::string>& errors,
                                uint64_t version, const Model& held, const std::string& when) {
    EXPECT_EQ(errors[0], "");
    EXPECT_FALSE(reports[0].committed);
    EXPECT_NE(reports[0].abort_reason.find("producer rank 1"), std::string::npos) << reports[0].abort_reason;
    EXPECT_NE(errors[1], "") << "the killed rank's call fails";
    EXPECT_EQ(rank(0).version(), version);
    eventually_everyone_holds(held, when, test_time::scaled(10s));
  }

  // Every receiver but `dead` holds `model`'s bits exactly.
  void expect_survivors_hold(const Model& model, uint32_t dead, const std::string& when) const {
    for (uint32_t r = 1; r <= n_; ++r) {
      if (r == dead) continue;
      EXPECT_EQ(failures_[r], "") << "receiver " << r << " " << when;
      EXPECT_TRUE(same_bits(buffers_[r], model.weights())) << "receiver " << r << " " << when;
    }
  }
  transport::Transport& receiver_transport(uint32_t r) { return *member_transports_[r]; }
  Producer& rank(uint32_t g) { return *producers_[g]; }
  transport::Transport& rank_transport(uint32_t g) { return *transports_[g]; }
  void drop_rank(uint32_t g) {
    error_of([&] { producers_[g]->finish(); });
    producers_[g].reset();
  }
  const codec::Partition& partition() const { return partition_; }
  const std::vector<Bytes>& buffers(uint32_t r) const { return buffers_[r]; }
  // Member r holds only `specs`, given at attach (stated by PLACED); before start().
  void place_late(uint32_t r, std::vector<codec::BufferPlacement> specs) { placements_[r] = std::move(specs); }

 private:
  std::string name_;
  uint32_t m_, n_;
  TopologyKind kind_;
  const codec::Manifest& manifest_;
  codec::Partition partition_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<std::unique_ptr<Producer>> producers_;
  std::vector<std::unique_ptr<transport::Transport>> member_transports_;
  std::vector<std::unique_ptr<Receiver>> receivers_;
  std::vector<std::thread> threads_;
  std::vector<std::string> failures_;
  std::vector<std::vector<Bytes>> buffers_;
  std::vector<std::vector<codec::BufferPlacement>> placements_;  // [rank]: empty for a whole member
  bool started_ = false;
};

struct Shape {
  uint32_t m;
  uint32_t n;
  TopologyKind kind;
  bool raw = true;  // version 1 as RAW pieces (bootstrap), else a delta from zeros (refit)
};

class GroupVersions : public ::testing::TestWithParam<Shape> {};

// Versions 1..3 (1 from the all-zero version 0: every rank's RAW pieces, or a delta from zeros),
// each rank sending only its part down its own trees: every receiver ends each version with the
// whole model's exact bits, and the group records each version under its StateDigest (the digest a
// member holding it says at HELLO).
TEST_P(GroupVersions, EveryReceiverHoldsEveryVersionExactly) {
  const Shape shape = GetParam();
  Model model = Model::make(321);
  Group group(shape.m, shape.n, shape.kind, model);
  ASSERT_TRUE(group.start_all());
  uint64_t total_bytes = 0;
  for (uint32_t g = 0; g < shape.m; ++g) total_bytes += group.partition().part_bytes(g);
  ASSERT_EQ(total_bytes, model.manifest.total_bytes());
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) model.step(1000 + v);
    const auto reports = v == 1 && shape.raw ? group.bootstrap(model) : group.refit(model);
    uint32_t part_chunks = 0;
    for (uint32_t g = 0; g < shape.m; ++g) {
      EXPECT_TRUE(reports[g].committed) << "rank " << g << " version " << v << ": " << reports[g].abort_reason;
      EXPECT_EQ(reports[g].version, v);
      EXPECT_EQ(group.rank(g).version(), v);
      if (g > 0) part_chunks += reports[g].chunks;
    }
    EXPECT_GT(part_chunks, 0u);
    EXPECT_GT(reports[0].chunks, part_chunks) << "the coordinator's report counts every rank's chunks";
    EXPECT_EQ(reports[0].verified_receivers, shape.n);
    group.expect_everyone_holds(model, "at version " + std::to_string(v));
    const uint64_t state = codec::StateDigest::full_scan(model.weights()).combined();
    for (uint32_t g = 0; g < shape.m; ++g) EXPECT_EQ(group.rank(g).history().at(v), state) << "rank " << g;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupVersions,
                         ::testing::Values(Shape{2, 5, TopologyKind::binary}, Shape{3, 6, TopologyKind::binary},
                                           Shape{2, 6, TopologyKind::double_binary}, Shape{3, 4, TopologyKind::chain},
                                           Shape{2, 5, TopologyKind::binary, false}),
                         [](const auto& param_info) {
                           const Shape& p = param_info.param;
                           return "M" + std::to_string(p.m) + "_N" + std::to_string(p.n) + "_" +
                                  std::string(topology_kind_name(p.kind)) + (p.raw ? "" : "_delta_from_zeros");
                         });

// Placed members behind a producer group (docs/placement.md): members 1 and 2 hold complementary
// slices (rows of one tensor, columns of another, a fused buffer), one stating them at HELLO, the
// other by PLACED; member 3 holds the whole model. GROUP_BEGIN carries the plan of the slices, each
// rank cuts its part for them and reports its part's changes inside each slice (and its part of a
// newly stated slice's base), and the coordinator's seal carries the table: version 1 (a delta
// from zeros: every slice stated before it) and three more, every member exact on what it holds.
TEST(ProducerGroup, PlacedMembersAreExactBehindAGroup) {
  Model model = Model::make(77);
  using Part = codec::PlacementPart;
  const std::vector<codec::BufferPlacement> first{
      {"embed_rows", {Part{"embed", 0, 0, 100, std::nullopt}}, false, {}, 0},
      {"w0_cols", {Part{"layer.0.w", 1, 0, 200, std::nullopt}}, false, {}, 0},
      {"w1_rows", {Part{"layer.1.w", 0, 0, 256, std::nullopt}}, false, {}, 0}};
  const std::vector<codec::BufferPlacement> second{
      {"embed_rows", {Part{"embed", 0, 100, 256, std::nullopt}}, false, {}, 0},
      {"w0_cols", {Part{"layer.0.w", 1, 200, 512, std::nullopt}}, false, {}, 0},
      // Fused: two slices of different tensors side by side along dim 0.
      {"fused", {Part{"layer.1.w", 0, 256, 512, std::nullopt}, Part{"layer.1.w", 0, 0, 8, std::nullopt}}, false, {}, 0},
      {"bias", {Part{"head.bias", 0, 0, 333, std::nullopt}}, false, {}, 0}};
  Group group(2, 3, TopologyKind::binary, model, [&](ReceiverOptions& ro) {
    if (ro.rank == 1) ro.placement = first;  // stated at HELLO
  });
  group.place_late(2, second);  // stated by PLACED after WELCOME
  ASSERT_TRUE(group.start_all());
  for (uint64_t v = 1; v <= 4; ++v) {
    if (v > 1) model.step(500 + v);
    const auto reports = group.refit(model);  // version 1: a delta from zeros
    for (uint32_t g = 0; g < 2; ++g)
      ASSERT_TRUE(reports[g].committed) << "rank " << g << " version " << v << ": " << reports[g].abort_reason;
    EXPECT_EQ(reports[0].verified_receivers, 3u) << "version " << v;
    EXPECT_TRUE(holds_shard(group.buffers(1), first, model.manifest, model.tensors)) << "member 1, version " << v;
    EXPECT_TRUE(holds_shard(group.buffers(2), second, model.manifest, model.tensors)) << "member 2, version " << v;
    EXPECT_TRUE(same_bits(group.buffers(3), model.weights())) << "member 3, version " << v;
  }
}

// Rank 1 dies at its 3rd RAW piece of version 1: the bootstrap aborts on every member, each back
// at the all-zero version 0 exactly; rank 1 restarted (nothing to resume: version 0) and version 1
// sent again commit on every receiver exactly.
TEST(ProducerGroup, RankKilledMidBootstrapAbortsThenVersion1IsSentAgain) {
  Model model = Model::make(17);
  const Model zeros = zeros_of(model);
  Group group(2, 5, TopologyKind::binary, model);
  ASSERT_TRUE(group.start_all());
  at_data_message(group.rank_transport(1), 3, loop::Fault::Kind::die);
  std::vector<std::string> errors;
  group.expect_aborted_by_rank_1(group.bootstrap(model, &errors), errors, 0, zeros, "after the aborted bootstrap");

  group.drop_rank(1);
  group.make_rank(1, std::nullopt);
  ASSERT_EQ(error_of([&] { group.rank(1).start(); }), "");
  const auto reports = group.bootstrap(model);
  EXPECT_TRUE(reports[0].committed) << reports[0].abort_reason;
  EXPECT_TRUE(reports[1].committed) << reports[1].abort_reason;
  group.expect_everyone_holds(model, "at version 1 sent again");
  model.step(5);
  EXPECT_TRUE(group.refit(model)[0].committed);
  group.expect_everyone_holds(model, "at version 2");
}

// A receiver relaying in rank 0's tree dies at its 3rd forwarded RAW piece of version 1: the trees
// are repaired and, as relays keep no pieces here (retain_bytes 0), the new parents name what
// their new children lack in GAPs: each rank re-sends its own pieces (the coordinator forwards a
// GAP to the rank whose piece it names), and every survivor holds version 1 exactly.
TEST(ProducerGroup, ReceiverKilledMidBootstrapBothTreesRepair) {
  Model model = Model::make(19);
  Group group(2, 6, TopologyKind::binary, model, [](ReceiverOptions& ro) { ro.retain_bytes = 0; });
  ASSERT_TRUE(group.start_all());
  at_data_message(group.receiver_transport(2), 3, loop::Fault::Kind::die);
  const auto reports = group.bootstrap(model);
  EXPECT_TRUE(reports[0].committed) << reports[0].abort_reason;
  EXPECT_TRUE(reports[1].committed) << reports[1].abort_reason;
  bool reported = false;
  for (const auto& f : reports[0].failed_members) reported = reported || f.rank == 2;
  EXPECT_TRUE(reported) << "receiver 2 died in version 1 and is not reported";
  group.expect_survivors_hold(model, 2, "at version 1");
  model.step(8);
  EXPECT_TRUE(group.refit(model)[0].committed);
  group.expect_survivors_hold(model, 2, "at version 2");
}

// Rank 0 sends version 1 raw while rank 1 sends it as a delta from zeros: the numbering of the
// two would not fit, so nothing is sent, rank 0's call names rank 1 and rank 1's is not
// committed; the same version sent the same way by both then commits.
TEST(ProducerGroup, RanksSendingVersion1InDifferentWaysAreRefusedNamingTheRank) {
  Model model = Model::make(23);
  const Model zeros = zeros_of(model);
  Group group(2, 3, TopologyKind::binary, model);
  ASSERT_TRUE(group.start_all());
  RefitReport rank1;
  std::thread delta([&] { error_of([&] { rank1 = group.rank(1).refit(part_view(model, group.partition(), 1)); }); });
  const std::string error = error_of([&] { group.rank(0).bootstrap(part_view(model, group.partition(), 0)); });
  delta.join();
  EXPECT_NE(error.find("producer rank 1 sends version 1 as a delta (refit), rank 0 as a bootstrap"), std::string::npos)
      << error;
  EXPECT_FALSE(rank1.committed);
  EXPECT_NE(rank1.abort_reason.find("every rank must call the same"), std::string::npos) << rank1.abort_reason;
  group.expect_everyone_holds(zeros, "after the refused version 1");
  const auto reports = group.bootstrap(model);
  EXPECT_TRUE(reports[0].committed) << reports[0].abort_reason;
  group.expect_everyone_holds(model, "at version 1");
}

// Rank 1's link to the coordinator fails as it sends its GROUP_SENT of version 2 (the send, not
// the link's reader, finds it): its refit fails saying it lost the coordinator; the coordinator
// aborts the version on every member, each back at version 1 exactly.
TEST(ProducerGroup, GroupLinkFailingAtGroupSentIsTheCoordinatorsLoss) {
  Model model = Model::make(41);
  Group group(2, 4, TopologyKind::binary, model);
  ASSERT_TRUE(group.start_at_version_1(model));
  const Model v1 = model;
  loop::set_member_fault_hook(group.rank_transport(1),
                              std::make_shared<loop::FaultFunction>([](uint64_t, std::span<const std::byte> m) {
                                return loop::Fault{type_of(m) == MessageType::group_sent ? loop::Fault::Kind::close
                                                                                         : loop::Fault::Kind::deliver};
                              }));
  model.step(2);
  std::vector<std::string> errors;
  const auto reports = group.refit(model, &errors);
  EXPECT_FALSE(reports[0].committed);
  EXPECT_NE(errors[1].find("producer rank 1 lost the coordinator"), std::string::npos) << errors[1];
  group.eventually_everyone_holds(v1, "after the aborted version 2", test_time::scaled(10s));
}

// Rank 1 dies while its part of version 2 is going out: the version aborts on every member, each
// rolls back to version 1 exactly; refits fail naming the missing rank until it comes back with
// its part of version 1; then versions 2 and 3 commit exactly, with no full resend.
TEST(ProducerGroup, RankKilledMidVersionAbortsThenResumes) {
  Model model = Model::make(77);
  Group group(2, 5, TopologyKind::binary, model);
  ASSERT_TRUE(group.start_at_version_1(model));
  const Model v1 = model;

  // Dies at its 3rd data message of version 2 (before sending it).
  at_data_message(group.rank_transport(1), 3, loop::Fault::Kind::die);
  model.step(2);
  std::vector<std::string> errors;
  group.expect_aborted_by_rank_1(group.refit(model, &errors), errors, 1, v1, "after the aborted version 2");

  // Without rank 1 nothing is sent.
  const std::string missing = error_of([&] { group.rank(0).refit(part_view(model, group.partition(), 0)); });
  EXPECT_NE(missing.find("producer rank 1 has not said GROUP_HELLO"), std::string::npos) << missing;
  group.expect_everyone_holds(v1, "after a refit without rank 1");

  // Rank 1 restarts holding its part of version 1 (`run --resume`).
  group.drop_rank(1);
  group.make_rank(1, std::make_pair(uint64_t{1}, &v1));
  ASSERT_EQ(error_of([&] { group.rank(1).start(); }), "");
  for (uint64_t v = 2; v <= 3; ++v) {
    if (v > 2) model.step(3);
    const auto reports = group.refit(model);
    EXPECT_TRUE(reports[0].committed) << reports[0].abort_reason;
    EXPECT_TRUE(reports[1].committed) << reports[1].abort_reason;
    group.expect_everyone_holds(model, "at version " + std::to_string(v) + " after rank 1 came back");
  }
}

// Rank 1 dies between versions and comes back at another data URL (a trainer rank rescheduled on
// another host): every member learns the URL (EPOCH), its trees' roots JOIN it there, and versions
// 2 and 3 commit on every receiver exactly.
TEST(ProducerGroup, RankBackAtAnotherAddressIsJoinedThere) {
  Model model = Model::make(67);
  Group group(2, 5, TopologyKind::binary, model);
  ASSERT_TRUE(group.start_at_version_1(model));
  const Model v1 = model;
  loop::kill(group.rank_transport(1));
  group.drop_rank(1);
  const std::string moved = group.url(1) + "-moved";
  group.make_rank(1, std::make_pair(uint64_t{1}, &v1), [&](ProducerOptions& o) { o.listen_url = moved; });
  ASSERT_EQ(error_of([&] { group.rank(1).start(); }), "");
  for (uint64_t v = 2; v <= 3; ++v) {
    model.step(70 + v);
    const auto reports = group.refit(model);
    EXPECT_TRUE(reports[0].committed) << "version " << v << ": " << reports[0].abort_reason;
    EXPECT_TRUE(reports[1].committed) << "version " << v << ": " << reports[1].abort_reason;
    EXPECT_EQ(reports[0].verified_receivers, 5u);
    group.expect_everyone_holds(model, "at version " + std::to_string(v) + " with rank 1 moved");
  }
}

// A receiver that relays in rank 0's tree (binary over 1..6: rank 2 feeds 4 and 5) dies at its 3rd
// forwarded data message of version 2: every tree it was in is repaired (rank 1's trees too: the
// EPOCH reaches the rank), version 2 commits, and every survivor ends each version exactly.
TEST(ProducerGroup, ReceiverKilledMidVersionBothTreesRepair) {
  Model model = Model::make(31);
  Group group(2, 6, TopologyKind::binary, model);
  ASSERT_TRUE(group.start_at_version_1(model));
  at_data_message(group.receiver_transport(2), 3, loop::Fault::Kind::die);
  for (uint64_t v = 2; v <= 3; ++v) {
    model.step(40 + v);
    const auto reports = group.refit(model);
    EXPECT_TRUE(reports[0].committed) << "version " << v << ": " << reports[0].abort_reason;
    EXPECT_TRUE(reports[1].committed) << "version " << v << ": " << reports[1].abort_reason;
    if (v == 2) {
      bool reported = false;
      for (const auto& f : reports[0].failed_members) reported = reported || f.rank == 2;
      EXPECT_TRUE(reported) << "receiver 2 died in version 2 and is not reported";
      EXPECT_EQ(reports[0].verified_receivers, 5u);
    }
    group.expect_survivors_hold(model, 2, "at version " + std::to_string(v));
  }
}

// Rank 1 freezes (SIGSTOP-like: it neither sends nor answers) at its 3rd data message of version 2:
// its group link goes silent, the coordinator aborts the version on every member within about the
// peer timeout, every receiver rolls back exactly; rank 1 replaced (killed, resumed) commits the next.
TEST(ProducerGroup, RankFrozenMidVersionAbortsThenItsReplacementCommits) {
  Model model = Model::make(91);
  Group group(2, 4, TopologyKind::binary, model);
  ASSERT_TRUE(group.start_at_version_1(model));
  const Model v1 = model;
  at_data_message(group.rank_transport(1), 3, loop::Fault::Kind::freeze);
  model.step(6);
  std::thread frozen_rank([&] { error_of([&] { group.rank(1).refit(part_view(model, group.partition(), 1)); }); });
  const auto t0 = std::chrono::steady_clock::now();
  RefitReport aborted;
  const std::string error = error_of([&] { aborted = group.rank(0).refit(part_view(model, group.partition(), 0)); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(error, "");
  EXPECT_FALSE(aborted.committed);
  EXPECT_NE(aborted.abort_reason.find("producer rank 1"), std::string::npos) << aborted.abort_reason;
  EXPECT_LT(seconds, 20.0) << "a frozen rank must not hold the version for its whole timeout";
  group.eventually_everyone_holds(v1, "after the aborted version 2", test_time::scaled(10s));
  loop::kill(group.rank_transport(1));  // the frozen process is replaced
  frozen_rank.join();
  group.drop_rank(1);
  group.make_rank(1, std::make_pair(uint64_t{1}, &v1));
  ASSERT_EQ(error_of([&] { group.rank(1).start(); }), "");
  const auto reports = group.refit(model);
  EXPECT_TRUE(reports[0].committed) << reports[0].abort_reason;
  group.expect_everyone_holds(model, "at version 2 after rank 1 was replaced");
}

// A rank that comes back with other bits than its part of the committed version is refused,
// naming it; the group goes on once the right one is back.
TEST(ProducerGroup, RankBackWithOtherBitsIsRefused) {
  Model model = Model::make(5);
  Group group(2, 3, TopologyKind::binary, model);
  ASSERT_TRUE(group.start_at_version_1(model));
  const Model v1 = model;
  group.drop_rank(1);
  Model other = model;
  other.step(99);
  group.make_rank(1, std::make_pair(uint64_t{1}, &other));
  const std::string refused = error_of([&] { group.rank(1).start(); });
  EXPECT_NE(refused.find("producer rank 1"), std::string::npos) << refused;
  EXPECT_NE(refused.find("differs from the group's record"), std::string::npos) << refused;
  group.drop_rank(1);
  group.make_rank(1, std::make_pair(uint64_t{1}, &v1));
  ASSERT_EQ(error_of([&] { group.rank(1).start(); }), "");
  model.step(4);
  const auto reports = group.refit(model);
  EXPECT_TRUE(reports[0].committed);
  group.expect_everyone_holds(model, "at version 2");
}

// Versions 1 and 2 commit; then the coordinator dies at its first COMMIT of version 3, after
// deciding it (its before_commit ran: `deltacast run`'s state file says version 3): with
// `one_commit_out` that COMMIT reaches one receiver before it dies, else none does. Rank 1 loses its
// coordinator. v2 and v3 are the versions' models.
void coordinator_dies_at_commit_of_version_3(Group& group, Model& model, Model& v2, Model& v3, bool one_commit_out) {
  auto decided = std::make_shared<std::atomic<uint64_t>>(0);
  group.make_rank(0, std::nullopt, [decided](ProducerOptions& o) {
    o.before_commit = [decided](uint64_t v, uint64_t) { *decided = v; };
  });
  ASSERT_TRUE(group.start_at_version_1(model));
  model.step(2);
  ASSERT_TRUE(group.refit(model)[0].committed);
  v2 = model;
  loop::set_member_fault_hook(
      group.rank_transport(0),
      std::make_shared<loop::FaultFunction>([one_commit_out](uint64_t, std::span<const std::byte> m) {
        if (type_of(m) != MessageType::commit) return loop::Fault{};
        return loop::Fault{loop::Fault::Kind::die, {}, 0, one_commit_out};
      }));
  model.step(3);
  v3 = model;
  std::vector<std::string> errors;
  group.refit(model, &errors);
  EXPECT_EQ(decided->load(), 3u) << "the coordinator did not decide version 3 before it died";
  EXPECT_NE(errors[1].find("lost the coordinator"), std::string::npos) << errors[1];
  group.drop_rank(0);
  group.drop_rank(1);
}

// Each member's weights as a digest, so that one can be compared with several versions.
uint64_t digest_of(const std::vector<Bytes>& buffers, const codec::Manifest& manifest) {
  codec::ConstWeights w{&manifest, {}};
  for (const auto& b : buffers) w.tensors.emplace_back(b);
  return codec::StateDigest::full_scan(w).combined();
}

// The coordinator, resumed at version 3 knowing version 2 (its part of 2 and the digests of both),
// and rank 1 at version 2 (its state: it never heard 3 committed).
void resume_coordinator_at_3_and_rank_1_at_2(Group& group, const Model& v2, const Model& v3) {
  const auto& partition = group.partition();
  group.make_rank(0, std::make_pair(uint64_t{3}, &v3), [&](ProducerOptions& o) {
    o.resume->history = {{2, codec::StateDigest::full_scan(v2.weights()).combined()},
                         {3, codec::StateDigest::full_scan(v3.weights()).combined()}};
    o.resume->previous = ProducerResume::Previous{
        2, [&v2, &partition] { return std::make_pair(part_view(v2, partition, 0), CheckpointLayout{}); }};
  });
  group.make_rank(1, std::make_pair(uint64_t{2}, &v2));
}

// The coordinator dies after deciding version 3, before any COMMIT or GROUP_DECIDED went out:
// every receiver rolls 3 back. Resumed, the group finds every rank and every receiver at version 2
// and steps back to it (nothing is sent: the receivers stay live); versions 3 and 4 then commit on
// every receiver exactly.
TEST(ProducerGroup, CoordinatorLostAfterDecidingBeforeAnyCommitStepsBack) {
  Model model = Model::make(53), v2 = model, v3 = model;
  Group group(2, 4, TopologyKind::binary, model,
              [](ReceiverOptions& ro) { ro.producer_loss_timeout = test_time::scaled(std::chrono::seconds(30)); });
  coordinator_dies_at_commit_of_version_3(group, model, v2, v3, false);
  if (HasFatalFailure()) return;
  group.eventually_everyone_holds(v2, "after the coordinator died in version 3", test_time::scaled(10s));
  resume_coordinator_at_3_and_rank_1_at_2(group, v2, v3);
  const auto errors = group.start_ranks();
  ASSERT_EQ(errors, std::vector<std::string>(2));
  EXPECT_EQ(group.rank(0).version(), 2u);
  EXPECT_EQ(group.rank(0).history().count(3), 0u) << "the undecided version 3 is still in the history";
  group.expect_everyone_holds(v2, "after the step back");
  for (uint64_t v = 3; v <= 4; ++v) {
    if (v > 3) model.step(4);
    const auto reports = group.refit(model);
    EXPECT_TRUE(reports[0].committed) << "version " << v << ": " << reports[0].abort_reason;
    EXPECT_EQ(reports[0].version, v);
    group.expect_everyone_holds(model, "at version " + std::to_string(v) + " after the step back");
  }
}

// The coordinator dies right after its first COMMIT of version 3 left: one receiver holds 3, the
// others roll it back. The ranks hold 2: stepping back would undo a version a user may have seen,
// so the resumed group refuses to start, naming the receivers that hold 3, and no receiver's bits
// change.
TEST(ProducerGroup, CoordinatorLostAfterACommitLeftCannotStepBack) {
  Model model = Model::make(59), v2 = model, v3 = model;
  Group group(2, 4, TopologyKind::binary, model,
              [](ReceiverOptions& ro) { ro.producer_loss_timeout = test_time::scaled(std::chrono::seconds(30)); });
  coordinator_dies_at_commit_of_version_3(group, model, v2, v3, true);
  if (HasFatalFailure()) return;
  const uint64_t d2 = codec::StateDigest::full_scan(v2.weights()).combined();
  const uint64_t d3 = codec::StateDigest::full_scan(v3.weights()).combined();
  auto holders_of_3 = [&] {
    uint32_t count = 0;
    for (uint32_t r = 1; r <= 4; ++r) {
      const uint64_t d = digest_of(group.buffers(r), v2.manifest);
      EXPECT_TRUE(d == d2 || d == d3) << "receiver " << r << " holds neither version 2 nor 3";
      count += d == d3;
    }
    return count;
  };
  std::this_thread::sleep_for(500ms);  // the others roll back
  const uint32_t before = holders_of_3();
  EXPECT_GE(before, 1u) << "the COMMIT that left reached nobody";
  resume_coordinator_at_3_and_rank_1_at_2(group, v2, v3);
  const auto errors = group.start_ranks();
  EXPECT_NE(errors[0].find("the producer group cannot start"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("version 3 (its COMMIT reached them"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("version 3 (its COMMIT reached them"), std::string::npos)
      << "rank 1 is told why: " << errors[1];
  EXPECT_EQ(holders_of_3(), before);
}

// Bad input at start: a rank with another manifest is refused naming the rank and the manifest,
// and the coordinator's start fails naming the rank it waited for. No receiver got a WELCOME: none
// holds any weights.
TEST(ProducerGroup, RankWithAnotherManifestIsRefusedAndNothingIsWritten) {
  const Model model = Model::make(9);
  Group group(2, 3, TopologyKind::binary, model);
  // The coordinator gives up after 3 s; the real rank 1 never comes. (Both before the stranger
  // connects: it must reach this coordinator, not the one replaced.)
  group.make_rank(0, std::nullopt, [](ProducerOptions& o) { o.join_timeout = 3s; });
  group.drop_rank(1);
  std::vector<codec::TensorInfo> infos = model.manifest.tensors();
  infos.back().name = "head.bias.renamed";
  const codec::Manifest other(infos);
  transport::TransportOptions to;
  auto transport = transport::make_transport("loop", to);
  ProducerOptions po;
  po.listen_url = "loop://" + test_name() + "-stranger";
  po.group = {1, 2, group.url(0), {}};
  po.join_timeout = 5s;
  Producer stranger(*transport, other, po);
  std::string stranger_error;
  std::thread t([&] { stranger_error = error_of([&] { stranger.start(); }); });
  const auto errors = group.start(/*first_rank=*/2);
  t.join();
  EXPECT_NE(stranger_error.find("producer rank 1"), std::string::npos) << stranger_error;
  EXPECT_NE(stranger_error.find("manifest"), std::string::npos) << stranger_error;
  EXPECT_NE(errors[0].find("producer rank 1 has not said GROUP_HELLO"), std::string::npos) << errors[0];
  for (uint32_t r = 1; r <= 3; ++r) EXPECT_TRUE(group.buffers(r).empty()) << "receiver " << r << " was written";
}

// Two processes claim rank 1: exactly one is refused, naming the problem; the other runs.
TEST(ProducerGroup, TwoProcessesForOnePartOneIsRefused) {
  Model model = Model::make(13);
  Group group(2, 3, TopologyKind::binary, model);
  transport::TransportOptions to;
  auto transport = transport::make_transport("loop", to);
  ProducerOptions po;
  po.listen_url = "loop://" + test_name() + "-twin";
  po.group = {1, 2, group.url(0), {}};
  po.encode.chunk_bytes = 32 << 10;
  po.join_timeout = 20s;
  Producer twin(*transport, model.manifest, po);
  std::string twin_error;
  std::thread t([&] { twin_error = error_of([&] { twin.start(); }); });
  const auto errors = group.start();
  t.join();
  ASSERT_EQ(errors[0], "");
  const bool twin_refused = !twin_error.empty();
  EXPECT_NE(twin_refused, !errors[1].empty()) << "twin: " << twin_error << "; rank 1: " << errors[1];
  const std::string& refused = twin_refused ? twin_error : errors[1];
  EXPECT_NE(refused.find("two processes claim its part"), std::string::npos) << refused;
  if (twin_refused) {
    group.refit(model);
    group.expect_everyone_holds(model, "at version 1");
  }
}

}  // namespace
}  // namespace deltacast::tree
