// The relay tree end to end, with every member a thread of this process: a real Producer and real
// Receivers over real transports (loop://, and tcp, ucx, ofi+tcp on 127.0.0.1), bit-exact checks
// by memcmp.
#include <algorithm>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codec/encoder.h"
#include "tests/common/time_scale.h"
#include "tests/integration/tree/tree_test_model.h"
#include "transport/transport.h"
#include "tree/producer.h"
#include "tree/receiver.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

struct Params {
  std::string scheme;
  TopologyKind topology;
};

// A producer and `n` receiver threads; each receiver's buffers are kept for memcmp after run().
class Cluster {
 public:
  // first_start_version: receiver 1 attaches at that version with its buffers filled with 0x5A
  // (every other receiver starts at the all-zero version 0).
  Cluster(const Params& params, const codec::Manifest& manifest, uint32_t n, const std::string& name,
          uint64_t chunk_bytes = 64 << 10, uint64_t first_start_version = 0)
      : transport_(transport::make_transport(params.scheme, transport_options())),
        buffers_(n),
        summaries_(n),
        first_start_version_(first_start_version) {
    ProducerOptions options;
    options.listen_url = url(params.scheme, name + "-producer");
    options.receivers = n;
    options.topology = params.topology;
    options.encode.chunk_bytes = chunk_bytes;  // default: many chunks for a small model
    options.max_inflight_bytes_per_root = 256 << 10;
    options.version_timeout = std::chrono::milliseconds(60'000);
    // Under sanitizers (tests/common/time_scale.h) a healthy peer is slower: the silence and join
    // bounds stretch with it (under TSan an ofi+tcp handshake alone can outlast 5 s).
    options.peer_timeout = test_time::scaled(options.peer_timeout);
    options.join_timeout = test_time::scaled(options.join_timeout);
    producer_ = std::make_unique<Producer>(*transport_, manifest, options);
    for (uint32_t r = 1; r <= n; ++r) {
      ReceiverOptions ro;
      ro.rank = r;
      ro.producer_url = producer_->url();
      ro.listen_url = url(params.scheme, name + "-r" + std::to_string(r));
      ro.max_inflight_bytes_per_child = 128 << 10;  // exercise back-pressure
      ro.producer_loss_timeout = std::chrono::milliseconds(2000);  // a fenced member gives up soon
      ro.peer_timeout = test_time::scaled(ro.peer_timeout);        // sets each connect attempt's bound
      ro.connect_timeout = test_time::scaled(ro.connect_timeout);
      receivers_.push_back(std::make_unique<Receiver>(*transport_, ro));
    }
    for (uint32_t i = 0; i < n; ++i) threads_.emplace_back([this, i] { serve(i); });
    try {
      producer_->start();
    } catch (...) {
      // A failed start (members found silent on an overloaded machine, e.g. under ASan): end every
      // receiver thread before the exception leaves, or joinable threads terminate the process.
      for (auto& r : receivers_) r->stop();
      producer_.reset();
      for (auto& t : threads_) t.join();
      throw;
    }
  }
  ~Cluster() {
    if (!finished_) finish();
  }
  void finish() {
    finished_ = true;
    producer_->finish();
    for (auto& t : threads_) t.join();
  }
  Producer& producer() { return *producer_; }
  Receiver& receiver(size_t i) { return *receivers_[i]; }
  size_t size() const { return receivers_.size(); }
  const std::string& failure(size_t i) const { return failures_[i]; }
  const std::vector<Bytes>& buffers(size_t i) const { return buffers_[i]; }

  // Every receiver ended without failure at `version`, its buffers `expected` byte for byte.
  void expect_every_member_at(uint64_t version, const codec::ConstWeights& expected) {
    for (size_t i = 0; i < size(); ++i) {
      EXPECT_EQ(failure(i), "") << "receiver " << i + 1;
      EXPECT_EQ(receiver(i).version(), version) << "receiver " << i + 1;
      EXPECT_TRUE(holds(i, expected)) << "receiver " << i + 1;
    }
  }
  // True when receiver i's buffers equal `expected` byte for byte.
  bool holds(size_t i, const codec::ConstWeights& expected) const {
    const auto& mine = buffers_[i];
    if (mine.size() != expected.tensors.size()) return false;
    for (size_t t = 0; t < mine.size(); ++t)
      if (mine[t].size() != expected.tensors[t].size() ||
          std::memcmp(mine[t].data(), expected.tensors[t].data(), mine[t].size()) != 0)
        return false;
    return true;
  }

 private:
  // The defaults, with the silence bound stretched under sanitizers (tests/common/time_scale.h).
  static transport::TransportOptions transport_options() {
    transport::TransportOptions options;
    options.peer_timeout = test_time::scaled(options.peer_timeout);
    options.connect_timeout = test_time::scaled(options.connect_timeout);
    return options;
  }
  static std::string url(const std::string& scheme, const std::string& name) {
    return scheme == "loop" ? "loop://" + name : scheme + "://127.0.0.1:0";
  }
  void serve(size_t i) {
    try {
      summaries_[i] = join_and_serve(*receivers_[i], buffers_[i], i == 0 ? first_start_version_ : 0);
    } catch (const std::exception& e) {
      failures_[i] = e.what();
    }
  }

  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<Producer> producer_;
  std::vector<std::unique_ptr<Receiver>> receivers_;
  std::vector<std::vector<Bytes>> buffers_;
  std::vector<RunSummary> summaries_;
  std::vector<std::string> failures_ = std::vector<std::string>(16);
  std::vector<std::thread> threads_;
  uint64_t first_start_version_ = 0;
  bool finished_ = false;
};

bool all_bytes_are(const std::vector<Bytes>& tensors, std::byte value) {
  for (const auto& t : tensors)
    for (auto b : t)
      if (b != value) return false;
  return true;
}

class RelayTree : public ::testing::TestWithParam<Params> {
 protected:
  std::string name() const {
    return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
};

std::string sanitize(std::string s) {
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  return s;
}

TEST_P(RelayTree, EveryReceiverIsBitExactAfterEachVersion) {
  Model model = Model::make(1);
  const uint32_t n = 7;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()));
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) model.step(v);
    RefitReport report = cluster.producer().refit(model.weights());
    ASSERT_TRUE(report.committed) << report.abort_reason;
    EXPECT_EQ(report.version, v);
    EXPECT_EQ(report.verified_receivers, n);
    EXPECT_GT(report.chunks, 1u);
    if (v > 1) {
      EXPECT_LT(report.changes, report.elements / 20);
    }
  }
  cluster.finish();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(cluster.failure(i), "") << "receiver " << i + 1;
    EXPECT_TRUE(cluster.holds(i, model.weights())) << "receiver " << i + 1 << " differs";
    EXPECT_EQ(cluster.receiver(i).version(), 3u);
    EXPECT_EQ(cluster.receiver(i).stats().versions_committed, 3u);
  }
}

TEST_P(RelayTree, RawBootstrapThenDeltasAreBitExact) {
  Model model = Model::make(5);
  const uint32_t n = 4;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()));
  RefitReport full = cluster.producer().bootstrap(model.weights());
  ASSERT_TRUE(full.committed) << full.abort_reason;
  EXPECT_EQ(full.version, 1u);
  EXPECT_EQ(full.verified_receivers, n);
  EXPECT_EQ(full.frames_bytes, model.manifest.total_bytes());
  for (int step = 0; step < 2; ++step) {
    model.step(40 + step);
    RefitReport delta = cluster.producer().refit(model.weights());
    ASSERT_TRUE(delta.committed) << delta.abort_reason;
    EXPECT_LT(delta.frames_bytes * 10, full.frames_bytes);
  }
  cluster.finish();
  cluster.expect_every_member_at(3u, model.weights());
}

// Receivers refuse raw pieces that split an element: a chunk size that is not a multiple of 2 or
// 4 bytes must still give pieces on element boundaries, and the baseline digest the producer
// computes after the bootstrap must equal a full scan of the checkpoint.
TEST_P(RelayTree, RawBootstrapWithOddChunkBytesIsBitExact) {
  Model model = Model::make(6);
  const uint32_t n = 3;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()), (32 << 10) + 1);
  RefitReport full = cluster.producer().bootstrap(model.weights());
  ASSERT_TRUE(full.committed) << full.abort_reason;
  EXPECT_EQ(full.verified_receivers, n);
  EXPECT_EQ(full.frames_bytes, model.manifest.total_bytes());
  EXPECT_EQ(cluster.producer().digest(), codec::StateDigest::full_scan(model.weights()));
  model.step(77);
  RefitReport delta = cluster.producer().refit(model.weights());
  ASSERT_TRUE(delta.committed) << delta.abort_reason;
  cluster.finish();
  cluster.expect_every_member_at(2u, model.weights());
}

// Receiver 1 (a root, or the head of the chain) holds version 5, so it refuses the bootstrap:
// it still forwards the pieces (copied, since they did not land in its buffers), the others
// land them and ack, the producer aborts, and every other receiver zeroes its buffers again
// (after any body still landing) while receiver 1's bits stay untouched.
TEST_P(RelayTree, RefusedBootstrapLeavesEveryReceiverAtItsOwnVersion) {
  Model model = Model::make(8);
  const uint32_t n = 5;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()), 64 << 10, 5);
  try {
    RefitReport full = cluster.producer().bootstrap(model.weights());
    EXPECT_FALSE(full.committed);
  } catch (const Error& e) {
    // Receiver 1 answers ABORT with ACTIVE(5), not the version 0 the producer expected.
    EXPECT_EQ(e.code(), Errc::state) << e.what();
  }
  EXPECT_EQ(cluster.producer().version(), 0u);
  cluster.finish();
  EXPECT_EQ(cluster.receiver(0).version(), 5u);
  EXPECT_GE(cluster.receiver(0).stats().frames_refused, 1u);
  EXPECT_TRUE(all_bytes_are(cluster.buffers(0), std::byte{0x5A})) << "receiver 1 was written";
  for (size_t i = 1; i < n; ++i) {
    EXPECT_EQ(cluster.failure(i), "");
    EXPECT_EQ(cluster.receiver(i).version(), 0u);
    EXPECT_EQ(cluster.receiver(i).stats().versions_aborted, 1u) << "receiver " << i + 1;
    // The pieces reached them intact through receiver 1 (only the abort undid them).
    EXPECT_EQ(cluster.receiver(i).stats().frames_refused, 0u) << "receiver " << i + 1;
    EXPECT_TRUE(all_bytes_are(cluster.buffers(i), std::byte{0})) << "receiver " << i + 1 << " not back at zeros";
  }
}

TEST_P(RelayTree, DeltaWithWrongBaseIsRefusedAndBitsStayAtTheBase) {
  Model model = Model::make(2);
  const uint32_t n = 5;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()));
  ASSERT_TRUE(cluster.producer().refit(model.weights()).committed);
  Model base = model;
  model.step(10);
  // Frames that claim base version 7, which nobody holds.
  codec::EncodeOptions options;
  options.chunk_bytes = 64 << 10;
  auto wrong = codec::encode_delta(base.weights(), model.weights(), cluster.producer().digest(),
                                   {7, 8}, options);
  RefitReport report = cluster.producer().publish(wrong.frames, 8, wrong.new_digest.combined());
  EXPECT_FALSE(report.committed);
  EXPECT_NE(report.abort_reason.find("version_mismatch"), std::string::npos) << report.abort_reason;
  EXPECT_EQ(report.verified_receivers, 0u);
  // The tree still works afterwards, from the right base.
  RefitReport good = cluster.producer().refit(model.weights());
  EXPECT_TRUE(good.committed) << good.abort_reason;
  EXPECT_EQ(good.version, 2u);
  cluster.finish();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(cluster.failure(i), "");
    EXPECT_GE(cluster.receiver(i).stats().frames_refused, 1u);
    EXPECT_TRUE(cluster.holds(i, model.weights())) << "receiver " << i + 1;
  }
}

TEST_P(RelayTree, AbortRollsEveryReceiverBackToTheBaseBits) {
  Model model = Model::make(3);
  const uint32_t n = 6;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()));
  ASSERT_TRUE(cluster.producer().refit(model.weights()).committed);
  Model base = model;
  model.step(20);
  RefitReport report =
      cluster.producer().refit(model.weights(), {.dry_run = true, .value_mode = std::nullopt, .layout = std::nullopt});
  EXPECT_FALSE(report.committed);
  EXPECT_EQ(report.verified_receivers, n);  // everybody applied and verified, then rolled back
  EXPECT_EQ(cluster.producer().version(), 1u);
  cluster.finish();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(cluster.failure(i), "");
    EXPECT_EQ(cluster.receiver(i).version(), 1u);
    EXPECT_EQ(cluster.receiver(i).stats().versions_aborted, 1u);
    EXPECT_TRUE(cluster.holds(i, base.weights())) << "receiver " << i + 1 << " not at the base";
  }
}

TEST_P(RelayTree, ReplayedChunkIsRefusedAndNotForwarded) {
  Model model = Model::make(4);
  const uint32_t n = 7;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()));
  ASSERT_TRUE(cluster.producer().refit(model.weights()).committed);
  Model base = model;
  model.step(30);
  codec::EncodeOptions options;
  options.chunk_bytes = 64 << 10;
  auto delta = codec::encode_delta(base.weights(), model.weights(), cluster.producer().digest(),
                                   {1, 2}, options);
  ASSERT_GT(delta.frames.size(), 3u);
  // The root's parent sends chunk 0 twice (chunk 0 goes down tree 0 in every topology).
  auto frames = delta.frames;
  frames.insert(frames.begin() + 2, delta.frames[0]);
  RefitReport report = cluster.producer().publish(frames, 2, delta.new_digest.combined());
  EXPECT_TRUE(report.committed) << report.abort_reason;
  cluster.finish();
  uint64_t replayed = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(cluster.failure(i), "");
    replayed += cluster.receiver(i).stats().frames_replayed;
    EXPECT_TRUE(cluster.holds(i, model.weights())) << "receiver " << i + 1;
  }
  EXPECT_EQ(replayed, 1u) << "the duplicate must be refused once, at the root, and not forwarded";
}

// forward() (a store gateway relaying versions it applies itself meanwhile): the members get the
// frames at once, but the version commits only once the relay's own copy is ready; then the copy
// is the baseline the next refit encodes against. Broken by committing without waiting for the
// copy (the members are at version 2 while it is pending).
TEST_P(RelayTree, AForwardedVersionCommitsOnlyOnceTheRelaysOwnCopyHoldsIt) {
  Model model = Model::make(5);
  const uint32_t n = 5;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()));
  ASSERT_TRUE(cluster.producer().refit(model.weights()).committed);
  Model base = model;
  model.step(40);
  codec::EncodeOptions options;
  options.chunk_bytes = 64 << 10;
  const auto delta = codec::encode_delta(base.weights(), model.weights(), cluster.producer().digest(), {1, 2}, options);
  std::promise<Producer::RelayCopy> own;
  std::thread relay([&] {
    // Every member has every frame and verified them; the version still waits for the relay.
    const auto until = std::chrono::steady_clock::now() + test_time::scaled(std::chrono::milliseconds(30'000));
    for (uint32_t i = 0; i < n; ++i)
      while (cluster.receiver(i).stats().frames_received < delta.frames.size() &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(cluster.receiver(i).version(), 1u) << "receiver " << i + 1;
    own.set_value({model.weights(), delta.new_digest});
  });
  const RefitReport report =
      cluster.producer().forward(delta.frames, 2, delta.new_digest.combined(), own.get_future().share());
  relay.join();
  EXPECT_TRUE(report.committed) << report.abort_reason;
  EXPECT_EQ(report.verified_receivers, n);
  EXPECT_EQ(cluster.producer().version(), 2u);
  EXPECT_EQ(cluster.producer().digest().combined(), delta.new_digest.combined());
  model.step(41);  // encoded against the forwarded copy
  ASSERT_TRUE(cluster.producer().refit(model.weights()).committed);
  cluster.finish();
  cluster.expect_every_member_at(3u, model.weights());
}

// A relay whose own copy fails (its apply throws) or differs (another digest): the version aborts
// on every member, which roll back to the base bits, forward() throws the copy's error, and the
// producer's baseline stays the base. Broken by ignoring the copy's error or its digest.
TEST_P(RelayTree, AForwardedVersionWhoseOwnCopyFailsAbortsOnEveryMember) {
  Model model = Model::make(6);
  const uint32_t n = 4;
  Cluster cluster(GetParam(), model.manifest, n, sanitize(name()));
  ASSERT_TRUE(cluster.producer().refit(model.weights()).committed);
  Model base = model;
  model.step(50);
  codec::EncodeOptions options;
  options.chunk_bytes = 64 << 10;
  const auto delta = codec::encode_delta(base.weights(), model.weights(), cluster.producer().digest(), {1, 2}, options);
  std::promise<Producer::RelayCopy> failed;
  failed.set_exception(std::make_exception_ptr(Error(Errc::corrupt_frame, "the relay's copy refused a chunk")));
  try {
    cluster.producer().forward(delta.frames, 2, delta.new_digest.combined(), failed.get_future().share());
    ADD_FAILURE() << "a failed copy was forwarded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_frame) << e.what();
  }
  std::promise<Producer::RelayCopy> other;
  other.set_value({base.weights(), codec::StateDigest::full_scan(base.weights())});
  try {
    cluster.producer().forward(delta.frames, 2, delta.new_digest.combined(), other.get_future().share());
    ADD_FAILURE() << "a copy of other bits was forwarded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::verify_failed) << e.what();
  }
  EXPECT_EQ(cluster.producer().version(), 1u);
  EXPECT_EQ(cluster.producer().digest().combined(), codec::StateDigest::full_scan(base.weights()).combined());
  ASSERT_TRUE(cluster.producer().refit(model.weights()).committed);  // from the base, still the baseline
  cluster.finish();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(cluster.failure(i), "");
    EXPECT_EQ(cluster.receiver(i).version(), 2u);  // the refit from the base bits committed: rolled back
    EXPECT_TRUE(cluster.holds(i, model.weights())) << "receiver " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Transports, RelayTree,
    ::testing::Values(Params{"loop", TopologyKind::binary}, Params{"loop", TopologyKind::double_binary},
                      Params{"loop", TopologyKind::chain}, Params{"tcp", TopologyKind::binary},
                      Params{"tcp", TopologyKind::double_binary}, Params{"tcp", TopologyKind::chain},
                      // RAW bodies are separate messages received into place: every backend.
                      Params{"ucx", TopologyKind::double_binary}, Params{"ofi+tcp", TopologyKind::chain}),
    [](const auto& param_info) {
      std::string scheme = param_info.param.scheme;
      std::replace(scheme.begin(), scheme.end(), '+', '_');  // gtest names: [A-Za-z0-9_]
      return scheme + "_" + std::string(topology_kind_name(param_info.param.topology));
    });

}  // namespace
}  // namespace deltacast::tree
