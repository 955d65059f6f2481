// Failure repair, deterministically: every member is a thread of this process with its OWN
// loopback transport, so a fault hook can kill or freeze one member at an exact message (the k-th
// frame it forwards, the middle of a RAW body, right after its ACK), as SIGKILL / SIGSTOP would.
// After each case every survivor's weights are compared bit for bit (memcmp) with the producer's,
// the version is committed without an ABORT, and the job goes on.
#include <atomic>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codec/frame.h"
#include "tests/common/memory_reader.h"
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
// Stretched under sanitizers (tests/common/time_scale.h).
const auto kPeerTimeout = test_time::scaled(600ms);

// What a member sends, as a fault hook sees it.
struct Sent {
  std::optional<MessageType> type;  // nullopt: a bare RAW body
  uint64_t version = 0;             // FRAME: the codec frame's new version; ACK: its version
};
Sent classify(std::span<const std::byte> message) {
  Sent s;
  try {
    s.type = message_type(message);
  } catch (const Error&) {
    return s;  // no tree header: a RAW body
  }
  try {
    if (*s.type == MessageType::frame) {
      auto payload = frame_payload(message);
      s.version = codec::parse_frame(payload).header.new_version;
    } else if (*s.type == MessageType::ack) {
      s.version = std::get<Ack>(decode_message(message)).version;
    } else if (*s.type == MessageType::commit) {
      s.version = std::get<Commit>(decode_message(message)).version;
    }
  } catch (const Error&) {
  }
  return s;
}

// The failover tests' cluster: members in named clusters (for delegated commits), gated members,
// small in-flight windows so that a version spans many messages, and per-member fault hooks.
class FailCluster : public LoopCluster {
 public:
  FailCluster(TopologyKind kind, const codec::Manifest& manifest, uint32_t n, const std::string& name,
              std::vector<std::string> clusters = {}, std::set<uint32_t> gated = {}, bool delegated = false)
      : LoopCluster(name, n, kPeerTimeout), clusters_(std::move(clusters)), gated_(std::move(gated)) {
    ProducerOptions po;
    po.receivers = n;
    po.topology = kind;
    po.encode.chunk_bytes = 32 << 10;  // many chunks for a small model
    po.max_inflight_bytes_per_root = 256 << 10;
    po.version_timeout = 30s;
    po.join_timeout = test_time::scaled(10s);
    po.delegate_commit = delegated;
    po.on_progress = [this](uint32_t sent, uint32_t count) {
      if (on_progress_) on_progress_(sent);
      if (on_progress_of_) on_progress_of_(sent, count);
    };
    po.before_commit = [this](uint64_t version, uint64_t) {
      if (before_commit_) before_commit_(version);
    };
    start(manifest, po);
  }
  ~FailCluster() override {
    if (!finished()) finish();
  }
  void on_progress(std::function<void(uint32_t)> f) { on_progress_ = std::move(f); }
  // Runs after the producer posted each data message of a version: (posted so far, the version's).
  void on_progress_of(std::function<void(uint32_t, uint32_t)> f) { on_progress_of_ = std::move(f); }
  // Runs when the producer has decided to commit a version, before COMMIT goes out.
  void before_commit(std::function<void(uint64_t)> f) { before_commit_ = std::move(f); }

  // Installs a hook on member r: `decide` sees each message r sends and may return die/freeze.
  void hook(uint32_t r, std::function<loop::Fault(const Sent&)> decide) { install(transport_of(r), std::move(decide)); }
  // A new process for rank r (after the old one died): fresh buffers at version 0, same rank.
  // `decide`, when given, is the new member's hook (see hook()) from its first message on.
  void restart(uint32_t r, std::function<loop::Fault(const Sent&)> decide = {}) {
    LoopCluster::restart(r, [&](transport::Transport& t) {
      if (decide) install(t, std::move(decide));
    });
  }

 private:
  static void install(transport::Transport& t, std::function<loop::Fault(const Sent&)> decide) {
    loop::set_member_fault_hook(
        t, std::make_shared<loop::FaultFunction>(
               [decide = std::move(decide)](uint64_t, std::span<const std::byte> m) { return decide(classify(m)); }));
  }
  std::unique_ptr<Receiver> make_receiver(uint32_t r) override {
    ReceiverOptions ro = receiver_options(r);
    ro.cluster = clusters_.empty() ? "" : clusters_[r - 1];
    ro.max_inflight_bytes_per_child = 128 << 10;
    ro.gated = gated_.count(r) > 0;
    return std::make_unique<Receiver>(transport_of(r), ro);
  }

  std::vector<std::string> clusters_;
  std::set<uint32_t> gated_;
  std::function<void(uint32_t)> on_progress_;
  std::function<void(uint32_t, uint32_t)> on_progress_of_;
  std::function<void(uint64_t)> before_commit_;
};

// Dies (or freezes) at the k-th data message it forwards of `version` (before delivering it).
std::function<loop::Fault(const Sent&)> at_forwarded_frame(uint64_t version, int k, loop::Fault::Kind kind) {
  auto seen = std::make_shared<std::atomic<int>>(0);
  return [=](const Sent& s) {
    if (s.type == MessageType::frame && s.version == version && ++*seen == k) return loop::Fault{kind};
    return loop::Fault{};
  };
}

// Dies (or freezes) right after its first ACK of `version` left: it verified, then it is gone.
std::function<loop::Fault(const Sent&)> after_its_ack(uint64_t version, loop::Fault::Kind kind) {
  return [=](const Sent& s) {
    loop::Fault f;
    if (s.type == MessageType::ack && s.version == version) {
      f.kind = kind;
      f.after = true;
    }
    return f;
  };
}

// The report's entry for `rank` (checked to be there, with `cause`); a default one when missing.
FailedMember expect_failed(const RefitReport& report, uint32_t rank, const std::string& cause) {
  for (const auto& f : report.failed_members)
    if (f.rank == rank) {
      EXPECT_EQ(f.cause, cause) << "rank " << rank;
      return f;
    }
  ADD_FAILURE() << "rank " << rank << " is not in failed_members";
  return FailedMember{};
}

// Bootstrap + one delta, then the faulty version 3, then version 4 to show the job goes on.
struct Refits {
  Model model = Model::make(11);
  RefitReport v2;
  void bootstrap_and_step(FailCluster& c) {
    RefitReport full = c.producer().bootstrap(model.weights());
    ASSERT_TRUE(full.committed) << full.abort_reason;
    model.step(1);
    v2 = c.producer().refit(model.weights());
    ASSERT_TRUE(v2.committed) << v2.abort_reason;
  }
  RefitReport step(FailCluster& c, uint64_t seed) {
    model.step(seed);
    return c.producer().refit(model.weights());
  }
};

void expect_survivors_exact(FailCluster& c, uint32_t n, const std::set<uint32_t>& dead, const Model& model) {
  for (uint32_t r = 1; r <= n; ++r) {
    if (dead.count(r)) continue;
    EXPECT_EQ(c.failure(r), "") << "rank " << r;
    EXPECT_TRUE(c.holds(r, model.weights())) << "survivor rank " << r << " differs from the producer";
    EXPECT_EQ(c.receiver(r).stats().versions_aborted, 0u) << "rank " << r << " saw an ABORT";
  }
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// SIGCONT for frozen member `rank` (its fault hook cleared), then versions 4..12, 300 ms apart,
// each committed, until one counts all n members again: the member rejoined.
void thaw_until_back(FailCluster& c, Refits& run, uint32_t rank, uint32_t n) {
  c.hook(rank, [](const Sent&) { return loop::Fault{}; });
  loop::thaw(c.transport_of(rank));
  c.thawed(rank);
  bool back = false;
  for (uint64_t v = 4; v <= 12 && !back; ++v) {
    std::this_thread::sleep_for(300ms);
    const RefitReport r = run.step(c, v);
    ASSERT_TRUE(r.committed) << r.abort_reason;
    back = r.receivers == n;
  }
  EXPECT_TRUE(back) << "the thawed member " << rank << " never rejoined";
}

// Every failure case runs with the producer deciding each commit and, for binary and chain, with
// a delegate deciding it (docs/protocol.md, "Delegated commit").
struct FailoverCase {
  TopologyKind kind = TopologyKind::binary;
  bool delegated = false;
};
class Failover : public ::testing::TestWithParam<FailoverCase> {
 protected:
  TopologyKind kind() const { return GetParam().kind; }
  FailCluster make(const codec::Manifest& manifest, uint32_t n, std::vector<std::string> clusters = {}) {
    return FailCluster(kind(), manifest, n, test_name(), std::move(clusters), {}, GetParam().delegated);
  }
};

TEST_P(Failover, InteriorMemberDiesMidDelta) {
  const uint32_t n = 7;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  run.bootstrap_and_step(c);
  // Rank 2 forwards in every kind (binary: children 4 and 5; chain: rank 3; double binary: tree 1).
  c.hook(2, at_forwarded_frame(3, 2, loop::Fault::Kind::die));
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  expect_failed(r3, 2, "link_closed");
  EXPECT_EQ(r3.receivers, n - 1);
  EXPECT_EQ(r3.verified_receivers, n - 1);
  EXPECT_GT(r3.epoch, 0u);
  RefitReport r4 = run.step(c, 4);
  ASSERT_TRUE(r4.committed) << r4.abort_reason;
  EXPECT_TRUE(r4.failed_members.empty());
  c.finish();
  expect_survivors_exact(c, n, {2}, run.model);
}

TEST_P(Failover, RootDiesMidDelta) {
  const uint32_t n = 6;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  run.bootstrap_and_step(c);
  c.hook(1, at_forwarded_frame(3, 1, loop::Fault::Kind::die));
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  expect_failed(r3, 1, "link_closed");
  RefitReport r4 = run.step(c, 4);
  ASSERT_TRUE(r4.committed) << r4.abort_reason;
  c.finish();
  expect_survivors_exact(c, n, {1}, run.model);
}

// Issue 35's whole-job loss: the root dies once the producer has posted the bootstrap's last
// piece, and the new root lacks more than the producer's window on a root (here: every piece;
// the old root forwarded nothing). Every re-send then goes out from the joint commit's loop, which
// asks only OutboundLink::inflight_bytes() whether the new root has room. Before f8d46ab that
// count moved only in wait_below(), so the root stayed "full", the re-sends stayed queued, nobody
// acked, the version aborted at the version timeout and `deltacast run` exited 1 with nothing
// committed. One member's death must never end the job.
TEST_P(Failover, RootDiesAfterTheLastPieceWasPostedAndEveryReSendGoesFromTheCommitLoop) {
  const uint32_t n = 6;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  // Rank 1 takes every piece from the producer and passes none on (its RAW headers and bodies to
  // its children are lost): whoever replaces it holds nothing of version 1.
  c.hook(1, [](const Sent& s) {
    const bool raw_data = !s.type || *s.type == MessageType::raw;
    return raw_data ? loop::Fault{loop::Fault::Kind::drop} : loop::Fault{};
  });
  // On the producer's thread, right after it posted the last piece: the kill lands in the joint
  // commit, with no data left to send (the producer's RAW bootstrap has no seal).
  std::atomic<bool> killed{false};
  uint32_t pieces = 0;
  c.on_progress_of([&](uint32_t sent, uint32_t count) {
    pieces = count;
    if (sent == count && !killed.exchange(true)) loop::kill(c.transport_of(1));
  });
  const auto started = std::chrono::steady_clock::now();
  RefitReport full = c.producer().bootstrap(run.model.weights());
  ASSERT_TRUE(killed.load());
  ASSERT_TRUE(full.committed) << full.abort_reason << " (after "
                              << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
                              << " s)";
  expect_failed(full, 1, "link_closed");
  // Every piece went again, far more than the 256 KiB window on a root.
  EXPECT_GE(full.resent_chunks, pieces / 2) << "of " << pieces << " pieces";
  EXPECT_GT(uint64_t{full.resent_chunks} * (32 << 10), uint64_t{256} << 10);
  EXPECT_EQ(full.receivers, n - 1);
  for (uint64_t step = 2; step <= 3; ++step) {
    RefitReport r = run.step(c, step);
    ASSERT_TRUE(r.committed) << r.abort_reason;
  }
  c.finish();
  expect_survivors_exact(c, n, {1}, run.model);
}

TEST_P(Failover, LeafDiesBeforeItsAck) {
  const uint32_t n = 7;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  run.bootstrap_and_step(c);
  c.hook(7, [](const Sent& s) {
    return s.type == MessageType::ack && s.version == 3 ? loop::Fault{loop::Fault::Kind::die} : loop::Fault{};
  });
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  expect_failed(r3, 7, "link_closed");
  c.finish();
  expect_survivors_exact(c, n, {7}, run.model);
}

TEST_P(Failover, MemberDiesBetweenItsAckAndTheCommit) {
  const uint32_t n = 5;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  run.bootstrap_and_step(c);
  // The ACK gets out, then the member dies: it verified, but it is not live at the commit.
  c.hook(3, after_its_ack(3, loop::Fault::Kind::die));
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  RefitReport r4 = run.step(c, 4);
  ASSERT_TRUE(r4.committed) << r4.abort_reason;
  // Depending on timing the death is seen during version 3 or just before version 4.
  std::vector<FailedMember> all = r3.failed_members;
  all.insert(all.end(), r4.failed_members.begin(), r4.failed_members.end());
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].rank, 3u);
  c.finish();
  expect_survivors_exact(c, n, {3}, run.model);
}

TEST_P(Failover, ParentAndChildDieAtOnce) {
  const uint32_t n = 8;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  run.bootstrap_and_step(c);
  // Rank 2 and one of its children in tree 0 (binary: 5; chain: 3; double binary: 1 or 3).
  std::atomic<bool> done{false};
  const uint32_t child = kind() == TopologyKind::binary ? 5 : kind() == TopologyKind::chain ? 3 : 4;
  c.on_progress([&](uint32_t sent) {
    if (sent == 3 && !done.exchange(true)) {
      loop::kill(c.transport_of(2));
      loop::kill(c.transport_of(child));
    }
  });
  RefitReport r3 = run.step(c, 3);
  c.on_progress(nullptr);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  expect_failed(r3, 2, "link_closed");
  expect_failed(r3, child, "link_closed");
  RefitReport r4 = run.step(c, 4);
  ASSERT_TRUE(r4.committed) << r4.abort_reason;
  c.finish();
  expect_survivors_exact(c, n, {2, child}, run.model);
}

TEST_P(Failover, MemberDiesInTheMiddleOfARawBody) {
  const uint32_t n = 6;
  Model model = Model::make(21);
  FailCluster c = make(model.manifest, n);
  // Rank 2 dies as it forwards its third RAW body (a bare message, no tree header).
  auto bodies = std::make_shared<std::atomic<int>>(0);
  c.hook(2, [bodies](const Sent& s) {
    return !s.type && ++*bodies == 3 ? loop::Fault{loop::Fault::Kind::die} : loop::Fault{};
  });
  RefitReport full = c.producer().bootstrap(model.weights());
  ASSERT_TRUE(full.committed) << full.abort_reason;
  expect_failed(full, 2, "link_closed");
  model.step(5);
  RefitReport r2 = c.producer().refit(model.weights());
  ASSERT_TRUE(r2.committed) << r2.abort_reason;
  c.finish();
  expect_survivors_exact(c, n, {2}, model);
}

TEST_P(Failover, FrozenMemberIsDetectedWithinPeerTimeoutAndRejoinsAfterThaw) {
  const uint32_t n = 7;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  run.bootstrap_and_step(c);
  c.frozen(2);
  auto freeze = at_forwarded_frame(3, 2, loop::Fault::Kind::freeze);
  auto frozen_at = std::make_shared<std::atomic<std::chrono::steady_clock::rep>>(0);
  c.hook(2, [freeze, frozen_at](const Sent& s) {
    const loop::Fault f = freeze(s);
    if (f.kind == loop::Fault::Kind::freeze) *frozen_at = std::chrono::steady_clock::now().time_since_epoch().count();
    return f;
  });
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  const FailedMember frozen = expect_failed(r3, 2, "silent");
  // The producer's verdict came timeouts.peer after the freeze (its last sign of life): not before
  // (a false verdict), and not much after (a heartbeat's period, plus scheduling on a loaded
  // machine). A detector 2x slower fails. (FailedMember::detection_seconds is the bound itself.)
  ASSERT_NE(frozen_at->load(), 0);
  const std::chrono::steady_clock::time_point froze{std::chrono::steady_clock::duration(frozen_at->load())};
  const auto verdict = c.producer().session_start() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(frozen.detected_at_s));
  const double detection = std::chrono::duration<double>(verdict - froze).count();
  const double peer = std::chrono::duration<double>(kPeerTimeout).count();
  std::printf("frozen member: verdict %.3f s after the freeze (timeouts.peer %.3f s)\n", detection, peer);
  EXPECT_GE(detection, 0.95 * peer) << "a verdict before timeouts.peer of silence";
  EXPECT_LE(detection, 1.5 * peer + std::chrono::duration<double>(test_time::scaled(250ms)).count())
      << "detection is slower than timeouts.peer plus a heartbeat";
  EXPECT_LT(r3.refit_seconds, 4 * peer + 2);  // the version waited for that, not its version timeout
  // SIGCONT: the member learns it was fenced, rolls back what it had of version 3, catches up by
  // replaying version 3 from a peer's retained frames, and is admitted again.
  thaw_until_back(c, run, 2, n);
  RefitReport last = run.step(c, 13);
  ASSERT_TRUE(last.committed) << last.abort_reason;
  EXPECT_EQ(last.verified_receivers, n);
  c.finish();
  for (uint32_t r = 1; r <= n; ++r) {
    EXPECT_EQ(c.failure(r), "") << "rank " << r;
    EXPECT_TRUE(c.holds(r, run.model.weights())) << "rank " << r << " differs";
  }
}

// A member that died comes back as a new process (version 0): it takes a snapshot from a live
// peer in its own cluster, replays what was committed after it, and is admitted again, while the
// producer keeps refitting.
TEST_P(Failover, RestartedMemberCatchesUpBySnapshotWhileRefitsFlow) {
  const uint32_t n = 6;
  Refits run;
  FailCluster c = make(run.model.manifest, n, {"a", "a", "a", "b", "b", "b"});
  run.bootstrap_and_step(c);
  c.restart(5);
  bool back = false;
  for (uint64_t v = 3; v <= 14 && !back; ++v) {
    RefitReport r = run.step(c, v);
    ASSERT_TRUE(r.committed) << r.abort_reason;
    back = r.receivers == n && r.verified_receivers == n;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(back) << "the restarted member never rejoined";
  // Its snapshot came from a live member of its own cluster b (ranks 4 and 6), not across the
  // cluster boundary (a, ranks 1-3) nor from the producer.
  const ReceiverStats restarted = c.receiver(5).stats();
  EXPECT_EQ(restarted.snapshots_taken, 1u);
  EXPECT_TRUE(restarted.last_snapshot_source == 4 || restarted.last_snapshot_source == 6)
      << "snapshot from rank " << restarted.last_snapshot_source;
  RefitReport last = run.step(c, 15);
  ASSERT_TRUE(last.committed) << last.abort_reason;
  EXPECT_EQ(last.verified_receivers, n);
  c.finish();
  for (uint32_t r = 1; r <= n; ++r) {
    EXPECT_EQ(c.failure(r), "") << "rank " << r;
    EXPECT_TRUE(c.holds(r, run.model.weights())) << "rank " << r << " differs";
  }
}

// finish() while a restarted member is still catching up: the producer waits for it (up to the
// join timeout) before BYE, so it ends on the committed version like every other member. It said
// HELLO before finish() was called, and its first snapshot request (FETCH, to a live peer) is held
// back until that peer counts as silent (600 ms), so it takes its snapshot from the next peer, well
// after finish() began (without the wait, BYE ends every peer first and it stays at version 0).
TEST_P(Failover, MemberStillCatchingUpAtFinishEndsOnTheCommittedVersion) {
  const uint32_t n = 4;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  run.bootstrap_and_step(c);
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  auto hello_sent = std::make_shared<std::atomic<bool>>(false);
  auto fetches = std::make_shared<std::atomic<int>>(0);
  c.restart(3, [hello_sent, fetches](const Sent& s) {
    loop::Fault f;
    if (s.type == MessageType::hello) hello_sent->store(true);
    if (s.type == MessageType::fetch && fetches->fetch_add(1) == 0) {
      f.kind = loop::Fault::Kind::delay;
      f.delay = 1500ms;
    }
    return f;
  });
  const auto deadline = std::chrono::steady_clock::now() + test_time::scaled(10s);
  while (!hello_sent->load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(hello_sent->load()) << "the restarted member never said HELLO";
  std::this_thread::sleep_for(200ms);  // the HELLO reaches the producer's queue
  c.finish();
  expect_survivors_exact(c, n, {}, run.model);
}

// A restarted member whose every FETCH takes 150 ms, while the producer refits back to back (a
// version takes far less): each catch-up ends after a newer version began, so it would chase the
// producer round after round (a READY, a new plan, another FETCH). The next version waits for it
// instead (a bounded hold, docs/protocol.md "Rejoin and late join"): a snapshot, at most two
// replays, and it is back; then it ends bit-exact.
TEST_P(Failover, MemberChasingBackToBackVersionsIsAdmittedAfterAFewRounds) {
  const uint32_t n = 4;
  Refits run;
  FailCluster c = make(run.model.manifest, n);
  run.bootstrap_and_step(c);
  auto readies = std::make_shared<std::atomic<int>>(0);
  c.restart(3, [readies](const Sent& s) {
    loop::Fault f;
    if (s.type == MessageType::ready) readies->fetch_add(1);
    if (s.type == MessageType::fetch) {
      f.kind = loop::Fault::Kind::delay;
      f.delay = 150ms;
    }
    return f;
  });
  uint64_t v = 3;
  int rounds = -1;  // READYs it sent while catching up
  for (int k = 1; k <= 60 && rounds < 0; ++k, ++v) {
    const int before = readies->load();
    RefitReport r = run.step(c, v);
    ASSERT_TRUE(r.committed) << r.abort_reason;
    // (Before the producer saw the old process die, rank 3 may still count as live.)
    if (before > 0 && r.receivers == n && r.verified_receivers == n) rounds = before;
  }
  ASSERT_GT(rounds, 0) << "the restarted member never got back in 60 back-to-back versions";
  RecordProperty("catch_up_rounds", rounds);
  EXPECT_LE(rounds, 3) << "the restarted member chased the producer for " << rounds << " rounds";
  RefitReport last = run.step(c, v);
  ASSERT_TRUE(last.committed) << last.abort_reason;
  EXPECT_EQ(last.verified_receivers, n);
  c.finish();
  expect_survivors_exact(c, n, {}, run.model);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, Failover,
    ::testing::Values(FailoverCase{TopologyKind::binary, false}, FailoverCase{TopologyKind::double_binary, false},
                      FailoverCase{TopologyKind::chain, false}, FailoverCase{TopologyKind::binary, true},
                      FailoverCase{TopologyKind::chain, true}),
    [](const auto& param_info) {
      return std::string(topology_kind_name(param_info.param.kind)) + (param_info.param.delegated ? "_delegated" : "");
    });

// ---- Delegated commit (docs/protocol.md): the delegate's own failures, and a NACK ----------------

FailCluster delegated(const Model& model, uint32_t n) {
  return FailCluster(TopologyKind::binary, model.manifest, n, test_name(), {}, {}, true);
}

TEST(DelegatedCommit, TheDelegateCommitsEveryVersionAndTheReportNamesIt) {
  const uint32_t n = 5;
  Refits run;
  FailCluster c = delegated(run.model, n);
  run.bootstrap_and_step(c);
  EXPECT_NE(run.v2.commit_delegate, 0u);
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  EXPECT_EQ(r3.commit_delegate, run.v2.commit_delegate);
  EXPECT_EQ(r3.verified_receivers, n);
  c.finish();
  expect_survivors_exact(c, n, {}, run.model);
  for (uint32_t r = 1; r <= n; ++r) EXPECT_EQ(c.receiver(r).stats().versions_committed, 3u) << "rank " << r;
}

// The delegate acks (to the producer) and dies before deciding: the producer decides from the
// answers it has itself, and the next version has another delegate.
TEST(DelegatedCommit, DelegateDiesBeforeDecidingAndTheProducerCommits) {
  const uint32_t n = 5;
  Refits run;
  FailCluster c = delegated(run.model, n);
  run.bootstrap_and_step(c);
  const uint32_t d = run.v2.commit_delegate;
  ASSERT_NE(d, 0u);
  c.hook(d, after_its_ack(3, loop::Fault::Kind::die));
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  expect_failed(r3, d, "link_closed");
  EXPECT_EQ(r3.commit_delegate, 0u) << "the producer took over";
  RefitReport r4 = run.step(c, 4);
  ASSERT_TRUE(r4.committed) << r4.abort_reason;
  EXPECT_NE(r4.commit_delegate, 0u);
  EXPECT_NE(r4.commit_delegate, d);
  c.finish();
  expect_survivors_exact(c, n, {d}, run.model);
}

// The delegate freezes after its ACK (SIGSTOP): members cannot reach it, the producer fails it
// after timeouts.peer and commits itself; the next versions have another delegate, to which the
// members' answers go although their links to the frozen one were still being opened.
TEST(DelegatedCommit, DelegateFreezesAndTheNextVersionsHaveAnother) {
  const uint32_t n = 5;
  Refits run;
  FailCluster c = delegated(run.model, n);
  run.bootstrap_and_step(c);
  const uint32_t d = run.v2.commit_delegate;
  ASSERT_NE(d, 0u);
  c.frozen(d);
  c.hook(d, after_its_ack(3, loop::Fault::Kind::freeze));
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  expect_failed(r3, d, "silent");
  for (uint64_t v = 4; v <= 5; ++v) {
    RefitReport r = run.step(c, v);
    ASSERT_TRUE(r.committed) << r.abort_reason;
    EXPECT_NE(r.commit_delegate, d);
  }
  c.finish();
  expect_survivors_exact(c, n, {d}, run.model);
}

// The delegate dies while it sends its COMMITs: some members committed, the others did not hear
// it. The producer commits the same attempt; members that already committed answer ACTIVE again.
// Nobody rolls back.
TEST(DelegatedCommit, DelegateDiesHalfwayThroughItsCommitsAndNoMemberRollsBack) {
  const uint32_t n = 6;
  Refits run;
  FailCluster c = delegated(run.model, n);
  run.bootstrap_and_step(c);
  const uint32_t d = run.v2.commit_delegate;
  ASSERT_NE(d, 0u);
  auto commits = std::make_shared<std::atomic<int>>(0);
  c.hook(d, [commits](const Sent& s) {
    if (s.type == MessageType::commit && s.version == 3 && ++*commits == 3) return loop::Fault{loop::Fault::Kind::die};
    return loop::Fault{};
  });
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  EXPECT_EQ(commits->load(), 3) << "the delegate did not send its COMMITs";
  expect_failed(r3, d, "link_closed");
  RefitReport r4 = run.step(c, 4);
  ASSERT_TRUE(r4.committed) << r4.abort_reason;
  c.finish();
  expect_survivors_exact(c, n, {d}, run.model);
}

// One member refuses the version while the others ack it to the delegate (its buffers were changed
// behind its back, so the seal's digests do not verify there): only the producer aborts, every
// member rolls back to the base bits exactly, and the next version commits.
TEST(DelegatedCommit, ANackAbortsEveryMemberBackToTheBaseBits) {
  const uint32_t n = 5;
  Refits run;
  FailCluster c = delegated(run.model, n);
  run.bootstrap_and_step(c);
  const Model base = run.model;
  // Between versions (rank 4 is idle): flip every bit of one small tensor; ~1% of its elements
  // change in the next version, so the incremental digest there cannot match the seal's.
  const size_t norm = 2;
  for (auto& b : c.buffers_mut(4)[norm]) b = ~b;
  RefitReport r3 = run.step(c, 3);
  EXPECT_FALSE(r3.committed);
  EXPECT_NE(r3.abort_reason.find("rank 4"), std::string::npos) << r3.abort_reason;
  EXPECT_EQ(r3.verified_receivers, n - 1);
  EXPECT_TRUE(r3.failed_members.empty());
  for (auto& b : c.buffers_mut(4)[norm]) b = ~b;  // its committed bits again
  for (uint32_t r = 1; r <= n; ++r) {
    EXPECT_TRUE(c.holds(r, base.weights())) << "rank " << r << " is not back at the base";
    EXPECT_EQ(c.receiver(r).stats().versions_aborted, 1u) << "rank " << r;
    EXPECT_EQ(c.receiver(r).version(), 2u) << "rank " << r;
  }
  RefitReport r4 = run.step(c, 4);
  ASSERT_TRUE(r4.committed) << r4.abort_reason;
  c.finish();
  EXPECT_EQ(c.failures(), "");
  for (uint32_t r = 1; r <= n; ++r) EXPECT_TRUE(c.holds(r, run.model.weights())) << "rank " << r;
}

// A member that comes back claiming a version whose digest is not the producer's is refused with a
// clear error naming both digests, and is not admitted: the next version goes to the others only.
// It claims version 2 while the producer has committed 3: only the producer's record of version
// 2's digest can tell (the member itself compares with WELCOME's committed version, 3). Checked
// to fail with the producer's check (tree/producer/admission.cpp, the held_digest != want branch)
// removed: the join then succeeds.
TEST(Rejoin, WrongDigestIsRefusedAndNothingIsWritten) {
  const uint32_t n = 3;
  Refits run;
  FailCluster c(TopologyKind::binary, run.model.manifest, n, test_name());
  run.bootstrap_and_step(c);
  const Model v2 = run.model;
  loop::kill(c.transport_of(3));
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  // A new instance of rank 3 holding "version 2" with one flipped bit.
  Model held = v2;
  held.tensors[1][100] ^= std::byte{1};
  auto t = transport::make_transport("loop", {});
  ReceiverOptions ro;
  ro.rank = 3;
  ro.producer_url = "loop://" + test_name() + "-producer";
  ro.listen_url = "loop://" + test_name() + "-r3-again";
  ro.join_timeout = 5s;
  Receiver again(*t, ro);
  const auto wrong = codec::StateDigest::full_scan(held.weights()).combined();
  const auto right = codec::StateDigest::full_scan(v2.weights()).combined();
  ASSERT_NE(wrong, right);
  try {
    again.join(2, wrong);
    FAIL() << "a wrong digest was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::verify_failed) << e.what();
    char digests[64];
    std::snprintf(digests, sizeof digests, "%016llx", static_cast<unsigned long long>(wrong));
    EXPECT_NE(std::string(e.what()).find(digests), std::string::npos) << e.what();
    std::snprintf(digests, sizeof digests, "%016llx", static_cast<unsigned long long>(right));
    EXPECT_NE(std::string(e.what()).find(digests), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing was written"), std::string::npos) << e.what();
  }
  // Refused before WELCOME: the instance has no manifest, so no buffers can be attached to it.
  EXPECT_THROW(again.attach(codec::MutableWeights{&held.manifest, {}}, 2), Error);
  RefitReport r4 = run.step(c, 4);
  ASSERT_TRUE(r4.committed) << r4.abort_reason;
  EXPECT_EQ(r4.receivers, n - 1) << "the refused instance was admitted";
  c.finish();
  expect_survivors_exact(c, n, {3}, run.model);
}

// A member that lost its producer gives up rejoining after timeouts.producer_loss (here 1 s), as
// its log says, even when something at the producer's address takes its HELLO and never answers:
// it does not wait timeouts.join (here 10 s) for a WELCOME. Its committed version stays intact.
TEST(Rejoin, ASilentProducerAddressEndsTheRejoinWithinTheProducerLossTimeout) {
  Refits run;
  FailCluster c(TopologyKind::binary, run.model.manifest, 1, test_name());
  run.bootstrap_and_step(c);
  loop::kill(c.producer_transport());  // the producer is gone: rank 1 tries to rejoin
  // Something else now listens at the producer's address, reads each HELLO and stays silent.
  auto silent = transport::make_transport("loop", {});
  auto listener = silent->listen(transport::Url::parse("loop://" + test_name() + "-producer"));
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<transport::Connection>> held;
  std::atomic<int> hellos{0};
  std::thread answerer([&] {
    std::vector<std::byte> buffer(1 << 20);
    while (!stop) {
      auto connection = listener->accept(50ms);
      if (!connection) continue;
      if (connection->post_recv(buffer)->wait(5s).ok()) ++hellos;
      held.push_back(std::move(connection));  // open, and never a WELCOME
    }
  });
  const auto lost = std::chrono::steady_clock::now();
  const bool gave_up = eventually([&] { return !c.failure(1).empty(); }, test_time::scaled(8s));
  const auto waited = std::chrono::steady_clock::now() - lost;
  stop = true;
  answerer.join();
  ASSERT_TRUE(gave_up) << "rank 1 still waits for a WELCOME after 8 s";
  EXPECT_GE(hellos.load(), 1) << "rank 1 never said HELLO to the silent address";
  EXPECT_LT(waited, test_time::scaled(5s)) << "rank 1 waited timeouts.join, not timeouts.producer_loss";
  EXPECT_NE(c.failure(1).find("could not rejoin"), std::string::npos) << c.failure(1);
  EXPECT_EQ(c.receiver(1).version(), 2u);
  EXPECT_TRUE(c.holds(1, run.model.weights())) << "rank 1's committed version was touched";
}

// The last resort: no live peer can serve a snapshot (the only member restarted empty), so the
// producer streams its baseline, and the member is back for the next version.
TEST(Rejoin, TheProducerServesTheSnapshotWhenNoPeerCan) {
  const uint32_t n = 1;
  Refits run;
  FailCluster c(TopologyKind::binary, run.model.manifest, n, test_name());
  run.bootstrap_and_step(c);
  c.restart(1);
  ASSERT_TRUE(eventually([&] { return c.receiver(1).version() == 2; }, 20s)) << "no snapshot came";
  EXPECT_TRUE(c.holds(1, run.model.weights())) << "the snapshot differs from version 2";
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  EXPECT_EQ(r3.verified_receivers, n);
  c.finish();
  EXPECT_EQ(c.failure(1), "");
  EXPECT_TRUE(c.holds(1, run.model.weights())) << "rank 1 differs from the producer";
}

// --- The producer reading each version (Producer::refit over a WeightsReader: pread of a
// trainer's checkpoint, trainer.kind watch).

// Versions read in pieces commit bit-exact on every member, the baseline follows them (the next
// version's frames apply on top), and each version is read twice: scanned, then into the baseline.
// A read that fails during the encode aborts the version: the members stay where they were and
// the producer goes on.
// A read that fails after the commit (the checkpoint truncated under the producer) leaves every
// member at that version, bit-exact, and the producer without a baseline: it says so, and refuses
// to send another version (from memory or read) instead of sending deltas from mixed bits.
TEST(ReadRefit, VersionsReadInPiecesCommitAndAFailedReadAbortsOrStopsTheProducer) {
  const uint32_t n = 3;
  Refits run;
  FailCluster c(TopologyKind::binary, run.model.manifest, n, test_name());
  run.bootstrap_and_step(c);
  const uint64_t total = run.model.manifest.total_bytes();
  for (uint64_t v = 3; v <= 4; ++v) {
    run.model.step(v);
    const codec::testing::MemoryReader reader(run.model.weights());
    const RefitReport r = c.producer().refit(reader);
    ASSERT_TRUE(r.committed) << r.abort_reason;
    EXPECT_EQ(r.verified_receivers, n);
    EXPECT_GE(reader.bytes.load(), 2 * total) << "version " << v << " was not scanned and read into the baseline";
    // Plus the class sampler's runs: 4096 of the 16 Ki elements of each 32 KiB chunk.
    EXPECT_LE(reader.bytes.load(), 2 * total + total / 4 + 4096) << "version " << v;
    for (uint32_t rank = 1; rank <= n; ++rank)
      EXPECT_TRUE(c.holds(rank, run.model.weights())) << "rank " << rank << " at version " << v;
  }
  RefitReport r5 = run.step(c, 5);  // from memory, on the baseline the reads left
  ASSERT_TRUE(r5.committed) << r5.abort_reason;

  // A read failing while the version is encoded (the file truncated before the commit): the
  // version is aborted, every member rolls back to version 5, and the producer goes on.
  {
    Model attempt = run.model;
    attempt.step(60);
    codec::testing::MemoryReader truncated(attempt.weights());
    truncated.fail_at = 3;
    try {
      (void)c.producer().refit(truncated);
      FAIL() << "a read failed during the encode, the refit did not";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::io) << e.what();
    }
    EXPECT_EQ(c.producer().version(), 5u);
    for (uint32_t rank = 1; rank <= n; ++rank) {
      ASSERT_TRUE(eventually([&] { return c.receiver(rank).stats().versions_aborted == 1; })) << "rank " << rank;
      EXPECT_TRUE(c.holds(rank, run.model.weights())) << "rank " << rank << " left version 5";
    }
  }

  run.model.step(6);
  codec::testing::MemoryReader failing(run.model.weights());
  c.before_commit([&](uint64_t v) {
    if (v == 6) failing.fail_at = failing.reads + 2;  // the second read into the baseline fails
  });
  try {
    (void)c.producer().refit(failing);
    FAIL() << "the baseline could not be read, the refit did not say so";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io) << e.what();
    EXPECT_NE(std::string(e.what()).find("baseline"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test.safetensors"), std::string::npos) << e.what();
  }
  c.before_commit(nullptr);
  EXPECT_EQ(c.producer().version(), 6u) << "the members hold version 6";
  for (uint32_t rank = 1; rank <= n; ++rank) {
    ASSERT_TRUE(eventually([&] { return c.receiver(rank).version() == 6; })) << "rank " << rank;
    EXPECT_TRUE(c.holds(rank, run.model.weights())) << "rank " << rank << " is not at version 6";
  }
  const Model v6 = run.model;
  run.model.step(7);
  const codec::testing::MemoryReader next(run.model.weights());
  for (int from_memory = 0; from_memory < 2; ++from_memory) {
    try {
      (void)(from_memory ? c.producer().refit(run.model.weights()) : c.producer().refit(next));
      FAIL() << "a producer without a baseline sent version 7";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::state) << e.what();
      EXPECT_NE(std::string(e.what()).find("baseline"), std::string::npos) << e.what();
    }
  }
  c.finish();
  for (uint32_t rank = 1; rank <= n; ++rank) {
    EXPECT_EQ(c.failure(rank), "") << "rank " << rank;
    EXPECT_TRUE(c.holds(rank, v6.weights())) << "rank " << rank << " left version 6";
  }
}

// The root freezes at the first chunk of a version read in pieces, holding every chunk the
// producer sent it: once it is found silent, the new root's RESUME makes the producer encode the
// chunks again from the reader (read again), the version commits on the survivors bit-exact, and
// after the thaw the member catches up and the next versions go on from the baseline.
TEST(ReadRefit, ARootFrozenMidVersionIsRepairedFromTheReader) {
  const uint32_t n = 3;
  Refits run;
  FailCluster c(TopologyKind::binary, run.model.manifest, n, test_name());
  run.bootstrap_and_step(c);
  c.frozen(1);
  c.hook(1, at_forwarded_frame(3, 1, loop::Fault::Kind::freeze));
  run.model.step(3);
  const codec::testing::MemoryReader reader(run.model.weights());
  const RefitReport r3 = c.producer().refit(reader);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  expect_failed(r3, 1, "silent");
  EXPECT_EQ(r3.verified_receivers, n - 1);
  EXPECT_GT(r3.resent_chunks, 0u);
  const uint64_t total = run.model.manifest.total_bytes();
  EXPECT_GT(reader.bytes.load(), 2 * total) << "the resent chunks were not read again";
  thaw_until_back(c, run, 1, n);
  const RefitReport last = run.step(c, 13);
  ASSERT_TRUE(last.committed) << last.abort_reason;
  c.finish();
  for (uint32_t r = 1; r <= n; ++r) {
    EXPECT_EQ(c.failure(r), "") << "rank " << r;
    EXPECT_TRUE(c.holds(r, run.model.weights())) << "rank " << r << " differs";
  }
}

// --- The apply gate: gated members verify, ack and commit without writing their buffers; the
// server writes the queued versions at its safe point (Receiver::apply_pending).


TEST(Gate, GatedMembersCommitWithoutWritingAndApplyQueuedVersionsInOrder) {
  const uint32_t n = 5;
  Refits run;
  // Rank 1 is the root: a gated relay still forwards every frame at once.
  FailCluster c(TopologyKind::binary, run.model.manifest, n, test_name(), {}, {1, 4});
  RefitReport full = c.producer().bootstrap(run.model.weights());
  ASSERT_TRUE(full.committed) << full.abort_reason;
  ASSERT_TRUE(eventually([&] { return c.receiver(4).version() == 1 && c.receiver(1).version() == 1; }));
  EXPECT_TRUE(c.holds(1, run.model.weights())) << "the bootstrap is never gated";
  const Model v1 = run.model;
  std::vector<Model> versions;
  for (uint64_t v = 2; v <= 4; ++v) {
    RefitReport r = run.step(c, v);
    ASSERT_TRUE(r.committed) << r.abort_reason;
    EXPECT_EQ(r.verified_receivers, n);
    ASSERT_TRUE(eventually([&] { return c.receiver(1).version() == v && c.receiver(4).version() == v; }));
    for (uint32_t g : {1u, 4u}) {
      EXPECT_TRUE(c.holds(g, v1.weights())) << "gated rank " << g << " wrote version " << v << " before apply";
      EXPECT_EQ(c.receiver(g).applied_version(), 1u);
    }
    versions.push_back(run.model);
  }
  EXPECT_EQ(c.receiver(4).pending(), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_TRUE(c.receiver(2).pending().empty());
  // Ungated members hold every version as it commits.
  ASSERT_TRUE(eventually([&] { return c.receiver(5).version() == 4; }));
  EXPECT_TRUE(c.holds(5, run.model.weights()));
  // Rank 4 applies everything queued; rank 1 applies between the next versions.
  EXPECT_EQ(c.receiver(4).apply_pending(), 4u);
  EXPECT_TRUE(c.holds(4, run.model.weights()));
  EXPECT_TRUE(c.receiver(4).pending().empty());
  EXPECT_EQ(c.receiver(1).apply_pending(), 4u);
  EXPECT_TRUE(c.holds(1, run.model.weights()));
  RefitReport r5 = run.step(c, 5);
  ASSERT_TRUE(r5.committed) << r5.abort_reason;
  ASSERT_TRUE(eventually([&] { return c.receiver(1).version() == 5; }));
  EXPECT_TRUE(c.holds(1, versions.back().weights()));
  EXPECT_EQ(c.receiver(1).apply_pending(), 5u);
  EXPECT_TRUE(c.holds(1, run.model.weights()));
  c.finish();
  // The digest a gated member reports is the committed version's, not the buffers'.
  EXPECT_EQ(c.receiver(4).digest(), codec::StateDigest::full_scan(run.model.weights()).combined());
  for (uint32_t r : {2u, 3u, 5u}) EXPECT_TRUE(c.holds(r, run.model.weights())) << "rank " << r;
  EXPECT_EQ(c.receiver(4).pending(), (std::vector<uint64_t>{5}));
}

TEST(Gate, AnAbortedVersionNeverReachesTheQueueOrTheBuffers) {
  const uint32_t n = 3;
  Refits run;
  FailCluster c(TopologyKind::binary, run.model.manifest, n, test_name(), {}, {2});
  RefitReport full = c.producer().bootstrap(run.model.weights());
  ASSERT_TRUE(full.committed) << full.abort_reason;
  const Model v1 = run.model;
  Model tried = run.model;
  tried.step(77);
  RefitOptions dry;
  dry.dry_run = true;
  RefitReport r = c.producer().refit(tried.weights(), dry);
  EXPECT_FALSE(r.committed);
  EXPECT_EQ(r.verified_receivers, n) << "a dry run delivers and verifies everywhere";
  ASSERT_TRUE(eventually([&] { return c.receiver(2).stats().versions_aborted == 1; }));
  EXPECT_TRUE(c.receiver(2).pending().empty());
  EXPECT_TRUE(c.holds(2, v1.weights()));
  // The next real version stages on the committed one, not on the aborted one.
  run.model.step(3);
  RefitReport r2 = c.producer().refit(run.model.weights());
  ASSERT_TRUE(r2.committed) << r2.abort_reason;
  ASSERT_TRUE(eventually([&] { return c.receiver(2).version() == 2; }));
  EXPECT_TRUE(c.holds(2, v1.weights()));
  EXPECT_EQ(c.receiver(2).apply_pending(), 2u);
  EXPECT_TRUE(c.holds(2, run.model.weights()));
  c.finish();
  for (uint32_t m = 1; m <= n; ++m) EXPECT_TRUE(c.holds(m, run.model.weights())) << "rank " << m;
}

// A restarted member takes its snapshot from gated peers whose servers have not applied: what
// their buffers hold (an older committed version), then replays the versions after it from the
// same peer's retained frames. A gated relay that dies mid-delta is repaired like any other.
TEST(Gate, RejoinAndRepairAroundGatedMembers) {
  const uint32_t n = 6;
  Refits run;
  FailCluster c(TopologyKind::binary, run.model.manifest, n, test_name(), {}, {1, 2, 3, 4, 6});
  run.bootstrap_and_step(c);
  c.hook(2, at_forwarded_frame(3, 2, loop::Fault::Kind::die));
  RefitReport r3 = run.step(c, 3);
  ASSERT_TRUE(r3.committed) << r3.abort_reason;
  expect_failed(r3, 2, "link_closed");
  c.restart(5);
  bool back = false;
  for (uint64_t v = 4; v <= 14 && !back; ++v) {
    RefitReport r = run.step(c, v);
    ASSERT_TRUE(r.committed) << r.abort_reason;
    back = r.receivers == n - 1 && r.verified_receivers == n - 1;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(back) << "the restarted member never rejoined";
  RefitReport last = run.step(c, 15);
  ASSERT_TRUE(last.committed) << last.abort_reason;
  c.finish();
  EXPECT_TRUE(c.holds(5, run.model.weights())) << "the rejoined member differs";
  for (uint32_t r : {1u, 3u, 4u, 6u}) {
    EXPECT_EQ(c.failure(r), "") << "rank " << r;
    EXPECT_FALSE(c.receiver(r).pending().empty());
    c.receiver(r).apply_pending();
    EXPECT_TRUE(c.holds(r, run.model.weights())) << "gated rank " << r << " differs after apply";
  }
}

}  // namespace
}  // namespace deltacast::tree
