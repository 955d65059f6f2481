// Session: a member's version state machine over the host's weights (tree/session.h). Real frames
// from the codec's encoder and real RAW pieces (RawChunkHeader + raw_piece_hash) drive it; every
// check on the weights is bitwise (memcmp), over a model that holds NaNs (several payloads), ±inf,
// -0.0, subnormals, odd element counts, a tensor whose every element changes and one that never
// does.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codec/digest.h"
#include "codec/encoder.h"
#include "codec/frame.h"
#include "codec/manifest.h"
#include "tree/protocol.h"
#include "tree/session.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
using codec::DType;
using codec::StateDigest;

constexpr uint32_t kRank = 7;

// ---------------------------------------------------------------------------------------------
// The model: tensors of several dtypes and odd sizes.

codec::Manifest small_manifest() {
  return codec::Manifest({{"emb", DType::bf16, {5, 7}},      // 35, odd
                          {"proj", DType::f32, {3, 11}},     // 33, odd
                          {"bias", DType::bf16, {1}},        // a single element
                          {"frozen", DType::f32, {9}},       // never changes
                          {"all", DType::bf16, {17}},        // every element changes every version
                          {"half", DType::f16, {13}}});
}

codec::Manifest snapshot_manifest() {
  return codec::Manifest({{"emb", DType::bf16, {7, 43}},     // 301
                          {"proj", DType::f32, {77}},
                          {"frozen", DType::bf16, {3}},      // never changes
                          {"one", DType::f32, {1}},
                          {"all", DType::f32, {29}},         // every element changes every version
                          {"tail", DType::bf16, {131}}});
}

unsigned width_of(const codec::Manifest& m, uint32_t t) {
  return static_cast<unsigned>(codec::dtype_size(m.at(t).dtype));
}

uint32_t load(const std::vector<std::byte>& b, unsigned width, uint64_t i) {
  uint32_t v = 0;
  std::memcpy(&v, b.data() + i * width, width);  // little-endian host
  return v;
}
void store(std::vector<std::byte>& b, unsigned width, uint64_t i, uint32_t v) { std::memcpy(b.data() + i * width, &v, width); }

// Bit patterns at the edges of each float format.
std::vector<uint32_t> edge_values(DType dt) {
  switch (dt) {
    case DType::bf16:
      return {0x7FC0, 0x7F81, 0xFFC1, 0x7FFF,  // NaNs with several payloads and signs
              0x7F80, 0xFF80,                  // ±inf
              0x8000, 0x0000,                  // -0.0, +0.0
              0x0001, 0x007F, 0x807F, 0x8001,  // subnormals
              0x7F7F, 0xFF7F};                 // ±max
    case DType::f32:
      return {0x7FC00000, 0x7FA00001, 0xFFFFFFFF, 0x7F800001, 0x7F800000, 0xFF800000,
              0x80000000, 0x00000000, 0x00000001, 0x007FFFFF, 0x807FFFFF, 0x80000001,
              0x7F7FFFFF, 0xFF7FFFFF};
    case DType::f16:
      return {0x7E00, 0x7C01, 0xFE01, 0x7C00, 0xFC00, 0x8000, 0x0000, 0x0001, 0x03FF, 0x83FF, 0x7BFF};
    default:
      return {0x00, 0xFF, 0x80, 0x7F};
  }
}

struct Weights {
  const codec::Manifest* manifest;
  std::vector<std::vector<std::byte>> bytes;
  explicit Weights(const codec::Manifest& m) : manifest(&m) {
    for (const auto& t : m.tensors()) bytes.emplace_back(t.nbytes());
  }
  codec::ConstWeights view() const {
    codec::ConstWeights w{manifest, {}};
    for (const auto& b : bytes) w.tensors.emplace_back(b.data(), b.size());
    return w;
  }
  codec::MutableWeights mut() {
    codec::MutableWeights w{manifest, {}};
    for (auto& b : bytes) w.tensors.emplace_back(b.data(), b.size());
    return w;
  }
  StateDigest digest() const { return StateDigest::full_scan(view()); }
};

// Bitwise equality, naming the first differing tensor and element.
::testing::AssertionResult same_bits(const Weights& actual, const Weights& expected) {
  for (uint32_t t = 0; t < expected.bytes.size(); ++t) {
    const auto& a = actual.bytes[t];
    const auto& e = expected.bytes[t];
    if (a.size() != e.size()) return ::testing::AssertionFailure() << "tensor " << t << ": sizes differ";
    if (!e.empty() && std::memcmp(a.data(), e.data(), e.size()) != 0) {
      const unsigned w = width_of(*expected.manifest, t);
      for (uint64_t i = 0; i < e.size() / w; ++i)
        if (load(a, w, i) != load(e, w, i)) {
          std::ostringstream what;
          what << "tensor " << t << " element " << i << ": 0x" << std::hex << load(a, w, i) << " != 0x"
               << load(e, w, i);
          return ::testing::AssertionFailure() << what.str();
        }
    }
  }
  return ::testing::AssertionSuccess();
}

bool is_zero(const Weights& w) {
  for (const auto& b : w.bytes)
    if (std::any_of(b.begin(), b.end(), [](std::byte x) { return x != std::byte{0}; })) return false;
  return true;
}

bool never_changes(const codec::Manifest& m, uint32_t t) { return m.at(t).name == "frozen"; }
bool always_changes(const codec::Manifest& m, uint32_t t) { return m.at(t).name == "all"; }

// A first version: random bits with every edge value planted (several times).
Weights random_version(const codec::Manifest& m, std::mt19937_64& rng) {
  Weights w(m);
  for (uint32_t t = 0; t < m.size(); ++t) {
    const unsigned width = width_of(m, t);
    const auto edges = edge_values(m.at(t).dtype);
    const uint32_t mask = width == 4 ? 0xFFFFFFFFu : (1u << (8 * width)) - 1;
    for (uint64_t i = 0; i < m.at(t).numel(); ++i)
      store(w.bytes[t], width, i, i % 3 == 0 ? edges[(i / 3) % edges.size()] : static_cast<uint32_t>(rng()) & mask);
  }
  return w;
}

// The next version: ~40% of the elements change (to edge values or random bits, also between
// NaN payloads, ±0, ±inf), all of the "all" tensors, none of the "frozen" ones.
Weights next_version(const Weights& base, std::mt19937_64& rng) {
  const auto& m = *base.manifest;
  Weights next = base;
  std::uniform_real_distribution<double> u(0, 1);
  for (uint32_t t = 0; t < m.size(); ++t) {
    if (never_changes(m, t)) continue;
    const unsigned width = width_of(m, t);
    const auto edges = edge_values(m.at(t).dtype);
    const uint32_t mask = width == 4 ? 0xFFFFFFFFu : (1u << (8 * width)) - 1;
    for (uint64_t i = 0; i < m.at(t).numel(); ++i) {
      if (!always_changes(m, t) && u(rng) >= 0.4) continue;
      const uint32_t old = load(base.bytes[t], width, i);
      uint32_t v;
      do {
        v = rng() % 2 ? edges[rng() % edges.size()] : static_cast<uint32_t>(rng()) & mask;
      } while (v == old);
      store(next.bytes[t], width, i, v);
    }
  }
  return next;
}

// One encoded version: frames (chunks in order, then the seal) and their parsed views.
struct Encoded {
  std::vector<std::vector<std::byte>> frames;
  std::vector<codec::FrameView> views;
  StateDigest new_digest;
  uint64_t changes = 0;
  size_t chunks() const { return frames.size() - 1; }
  const codec::FrameView& seal() const { return views.back(); }
};

Encoded encode(const Weights& base, const Weights& next, uint64_t base_version, uint64_t chunk_bytes = 64,
               const StateDigest* base_digest = nullptr) {
  codec::EncodeOptions opts;
  opts.chunk_bytes = chunk_bytes;
  const StateDigest digest = base_digest ? *base_digest : base.digest();
  auto delta = codec::encode_delta(base.view(), next.view(), digest, {base_version, base_version + 1}, opts);
  Encoded e;
  e.frames = std::move(delta.frames);
  e.new_digest = delta.new_digest;
  e.changes = delta.stats.changes;
  for (const auto& f : e.frames) e.views.push_back(codec::parse_frame(f));
  return e;
}

template <typename T>
const T* as(const std::optional<Message>& m) {
  return m ? std::get_if<T>(&*m) : nullptr;
}

// Sends collected by Session::commit.
struct Sent {
  std::vector<Message> messages;
  std::function<void(const Message&)> fn() {
    return [this](const Message& m) { messages.push_back(m); };
  }
};

Errc thrown_code(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::ok;
}

// ---------------------------------------------------------------------------------------------
// A member holding version kBase (random bits) and the next version encoded against it.

struct DeltaFixture : ::testing::Test {
  static constexpr uint64_t kBase = 5;
  codec::Manifest m = small_manifest();
  std::mt19937_64 rng{2024};
  Weights base = random_version(m, rng);
  Weights next = next_version(base, rng);
  Weights held = base;  // the member's buffers
  Encoded delta = encode(base, next, kBase);
  Session session{m, held.mut(), kBase, base.digest(), kRank};

  void SetUp() override { ASSERT_GE(delta.chunks(), 3u); }

  // Applies every frame of `e` in the given order; returns the replies.
  std::vector<Message> apply_all(const Encoded& e, uint64_t attempt, std::vector<size_t> order = {}) {
    if (order.empty())
      for (size_t i = 0; i < e.views.size(); ++i) order.push_back(i);
    std::vector<Message> replies;
    for (size_t i : order) {
      EXPECT_TRUE(session.admit(Session::DataKind::frame, attempt, e.views[i].header.new_version));
      auto out = session.apply_frame(attempt, e.views[i]);
      EXPECT_FALSE(out.replayed) << "frame " << i;
      EXPECT_FALSE(out.refused) << "frame " << i;
      if (out.reply) replies.push_back(*out.reply);
    }
    return replies;
  }
};

// ---- admit ------------------------------------------------------------------------------------

TEST_F(DeltaFixture, AdmitRefusesAttemptsAtOrBelowTheFloorAndForeignAttemptsInFlight) {
  EXPECT_EQ(session.attempt_floor(), 0u);
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 0, kBase + 1)) << "attempt 0 is at the floor";
  EXPECT_FALSE(session.in_flight_attempt());

  // The first data message starts the attempt.
  EXPECT_TRUE(session.admit(Session::DataKind::frame, 3, kBase + 1));
  EXPECT_EQ(session.in_flight_attempt(), 3u);
  EXPECT_EQ(session.in_flight_version(), kBase + 1);
  EXPECT_TRUE(session.admit(Session::DataKind::frame, 3, kBase + 1));
  // Another attempt (older or newer) while one is in flight, or another version of it: refused.
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 4, kBase + 1));
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 2, kBase + 1));
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 3, kBase + 2));
  EXPECT_EQ(session.in_flight_attempt(), 3u);

  // COMMIT moves the floor to that attempt.
  ASSERT_EQ(apply_all(delta, 3).size(), 1u);
  Sent sent;
  session.commit(Commit{kBase + 1, 3, delta.new_digest.combined()}, sent.fn());
  EXPECT_EQ(session.attempt_floor(), 3u);
  EXPECT_FALSE(session.in_flight_attempt());
  EXPECT_FALSE(session.in_flight_version());
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 3, kBase + 2)) << "the committed attempt is stale now";
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 2, kBase + 2));

  // ABORT moves it to the aborted attempt.
  EXPECT_TRUE(session.admit(Session::DataKind::frame, 9, kBase + 2));
  session.abort(Abort{kBase + 2, 9, "test"});
  EXPECT_EQ(session.attempt_floor(), 9u);
  EXPECT_FALSE(session.in_flight_attempt());
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 9, kBase + 2));
  EXPECT_FALSE(session.admit(Session::DataKind::raw, 8, kBase + 2));
  EXPECT_TRUE(session.admit(Session::DataKind::frame, 10, kBase + 2));
}

// Data of a newer attempt that overtook its predecessor's ABORT (the data and the decision travel
// on different links): the admission waits for the decision and then starts the new attempt;
// before 2026-12-07 it was dropped at once, and the member missed those chunks of the retry (a
// relay stalled 11 s, then failed: RelayTree.AForwardedVersionWhoseOwnCopyFailsAbortsOnEveryMember).
// With no decision coming it gives up after the wait and drops the data as before.
TEST_F(DeltaFixture, DataOfANewerAttemptWaitsForTheDecisionOnTheOneInFlight) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 3, kBase + 1));
  session.apply_frame(3, delta.views[0]);
  auto aborter = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(100ms);
    session.abort(Abort{kBase + 1, 3, "the producer stopped this version"});
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(session.admit(Session::DataKind::frame, 4, kBase + 1, false, 10s));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms) << "admitted before the ABORT arrived";
  aborter.get();
  EXPECT_EQ(session.in_flight_attempt(), 4u);
  EXPECT_TRUE(same_bits(held, base)) << "attempt 3's chunk was not rolled back";
  ASSERT_EQ(apply_all(delta, 4).size(), 1u);  // every chunk of the retry applies, the seal acks
  Sent sent;
  session.commit(Commit{kBase + 1, 4, delta.new_digest.combined()}, sent.fn());
  EXPECT_TRUE(same_bits(held, next));
  // No decision for the attempt in flight: after the wait, the newer data is dropped.
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 5, kBase + 2));
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 6, kBase + 2, false, 150ms));
  EXPECT_GE(std::chrono::steady_clock::now() - t1, 140ms);
  EXPECT_EQ(session.in_flight_attempt(), 5u);
}

TEST_F(DeltaFixture, AbortWithNothingInFlightStillMovesTheFloor) {
  const Message active = session.abort(Abort{kBase + 1, 4, "nothing here"});
  const auto* a = std::get_if<Active>(&active);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->rank, kRank);
  EXPECT_EQ(a->version, kBase);
  EXPECT_EQ(a->digest, base.digest().combined());
  EXPECT_EQ(session.attempt_floor(), 4u);
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 4, kBase + 1));
  // A lower ABORT never moves it back.
  session.abort(Abort{kBase + 1, 2, "old"});
  EXPECT_EQ(session.attempt_floor(), 4u);
}

TEST_F(DeltaFixture, AbortOfAnOlderAttemptLeavesTheOneInFlight) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 6, kBase + 1));
  session.apply_frame(6, delta.views[0]);
  session.abort(Abort{kBase + 1, 5, "an older attempt"});
  EXPECT_EQ(session.in_flight_attempt(), 6u);
  EXPECT_EQ(session.attempt_floor(), 5u);
  // The rest still completes and commits.
  std::vector<size_t> rest;
  for (size_t i = 1; i < delta.views.size(); ++i) rest.push_back(i);
  ASSERT_EQ(apply_all(delta, 6, rest).size(), 1u);
  Sent sent;
  session.commit(Commit{kBase + 1, 6, delta.new_digest.combined()}, sent.fn());
  EXPECT_TRUE(same_bits(held, next));
}

// ---- deltas -----------------------------------------------------------------------------------

TEST_F(DeltaFixture, EveryChunkAndTheSealGiveExactlyOneAckWithTheNewDigest) {
  std::vector<size_t> order;
  for (size_t i = 0; i < delta.views.size(); ++i) order.push_back(i);
  std::shuffle(order.begin(), order.end(), rng);  // chunks are independent; the seal may come first
  size_t acks = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 1));
    auto out = session.apply_frame(1, delta.views[order[k]]);
    EXPECT_FALSE(out.refused);
    EXPECT_FALSE(out.replayed);
    if (k + 1 < order.size()) {
      EXPECT_FALSE(out.reply) << "a reply before the last frame (" << k << ")";
      continue;
    }
    const auto* ack = as<Ack>(out.reply);
    ASSERT_NE(ack, nullptr) << "the last frame must complete the version with an ACK";
    ++acks;
    EXPECT_EQ(ack->rank, kRank);
    EXPECT_EQ(ack->version, kBase + 1);
    EXPECT_EQ(ack->digest, delta.new_digest.combined());
    EXPECT_EQ(ack->digest, next.digest().combined());
    EXPECT_EQ(ack->applied_changes, delta.changes);
  }
  EXPECT_EQ(acks, 1u);
  // Replays after the ACK: counted, never a second ACK or a NACK.
  for (const auto& view : delta.views) {
    auto out = session.apply_frame(1, view);
    EXPECT_TRUE(out.replayed);
    EXPECT_FALSE(out.reply);
  }
  // Not committed yet: the committed version stays until COMMIT.
  EXPECT_EQ(session.version(), kBase);
  EXPECT_EQ(session.digest(), base.digest().combined());
}

TEST_F(DeltaFixture, AReplayedChunkIsReportedReplayedNotNacked) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 1));
  auto first = session.apply_frame(1, delta.views[0]);
  EXPECT_FALSE(first.replayed);
  const Weights after_one = held;
  auto again = session.apply_frame(1, delta.views[0]);
  EXPECT_TRUE(again.replayed);
  EXPECT_FALSE(again.refused);
  EXPECT_FALSE(again.reply) << "a replayed chunk must not be answered (no NACK)";
  EXPECT_TRUE(same_bits(held, after_one));
  // The version still completes.
  std::vector<size_t> rest;
  for (size_t i = 1; i < delta.views.size(); ++i) rest.push_back(i);
  auto replies = apply_all(delta, 1, rest);
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_NE(std::get_if<Ack>(&replies[0]), nullptr);
}

TEST_F(DeltaFixture, DataOfAnotherAttemptIsIgnoredByApply) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 2, kBase + 1));
  auto out = session.apply_frame(3, delta.views[0]);  // not the attempt in flight
  EXPECT_FALSE(out.reply);
  EXPECT_FALSE(out.refused);
  EXPECT_FALSE(out.replayed);
  EXPECT_TRUE(same_bits(held, base));
}

TEST_F(DeltaFixture, AWrongBaseFrameIsNackedOnceAndWritesNothing) {
  // The same version number encoded from other bits (another base digest).
  Weights other = base;
  other.bytes[0][0] ^= std::byte{1};
  const Encoded wrong = encode(other, next, kBase);
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 1));
  auto out = session.apply_frame(1, wrong.views[0]);
  EXPECT_TRUE(out.refused);
  EXPECT_FALSE(out.replayed);
  const auto* nack = as<Nack>(out.reply);
  ASSERT_NE(nack, nullptr);
  EXPECT_EQ(nack->rank, kRank);
  EXPECT_EQ(nack->version, kBase + 1);
  EXPECT_EQ(nack->errc, static_cast<uint32_t>(Errc::version_mismatch));
  EXPECT_TRUE(same_bits(held, base));
  // A second refusal: refused again, but the NACK went once.
  auto second = session.apply_frame(1, wrong.views[1]);
  EXPECT_TRUE(second.refused);
  EXPECT_FALSE(second.reply);
  EXPECT_TRUE(same_bits(held, base));
  // Even complete good data no longer ACKs a NACKed version.
  for (const auto& view : delta.views) EXPECT_FALSE(session.apply_frame(1, view).reply);
  // ABORT restores the base and answers ACTIVE(base).
  const Message active = session.abort(Abort{kBase + 1, 1, "nacked"});
  ASSERT_NE(std::get_if<Active>(&active), nullptr);
  EXPECT_EQ(std::get<Active>(active).version, kBase);
  EXPECT_TRUE(same_bits(held, base));
}

TEST_F(DeltaFixture, AFrameOfTheWrongBaseVersionIsNacked) {
  const Encoded later = encode(base, next, kBase + 1);  // names base kBase+1, which is not held
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 2));
  auto out = session.apply_frame(1, later.views[0]);
  const auto* nack = as<Nack>(out.reply);
  ASSERT_NE(nack, nullptr);
  EXPECT_EQ(nack->errc, static_cast<uint32_t>(Errc::version_mismatch));
  EXPECT_TRUE(same_bits(held, base));
}

TEST_F(DeltaFixture, ASealThatDoesNotVerifyIsNackedNotAcked) {
  // A seal of the same base and chunk plan, but for other new bits.
  Weights other = next;
  other.bytes[1][4] ^= std::byte{0x10};
  const Encoded foreign = encode(base, other, kBase);
  ASSERT_EQ(foreign.chunks(), delta.chunks());
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 1));
  for (size_t i = 0; i < delta.chunks(); ++i) EXPECT_FALSE(session.apply_frame(1, delta.views[i]).reply);
  auto out = session.apply_frame(1, foreign.seal());
  const auto* nack = as<Nack>(out.reply);
  ASSERT_NE(nack, nullptr) << "a version that fails verification must be NACKed";
  EXPECT_EQ(nack->errc, static_cast<uint32_t>(Errc::verify_failed));
  // COMMIT of a version not verified: NACK, nothing committed.
  Sent sent;
  session.commit(Commit{kBase + 1, 1, foreign.new_digest.combined()}, sent.fn());
  ASSERT_EQ(sent.messages.size(), 1u);
  EXPECT_NE(std::get_if<Nack>(&sent.messages[0]), nullptr);
  EXPECT_EQ(session.version(), kBase);
  session.abort(Abort{kBase + 1, 1, ""});
  EXPECT_TRUE(same_bits(held, base));
}

TEST_F(DeltaFixture, CommitSendsActiveAndTheBitsAreTheNewVersion) {
  ASSERT_EQ(apply_all(delta, 4).size(), 1u);
  Sent sent;
  session.commit(Commit{kBase + 1, 4, delta.new_digest.combined()}, sent.fn());
  ASSERT_EQ(sent.messages.size(), 1u);
  const auto* active = std::get_if<Active>(&sent.messages[0]);
  ASSERT_NE(active, nullptr);
  EXPECT_EQ(active->rank, kRank);
  EXPECT_EQ(active->version, kBase + 1);
  EXPECT_EQ(active->digest, delta.new_digest.combined());
  EXPECT_TRUE(same_bits(held, next));
  EXPECT_EQ(session.version(), kBase + 1);
  EXPECT_EQ(session.digest(), next.digest().combined());
  // The next version applies on top.
  const Weights third = next_version(next, rng);
  const Encoded delta2 = encode(next, third, kBase + 1);
  ASSERT_EQ(apply_all(delta2, 5).size(), 1u);
  session.commit(Commit{kBase + 2, 5, delta2.new_digest.combined()}, sent.fn());
  EXPECT_TRUE(same_bits(held, third));
  EXPECT_EQ(session.digest(), third.digest().combined());
}

TEST_F(DeltaFixture, AbortRollsBackBitExactlyAndAnswersActiveOfTheOldVersion) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 2, kBase + 1));
  for (size_t i = 0; i + 1 < delta.chunks(); ++i) session.apply_frame(2, delta.views[i]);
  ASSERT_FALSE(same_bits(held, base)) << "the test needs written elements to roll back";
  const Message reply = session.abort(Abort{kBase + 1, 2, "timeout"});
  const auto* active = std::get_if<Active>(&reply);
  ASSERT_NE(active, nullptr);
  EXPECT_EQ(active->rank, kRank);
  EXPECT_EQ(active->version, kBase);
  EXPECT_EQ(active->digest, base.digest().combined());
  EXPECT_TRUE(same_bits(held, base));
  EXPECT_EQ(session.version(), kBase);
  // A retry (new attempt, same version) applies from scratch.
  ASSERT_EQ(apply_all(delta, 3).size(), 1u);
  Sent sent;
  session.commit(Commit{kBase + 1, 3, delta.new_digest.combined()}, sent.fn());
  EXPECT_TRUE(same_bits(held, next));
}

TEST_F(DeltaFixture, AbortOfAnAckedVersionRollsBackToo) {
  ASSERT_EQ(apply_all(delta, 2).size(), 1u);
  ASSERT_TRUE(same_bits(held, next));
  session.abort(Abort{kBase + 1, 2, "another member failed"});
  EXPECT_TRUE(same_bits(held, base));
  EXPECT_EQ(session.digest(), base.digest().combined());
}

TEST_F(DeltaFixture, CommitOfAnAttemptNotAckedIsNacked) {
  Sent sent;
  // Nothing in flight.
  session.commit(Commit{kBase + 1, 1, delta.new_digest.combined()}, sent.fn());
  ASSERT_EQ(sent.messages.size(), 1u);
  const auto* nack = std::get_if<Nack>(&sent.messages[0]);
  ASSERT_NE(nack, nullptr);
  EXPECT_EQ(nack->rank, kRank);
  EXPECT_EQ(nack->version, kBase + 1);
  EXPECT_EQ(nack->errc, static_cast<uint32_t>(Errc::state));
  // In flight, incomplete.
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 1));
  session.apply_frame(1, delta.views[0]);
  session.commit(Commit{kBase + 1, 1, delta.new_digest.combined()}, sent.fn());
  ASSERT_EQ(sent.messages.size(), 2u);
  EXPECT_NE(std::get_if<Nack>(&sent.messages[1]), nullptr);
  // Complete and acked, but COMMIT names another attempt or another version.
  std::vector<size_t> rest;
  for (size_t i = 1; i < delta.views.size(); ++i) rest.push_back(i);
  ASSERT_EQ(apply_all(delta, 1, rest).size(), 1u);
  session.commit(Commit{kBase + 1, 2, delta.new_digest.combined()}, sent.fn());
  session.commit(Commit{kBase + 2, 1, delta.new_digest.combined()}, sent.fn());
  ASSERT_EQ(sent.messages.size(), 4u);
  EXPECT_NE(std::get_if<Nack>(&sent.messages[2]), nullptr);
  EXPECT_NE(std::get_if<Nack>(&sent.messages[3]), nullptr);
  EXPECT_EQ(session.version(), kBase);
  EXPECT_EQ(session.in_flight_attempt(), 1u) << "a refused COMMIT leaves the version in flight";
  // The right COMMIT still works.
  session.commit(Commit{kBase + 1, 1, delta.new_digest.combined()}, sent.fn());
  ASSERT_EQ(sent.messages.size(), 5u);
  EXPECT_NE(std::get_if<Active>(&sent.messages[4]), nullptr);
  EXPECT_TRUE(same_bits(held, next));
}

TEST_F(DeltaFixture, DropInFlightRollsBackAndMovesTheFloor) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 8, kBase + 1));
  for (size_t i = 0; i < delta.chunks(); ++i) session.apply_frame(8, delta.views[i]);
  session.drop_in_flight();
  EXPECT_TRUE(same_bits(held, base));
  EXPECT_FALSE(session.in_flight_attempt());
  EXPECT_EQ(session.attempt_floor(), 8u);
  EXPECT_FALSE(session.admit(Session::DataKind::frame, 8, kBase + 1));
  session.drop_in_flight();  // nothing in flight: a no-op
  EXPECT_TRUE(same_bits(held, base));
}

TEST_F(DeltaFixture, RawDataDuringADeltaIsNacked) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 1));
  session.apply_frame(1, delta.views[0]);
  const Weights after_one = held;
  ASSERT_TRUE(session.admit(Session::DataKind::raw, 1, kBase + 1));
  const RawChunkHeader h{{1, 0}, kBase + 1, 0, 1, 0, 0, 4};
  std::optional<Message> reply;
  EXPECT_FALSE(session.claim_piece(1, h, reply));
  const auto* nack = as<Nack>(reply);
  ASSERT_NE(nack, nullptr);
  EXPECT_EQ(nack->errc, static_cast<uint32_t>(Errc::version_mismatch));
  EXPECT_TRUE(same_bits(held, after_one));
}

TEST_F(DeltaFixture, ConcurrentChunksGiveOneAck) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 1));
  std::atomic<int> acks{0}, others{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = t; i < delta.views.size(); i += 4) {
        auto out = session.apply_frame(1, delta.views[i]);
        if (as<Ack>(out.reply)) ++acks;
        else if (out.reply || out.refused || out.replayed) ++others;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(acks.load(), 1);
  EXPECT_EQ(others.load(), 0);
  EXPECT_TRUE(same_bits(held, next));
}

// Every edge value turns into the next one (NaN -> NaN of another payload, +inf -> -inf, -0.0 ->
// +0.0, subnormal -> subnormal, ...) in every tensor but the frozen one; commit and a rollback are
// both bit-exact.
TEST(SessionEdgeValues, EdgeTransitionsCommitAndRollBackExactly) {
  const codec::Manifest m = small_manifest();
  Weights base(m), next(m);
  for (uint32_t t = 0; t < m.size(); ++t) {
    const unsigned w = width_of(m, t);
    const auto edges = edge_values(m.at(t).dtype);
    for (uint64_t i = 0; i < m.at(t).numel(); ++i) {
      store(base.bytes[t], w, i, edges[i % edges.size()]);
      store(next.bytes[t], w, i, never_changes(m, t) ? edges[i % edges.size()] : edges[(i + 1) % edges.size()]);
    }
  }
  const Encoded d = encode(base, next, 11);
  for (bool commit : {true, false}) {
    SCOPED_TRACE(commit ? "commit" : "abort");
    Weights held = base;
    Session s(m, held.mut(), 11, base.digest(), kRank);
    std::optional<Message> ack;
    for (const auto& view : d.views) {
      ASSERT_TRUE(s.admit(Session::DataKind::frame, 1, 12));
      if (auto out = s.apply_frame(1, view); out.reply) ack = out.reply;
    }
    ASSERT_NE(as<Ack>(ack), nullptr);
    EXPECT_EQ(as<Ack>(ack)->digest, next.digest().combined());
    EXPECT_TRUE(same_bits(held, next));
    if (commit) {
      Sent sent;
      s.commit(Commit{12, 1, d.new_digest.combined()}, sent.fn());
      EXPECT_TRUE(same_bits(held, next));
      EXPECT_EQ(s.digest(), next.digest().combined());
    } else {
      s.abort(Abort{12, 1, ""});
      EXPECT_TRUE(same_bits(held, base));
      EXPECT_EQ(s.digest(), base.digest().combined());
    }
  }
}

// ---- catch-up: replay_frame and install -------------------------------------------------------

TEST_F(DeltaFixture, ReplayCommitsAVersionOnceCompleteAndVerified) {
  for (size_t i = 0; i + 1 < delta.views.size(); ++i) {
    EXPECT_FALSE(session.replay_frame(delta.views[i]));
    EXPECT_EQ(session.version(), kBase);
  }
  EXPECT_TRUE(session.replay_frame(delta.seal()));
  EXPECT_EQ(session.version(), kBase + 1);
  EXPECT_EQ(session.digest(), next.digest().combined());
  EXPECT_TRUE(same_bits(held, next));
  // Then the tree's next version applies.
  const Weights third = next_version(next, rng);
  const Encoded delta2 = encode(next, third, kBase + 1);
  ASSERT_EQ(apply_all(delta2, 1).size(), 1u);
  Sent sent;
  session.commit(Commit{kBase + 2, 1, delta2.new_digest.combined()}, sent.fn());
  EXPECT_TRUE(same_bits(held, third));
}

TEST_F(DeltaFixture, ABadReplayedFrameLeavesTheCommittedBits) {
  Weights other = base;
  other.bytes[4][0] ^= std::byte{1};
  const Encoded wrong = encode(other, next, kBase);
  EXPECT_FALSE(session.replay_frame(delta.views[0]));
  EXPECT_FALSE(session.replay_frame(delta.views[1]));
  EXPECT_NE(thrown_code([&] { session.replay_frame(wrong.views[2]); }), Errc::ok);
  EXPECT_TRUE(same_bits(held, base));
  EXPECT_EQ(session.version(), kBase);
  EXPECT_EQ(session.digest(), base.digest().combined());
  // A seal that does not verify: thrown, rolled back.
  Weights other_next = next;
  other_next.bytes[0][2] ^= std::byte{4};
  const Encoded foreign = encode(base, other_next, kBase);
  for (size_t i = 0; i < delta.chunks(); ++i) EXPECT_FALSE(session.replay_frame(delta.views[i]));
  EXPECT_EQ(thrown_code([&] { session.replay_frame(foreign.seal()); }), Errc::verify_failed);
  EXPECT_TRUE(same_bits(held, base));
  EXPECT_EQ(session.version(), kBase);
  // A clean replay still works afterwards.
  for (const auto& view : delta.views) session.replay_frame(view);
  EXPECT_EQ(session.version(), kBase + 1);
  EXPECT_TRUE(same_bits(held, next));
}

TEST_F(DeltaFixture, AbandonReplayRollsBack) {
  session.replay_frame(delta.views[0]);
  session.replay_frame(delta.views[1]);
  session.abandon_replay();
  EXPECT_TRUE(same_bits(held, base));
  EXPECT_EQ(session.version(), kBase);
  for (const auto& view : delta.views) session.replay_frame(view);
  EXPECT_TRUE(same_bits(held, next));
}

TEST_F(DeltaFixture, ReplayWhileAVersionIsInFlightThrowsState) {
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, kBase + 1));
  EXPECT_EQ(thrown_code([&] { session.replay_frame(delta.views[0]); }), Errc::state);
  EXPECT_EQ(thrown_code([&] { session.install(9, base.digest()); }), Errc::state);
  EXPECT_EQ(session.version(), kBase);
}

TEST_F(DeltaFixture, InstallSetsVersionAndDigestAndTheNextDeltaApplies) {
  // A snapshot of version 20 arrived in the buffers.
  const Weights snapshot = next_version(next, rng);
  for (size_t t = 0; t < held.bytes.size(); ++t)  // written into the session's buffers in place
    std::memcpy(held.bytes[t].data(), snapshot.bytes[t].data(), snapshot.bytes[t].size());
  session.install(20, snapshot.digest());
  EXPECT_EQ(session.version(), 20u);
  EXPECT_EQ(session.digest(), snapshot.digest().combined());
  const Weights v21 = next_version(snapshot, rng);
  const Encoded d = encode(snapshot, v21, 20);
  ASSERT_EQ(apply_all(d, 1).size(), 1u);
  Sent sent;
  session.commit(Commit{21, 1, d.new_digest.combined()}, sent.fn());
  EXPECT_TRUE(same_bits(held, v21));
  EXPECT_EQ(session.version(), 21u);
}

// ---------------------------------------------------------------------------------------------
// The raw bootstrap: version 1 from the all-zero version 0.

struct BootstrapFixture : ::testing::Test {
  codec::Manifest m = small_manifest();
  std::mt19937_64 rng{7};
  Weights checkpoint = random_version(m, rng);  // version 1
  Weights held{m};                              // all zeros: version 0
  Weights zeros{m};
  Session session{m, held.mut(), 0, zeros.digest(), kRank};
  std::vector<RawChunkHeader> pieces;  // attempt filled in per use

  void SetUp() override { pieces = plan_pieces(m, 3); }

  // Pieces of `elements` elements (the last of a tensor shorter), in manifest order.
  static std::vector<RawChunkHeader> plan_pieces(const codec::Manifest& m, uint64_t elements) {
    std::vector<RawChunkHeader> out;
    for (uint32_t t = 0; t < m.size(); ++t) {
      const uint64_t w = codec::dtype_size(m.at(t).dtype);
      for (uint64_t off = 0; off < m.at(t).nbytes(); off += elements * w)
        out.push_back({{0, 0}, 1, 0, 0, t, off, std::min(elements * w, m.at(t).nbytes() - off)});
    }
    for (uint32_t i = 0; i < out.size(); ++i) {
      out[i].chunk_index = i;
      out[i].chunk_count = static_cast<uint32_t>(out.size());
    }
    return out;
  }

  RawChunkHeader piece(size_t i, uint64_t attempt) const {
    RawChunkHeader h = pieces[i];
    h.envelope.attempt = attempt;
    return h;
  }

  std::span<const std::byte> source(const RawChunkHeader& h) const {
    return std::span(checkpoint.bytes[h.tensor]).subspan(h.byte_offset, h.byte_count);
  }

  uint64_t expected_sum() const {
    uint64_t sum = 0;
    for (const auto& h : pieces) sum += raw_piece_hash(h, source(h));
    return sum;
  }

  // Claims the piece, copies its bytes where the session says (as a relay receives them) and
  // lands it. Returns land_piece's reply.
  std::optional<Message> deliver(const RawChunkHeader& h) {
    EXPECT_TRUE(session.admit(Session::DataKind::raw, h.envelope.attempt, h.version));
    std::optional<Message> refusal;
    auto target = session.claim_piece(h.envelope.attempt, h, refusal);
    EXPECT_FALSE(refusal);
    if (!target) {
      ADD_FAILURE() << "piece " << h.chunk_index << " was not claimed";
      return std::nullopt;
    }
    EXPECT_EQ(target->data(), held.bytes[h.tensor].data() + h.byte_offset) << "the body lands in place";
    EXPECT_EQ(target->size(), h.byte_count);
    std::memcpy(target->data(), source(h).data(), h.byte_count);
    return session.land_piece(h, raw_piece_hash(h, *target));
  }

  // Every piece in order under `attempt`: no reply until the last, then one ACK with the sum of
  // the pieces' hashes, and the weights hold the checkpoint.
  void deliver_all_expecting_one_ack(uint64_t attempt) {
    for (size_t i = 0; i < pieces.size(); ++i) {
      auto ack = deliver(piece(i, attempt));
      if (i + 1 < pieces.size()) {
        EXPECT_FALSE(ack) << "a reply before the last piece";
      } else {
        ASSERT_NE(as<Ack>(ack), nullptr);
        EXPECT_EQ(as<Ack>(ack)->digest, expected_sum());
      }
    }
    EXPECT_TRUE(same_bits(held, checkpoint));
  }
};

TEST_F(BootstrapFixture, PiecesLandedGiveOneAckWithTheSumOfTheirHashes) {
  ASSERT_GE(pieces.size(), 10u);
  std::vector<size_t> order(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);  // the sum does not depend on the order
  for (size_t k = 0; k < order.size(); ++k) {
    auto reply = deliver(piece(order[k], 1));
    if (k + 1 < order.size()) {
      EXPECT_FALSE(reply) << "a reply before the last piece";
      continue;
    }
    const auto* ack = as<Ack>(reply);
    ASSERT_NE(ack, nullptr);
    EXPECT_EQ(ack->rank, kRank);
    EXPECT_EQ(ack->version, 1u);
    EXPECT_EQ(ack->digest, expected_sum());
  }
  EXPECT_TRUE(same_bits(held, checkpoint));
  // A piece that comes again after it landed is replayed: not claimed, no NACK.
  std::optional<Message> reply;
  EXPECT_FALSE(session.claim_piece(1, piece(0, 1), reply));
  EXPECT_FALSE(reply);
  EXPECT_TRUE(same_bits(held, checkpoint));
}

TEST_F(BootstrapFixture, APieceCutShortIsReleasedAndMayComeAgain) {
  const RawChunkHeader h = piece(4, 1);
  ASSERT_TRUE(session.admit(Session::DataKind::raw, 1, 1));
  std::optional<Message> reply;
  auto target = session.claim_piece(1, h, reply);
  ASSERT_TRUE(target);
  std::memcpy(target->data(), source(h).data(), h.byte_count / 2);  // half the body came
  EXPECT_FALSE(session.land_piece(h, std::nullopt));
  // It may be claimed again (a resumed or re-sent copy) and then counts once.
  deliver_all_expecting_one_ack(1);
}

TEST_F(BootstrapFixture, ALastPieceCutShortDoesNotAck) {
  for (size_t i = 0; i + 1 < pieces.size(); ++i) EXPECT_FALSE(deliver(piece(i, 1)));
  const RawChunkHeader last = piece(pieces.size() - 1, 1);
  std::optional<Message> reply;
  auto target = session.claim_piece(1, last, reply);
  ASSERT_TRUE(target);
  EXPECT_FALSE(session.land_piece(last, std::nullopt)) << "a cut-short piece completes nothing";
  auto ack = deliver(last);
  ASSERT_NE(as<Ack>(ack), nullptr);
  EXPECT_EQ(as<Ack>(ack)->digest, expected_sum());
}

TEST_F(BootstrapFixture, APieceOutsideItsTensorOrSplittingAnElementIsRefused) {
  const uint32_t f32 = 1;  // "proj": 33 x f32 = 132 bytes
  ASSERT_EQ(m.at(f32).dtype, DType::f32);
  const uint64_t n = m.at(f32).nbytes();
  const uint32_t count = static_cast<uint32_t>(pieces.size());
  const std::vector<RawChunkHeader> bad = {
      {{1, 0}, 1, 0, count, static_cast<uint32_t>(m.size()), 0, 4},  // no such tensor
      {{1, 0}, 1, 0, count, f32, n - 4, 8},                           // runs past the end
      {{1, 0}, 1, 0, count, f32, n + 4, 4},                           // starts past the end
      {{1, 0}, 1, 0, count, f32, 2, 4},                               // offset splits an element
      {{1, 0}, 1, 0, count, f32, 0, 6},                               // size splits an element
      {{1, 0}, 1, 0, count, f32, 4, UINT64_MAX - 3},                  // wraps around
      {{1, 0}, 1, count, count, f32, 0, 4},                           // index beyond the count
  };
  for (size_t k = 0; k < bad.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    Weights buffers(m);
    Session s(m, buffers.mut(), 0, zeros.digest(), kRank);
    ASSERT_TRUE(s.admit(Session::DataKind::raw, 1, 1));
    std::optional<Message> reply;
    EXPECT_FALSE(s.claim_piece(1, bad[k], reply));
    const auto* nack = as<Nack>(reply);
    ASSERT_NE(nack, nullptr);
    EXPECT_EQ(nack->version, 1u);
    EXPECT_EQ(nack->errc, static_cast<uint32_t>(Errc::corrupt_frame));
    EXPECT_TRUE(is_zero(buffers));
    // The session is not wedged (the refusal released its data lock): ABORT returns.
    s.abort(Abort{1, 1, ""});
    EXPECT_TRUE(is_zero(buffers));
  }
}

TEST_F(BootstrapFixture, PiecesDisagreeingOnTheCountAreRefused) {
  EXPECT_FALSE(deliver(piece(0, 1)));
  RawChunkHeader h = piece(1, 1);
  h.chunk_count += 1;
  std::optional<Message> reply;
  EXPECT_FALSE(session.claim_piece(1, h, reply));
  ASSERT_NE(as<Nack>(reply), nullptr);
  EXPECT_EQ(as<Nack>(reply)->errc, static_cast<uint32_t>(Errc::corrupt_frame));
}

// Found by fuzz_raw_header: a 2^32-1 chunk count made the member allocate ~1 GiB of piece flags.
TEST_F(BootstrapFixture, AChunkCountAboveWhatTheCheckpointHoldsIsRefusedBeforeAnyAllocation) {
  RawChunkHeader h = piece(0, 1);
  h.chunk_count = 0xFFFFFFFFu;
  ASSERT_TRUE(session.admit(Session::DataKind::raw, 1, 1));
  std::optional<Message> reply;
  EXPECT_FALSE(session.claim_piece(1, h, reply));
  ASSERT_NE(as<Nack>(reply), nullptr);
  EXPECT_EQ(as<Nack>(reply)->errc, static_cast<uint32_t>(Errc::corrupt_frame));
  EXPECT_TRUE(is_zero(held));
  EXPECT_EQ(max_raw_chunk_count(m), m.total_elements() + m.size());
}

TEST_F(BootstrapFixture, RawOfAnotherVersionThanOneIsNacked) {
  RawChunkHeader h = piece(0, 1);
  h.version = 2;
  ASSERT_TRUE(session.admit(Session::DataKind::raw, 1, 2));
  std::optional<Message> reply;
  EXPECT_FALSE(session.claim_piece(1, h, reply));
  ASSERT_NE(as<Nack>(reply), nullptr);
  EXPECT_EQ(as<Nack>(reply)->errc, static_cast<uint32_t>(Errc::version_mismatch));
  EXPECT_TRUE(is_zero(held));
}

TEST_F(BootstrapFixture, RawAtANonZeroVersionIsNacked) {
  // A member that holds version 3 can not take a bootstrap.
  Weights v3 = random_version(m, rng);
  Weights buffers = v3;
  Session s(m, buffers.mut(), 3, v3.digest(), kRank);
  RawChunkHeader h = piece(0, 1);
  h.version = 4;
  EXPECT_TRUE(s.admit(Session::DataKind::raw, 1, 4));
  std::optional<Message> reply;
  EXPECT_FALSE(s.claim_piece(1, h, reply));
  const auto* nack = as<Nack>(reply);
  ASSERT_NE(nack, nullptr);
  EXPECT_EQ(nack->rank, kRank);
  EXPECT_EQ(nack->errc, static_cast<uint32_t>(Errc::version_mismatch));
  EXPECT_TRUE(same_bits(buffers, v3));
  // A version 1 piece is refused as well.
  Weights buffers2 = v3;
  Session s2(m, buffers2.mut(), 3, v3.digest(), kRank);
  EXPECT_TRUE(s2.admit(Session::DataKind::raw, 1, 1));
  reply.reset();
  EXPECT_FALSE(s2.claim_piece(1, piece(0, 1), reply));
  ASSERT_NE(as<Nack>(reply), nullptr);
  EXPECT_TRUE(same_bits(buffers2, v3));
  // ABORT: nothing to roll back, the bits stay version 3.
  const Message active = s2.abort(Abort{1, 1, ""});
  EXPECT_EQ(std::get<Active>(active).version, 3u);
  EXPECT_TRUE(same_bits(buffers2, v3));
}

TEST_F(BootstrapFixture, ADeltaFrameDuringTheBootstrapIsNacked) {
  EXPECT_FALSE(deliver(piece(0, 1)));
  const Weights v2 = next_version(checkpoint, rng);
  const Encoded d = encode(checkpoint, v2, 1);
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 1, 1));
  auto out = session.apply_frame(1, d.views[0]);
  EXPECT_TRUE(out.refused);
  ASSERT_NE(as<Nack>(out.reply), nullptr);
}

TEST_F(BootstrapFixture, AbortZeroesEverythingAndARetryStartsAfresh) {
  for (size_t i = 0; i < pieces.size() / 2; ++i) EXPECT_FALSE(deliver(piece(i, 1)));
  ASSERT_FALSE(is_zero(held));
  const Message reply = session.abort(Abort{1, 1, "a member failed"});
  const auto* active = std::get_if<Active>(&reply);
  ASSERT_NE(active, nullptr);
  EXPECT_EQ(active->version, 0u);
  EXPECT_EQ(active->digest, zeros.digest().combined());
  EXPECT_TRUE(is_zero(held));
  EXPECT_EQ(session.attempt_floor(), 1u);
  EXPECT_FALSE(session.admit(Session::DataKind::raw, 1, 1));
  // The retry: every piece again (none is taken for replayed), the same sum.
  deliver_all_expecting_one_ack(2);
}

TEST_F(BootstrapFixture, AbortWaitsForABodyStillLanding) {
  ASSERT_TRUE(session.admit(Session::DataKind::raw, 1, 1));
  const RawChunkHeader h = piece(0, 1);
  std::optional<Message> reply;
  auto target = session.claim_piece(1, h, reply);
  ASSERT_TRUE(target);
  auto aborted = std::async(std::launch::async, [&] { return session.abort(Abort{1, 1, ""}); });
  EXPECT_EQ(aborted.wait_for(150ms), std::future_status::timeout) << "ABORT must wait for the body";
  std::memcpy(target->data(), source(h).data(), h.byte_count);
  session.land_piece(h, raw_piece_hash(h, *target));
  ASSERT_EQ(aborted.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(std::get<Active>(aborted.get()).version, 0u);
  EXPECT_TRUE(is_zero(held));
}

TEST_F(BootstrapFixture, AfterCommitTheDigestIsAFullScanAndTheNextDeltaApplies) {
  std::optional<Message> ack;
  for (size_t i = 0; i < pieces.size(); ++i) ack = deliver(piece(i, 1));
  ASSERT_NE(as<Ack>(ack), nullptr);
  Sent sent;
  session.commit(Commit{1, 1, as<Ack>(ack)->digest}, sent.fn());
  ASSERT_EQ(sent.messages.size(), 1u);
  const auto* active = std::get_if<Active>(&sent.messages[0]);
  ASSERT_NE(active, nullptr);
  EXPECT_EQ(active->version, 1u);
  EXPECT_EQ(session.version(), 1u);
  EXPECT_EQ(session.attempt_floor(), 1u);
  EXPECT_EQ(session.digest(), StateDigest::full_scan(held.view()).combined());
  EXPECT_EQ(session.digest(), checkpoint.digest().combined());
  EXPECT_TRUE(same_bits(held, checkpoint));
  // Version 2, a delta against the full scan's digest.
  const Weights v2 = next_version(checkpoint, rng);
  const Encoded d = encode(checkpoint, v2, 1);
  for (size_t i = 0; i < d.views.size(); ++i) {
    ASSERT_TRUE(session.admit(Session::DataKind::frame, 2, 2));
    auto out = session.apply_frame(2, d.views[i]);
    EXPECT_FALSE(out.refused) << (as<Nack>(out.reply) ? as<Nack>(out.reply)->message : "");
    if (i + 1 == d.views.size()) {
      ASSERT_NE(as<Ack>(out.reply), nullptr);
      EXPECT_EQ(as<Ack>(out.reply)->digest, v2.digest().combined());
    }
  }
  session.commit(Commit{2, 2, d.new_digest.combined()}, sent.fn());
  ASSERT_EQ(sent.messages.size(), 2u);
  EXPECT_EQ(std::get<Active>(sent.messages[1]).version, 2u);
  EXPECT_TRUE(same_bits(held, v2));
  // And an ABORT of version 3 returns to version 2 exactly.
  const Weights v3 = next_version(v2, rng);
  const Encoded d3 = encode(v2, v3, 2);
  ASSERT_TRUE(session.admit(Session::DataKind::frame, 3, 3));
  session.apply_frame(3, d3.views[0]);
  session.abort(Abort{3, 3, ""});
  EXPECT_TRUE(same_bits(held, v2));
}

// ---------------------------------------------------------------------------------------------
// SnapshotReader: consistent reads of the committed version while refits go on.

struct SnapshotFixture : ::testing::Test {
  static constexpr uint64_t kV = 4;
  codec::Manifest m = snapshot_manifest();
  std::mt19937_64 rng{99};
  Weights v = random_version(m, rng);
  Weights held = v;
  Session session{m, held.mut(), kV, v.digest(), kRank};
  uint64_t next_attempt = 1;

  struct Piece {
    uint32_t tensor;
    uint64_t offset, size;
  };
  // Pieces of `elements` elements in (tensor, offset) order.
  std::vector<Piece> pieces(uint64_t elements) const {
    std::vector<Piece> out;
    for (uint32_t t = 0; t < m.size(); ++t) {
      const uint64_t w = codec::dtype_size(m.at(t).dtype);
      for (uint64_t off = 0; off < m.at(t).nbytes(); off += elements * w)
        out.push_back({t, off, std::min(elements * w, m.at(t).nbytes() - off)});
    }
    return out;
  }

  // Applies `e` through the session and commits it.
  void refit(const Encoded& e, uint64_t version) {
    const uint64_t attempt = next_attempt++;
    std::optional<Message> last;
    for (const auto& view : e.views) {
      ASSERT_TRUE(session.admit(Session::DataKind::frame, attempt, version));
      auto out = session.apply_frame(attempt, view);
      ASSERT_FALSE(out.refused);
      if (out.reply) last = out.reply;
    }
    ASSERT_NE(as<Ack>(last), nullptr);
    Sent sent;
    session.commit(Commit{version, attempt, e.new_digest.combined()}, sent.fn());
    ASSERT_EQ(sent.messages.size(), 1u);
    ASSERT_NE(std::get_if<Active>(&sent.messages[0]), nullptr);
  }

  // Reads pieces [from, to) into `out` (one buffer per tensor).
  void read(Session::SnapshotReader& reader, const std::vector<Piece>& ps, size_t from, size_t to, Weights& out) {
    for (size_t i = from; i < to; ++i) {
      std::vector<std::byte> body(ps[i].size);
      reader.read(ps[i].tensor, ps[i].offset, body);
      std::memcpy(out.bytes[ps[i].tensor].data() + ps[i].offset, body.data(), body.size());
    }
  }
};

TEST_F(SnapshotFixture, ReadsAreTheSnapshotVersionAcrossCommitsAndAVersionInFlight) {
  for (uint64_t elements : {1u, 5u, 64u}) {
    SCOPED_TRACE("pieces of " + std::to_string(elements) + " elements");
    const Weights at_v = held;  // the version the reader serves
    const uint64_t version = session.version();
    const auto ps = pieces(elements);
    auto reader = session.begin_snapshot();
    EXPECT_EQ(reader->version(), version);
    EXPECT_EQ(reader->digest(), at_v.digest().combined());
    Weights got(m);
    read(*reader, ps, 0, ps.size() / 2, got);
    // V+1 and V+2 commit through the session.
    const Weights v1 = next_version(held, rng);
    refit(encode(held, v1, version), version + 1);
    const Weights v2 = next_version(v1, rng);
    refit(encode(v1, v2, version + 1), version + 2);
    ASSERT_TRUE(same_bits(held, v2));
    // V+3 in flight: some chunks applied, not committed.
    const Weights v3 = next_version(v2, rng);
    const Encoded d3 = encode(v2, v3, version + 2);
    const uint64_t attempt = next_attempt++;
    ASSERT_TRUE(session.admit(Session::DataKind::frame, attempt, version + 3));
    for (size_t i = 0; i < d3.chunks(); i += 2) ASSERT_FALSE(session.apply_frame(attempt, d3.views[i]).refused);
    // The rest of the reads.
    read(*reader, ps, ps.size() / 2, ps.size(), got);
    EXPECT_TRUE(same_bits(got, at_v));
    // Reading changed nothing: V+3 completes and commits as usual.
    std::optional<Message> ack;
    for (size_t i = 0; i < d3.views.size(); ++i) {
      if (i < d3.chunks() && i % 2 == 0) continue;
      auto out = session.apply_frame(attempt, d3.views[i]);
      ASSERT_FALSE(out.refused);
      if (out.reply) ack = out.reply;
    }
    ASSERT_NE(as<Ack>(ack), nullptr);
    EXPECT_EQ(as<Ack>(ack)->digest, v3.digest().combined());
    Sent sent;
    session.commit(Commit{version + 3, attempt, d3.new_digest.combined()}, sent.fn());
    EXPECT_TRUE(same_bits(held, v3));
  }
}

TEST_F(SnapshotFixture, ReadsStartedWhileAVersionIsInFlightSeeTheCommittedVersion) {
  const Weights v1 = next_version(v, rng);
  const Encoded d1 = encode(v, v1, kV);
  const uint64_t attempt = next_attempt++;
  ASSERT_TRUE(session.admit(Session::DataKind::frame, attempt, kV + 1));
  for (size_t i = 0; i < d1.chunks(); ++i) session.apply_frame(attempt, d1.views[i]);
  auto reader = session.begin_snapshot();
  EXPECT_EQ(reader->version(), kV);
  const auto ps = pieces(7);
  Weights got(m);
  read(*reader, ps, 0, ps.size() / 3, got);
  auto ack = session.apply_frame(attempt, d1.seal());
  ASSERT_NE(as<Ack>(ack.reply), nullptr);
  Sent sent;
  session.commit(Commit{kV + 1, attempt, d1.new_digest.combined()}, sent.fn());
  read(*reader, ps, ps.size() / 3, ps.size(), got);
  EXPECT_TRUE(same_bits(got, v));
}

TEST_F(SnapshotFixture, AnAbortedVersionDuringTheReadLeavesItConsistent) {
  auto reader = session.begin_snapshot();
  const auto ps = pieces(3);
  Weights got(m);
  read(*reader, ps, 0, ps.size() / 4, got);
  const Weights v1 = next_version(v, rng);
  const Encoded d1 = encode(v, v1, kV);
  const uint64_t aborted = next_attempt++;
  ASSERT_TRUE(session.admit(Session::DataKind::frame, aborted, kV + 1));
  for (const auto& view : d1.views) session.apply_frame(aborted, view);
  read(*reader, ps, ps.size() / 4, ps.size() / 2, got);
  session.abort(Abort{kV + 1, aborted, ""});
  refit(d1, kV + 1);  // the retry commits
  read(*reader, ps, ps.size() / 2, ps.size(), got);
  EXPECT_TRUE(same_bits(got, v));
}

TEST_F(SnapshotFixture, VersionsReplayedDuringTheReadAreUndoneToo) {
  auto reader = session.begin_snapshot();
  const auto ps = pieces(5);
  Weights got(m);
  read(*reader, ps, 0, ps.size() / 2, got);
  const Weights v1 = next_version(v, rng);
  const Encoded d1 = encode(v, v1, kV);
  for (const auto& view : d1.views) session.replay_frame(view);
  ASSERT_EQ(session.version(), kV + 1);
  read(*reader, ps, ps.size() / 2, ps.size(), got);
  EXPECT_TRUE(same_bits(got, v));
}

// A replay (catch-up) applies frames outside any attempt: a read in the middle of one must still
// see the snapshot's version, as the reader's contract says "whatever was applied since".
TEST_F(SnapshotFixture, APartlyReplayedVersionIsUndoneForTheReader) {
  auto reader = session.begin_snapshot();
  const auto ps = pieces(5);
  Weights got(m);
  read(*reader, ps, 0, ps.size() / 2, got);
  const Weights v1 = next_version(v, rng);
  const Encoded d1 = encode(v, v1, kV);
  for (size_t i = 0; i < d1.chunks(); ++i) session.replay_frame(d1.views[i]);  // no seal yet
  read(*reader, ps, ps.size() / 2, ps.size(), got);
  EXPECT_TRUE(same_bits(got, v));
}

TEST_F(SnapshotFixture, TwoReadersAtDifferentPlaces) {
  const auto ps = pieces(4);
  auto first = session.begin_snapshot();
  Weights got_first(m);
  read(*first, ps, 0, ps.size() / 3, got_first);
  const Weights v1 = next_version(v, rng);
  refit(encode(v, v1, kV), kV + 1);
  auto second = session.begin_snapshot();
  EXPECT_EQ(second->version(), kV + 1);
  Weights got_second(m);
  read(*second, ps, 0, ps.size() / 2, got_second);
  read(*first, ps, ps.size() / 3, 2 * ps.size() / 3, got_first);
  const Weights v2 = next_version(v1, rng);
  refit(encode(v1, v2, kV + 1), kV + 2);
  read(*first, ps, 2 * ps.size() / 3, ps.size(), got_first);
  read(*second, ps, ps.size() / 2, ps.size(), got_second);
  EXPECT_TRUE(same_bits(got_first, v));
  EXPECT_TRUE(same_bits(got_second, v1));
}

TEST_F(SnapshotFixture, BeginSnapshotAtVersionZeroThrowsState) {
  Weights zeros(m);
  Weights buffers(m);
  Session s(m, buffers.mut(), 0, zeros.digest(), kRank);
  EXPECT_EQ(thrown_code([&] { s.begin_snapshot(); }), Errc::state);
}

TEST_F(SnapshotFixture, AReaderDestroyedMidwayLeavesTheSessionWorking) {
  const auto ps = pieces(6);
  {
    auto reader = session.begin_snapshot();
    Weights got(m);
    read(*reader, ps, 0, ps.size() / 2, got);
  }
  const Weights v1 = next_version(v, rng);
  refit(encode(v, v1, kV), kV + 1);
  const Weights v2 = next_version(v1, rng);
  refit(encode(v1, v2, kV + 1), kV + 2);
  EXPECT_TRUE(same_bits(held, v2));
  EXPECT_EQ(session.digest(), v2.digest().combined());
  // A new reader serves the new version.
  auto reader = session.begin_snapshot();
  Weights got(m);
  read(*reader, ps, 0, ps.size(), got);
  EXPECT_TRUE(same_bits(got, v2));
}

}  // namespace
}  // namespace deltacast::tree
