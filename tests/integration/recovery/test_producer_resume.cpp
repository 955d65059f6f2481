// A restarted producer continues the version chain (ProducerOptions::resume; docs/protocol.md,
// "Producer loss"), in one process: every member is a thread with its own loopback transport, the
// producer's transport is killed (as SIGKILL would) and a second Producer resumes at the same
// address from the first one's committed version, baseline, attempt and history. Cases: every
// member kept the version; members behind it (a restarted one at version 0, one holding an older
// version) catch up from live peers; a member whose digest differs is refused; nobody holding the
// version fails the start with a clear error. Plus the trainer simulator's re-simulation, which
// `deltacast run --resume` relies on, independent of the thread count.
#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codec/digest.h"
#include "sim/trainer_simulator.h"
#include "tests/integration/tree/tree_test_model.h"
#include "transport/loopback/loopback.h"
#include "transport/transport.h"
#include "tree/producer.h"
#include "tree/receiver.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
namespace loop = transport::loopback;
using Role = MemberAtStart::Role;
constexpr auto kPeerTimeout = 600ms;

std::string test_name() {
  std::string s = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  return s;
}

uint64_t digest_of(const Model& model) { return codec::StateDigest::full_scan(model.weights()).combined(); }

std::vector<Bytes> copy_of(const Model& model) { return model.tensors; }

// What a member holds when its (new) process starts: version 0 (zeros), or a kept version.
struct Held {
  uint64_t version = 0;
  uint64_t digest = 0;
  std::vector<Bytes> bits;  // empty: zeros
};

// A producer at loop://NAME-producer that can be lost and replaced, and N member threads.
class ResumeCluster {
 public:
  ResumeCluster(const codec::Manifest& manifest, uint32_t n, std::string name)
      : manifest_(manifest), n_(n), name_(std::move(name)), members_(n + 1) {
    for (uint32_t r = 1; r <= n; ++r) start_member(r, Held{});
  }
  ~ResumeCluster() {
    if (producer_) {
      try {
        producer_->finish();
      } catch (const std::exception&) {
      }
    }
    for (uint32_t r = 1; r <= n_; ++r) stop_member(r);
    for (auto& m : retired_)
      if (m->thread.joinable()) m->thread.join();
  }

  // A new producer process at the same address: fresh (version 0) or resumed.
  StartReport start_producer(std::optional<ProducerResume> resume = std::nullopt) {
    transport::TransportOptions to;
    to.peer_timeout = kPeerTimeout;
    producer_transport_ = transport::make_transport("loop", to);
    ProducerOptions po;
    po.listen_url = "loop://" + name_ + "-producer";
    po.receivers = n_;
    po.topology = TopologyKind::binary;
    po.encode.chunk_bytes = 32 << 10;
    po.version_timeout = 30s;
    po.join_timeout = 10s;
    po.peer_timeout = kPeerTimeout;
    po.resume = std::move(resume);
    // What a state file records (run's producer): each version's digest before its COMMIT.
    po.before_commit = [this](uint64_t version, uint64_t digest) { recorded[version] = digest; };
    producer_ = std::make_unique<Producer>(*producer_transport_, manifest_, po);
    return producer_->start();
  }
  std::map<uint64_t, uint64_t> recorded;  // before_commit's (version, digest), as a state file keeps them
  // The producer process dies (SIGKILL): its links close; members keep their committed version
  // and retry its address.
  void kill_producer() {
    loop::kill(*producer_transport_);
    producer_.reset();
    producer_transport_.reset();
  }
  Producer& producer() { return *producer_; }
  void finish() {
    producer_->finish();
    for (uint32_t r = 1; r <= n_; ++r) stop_member(r);
  }

  // A new process for rank r holding `held`; the old one dies first. Its thread may go on
  // retrying the producer from its dead transport for a while: it is joined at the end.
  void restart_member(uint32_t r, Held held) {
    loop::kill(*members_[r]->transport);
    retired_.push_back(std::move(members_[r]));
    start_member(r, std::move(held));
  }
  const std::string& failure(uint32_t r) const { return members_[r]->failure; }
  bool holds(uint32_t r, const Model& model) const { return same_bits(members_[r]->buffers, model.weights()); }
  // Every member ended without failure, bit-exact with `model` (the resumed producer's bits).
  void expect_every_member_holds(const Model& model) const {
    for (uint32_t r = 1; r <= n_; ++r) {
      EXPECT_EQ(failure(r), "") << "rank " << r;
      EXPECT_TRUE(holds(r, model)) << "rank " << r << " differs from the resumed producer";
    }
  }

 private:
  struct Member {
    std::unique_ptr<transport::Transport> transport;
    std::unique_ptr<Receiver> receiver;
    std::vector<Bytes> buffers;
    std::string failure;
    std::thread thread;
  };
  void start_member(uint32_t r, Held held) {
    members_[r] = std::make_unique<Member>();
    Member& m = *members_[r];
    transport::TransportOptions to;
    to.peer_timeout = kPeerTimeout;
    m.transport = transport::make_transport("loop", to);
    ReceiverOptions ro;
    ro.rank = r;
    ro.producer_url = "loop://" + name_ + "-producer";
    ro.listen_url = "loop://" + name_ + "-r" + std::to_string(r);
    ro.peer_timeout = kPeerTimeout;
    ro.connect_timeout = 2s;
    ro.join_timeout = 10s;
    ro.producer_loss_timeout = 5s;  // the tests restart the producer at once
    m.receiver = std::make_unique<Receiver>(*m.transport, ro);
    m.thread = std::thread([&m, held = std::move(held)]() mutable { serve(m, std::move(held)); });
  }
  void stop_member(uint32_t r) {
    if (members_[r]->thread.joinable()) members_[r]->thread.join();
  }
  static void serve(Member& m, Held held) {
    try {
      const auto& manifest = m.receiver->join(held.version, held.digest);
      m.buffers = held.bits;
      if (m.buffers.empty())
        for (const auto& t : manifest.tensors()) m.buffers.emplace_back(t.nbytes(), std::byte{0});
      codec::MutableWeights weights{&manifest, {}};
      for (auto& b : m.buffers) weights.tensors.emplace_back(b.data(), b.size());
      m.receiver->attach(weights, held.version);
      m.receiver->run();
    } catch (const std::exception& e) {
      m.failure = e.what();
    }
  }

  const codec::Manifest& manifest_;
  const uint32_t n_;
  const std::string name_;
  std::unique_ptr<transport::Transport> producer_transport_;
  std::unique_ptr<Producer> producer_;
  std::vector<std::unique_ptr<Member>> members_;  // [rank]
  std::vector<std::unique_ptr<Member>> retired_;  // processes that died (restart_member)
};

// The first producer's life: bootstrap (version 1) and two steps (versions 2, 3), then it dies.
// Keeps what its state file would: the versions' bits (for members that kept an older one), the
// last attempt and the digests.
struct FirstLife {
  Model model = Model::make(31);
  std::vector<std::vector<Bytes>> bits;  // [version]
  uint64_t attempt = 0;
  std::map<uint64_t, uint64_t> history;

  void run(ResumeCluster& c) {
    bits.push_back({});
    c.start_producer();
    ASSERT_TRUE(c.producer().bootstrap(model.weights()).committed);
    bits.push_back(copy_of(model));
    for (uint64_t step = 1; step <= 2; ++step) {
      model.step(step);
      RefitReport r = c.producer().refit(model.weights());
      ASSERT_TRUE(r.committed) << r.abort_reason;
      bits.push_back(copy_of(model));
    }
    attempt = c.producer().attempt();
    history = c.producer().history();
    ASSERT_EQ(c.producer().version(), 3u);
    ASSERT_EQ(history.at(3), c.producer().digest().combined());
    c.kill_producer();
  }
  ProducerResume resume() const { return ProducerResume{3, model.weights(), attempt, history, {}}; }
  // Members behind are admitted at a version boundary once caught up: refits (each committed)
  // until every one of the n members verified one.
  void refit_until_all_verified(ResumeCluster& c, uint32_t n) {
    uint32_t in = 0;
    for (uint64_t step = 3; step <= 40 && in < n; ++step) {
      model.step(step);
      RefitReport r = c.producer().refit(model.weights());
      ASSERT_TRUE(r.committed) << r.abort_reason;
      in = r.verified_receivers;
      if (in < n) std::this_thread::sleep_for(50ms);
    }
    EXPECT_EQ(in, n) << "the members behind never joined the live set";
  }
  Held held(uint64_t version, bool wrong_digest = false) const {
    Model m{model.manifest, bits[version]};
    return Held{version, digest_of(m) ^ (wrong_digest ? 0x55 : 0), bits[version]};
  }
};

TEST(ProducerResume, EveryMemberKeptTheVersion) {
  const uint32_t n = 5;
  FirstLife life;
  ResumeCluster c(life.model.manifest, n, test_name());
  ASSERT_NO_FATAL_FAILURE(life.run(c));
  const StartReport start = c.start_producer(life.resume());
  EXPECT_EQ(start.version, 3u);
  EXPECT_EQ(start.count(Role::live), n);
  for (const auto& m : start.members) EXPECT_EQ(m.held_version, 3u) << "rank " << m.rank;
  EXPECT_EQ(c.producer().version(), 3u);
  for (uint64_t step = 3; step <= 4; ++step) {
    life.model.step(step);
    RefitReport r = c.producer().refit(life.model.weights());
    ASSERT_TRUE(r.committed) << r.abort_reason;
    EXPECT_EQ(r.version, step + 1);
    EXPECT_EQ(r.verified_receivers, n);
  }
  // Attempt ids go on above the first producer's.
  EXPECT_GT(c.producer().attempt(), life.attempt);
  EXPECT_EQ(c.producer().history().at(5), c.producer().digest().combined());
  c.finish();
  c.expect_every_member_holds(life.model);
}

// The producer dies right after the bootstrap committed, so its state file holds version 1 as
// recorded before the COMMIT: that record is version 1's StateDigest (not the RAW pieces' hash sum
// the members acked), so the resumed producer takes every member back live at version 1.
TEST(ProducerResume, ResumedRightAfterTheBootstrapEveryMemberKeptVersion1) {
  const uint32_t n = 4;
  Model model = Model::make(41);
  ResumeCluster c(model.manifest, n, test_name());
  c.start_producer();
  ASSERT_TRUE(c.producer().bootstrap(model.weights()).committed);
  const uint64_t attempt = c.producer().attempt();
  const std::map<uint64_t, uint64_t> state{{1, c.recorded.at(1)}};
  EXPECT_EQ(c.recorded.at(1), codec::StateDigest::full_scan(model.weights()).combined());
  c.kill_producer();
  const StartReport start = c.start_producer(ProducerResume{1, model.weights(), attempt, state, {}});
  EXPECT_EQ(start.version, 1u);
  EXPECT_EQ(start.count(Role::live), n) << "members holding version 1 are refused: the record is not their digest";
  model.step(9);
  RefitReport r = c.producer().refit(model.weights());
  ASSERT_TRUE(r.committed) << r.abort_reason;
  EXPECT_EQ(r.verified_receivers, n);
  c.finish();
  c.expect_every_member_holds(model);
}

TEST(ProducerResume, MembersBehindCatchUpFromLivePeers) {
  const uint32_t n = 5;
  FirstLife life;
  ResumeCluster c(life.model.manifest, n, test_name());
  ASSERT_NO_FATAL_FAILURE(life.run(c));
  // Rank 2's process restarted with nothing (version 0: a snapshot); rank 4's kept version 2 (a
  // replay of version 3 from a peer's retained frames).
  c.restart_member(2, Held{});
  c.restart_member(4, life.held(2));
  const StartReport start = c.start_producer(life.resume());
  EXPECT_EQ(start.count(Role::live), n - 2);
  EXPECT_EQ(start.members.at(1).role, Role::catching_up);
  EXPECT_EQ(start.members.at(1).held_version, 0u);
  EXPECT_EQ(start.members.at(3).role, Role::catching_up);
  EXPECT_EQ(start.members.at(3).held_version, 2u);
  // They are admitted at a version boundary once caught up: refit until every member is in.
  ASSERT_NO_FATAL_FAILURE(life.refit_until_all_verified(c, n));
  c.finish();
  c.expect_every_member_holds(life.model);
}

TEST(ProducerResume, MemberWithAnotherDigestIsRefused) {
  const uint32_t n = 4;
  FirstLife life;
  ResumeCluster c(life.model.manifest, n, test_name());
  ASSERT_NO_FATAL_FAILURE(life.run(c));
  c.restart_member(3, life.held(3, /*wrong_digest=*/true));
  const StartReport start = c.start_producer(life.resume());
  EXPECT_EQ(start.count(Role::live), n - 1);
  EXPECT_EQ(start.members.at(2).role, Role::refused);
  EXPECT_NE(start.members.at(2).detail.find("the producer's digest of that version is"), std::string::npos)
      << start.members.at(2).detail;
  life.model.step(3);
  RefitReport r = c.producer().refit(life.model.weights());
  ASSERT_TRUE(r.committed) << r.abort_reason;
  EXPECT_EQ(r.verified_receivers, n - 1);
  c.finish();
  EXPECT_NE(c.failure(3).find("refused"), std::string::npos) << c.failure(3);
  for (uint32_t rank : {1u, 2u, 4u}) {
    EXPECT_EQ(c.failure(rank), "") << "rank " << rank;
    EXPECT_TRUE(c.holds(rank, life.model)) << "rank " << rank;
  }
}

// Nobody holds the committed version (the producer wrote it as committed, then died before its
// COMMIT went out): the start goes on, every member catches up from the producer's own snapshot
// (no peer can serve it) and the chain continues.
TEST(ProducerResume, NoMemberHoldingTheVersionCatchesUpFromTheProducer) {
  const uint32_t n = 3;
  FirstLife life;
  ResumeCluster c(life.model.manifest, n, test_name());
  ASSERT_NO_FATAL_FAILURE(life.run(c));
  c.restart_member(1, Held{});
  c.restart_member(2, life.held(2));
  c.restart_member(3, Held{});
  const StartReport start = c.start_producer(life.resume());
  EXPECT_EQ(start.count(Role::live), 0u);
  EXPECT_EQ(start.count(Role::catching_up), n);
  ASSERT_NO_FATAL_FAILURE(life.refit_until_all_verified(c, n));
  c.finish();
  c.expect_every_member_holds(life.model);
}

TEST(ProducerResume, FreshProducerRefusesMembersThatHoldLaterVersions) {
  const uint32_t n = 3;
  FirstLife life;
  ResumeCluster c(life.model.manifest, n, test_name());
  ASSERT_NO_FATAL_FAILURE(life.run(c));
  c.restart_member(2, Held{});
  // Without resume the producer is at version 0: ranks 1 and 3 (at version 3) cannot take part.
  const StartReport start = c.start_producer();
  EXPECT_EQ(start.version, 0u);
  EXPECT_EQ(start.count(Role::live), 1u);
  EXPECT_EQ(start.members.at(0).role, Role::refused);
  EXPECT_NE(start.members.at(0).detail.find("--resume"), std::string::npos) << start.members.at(0).detail;
  Model fresh = Model::make(5);
  ASSERT_TRUE(c.producer().bootstrap(fresh.weights()).committed);
  c.finish();
  EXPECT_TRUE(c.holds(2, fresh));
  EXPECT_NE(c.failure(1).find("newer than the producer's committed version 0"), std::string::npos) << c.failure(1);
}

TEST(ProducerResume, BaselineMustMatchItsDigest) {
  Model model = Model::make(3);
  auto t = transport::make_transport("loop", {});
  ProducerOptions po;
  po.listen_url = "loop://" + test_name();
  po.resume = ProducerResume{2, model.weights(), 7, {{1, 1}, {2, digest_of(model) + 1}}, {}};
  try {
    Producer p(*t, model.manifest, po);
    FAIL() << "a baseline that is not version 2's bits was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::verify_failed) << e.what();
  }
  po.resume = ProducerResume{2, model.weights(), 7, {{1, 1}}, {}};
  EXPECT_THROW(Producer(*t, model.manifest, po), Error);  // no digest for version 2
  po.resume = ProducerResume{2, model.weights(), 7, {{2, digest_of(model)}}, {}};
  Producer p(*t, model.manifest, po);
  EXPECT_EQ(p.version(), 2u);
  EXPECT_EQ(p.attempt(), 7u);
  EXPECT_EQ(p.digest().combined(), digest_of(model));
}

// `deltacast run --resume` rebuilds the committed bits by re-simulating the trainer with
// threads = hardware_concurrency, which may differ from the run that wrote the state.
TEST(TrainerResimulation, SameBitsWhateverTheThreadCount) {
  auto config = [](unsigned threads) {
    sim::SimConfig c;
    c.params = 3'000'000;
    c.lr = 1e-5f;
    c.seed = 7;
    c.threads = threads;
    return c;
  };
  std::vector<uint64_t> digests;
  for (unsigned threads : {1u, 2u, 3u, 8u}) {
    sim::TrainerSimulator trainer(config(threads));
    for (int s = 0; s < 3; ++s) trainer.step();
    digests.push_back(codec::StateDigest::full_scan(trainer.bf16_weights(), threads).combined());
    EXPECT_EQ(digests.back(), codec::StateDigest::full_scan(trainer.bf16_weights(), 1).combined())
        << "the digest's full scan depends on its thread count (" << threads << ")";
  }
  for (size_t i = 1; i < digests.size(); ++i) EXPECT_EQ(digests[i], digests[0]) << "thread count #" << i;
  // And a continued run equals a re-simulated one step for step.
  sim::TrainerSimulator a(config(2)), b(config(5));
  for (int s = 0; s < 2; ++s) a.step();
  for (int s = 0; s < 2; ++s) b.step();
  a.step();
  b.step();
  EXPECT_EQ(codec::StateDigest::full_scan(a.bf16_weights()).combined(),
            codec::StateDigest::full_scan(b.bf16_weights()).combined());
}

}  // namespace
}  // namespace deltacast::tree
