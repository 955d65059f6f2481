// relay_link: OutboundLink (ordered posts, back-pressure, stall detection, cancel) and
// ControlReaders (ordered events per connection, one failure event, prompt stop) over the real
// in-process loopback transport; a peer that does not read is a frozen loopback member
// (transport::loopback::freeze), so sends towards it stay pending.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/loopback/loopback.h"
#include "transport/transport.h"
#include "tree/protocol.h"
#include "tree/relay_link.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
namespace loopback = transport::loopback;

transport::TransportOptions options(std::chrono::milliseconds peer_timeout) {
  transport::TransportOptions o;
  o.secret = "s";
  o.connect_timeout = 2s;
  o.heartbeat_interval = 100ms;
  o.peer_timeout = peer_timeout;
  o.max_message_bytes = 1 << 20;
  return o;
}

SharedBytes bytes_of(const std::string& text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return std::make_shared<const std::vector<std::byte>>(span.begin(), span.end());
}

std::string text_of(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

int unique_id() {
  static std::atomic<int> next{0};
  return next++;
}

// Two members: `sender` connects to `receiver`'s listener. The sender's connection goes into an
// OutboundLink; the receiver reads with `receive`.
struct LinkPair {
  std::unique_ptr<transport::Transport> sender, receiver;
  std::unique_ptr<transport::Listener> listener;
  std::unique_ptr<transport::Connection> inbound;  // the receiver's end
  std::unique_ptr<OutboundLink> link;

  explicit LinkPair(std::chrono::milliseconds sender_patience = 30s) {
    sender = transport::make_transport("loop", options(sender_patience));
    receiver = transport::make_transport("loop", options(30s));
    listener = receiver->listen(transport::Url::parse("loop://relay-link-" + std::to_string(unique_id())));
    auto outbound = sender->connect(listener->local_url(), 2s);
    inbound = listener->accept(2s);
    link = std::make_unique<OutboundLink>(std::move(outbound), 3, 1);
  }
  ~LinkPair() { link.reset(); }

  // The next message on the receiver's end, or the failure.
  std::string receive(std::chrono::milliseconds timeout = 2s, Status* status = nullptr) {
    try {
      auto m = recv_message(*inbound, 1 << 16, timeout);
      if (status) *status = Status::success();
      return text_of(m);
    } catch (const Error& e) {
      if (status) *status = e.status();
      return {};
    }
  }
};

// ---- OutboundLink -----------------------------------------------------------------------------

TEST(OutboundLink, PostsArriveInTheOrderPosted) {
  LinkPair pair;
  EXPECT_EQ(pair.link->peer_rank(), 3u);
  EXPECT_EQ(pair.link->tree(), 1);
  static const std::string body = "body-of-the-pair";
  static const std::string view = "a view the caller owns";
  pair.link->post(bytes_of("one"));
  pair.link->post_pair(bytes_of("header"), std::as_bytes(std::span(body.data(), body.size())));
  pair.link->post_view(std::as_bytes(std::span(view.data(), view.size())));
  auto owned = bytes_of("owned body");
  pair.link->post_pair(bytes_of("header2"), *owned, owned);
  owned.reset();  // the link keeps it
  pair.link->post(bytes_of("last"));
  for (const char* expected : {"one", "header", "body-of-the-pair", "a view the caller owns", "header2", "owned body",
                               "last"})
    EXPECT_EQ(pair.receive(), expected);
  EXPECT_TRUE(pair.link->flush(1s));
  EXPECT_EQ(pair.link->inflight_bytes(), 0u);
  EXPECT_EQ(pair.link->stalled_for(), 0ms);
  EXPECT_FALSE(pair.link->dead());
}

TEST(OutboundLink, ConcurrentPostsNeverSplitAPair) {
  LinkPair pair;
  constexpr int kThreads = 4, kPairs = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPairs; ++i) {
        const std::string id = std::to_string(t) + ":" + std::to_string(i);
        auto body = bytes_of("B" + id);
        pair.link->post_pair(bytes_of("H" + id), *body, body);
        if (i % 10 == 0) pair.link->post(bytes_of("S" + id));
      }
    });
  for (auto& t : threads) t.join();
  std::vector<int> next(kThreads, 0);      // per thread: the next pair index expected
  std::vector<int> next_single(kThreads, 0);
  const int total = kThreads * (2 * kPairs + kPairs / 10);
  for (int k = 0; k < total; ++k) {
    const std::string m = pair.receive();
    ASSERT_FALSE(m.empty()) << "message " << k;
    const int t = m[1] - '0';
    const int i = std::stoi(m.substr(3));
    if (m[0] == 'S') {
      EXPECT_EQ(i, next_single[t] * 10) << m;
      ++next_single[t];
      continue;
    }
    ASSERT_EQ(m[0], 'H') << "a body without its header: " << m;
    EXPECT_EQ(i, next[t]) << "a thread's posts keep their order: " << m;
    ++next[t];
    ASSERT_EQ(pair.receive(), "B" + m.substr(1)) << "the body must follow its header at once";
    ++k;
  }
  EXPECT_TRUE(pair.link->flush(1s));
}

// A producer's deferred re-sends ask only inflight_bytes() whether a root has room: it must see
// the peer drain (a count that moved only in wait_below() kept re-sends queued for ever once the
// version's last chunk was out).
TEST(OutboundLink, InflightBytesCountsOnlySendsNotYetFinished) {
  LinkPair pair;
  pair.link->post(bytes_of(std::string(100, 'a')));
  EXPECT_EQ(pair.link->inflight_bytes() % 100, 0u);
  EXPECT_EQ(pair.receive(), std::string(100, 'a'));
  const auto deadline = Clock::now() + 2s;
  while (pair.link->inflight_bytes() != 0 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(pair.link->inflight_bytes(), 0u);
}

TEST(OutboundLink, APeerThatDoesNotReadStallsTheLink) {
  LinkPair pair;
  EXPECT_EQ(pair.link->stalled_for(), 0ms) << "nothing pending";
  // A stall counts from the first send left pending, not from the link's last activity.
  pair.link->post(bytes_of("drained"));
  EXPECT_TRUE(pair.link->wait_below(0, 1s));
  EXPECT_EQ(pair.receive(), "drained");
  std::this_thread::sleep_for(300ms);
  loopback::freeze(*pair.receiver);
  const auto m1 = bytes_of(std::string(100, 'a')), m2 = bytes_of(std::string(50, 'b'));
  pair.link->post(m1);
  pair.link->post(m2);
  EXPECT_LT(pair.link->stalled_for(), 200ms) << "idle time before the posts is no stall";
  EXPECT_EQ(pair.link->inflight_bytes(), 150u);
  std::this_thread::sleep_for(250ms);
  EXPECT_GE(pair.link->stalled_for(), 200ms);
  const auto before = pair.link->stalled_for();
  std::this_thread::sleep_for(50ms);
  EXPECT_GT(pair.link->stalled_for(), before) << "stalled_for grows while nothing drains";

  // Back-pressure: above the cap, wait_below waits its timeout and says false.
  auto start = Clock::now();
  EXPECT_FALSE(pair.link->wait_below(149, 200ms));
  EXPECT_GE(Clock::now() - start, 190ms);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_FALSE(pair.link->wait_below(0, 0ms));
  EXPECT_TRUE(pair.link->wait_below(150, 0ms)) << "at the cap is below enough";
  EXPECT_EQ(pair.link->inflight_bytes(), 150u);
  EXPECT_FALSE(pair.link->dead());

  // flush gives up once the peer stalled for the timeout (it already has: returns soon).
  start = Clock::now();
  EXPECT_FALSE(pair.link->flush(100ms));
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_FALSE(pair.link->dead()) << "a stall is judged by the caller, not by the link";

  // The peer resumes: everything arrives in order, the link drains.
  loopback::thaw(*pair.receiver);
  EXPECT_EQ(pair.receive(), std::string(100, 'a'));
  EXPECT_EQ(pair.receive(), std::string(50, 'b'));
  EXPECT_TRUE(pair.link->wait_below(0, 2s));
  EXPECT_EQ(pair.link->inflight_bytes(), 0u);
  EXPECT_EQ(pair.link->stalled_for(), 0ms);
}

TEST(OutboundLink, FlushWaitsForTheStallTimeoutBeforeGivingUp) {
  LinkPair pair;
  loopback::freeze(*pair.receiver);
  pair.link->post(bytes_of("stuck"));
  const auto start = Clock::now();
  EXPECT_FALSE(pair.link->flush(400ms));
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 390ms);
  EXPECT_LT(took, 3s);
  loopback::thaw(*pair.receiver);
}

TEST(OutboundLink, FlushReturnsOnceAFrozenPeerResumes) {
  LinkPair pair;
  loopback::freeze(*pair.receiver);
  pair.link->post(bytes_of("later"));
  std::thread thaw([&] {
    std::this_thread::sleep_for(200ms);
    loopback::thaw(*pair.receiver);
  });
  EXPECT_TRUE(pair.link->flush(5s));
  thaw.join();
  EXPECT_EQ(pair.receive(), "later");
}

// stalled_for's contract: "zero when none is pending". A send that finished (a loopback send to a
// live peer finishes at once) is not pending, even before anything drained the link.
TEST(OutboundLink, StalledForIsZeroOnceEverySendFinished) {
  LinkPair pair;
  pair.link->post(bytes_of("delivered"));
  EXPECT_EQ(pair.receive(), "delivered");
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(pair.link->stalled_for(), 0ms) << "a healthy, fully drained peer is reported stalled";
}

TEST(OutboundLink, CancelAllClosesTheLinkAndItStaysDead) {
  LinkPair pair;
  loopback::freeze(*pair.receiver);
  for (int i = 0; i < 5; ++i) pair.link->post(bytes_of("pending " + std::to_string(i)));
  const auto start = Clock::now();
  pair.link->cancel_all();
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_TRUE(pair.link->dead());
  EXPECT_EQ(pair.link->inflight_bytes(), 0u);
  EXPECT_EQ(pair.link->stalled_for(), 0ms);
  // Later posts are ignored.
  pair.link->post(bytes_of("after"));
  pair.link->post_pair(bytes_of("h"), std::span<const std::byte>{});
  EXPECT_EQ(pair.link->inflight_bytes(), 0u);
  EXPECT_TRUE(pair.link->wait_below(0, 0ms));
  EXPECT_TRUE(pair.link->flush(10ms));
  pair.link->cancel_all();  // twice is fine
  EXPECT_TRUE(pair.link->dead());
  // The peer sees the link closed (after whatever it still got), never "after".
  loopback::thaw(*pair.receiver);
  Status status;
  for (int i = 0; i < 7; ++i) {
    const std::string m = pair.receive(2s, &status);
    if (!status.ok()) break;
    EXPECT_NE(m, "after");
  }
  EXPECT_EQ(status.code, Errc::connection) << status.message;
}

TEST(OutboundLink, APeerThatDiesMarksTheLinkDead) {
  LinkPair pair;
  pair.link->post(bytes_of("first"));
  EXPECT_EQ(pair.receive(), "first");
  loopback::freeze(*pair.receiver);
  pair.link->post(bytes_of("held"));
  loopback::kill(*pair.receiver);
  EXPECT_TRUE(pair.link->wait_below(0, 2s)) << "a dead link is below any cap";
  EXPECT_TRUE(pair.link->dead());
  pair.link->post(bytes_of("ignored"));
  EXPECT_TRUE(pair.link->flush(100ms));
}

TEST(OutboundLink, ASilentPeerFailsTheLinkAfterThePeerTimeout) {
  LinkPair pair(300ms);
  loopback::freeze(*pair.receiver);
  pair.link->post(bytes_of("never"));
  const auto start = Clock::now();
  EXPECT_TRUE(pair.link->wait_below(0, 5s));
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_TRUE(pair.link->dead());
}

// ---- failure_cause_of -------------------------------------------------------------------------

TEST(FailureCauseOf, SilentStatusesAreSilentTheRestLinkClosed) {
  EXPECT_EQ(failure_cause_of(Status{Errc::connection, "loop: peer silent for more than 200 ms"}), FailureCause::silent);
  EXPECT_EQ(failure_cause_of(Status{Errc::connection, "tcp: peer 10.0.0.2:4000 silent for more than 5000 ms"}),
            FailureCause::silent);
  EXPECT_EQ(failure_cause_of(Status{Errc::connection, "loop: peer died"}), FailureCause::link_closed);
  EXPECT_EQ(failure_cause_of(Status{Errc::connection, "loop: connection closed"}), FailureCause::link_closed);
  EXPECT_EQ(failure_cause_of(Status{Errc::connection, ""}), FailureCause::link_closed);
  EXPECT_EQ(failure_cause_of(Status{Errc::corrupt_frame, "bad magic"}), FailureCause::link_closed);
}

TEST(FailureCauseOf, ClassifiesTheLoopbackTransportsOwnStatuses) {
  LinkPair pair(200ms);
  auto to_frozen = pair.sender->connect(pair.listener->local_url(), 2s);
  auto frozen_end = pair.listener->accept(2s);
  LinkPair other;
  auto to_dead = other.sender->connect(other.listener->local_url(), 2s);
  auto dead_end = other.listener->accept(2s);
  loopback::freeze(*pair.receiver);
  loopback::kill(*other.receiver);
  const std::string text = "x";
  const auto bytes = std::as_bytes(std::span(text.data(), text.size()));
  const Status silent = to_frozen->post_send(bytes)->wait(5s);
  ASSERT_EQ(silent.code, Errc::connection);
  EXPECT_EQ(failure_cause_of(silent), FailureCause::silent) << silent.message;
  const Status died = to_dead->post_send(bytes)->wait(5s);
  ASSERT_EQ(died.code, Errc::connection);
  EXPECT_EQ(failure_cause_of(died), FailureCause::link_closed) << died.message;
  loopback::thaw(*pair.receiver);
}

// ---- ControlReaders ---------------------------------------------------------------------------

// A producer-side listener and members connected to it; each accepted connection is read by a
// ControlReaders whose events go to a queue.
struct ControlStar {
  std::unique_ptr<transport::Transport> hub;
  std::unique_ptr<transport::Listener> listener;
  std::vector<std::unique_ptr<transport::Transport>> members;
  std::vector<std::unique_ptr<transport::Connection>> member_ends;  // the members' side
  std::vector<std::shared_ptr<transport::Connection>> hub_ends;
  EventQueue<ControlEvent> events;
  ControlReaders readers;

  ControlStar(int n, std::chrono::milliseconds hub_patience = 30s, size_t max_bytes = 4096)
      : readers(max_bytes, [this](ControlEvent e) { events.push(std::move(e)); }) {
    hub = transport::make_transport("loop", options(hub_patience));
    listener = hub->listen(transport::Url::parse("loop://control-" + std::to_string(unique_id())));
    for (int i = 0; i < n; ++i) {
      members.push_back(transport::make_transport("loop", options(30s)));
      member_ends.push_back(members.back()->connect(listener->local_url(), 2s));
      hub_ends.push_back(std::shared_ptr<transport::Connection>(listener->accept(2s)));
    }
  }
  ~ControlStar() { readers.stop(); }
  void send(int member, const Message& m, uint64_t epoch = 0) { send_control(*member_ends[member], m, 2s, epoch); }
};

TEST(ControlReaders, DeliversEveryMessageInOrderPerConnection) {
  ControlStar star(2);
  star.readers.add(11, 1, star.hub_ends[0]);
  star.readers.add(12, 5, star.hub_ends[1]);
  constexpr int kEach = 50;
  std::thread a([&] {
    for (int i = 0; i < kEach; ++i) star.send(0, Ready{11, static_cast<uint64_t>(i), 0}, 100 + i);
  });
  std::thread b([&] {
    for (int i = 0; i < kEach; ++i) star.send(1, Ack{12, static_cast<uint64_t>(i), 7, 9}, 3);
  });
  a.join();
  b.join();
  int next_a = 0, next_b = 0;
  for (int k = 0; k < 2 * kEach; ++k) {
    auto e = star.events.pop(2s);
    ASSERT_TRUE(e) << "event " << k;
    ASSERT_TRUE(e->message) << e->status.message;
    EXPECT_TRUE(e->status.ok());
    if (e->rank == 11) {
      EXPECT_EQ(e->generation, 1u);
      const auto* ready = std::get_if<Ready>(&*e->message);
      ASSERT_NE(ready, nullptr);
      EXPECT_EQ(ready->version, static_cast<uint64_t>(next_a));
      EXPECT_EQ(e->epoch, static_cast<uint64_t>(100 + next_a));
      ++next_a;
    } else {
      ASSERT_EQ(e->rank, 12u);
      EXPECT_EQ(e->generation, 5u);
      const auto* ack = std::get_if<Ack>(&*e->message);
      ASSERT_NE(ack, nullptr);
      EXPECT_EQ(ack->version, static_cast<uint64_t>(next_b));
      EXPECT_EQ(ack->digest, 7u);
      EXPECT_EQ(ack->applied_changes, 9u);
      EXPECT_EQ(e->epoch, 3u);
      ++next_b;
    }
  }
  EXPECT_EQ(next_a, kEach);
  EXPECT_EQ(next_b, kEach);
  EXPECT_FALSE(star.events.pop(100ms));
}

TEST(ControlReaders, ALinkFailureIsReportedOnceWithItsStatus) {
  ControlStar star(2);
  star.readers.add(1, 0, star.hub_ends[0]);
  star.readers.add(2, 0, star.hub_ends[1]);
  star.send(0, Report{1, 4, 0, FailureCause::stalled, "child"});
  star.member_ends[0]->close();
  auto first = star.events.pop(2s);
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->message) << "what was sent before the close arrives first";
  EXPECT_EQ(std::get<Report>(*first->message).detail, "child");
  auto failure = star.events.pop(2s);
  ASSERT_TRUE(failure);
  EXPECT_EQ(failure->rank, 1u);
  EXPECT_FALSE(failure->message);
  EXPECT_EQ(failure->status.code, Errc::connection);
  EXPECT_FALSE(failure->status.message.empty());
  EXPECT_FALSE(star.events.pop(500ms)) << "one failure event per link";
  // The other member's link is unaffected.
  star.send(1, Bye{});
  auto other = star.events.pop(2s);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->rank, 2u);
  ASSERT_TRUE(other->message);
  EXPECT_NE(std::get_if<Bye>(&*other->message), nullptr);
  // A killed member: one failure event.
  loopback::kill(*star.members[1]);
  auto killed = star.events.pop(2s);
  ASSERT_TRUE(killed);
  EXPECT_EQ(killed->rank, 2u);
  EXPECT_FALSE(killed->message);
  EXPECT_EQ(killed->status.code, Errc::connection);
  EXPECT_EQ(failure_cause_of(killed->status), FailureCause::link_closed);
  EXPECT_FALSE(star.events.pop(300ms));
}

TEST(ControlReaders, AFrozenMemberIsReportedSilent) {
  ControlStar star(1, 300ms);
  star.readers.add(4, 2, star.hub_ends[0]);
  loopback::freeze(*star.members[0]);
  auto failure = star.events.pop(5s);
  ASSERT_TRUE(failure);
  EXPECT_EQ(failure->rank, 4u);
  EXPECT_EQ(failure->generation, 2u);
  EXPECT_FALSE(failure->message);
  EXPECT_EQ(failure->status.code, Errc::connection);
  EXPECT_EQ(failure_cause_of(failure->status), FailureCause::silent) << failure->status.message;
  EXPECT_FALSE(star.events.pop(300ms));
  loopback::thaw(*star.members[0]);
}

TEST(ControlReaders, AnUndecodableMessageIsAFailureAndClosesTheLink) {
  ControlStar star(1);
  star.readers.add(9, 0, star.hub_ends[0]);
  star.send(0, Ready{9, 1, 2});
  const std::string garbage = "not a protocol message at all";
  send_message(*star.member_ends[0], std::as_bytes(std::span(garbage.data(), garbage.size())), 1s);
  auto good = star.events.pop(2s);
  ASSERT_TRUE(good);
  ASSERT_TRUE(good->message);
  auto bad = star.events.pop(2s);
  ASSERT_TRUE(bad);
  EXPECT_FALSE(bad->message);
  EXPECT_EQ(bad->status.code, Errc::corrupt_frame);
  // The reader closed the link: the member sees it fail (not merely wait); no further events.
  try {
    recv_message(*star.member_ends[0], 64, 2s);
    ADD_FAILURE() << "the link must be closed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::connection) << e.what();
  }
  EXPECT_FALSE(star.events.pop(300ms));
}

TEST(ControlReaders, AMessageLargerThanTheBufferIsAFailure) {
  ControlStar star(1, 30s, 256);
  star.readers.add(9, 0, star.hub_ends[0]);
  star.send(0, Nack{9, 1, 3, std::string(1000, 'x')});
  auto e = star.events.pop(2s);
  ASSERT_TRUE(e);
  EXPECT_FALSE(e->message);
  EXPECT_FALSE(e->status.ok());
  EXPECT_FALSE(star.events.pop(300ms));
}

TEST(ControlReaders, StopJoinsPromptlyAndLaterAddsAreIgnored) {
  ControlStar star(3);
  for (int i = 0; i < 3; ++i) star.readers.add(static_cast<uint32_t>(i + 1), 0, star.hub_ends[i]);
  star.send(0, Bye{});
  ASSERT_TRUE(star.events.pop(2s));
  const auto start = Clock::now();
  star.readers.stop();
  EXPECT_LT(Clock::now() - start, 1s) << "stop must not wait for messages that never come";
  EXPECT_FALSE(star.events.pop(100ms)) << "a stopped reader reports no failure";
  // Messages sent now are not read; a reader added after stop does not start.
  star.send(1, Bye{});
  star.readers.add(7, 0, star.hub_ends[2]);
  star.send(2, Bye{});
  EXPECT_FALSE(star.events.pop(400ms));
  star.readers.stop();  // twice is fine
}

// A reader whose link ended is joined at the next add(), not kept until stop(): a producer adds a
// reader for every member connection, each rejoin included (it held an ended thread and its stack
// for each before).
TEST(ControlReaders, ReadersOfEndedLinksAreNotKept) {
  ControlStar star(4);
  for (int i = 0; i < 3; ++i) star.readers.add(static_cast<uint32_t>(i + 1), 0, star.hub_ends[i]);
  EXPECT_EQ(star.readers.threads_held(), 3u);
  for (int i = 0; i < 3; ++i) star.member_ends[i]->close();
  for (int i = 0; i < 3; ++i) {
    auto failure = star.events.pop(2s);
    ASSERT_TRUE(failure);
    EXPECT_FALSE(failure->message);
  }
  std::this_thread::sleep_for(200ms);  // each reader returns right after its failure event
  star.readers.add(4, 0, star.hub_ends[3]);
  EXPECT_EQ(star.readers.threads_held(), 1u) << "the three ended readers are still held";
  star.send(3, Bye{});
  auto bye = star.events.pop(2s);
  ASSERT_TRUE(bye);
  EXPECT_EQ(bye->rank, 4u);
}

TEST(ControlReaders, TheDestructorStopsTheReaders) {
  auto hub = transport::make_transport("loop", options(30s));
  auto listener = hub->listen(transport::Url::parse("loop://control-dtor-" + std::to_string(unique_id())));
  auto member = transport::make_transport("loop", options(30s));
  auto member_end = member->connect(listener->local_url(), 2s);
  std::shared_ptr<transport::Connection> hub_end(listener->accept(2s));
  std::atomic<int> events{0};
  const auto start = Clock::now();
  {
    ControlReaders readers(1024, [&](ControlEvent) { ++events; });
    readers.add(1, 0, hub_end);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_EQ(events.load(), 0);
}

// ---- the blocking helpers ---------------------------------------------------------------------

TEST(MessageHelpers, RecvMessageTimesOutThenStillReceives) {
  LinkPair pair;
  const auto start = Clock::now();
  try {
    recv_message(*pair.inbound, 64, 100ms);
    ADD_FAILURE() << "no message was sent";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_GE(Clock::now() - start, 90ms);
  pair.link->post(bytes_of("after the timeout"));
  EXPECT_EQ(pair.receive(), "after the timeout") << "the cancelled receive took no message";
}

TEST(MessageHelpers, SendControlRoundTrips) {
  LinkPair pair;
  auto outbound = pair.receiver->connect(pair.listener->local_url(), 2s);
  auto inbound = pair.listener->accept(2s);
  send_control(*outbound, Commit{4, 9, 77}, 1s, 12);
  // A large bound (a WELCOME's) costs nothing once the message is in: the vector is its size.
  const auto bytes = recv_message(*inbound, size_t{64} << 20, 1s);
  EXPECT_EQ(bytes.capacity(), bytes.size());
  EXPECT_LT(bytes.size(), 1024u);
  EXPECT_EQ(message_header(bytes).epoch, 12u);
  const auto m = decode_message(bytes);
  const auto& c = std::get<Commit>(m);
  EXPECT_EQ(c.version, 4u);
  EXPECT_EQ(c.attempt, 9u);
  EXPECT_EQ(c.digest, 77u);
}

TEST(MessageHelpers, SendMessageTimesOutTowardsAFrozenPeer) {
  LinkPair pair;
  auto outbound = pair.sender->connect(pair.listener->local_url(), 2s);
  auto inbound = pair.listener->accept(2s);
  loopback::freeze(*pair.receiver);
  const std::string text = "stuck";
  try {
    send_message(*outbound, std::as_bytes(std::span(text.data(), text.size())), 150ms);
    ADD_FAILURE() << "the send can not finish";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  loopback::thaw(*pair.receiver);
}

}  // namespace
}  // namespace deltacast::tree
