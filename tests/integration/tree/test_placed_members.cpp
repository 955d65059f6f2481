// Placed members in the relay tree (docs/placement.md, "Placed members in the tree"): receivers that
// hold only their tensor-parallel shard of a Llama-like model, the way vLLM shards it (fused qkv
// and gate_up split by rows, o_proj and down_proj by columns, a padded vocabulary split by rows),
// next to whole receivers, fed by one real Producer over tcp on 127.0.0.1 and over loop://. After
// every version each member's buffers are compared byte for byte with the slices built element by
// element from the producer's checkpoint (tests/unit/codec/placement_reference.h); padding rows
// must keep the 0xEE they were attached with.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codec/encoder.h"
#include "codec/placement.h"
#include "codec/tp_placement.h"
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

// Two Llama layers, hidden 128, intermediate 256, vocabulary 1000 (padded to 1024 by the TP
// helper: the last rank's embedding and lm_head buffers have padding rows), BF16 random bits
// (NaN, infinities, subnormals and -0.0 among them).
struct LlamaModel {
  codec::Manifest manifest;
  std::vector<Bytes> tensors;

  static LlamaModel make(uint64_t seed) {
    std::vector<codec::TensorInfo> infos{{"model.embed_tokens.weight", codec::DType::bf16, {1000, 128}}};
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      infos.push_back({p + "input_layernorm.weight", codec::DType::bf16, {128}});
      for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"})
        infos.push_back({p + "self_attn." + n + ".weight", codec::DType::bf16, {128, 128}});
      infos.push_back({p + "mlp.gate_proj.weight", codec::DType::bf16, {256, 128}});
      infos.push_back({p + "mlp.up_proj.weight", codec::DType::bf16, {256, 128}});
      infos.push_back({p + "mlp.down_proj.weight", codec::DType::bf16, {128, 256}});
    }
    infos.push_back({"model.norm.weight", codec::DType::bf16, {128}});
    infos.push_back({"lm_head.weight", codec::DType::bf16, {1000, 128}});
    LlamaModel m{codec::Manifest(infos), {}};
    std::mt19937_64 rng(seed);
    for (const auto& t : m.manifest.tensors()) {
      Bytes bytes(t.nbytes());
      for (auto& b : bytes) b = static_cast<std::byte>(rng());
      m.tensors.push_back(std::move(bytes));
    }
    return m;
  }
  // ~1% of the elements move by one ulp. quadrant: only elements of 2-D tensors in the first half
  // of both dimensions, which TP rank 1 of 2 holds none of (its rows, columns and vocabulary rows
  // all lie in the second halves): a version that changes nothing in that member's slices.
  void step(uint64_t seed, bool quadrant = false) {
    std::mt19937_64 rng(seed);
    for (uint32_t t = 0; t < manifest.size(); ++t) {
      const auto& shape = manifest.at(t).shape;
      if (quadrant && shape.size() != 2) continue;
      auto& bytes = tensors[t];
      for (size_t i = 0; i < bytes.size(); i += 2) {
        if (rng() % 100 != 0) continue;
        if (quadrant && ((i / 2) / shape[1] >= shape[0] / 2 || (i / 2) % shape[1] >= shape[1] / 2)) continue;
        bytes[i] = static_cast<std::byte>(std::to_integer<uint8_t>(bytes[i]) + ((rng() & 1) ? 1 : 255));
      }
    }
  }
  codec::ConstWeights weights() const {
    codec::ConstWeights w{&manifest, {}};
    for (const auto& t : tensors) w.tensors.emplace_back(t.data(), t.size());
    return w;
  }
};

// Member r's placement: (tp size, tp rank), or {0, 0} for a whole member.
struct Shard {
  uint32_t size = 0;
  uint32_t rank = 0;
};

// True when `buffers` equal the slices `specs` names of `model`, byte for byte (padding: 0xEE).
::testing::AssertionResult holds_shard(const std::vector<Bytes>& buffers,
                                       const std::vector<codec::BufferPlacement>& specs, const LlamaModel& model) {
  return tree::holds_shard(buffers, specs, model.manifest, model.tensors);
}

std::string url(const std::string& scheme, const std::string& name) {
  return scheme == "loop" ? "loop://" + name : scheme + "://127.0.0.1:0";
}

std::string test_label() {
  std::string s = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  return s;
}

// A producer and one receiver thread per shard, all on one transport.
class PlacedCluster {
 public:
  PlacedCluster(const std::string& scheme, const LlamaModel& model, std::vector<Shard> shards)
      : transport_(transport::make_transport(scheme, transport_options())),
        shards_(std::move(shards)),
        specs_(shards_.size()),
        buffers_(shards_.size()),
        failures_(shards_.size()) {
    const std::string name = test_label();
    ProducerOptions options;
    options.listen_url = url(scheme, name + "-producer");
    options.receivers = static_cast<uint32_t>(shards_.size());
    options.topology = TopologyKind::binary;
    options.encode.chunk_bytes = 24 << 10;  // many chunks, many segments across slice edges
    options.max_inflight_bytes_per_root = 256 << 10;
    options.version_timeout = 60s;
    options.peer_timeout = test_time::scaled(options.peer_timeout);
    options.join_timeout = test_time::scaled(options.join_timeout);
    producer_ = std::make_unique<Producer>(*transport_, model.manifest, options);
    for (uint32_t i = 0; i < shards_.size(); ++i) {
      ReceiverOptions ro;
      ro.rank = i + 1;
      ro.producer_url = producer_->url();
      ro.listen_url = url(scheme, name + "-r" + std::to_string(i + 1));
      ro.max_inflight_bytes_per_child = 128 << 10;
      ro.producer_loss_timeout = 2s;
      ro.peer_timeout = test_time::scaled(ro.peer_timeout);
      ro.connect_timeout = test_time::scaled(ro.connect_timeout);
      if (shards_[i].size) specs_[i] = codec::llama_tp_placement(model.manifest, shards_[i].rank, shards_[i].size);
      // Half the placed members state their slices at HELLO, the others by PLACED after WELCOME.
      if (i % 2 == 0) ro.placement = specs_[i];
      ro.gated = gated(i);
      receivers_.push_back(std::make_unique<Receiver>(*transport_, ro));
    }
    for (uint32_t i = 0; i < shards_.size(); ++i) threads_.emplace_back([this, i] { serve(i); });
    try {
      producer_->start();
    } catch (...) {
      for (auto& r : receivers_) r->stop();
      producer_.reset();
      for (auto& t : threads_) t.join();
      throw;
    }
  }
  ~PlacedCluster() {
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
  // Member i runs the apply gate: its buffers change only in apply_pending() (member 3: a placed
  // member stating its slices by PLACED).
  static bool gated(size_t i) { return i == 3; }
  // Member i holds exactly its part of `model` (its shard, or every tensor whole).
  ::testing::AssertionResult holds(size_t i, const LlamaModel& model) const {
    if (shards_[i].size) return holds_shard(buffers_[i], specs_[i], model);
    if (same_bits(buffers_[i], model.weights())) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "the whole member differs";
  }

 private:
  static transport::TransportOptions transport_options() {
    transport::TransportOptions options;
    options.peer_timeout = test_time::scaled(options.peer_timeout);
    options.connect_timeout = test_time::scaled(options.connect_timeout);
    return options;
  }
  void serve(size_t i) {
    try {
      if (shards_[i].size)
        join_and_serve_placed(*receivers_[i], specs_[i], buffers_[i]);
      else
        join_and_serve(*receivers_[i], buffers_[i]);
    } catch (const std::exception& e) {
      failures_[i] = e.what();
    }
  }

  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<Producer> producer_;
  std::vector<Shard> shards_;
  std::vector<std::vector<codec::BufferPlacement>> specs_;
  std::vector<std::unique_ptr<Receiver>> receivers_;
  std::vector<std::vector<Bytes>> buffers_;
  std::vector<std::string> failures_;
  std::vector<std::thread> threads_;
  bool finished_ = false;
};

class PlacedMembers : public ::testing::TestWithParam<std::string> {};

// T = 2 and T = 4 workers and a whole member in one tree: the bootstrap and three deltas (one of
// which changes nothing in TP rank 1 of 2's slices), each bit-exact on every member.
TEST_P(PlacedMembers, TensorParallelWorkersAreBitExactAfterEveryVersion) {
  LlamaModel model = LlamaModel::make(3);
  const std::vector<Shard> shards{{2, 0}, {0, 0}, {2, 1}, {4, 0}, {4, 1}, {4, 2}, {4, 3}};
  PlacedCluster cluster(GetParam(), model, shards);
  const auto n = static_cast<uint32_t>(shards.size());
  RefitReport full = cluster.producer().bootstrap(model.weights());
  ASSERT_TRUE(full.committed) << full.abort_reason;
  EXPECT_EQ(full.verified_receivers, n);
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(cluster.holds(i, model)) << "rank " << i + 1 << " after the bootstrap";
  LlamaModel before = model;
  for (uint64_t v = 2; v <= 4; ++v) {
    model.step(100 + v, v == 3);
    RefitReport r = cluster.producer().refit(model.weights());
    ASSERT_TRUE(r.committed) << r.abort_reason;
    EXPECT_EQ(r.verified_receivers, n) << "version " << v;
    EXPECT_GT(r.changes, 0u);
    // The gated member's buffers wait for its safe point: still the version before.
    EXPECT_TRUE(cluster.holds(3, before)) << "the gated member's buffers changed before apply_pending";
    EXPECT_EQ(cluster.receiver(3).pending(), std::vector<uint64_t>{v});
    EXPECT_EQ(cluster.receiver(3).apply_pending(), v);
    EXPECT_EQ(cluster.receiver(3).applied_digest(), cluster.receiver(1).digest()) << "version " << v;
    for (size_t i = 0; i < n; ++i) EXPECT_TRUE(cluster.holds(i, model)) << "rank " << i + 1 << " at version " << v;
    before = model;
  }
  const uint64_t digest = cluster.receiver(1).digest();  // the whole member's
  cluster.finish();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(cluster.failure(i), "") << "rank " << i + 1;
    EXPECT_EQ(cluster.receiver(i).version(), 4u);
    // A placed member names the version it holds as a whole member does.
    EXPECT_EQ(cluster.receiver(i).digest(), digest) << "rank " << i + 1;
    EXPECT_EQ(cluster.receiver(i).stats().versions_aborted, 0u) << "rank " << i + 1;
  }
}

// A relay of another producer's versions (a store gateway: Producer::forward) with placed members
// in its tree: the stored frames are not cut for their placements, so the relay encodes each
// version again from its own copy; every member ends bit-exact, and the next refit starts from the
// forwarded copy. Broken by sending the stored frames (the placed members refuse segments they
// hold partly: the version aborts).
TEST_P(PlacedMembers, AForwardedVersionReachesPlacedMembersEncodedForThem) {
  LlamaModel model = LlamaModel::make(4);
  const std::vector<Shard> shards{{2, 0}, {0, 0}, {2, 1}, {0, 0}};
  PlacedCluster cluster(GetParam(), model, shards);
  const auto n = static_cast<uint32_t>(shards.size());
  ASSERT_TRUE(cluster.producer().bootstrap(model.weights()).committed);
  const LlamaModel before = model;
  model.step(200, false);
  codec::EncodeOptions upstream;  // the upstream producer knows no placement here
  upstream.chunk_bytes = 24 << 10;
  const auto delta =
      codec::encode_delta(before.weights(), model.weights(), cluster.producer().digest(), {1, 2}, upstream);
  std::promise<Producer::RelayCopy> own;
  own.set_value({model.weights(), delta.new_digest});
  const RefitReport r =
      cluster.producer().forward(delta.frames, 2, delta.new_digest.combined(), own.get_future().share());
  ASSERT_TRUE(r.committed) << r.abort_reason;
  EXPECT_EQ(r.verified_receivers, n);
  EXPECT_EQ(cluster.receiver(3).apply_pending(), 2u);
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(cluster.holds(i, model)) << "rank " << i + 1 << " at version 2";
  model.step(201, false);
  ASSERT_TRUE(cluster.producer().refit(model.weights()).committed);
  EXPECT_EQ(cluster.receiver(3).apply_pending(), 3u);
  cluster.finish();
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(cluster.failure(i), "") << "rank " << i + 1;
    EXPECT_EQ(cluster.receiver(i).version(), 3u);
    EXPECT_TRUE(cluster.holds(i, model)) << "rank " << i + 1 << " at version 3";
  }
}

// Every backend: a placed relay passes each RAW body on from a bounce buffer it keeps alive until
// the send completed (ucx and ofi send from the caller's memory).
INSTANTIATE_TEST_SUITE_P(Schemes, PlacedMembers, ::testing::Values("loop", "tcp", "ucx", "ofi+tcp"),
                         [](const auto& param) {
                           std::string scheme = param.param;
                           std::replace(scheme.begin(), scheme.end(), '+', '_');  // gtest names: [A-Za-z0-9_]
                           return scheme;
                         });

// A member stating a slice the producer's checkpoint does not have is refused at HELLO, naming
// the slice; the others start and refit without it.
TEST(PlacedMembersRefused, SliceOutsideTheCheckpointIsRefusedAtHello) {
  LlamaModel model = LlamaModel::make(4);
  auto transport = transport::make_transport("loop", {});
  ProducerOptions options;
  options.listen_url = "loop://refused-producer";
  options.receivers = 2;
  options.join_timeout = test_time::scaled(10s);
  Producer producer(*transport, model.manifest, options);
  std::vector<Bytes> whole;
  std::string whole_failure;
  ReceiverOptions good;
  good.rank = 1;
  good.producer_url = producer.url();
  good.listen_url = "loop://refused-r1";
  Receiver first(*transport, good);
  std::thread serving([&] {
    try {
      join_and_serve(first, whole);
    } catch (const std::exception& e) {
      whole_failure = e.what();
    }
  });
  ReceiverOptions bad = good;
  bad.rank = 2;
  bad.listen_url = "loop://refused-r2";
  bad.placement = {{"wq", {{"model.layers.0.self_attn.q_proj.weight", 0, 64, 200, std::nullopt}}, false, {}, 0}};
  Receiver second(*transport, bad);
  std::string refusal;
  std::thread refused([&] {
    try {
      second.join();
    } catch (const Error& e) {
      refusal = e.what();
    }
  });
  const StartReport start = producer.start();
  refused.join();
  EXPECT_NE(refusal.find("q_proj"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("64:200"), std::string::npos) << refusal;
  EXPECT_EQ(start.count(MemberAtStart::Role::live), 1u);
  EXPECT_EQ(start.count(MemberAtStart::Role::refused), 1u);
  RefitReport full = producer.bootstrap(model.weights());
  ASSERT_TRUE(full.committed) << full.abort_reason;
  producer.finish();
  serving.join();
  EXPECT_EQ(whole_failure, "");
  EXPECT_TRUE(same_bits(whole, model.weights()));
}

// attach_placed checks the buffers against the placement before anything is written.
TEST(PlacedMembersRefused, BufferOfTheWrongSizeIsRefusedAtAttach) {
  LlamaModel model = LlamaModel::make(5);
  auto transport = transport::make_transport("loop", {});
  ProducerOptions options;
  options.listen_url = "loop://size-producer";
  options.receivers = 1;
  options.join_timeout = test_time::scaled(10s);
  Producer producer(*transport, model.manifest, options);
  ReceiverOptions ro;
  ro.rank = 1;
  ro.producer_url = producer.url();
  ro.listen_url = "loop://size-r1";
  ro.placement = codec::llama_tp_placement(model.manifest, 0, 2);
  Receiver receiver(*transport, ro);
  std::string failure;
  std::thread member([&] {
    try {
      const auto& manifest = receiver.join();
      const auto placement = codec::Placement::compile(manifest, ro.placement);
      std::vector<Bytes> buffers;
      for (uint32_t b = 0; b < placement.buffers().size(); ++b)
        buffers.emplace_back(placement.buffer_units(b) * 2, std::byte{0x11});
      buffers[1].pop_back();
      std::vector<std::span<std::byte>> spans;
      spans.reserve(buffers.size());
      for (auto& b : buffers) spans.emplace_back(b.data(), b.size());
      try {
        receiver.attach_placed(ro.placement, spans, 0);
      } catch (const Error& e) {
        failure = e.what();
        EXPECT_EQ(e.code(), Errc::invalid_argument);
      }
      for (size_t b = 0; b < buffers.size(); ++b)
        for (auto byte : buffers[b]) ASSERT_EQ(byte, std::byte{0x11}) << "buffer " << b << " was written";
      EXPECT_THROW(receiver.run(), Error);  // never attached
    } catch (const std::exception& e) {
      failure += std::string(" / ") + e.what();
    }
  });
  EXPECT_THROW(producer.start(), Error);  // the only member never says READY
  member.join();
  EXPECT_NE(failure.find(ro.placement[1].name), std::string::npos) << failure;
}

// ---- kill and rejoin: each member a thread with its own loopback transport ----

std::chrono::milliseconds peer_timeout() { return test_time::scaled(600ms); }

// The version an ACK a member sends is for (nullopt: another message).
std::optional<uint64_t> ack_version(std::span<const std::byte> message) {
  try {
    if (message_type(message) != MessageType::ack) return std::nullopt;
    return std::get<Ack>(decode_message(message)).version;
  } catch (const Error&) {
    return std::nullopt;
  }
}

class PlacedLoopCluster : public LoopCluster {
 public:
  PlacedLoopCluster(const LlamaModel& model, std::vector<Shard> shards)
      : LoopCluster(test_label(), static_cast<uint32_t>(shards.size()), peer_timeout()), shards_(std::move(shards)) {
    for (const auto& s : shards_)
      specs_.push_back(s.size ? codec::llama_tp_placement(model.manifest, s.rank, s.size)
                              : std::vector<codec::BufferPlacement>{});
    ProducerOptions po;
    po.receivers = size();
    po.topology = TopologyKind::binary;
    po.encode.chunk_bytes = 24 << 10;
    po.max_inflight_bytes_per_root = 256 << 10;
    po.version_timeout = 30s;
    po.join_timeout = test_time::scaled(10s);
    start(model.manifest, po);
  }
  ~PlacedLoopCluster() override {
    if (!finished()) finish();
  }
  // Member r dies as its ACK of `version` is about to leave: it applied the whole version in
  // place (its buffers hold neither version), and the producer never hears it.
  void kill_before_ack(uint32_t r, uint64_t version) {
    loop::set_member_fault_hook(transport_of(r),
                                std::make_shared<loop::FaultFunction>([=](uint64_t, std::span<const std::byte> m) {
                                  if (ack_version(m) == version) return loop::Fault{loop::Fault::Kind::die};
                                  return loop::Fault{};
                                }));
  }
  ::testing::AssertionResult holds_part(uint32_t r, const LlamaModel& model) const {
    if (shards_[r - 1].size) return holds_shard(buffers(r), specs_[r - 1], model);
    if (same_bits(buffers(r), model.weights())) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "the whole member differs";
  }

 private:
  std::unique_ptr<Receiver> make_receiver(uint32_t r) override {
    ReceiverOptions ro = receiver_options(r);
    ro.max_inflight_bytes_per_child = 128 << 10;
    if (r % 2 == 1) ro.placement = specs_[r - 1];  // the others state theirs by PLACED
    return std::make_unique<Receiver>(transport_of(r), ro);
  }
  void serve_member(uint32_t r, Receiver& receiver, std::vector<Bytes>& buffers) override {
    if (shards_[r - 1].size)
      join_and_serve_placed(receiver, specs_[r - 1], buffers);
    else
      join_and_serve(receiver, buffers);
  }
  std::vector<Shard> shards_;
  std::vector<std::vector<codec::BufferPlacement>> specs_;
};

// A placed member killed in the middle of a version comes back as a new process (version 0, its
// buffers 0xEE): it catches up by a snapshot of a whole source (a placed peer serves none) and
// the replay of what committed meanwhile, is admitted again and ends exact on its slices. The
// version it died in commits for the others.
TEST(PlacedMembersFailover, KilledPlacedMemberRejoinsBySnapshotAndEndsExact) {
  LlamaModel model = LlamaModel::make(6);
  // Rank 1, the first snapshot source the producer names, is placed: it refuses, and rank 2 (whole)
  // serves the snapshot.
  const std::vector<Shard> shards{{2, 0}, {0, 0}, {2, 1}, {4, 2}, {2, 1}};
  const auto n = static_cast<uint32_t>(shards.size());
  PlacedLoopCluster c(model, shards);
  RefitReport full = c.producer().bootstrap(model.weights());
  ASSERT_TRUE(full.committed) << full.abort_reason;
  model.step(1);
  RefitReport v2 = c.producer().refit(model.weights());
  ASSERT_TRUE(v2.committed) << v2.abort_reason;
  // Rank 3 (TP rank 1 of 2) dies in the middle of version 3.
  c.kill_before_ack(3, 3);
  model.step(2);
  RefitReport v3 = c.producer().refit(model.weights());
  ASSERT_TRUE(v3.committed) << v3.abort_reason;
  bool failed = false;
  for (const auto& f : v3.failed_members) failed = failed || f.rank == 3;
  EXPECT_TRUE(failed) << "rank 3 is not in version 3's failed members";
  c.restart(3);
  bool back = false;
  for (uint64_t v = 4; v <= 16 && !back; ++v) {
    model.step(v);
    RefitReport r = c.producer().refit(model.weights());
    ASSERT_TRUE(r.committed) << r.abort_reason;
    back = r.verified_receivers == n;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(back) << "the restarted placed member never rejoined";
  model.step(99);
  RefitReport last = c.producer().refit(model.weights());
  ASSERT_TRUE(last.committed) << last.abort_reason;
  EXPECT_EQ(last.verified_receivers, n);
  c.finish();
  for (uint32_t r = 1; r <= n; ++r) {
    EXPECT_EQ(c.failure(r), "") << "rank " << r;
    EXPECT_TRUE(c.holds_part(r, model)) << "rank " << r;
  }
}

}  // namespace
}  // namespace deltacast::tree
