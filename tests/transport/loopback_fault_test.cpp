// Fault injection on the loopback backend: each injected fault is seen by the receiver exactly as
// the tree layer must be ready to see it on a real link.
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/loopback/loopback.h"
#include "transport/transport.h"

namespace deltacast::transport::loopback {
namespace {

using namespace std::chrono_literals;

struct LoopPair {
  std::unique_ptr<Transport> transport = make_transport("loop", TransportOptions{"s", 1s, 100ms, 1s, 1 << 20});
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> sender, receiver;
  explicit LoopPair(const std::string& name) {
    listener = transport->listen(Url::parse("loop://" + name));
    sender = transport->connect(listener->local_url(), 1s);
    receiver = listener->accept(1s);
  }
};

std::vector<std::byte> bytes_of(std::string_view text) {
  auto span = std::as_bytes(std::span(text.data(), text.size()));
  return {span.begin(), span.end()};
}

// Faults message #1 only.
std::shared_ptr<FaultHook> on_second(Fault fault) {
  return std::make_shared<FaultFunction>([fault](uint64_t index, std::span<const std::byte>) {
    return index == 1 ? fault : Fault{};
  });
}

std::string receive(Connection& connection, std::chrono::milliseconds timeout, Status* status) {
  std::vector<std::byte> buffer(64);
  auto recv = connection.post_recv(buffer);
  *status = recv->wait(timeout);
  if (!status->ok()) {
    recv->cancel();
    recv->wait(1s);
    return {};
  }
  return std::string(reinterpret_cast<const char*>(buffer.data()), recv->bytes());
}

void send_three(Connection& connection) {
  for (auto text : {"first", "second", "third"}) {
    auto message = bytes_of(text);
    ASSERT_TRUE(connection.post_send(message)->wait(1s).ok());
  }
}

TEST(LoopbackFaults, DropLosesExactlyOneMessage) {
  LoopPair pair("fault-drop");
  set_fault_hook(*pair.sender, on_second(Fault{Fault::Kind::drop}));
  send_three(*pair.sender);
  Status status;
  EXPECT_EQ(receive(*pair.receiver, 1s, &status), "first");
  EXPECT_EQ(receive(*pair.receiver, 1s, &status), "third");
  receive(*pair.receiver, 50ms, &status);
  EXPECT_EQ(status.code, Errc::timeout);
}

TEST(LoopbackFaults, DelayHoldsBackWithoutReordering) {
  LoopPair pair("fault-delay");
  set_fault_hook(*pair.sender, on_second(Fault{Fault::Kind::delay, 300ms}));
  send_three(*pair.sender);
  Status status;
  EXPECT_EQ(receive(*pair.receiver, 1s, &status), "first");
  receive(*pair.receiver, 50ms, &status);  // "second" is still in flight
  EXPECT_EQ(status.code, Errc::timeout);
  EXPECT_EQ(receive(*pair.receiver, 2s, &status), "second");
  EXPECT_EQ(receive(*pair.receiver, 2s, &status), "third");  // never overtook "second"
}

TEST(LoopbackFaults, CorruptFlipsOneByte) {
  LoopPair pair("fault-corrupt");
  set_fault_hook(*pair.sender, on_second(Fault{Fault::Kind::corrupt, 0ms, 2}));
  send_three(*pair.sender);
  Status status;
  receive(*pair.receiver, 1s, &status);
  auto corrupted = receive(*pair.receiver, 1s, &status);
  ASSERT_EQ(corrupted.size(), 6u);
  EXPECT_NE(corrupted, "second");
  EXPECT_EQ(corrupted.substr(0, 2), "se");
  EXPECT_EQ(corrupted.substr(3), "ond");
}

TEST(LoopbackFaults, TruncateShortensTheMessage) {
  LoopPair pair("fault-truncate");
  set_fault_hook(*pair.sender, on_second(Fault{Fault::Kind::truncate, 0ms, 3}));
  send_three(*pair.sender);
  Status status;
  receive(*pair.receiver, 1s, &status);
  EXPECT_EQ(receive(*pair.receiver, 1s, &status), "sec");
  EXPECT_EQ(receive(*pair.receiver, 1s, &status), "third");
}

TEST(LoopbackFaults, CloseFailsBothEnds) {
  LoopPair pair("fault-close");
  set_fault_hook(*pair.sender, on_second(Fault{Fault::Kind::close}));
  auto first = bytes_of("first"), second = bytes_of("second");
  ASSERT_TRUE(pair.sender->post_send(first)->wait(1s).ok());
  EXPECT_EQ(pair.sender->post_send(second)->wait(1s).code, Errc::connection);
  Status status;
  receive(*pair.receiver, 1s, &status);  // "first" was dropped with the link
  EXPECT_EQ(status.code, Errc::connection);
}

TEST(LoopbackFaults, HookOnlyAcceptsLoopbackConnections) {
  auto tcp = make_transport("tcp", TransportOptions{});
  auto listener = tcp->listen(Url::parse("tcp://127.0.0.1:0"));
  auto connection = tcp->connect(listener->local_url(), 5s);
  try {
    set_fault_hook(*connection, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
}

TEST(LoopbackFaults, NameInUseIsRefused) {
  LoopPair pair("fault-name");
  EXPECT_THROW(pair.transport->listen(Url::parse("loop://fault-name")), Error);
}

// ---- Members: die, freeze, thaw --------------------------------------------------------------
// Each member is its own loopback Transport, as in the relay tree's failure tests.

using Clock = std::chrono::steady_clock;

TransportOptions with_patience(std::chrono::milliseconds peer_timeout) {
  return TransportOptions{"s", 1s, 100ms, peer_timeout, 1 << 20};
}

// A hub member listening on loop://NAME and two peers, each its own transport, connected to it.
struct Star {
  std::unique_ptr<Transport> hub, a, b;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> a_to_hub, hub_to_a, b_to_hub, hub_to_b;
  std::string name;
  Star(const std::string& star_name, std::chrono::milliseconds peer_timeout) : name(star_name) {
    hub = make_transport("loop", with_patience(peer_timeout));
    a = make_transport("loop", with_patience(peer_timeout));
    b = make_transport("loop", with_patience(peer_timeout));
    listener = hub->listen(Url::parse("loop://" + name));
    a_to_hub = a->connect(listener->local_url(), 1s);
    hub_to_a = listener->accept(1s);
    b_to_hub = b->connect(listener->local_url(), 1s);
    hub_to_b = listener->accept(1s);
  }
};

// Posts a string literal (static storage outlives any request).
std::shared_ptr<Request> post_text(Connection& connection, std::string_view literal) {
  return connection.post_send(std::as_bytes(std::span(literal.data(), literal.size())));
}

// A receive that stays posted across checks; withdrawn if still pending at the end.
struct Recv {
  std::vector<std::byte> buffer = std::vector<std::byte>(64);
  std::shared_ptr<Request> request;
  explicit Recv(Connection& connection) : request(connection.post_recv(buffer)) {}
  Recv(const Recv&) = delete;
  Recv& operator=(const Recv&) = delete;
  ~Recv() {
    if (!request->test()) {
      request->cancel();
      request->wait(1s);
    }
  }
  std::string text() const { return std::string(reinterpret_cast<const char*>(buffer.data()), request->bytes()); }
};

Errc thrown_code(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::ok;
}

// A request that finished at once (no waiting) with Errc::connection.
void expect_failed_now(Request& request) {
  ASSERT_TRUE(request.test());
  EXPECT_EQ(request.status().code, Errc::connection) << request.status().message;
}

// Everything the dead hub and its peers can still try fails, and its name is free again.
void expect_hub_dead(Star& star) {
  auto elsewhere = star.b->listen(Url::parse("loop://" + star.name + "-elsewhere"));
  EXPECT_EQ(thrown_code([&] { star.hub->connect(elsewhere->local_url(), 1s); }), Errc::connection);
  EXPECT_EQ(thrown_code([&] { star.hub->listen(Url::parse("loop://" + star.name + "-again")); }), Errc::io);
  EXPECT_EQ(thrown_code([&] { star.listener->accept(10ms); }), Errc::state);
  expect_failed_now(*post_text(*star.hub_to_b, "after death"));
  Recv hub_recv(*star.hub_to_a);
  expect_failed_now(*hub_recv.request);
  for (auto* peer : {star.a_to_hub.get(), star.b_to_hub.get()}) {
    expect_failed_now(*post_text(*peer, "to the dead"));
    Recv recv(*peer);
    expect_failed_now(*recv.request);
  }
  EXPECT_EQ(thrown_code([&] { star.a->connect(star.listener->local_url(), 1s); }), Errc::connection);
  auto replacement = make_transport("loop", with_patience(1s));
  EXPECT_NO_THROW(replacement->listen(Url::parse("loop://" + star.name)));
}

// A link between two other transports (a and b) works.
void expect_link_works(Transport& from, Transport& to, const std::string& name) {
  auto listener = to.listen(Url::parse("loop://" + name));
  auto client = from.connect(listener->local_url(), 1s);
  auto server = listener->accept(1s);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(post_text(*client, "ping")->wait(1s).ok());
  Status status;
  EXPECT_EQ(receive(*server, 1s, &status), "ping");
  ASSERT_TRUE(post_text(*server, "pong")->wait(1s).ok());
  EXPECT_EQ(receive(*client, 1s, &status), "pong");
}

TEST(LoopbackMembers, DieBeforeDeliveryClosesEveryLinkOfTheMember) {
  Star star("member-die-before", 1s);
  Recv b_pending(*star.b_to_hub);
  set_fault_hook(*star.hub_to_a, on_second(Fault{Fault::Kind::die}));
  ASSERT_TRUE(post_text(*star.hub_to_a, "first")->wait(1s).ok());
  auto second = post_text(*star.hub_to_a, "second");
  expect_failed_now(*second);
  // The hub's other link failed at once, not when a timeout ran out.
  expect_failed_now(*b_pending.request);
  EXPECT_EQ(b_pending.request->status().message, "loop: peer died");
  Status status;
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "first");  // sent before the death
  receive(*star.a_to_hub, 1s, &status);                       // "second" died with the hub
  EXPECT_EQ(status.code, Errc::connection);
  expect_hub_dead(star);
  expect_link_works(*star.a, *star.b, "member-die-before-ab");
}

TEST(LoopbackMembers, DieAfterDeliveryDeliversTheMessageFirst) {
  Star star("member-die-after", 1s);
  Recv b_pending(*star.b_to_hub);
  set_fault_hook(*star.hub_to_a, on_second(Fault{Fault::Kind::die, 0ms, 0, true}));
  ASSERT_TRUE(post_text(*star.hub_to_a, "first")->wait(1s).ok());
  auto second = post_text(*star.hub_to_a, "second");
  ASSERT_TRUE(second->test());
  EXPECT_TRUE(second->status().ok());
  expect_failed_now(*b_pending.request);
  expect_failed_now(*post_text(*star.hub_to_a, "third"));
  Status status;
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "first");
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "second");
  receive(*star.a_to_hub, 1s, &status);  // "third" was never delivered
  EXPECT_EQ(status.code, Errc::connection);
  expect_hub_dead(star);
}

TEST(LoopbackMembers, KillClosesEveryLinkAndListenerAtOnce) {
  Star star("member-kill", 1s);
  Recv a_pending(*star.a_to_hub), b_pending(*star.b_to_hub);
  kill(*star.hub);
  expect_failed_now(*a_pending.request);
  expect_failed_now(*b_pending.request);
  EXPECT_EQ(a_pending.request->status().message, "loop: peer died");
  expect_hub_dead(star);
  kill(*star.hub);  // idempotent
  expect_link_works(*star.a, *star.b, "member-kill-ab");
}

TEST(LoopbackMembers, KillOfAMemberWithQueuedConnectionsDropsThem) {
  Star star("member-kill-queued", 1s);
  auto c = make_transport("loop", with_patience(1s));
  auto c_to_hub = c->connect(star.listener->local_url(), 1s);  // never accepted
  kill(*star.hub);
  expect_failed_now(*post_text(*c_to_hub, "hello?"));
}

TEST(LoopbackMembers, FreezeFailsAPeersReceiveOnlyAfterItsPeerTimeout) {
  Star star("member-freeze-recv", 200ms);
  Recv a_pending(*star.a_to_hub);
  auto frozen_at = Clock::now();
  freeze(*star.hub);
  auto early = a_pending.request->wait(100ms);
  if (Clock::now() - frozen_at < 190ms) {
    EXPECT_EQ(early.code, Errc::timeout);
  }
  auto final_status = a_pending.request->wait(2s);
  EXPECT_EQ(final_status.code, Errc::connection);
  EXPECT_EQ(final_status.message, "loop: peer silent for more than 200 ms");
  EXPECT_GE(Clock::now() - frozen_at, 200ms);
  // Later posts on that link fail at once; a link between other transports is unaffected.
  expect_failed_now(*post_text(*star.a_to_hub, "late"));
  expect_link_works(*star.a, *star.b, "member-freeze-recv-ab");
}

TEST(LoopbackMembers, FreezeHoldsAPeersSendsThenFailsThemAtItsPeerTimeout) {
  Star star("member-freeze-send", 200ms);
  auto frozen_at = Clock::now();
  freeze(*star.hub);
  // b only sends: its sends stay pending (a normal loopback send completes at once) ...
  auto first = post_text(*star.b_to_hub, "first");
  auto second = post_text(*star.b_to_hub, "second");
  EXPECT_FALSE(first->test());
  auto early = first->wait(100ms);
  if (Clock::now() - frozen_at < 190ms) {
    EXPECT_EQ(early.code, Errc::timeout);
    EXPECT_FALSE(second->test());
  }
  // ... and fail when b's patience runs out.
  EXPECT_EQ(first->wait(2s).code, Errc::connection);
  EXPECT_GE(Clock::now() - frozen_at, 200ms);
  EXPECT_EQ(second->wait(1s).code, Errc::connection);
  expect_failed_now(*post_text(*star.b_to_hub, "third"));
}

TEST(LoopbackMembers, FrozenMembersSendsAreNotDelivered) {
  Star star("member-freeze-quiet", 2s);
  ASSERT_TRUE(post_text(*star.b_to_hub, "waiting")->wait(1s).ok());  // reached the hub before the freeze
  freeze(*star.hub);
  auto sent = post_text(*star.hub_to_a, "while frozen");
  Status status;
  receive(*star.a_to_hub, 100ms, &status);
  EXPECT_EQ(status.code, Errc::timeout);
  EXPECT_FALSE(sent->test());
  EXPECT_EQ(sent->wait(20ms).code, Errc::timeout);
  // Its receives make no progress either, even with a message waiting.
  receive(*star.hub_to_b, 50ms, &status);
  EXPECT_EQ(status.code, Errc::timeout);
}

TEST(LoopbackMembers, ThawBeforeTheTimeoutDeliversEverythingInOrder) {
  Star star("member-thaw-early", 2s);
  ASSERT_TRUE(post_text(*star.b_to_hub, "b0")->wait(1s).ok());  // accepted before the freeze
  freeze(*star.hub);
  auto h1 = post_text(*star.hub_to_a, "h1");
  auto h2 = post_text(*star.hub_to_a, "h2");
  auto b1 = post_text(*star.b_to_hub, "b1");
  auto b2 = post_text(*star.b_to_hub, "b2");
  Recv hub_recv(*star.hub_to_b);
  Recv a_recv(*star.a_to_hub);
  EXPECT_EQ(a_recv.request->wait(100ms).code, Errc::timeout);
  EXPECT_EQ(hub_recv.request->wait(20ms).code, Errc::timeout);  // "b0" waits for the thaw
  EXPECT_FALSE(h1->test());
  EXPECT_FALSE(b1->test());
  expect_link_works(*star.a, *star.b, "member-thaw-early-ab");
  thaw(*star.hub);
  for (auto* request : {h1.get(), h2.get(), b1.get(), b2.get()}) EXPECT_TRUE(request->wait(1s).ok());
  ASSERT_TRUE(a_recv.request->wait(1s).ok());
  EXPECT_EQ(a_recv.text(), "h1");
  ASSERT_TRUE(hub_recv.request->wait(1s).ok());
  EXPECT_EQ(hub_recv.text(), "b0");
  Status status;
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "h2");
  EXPECT_EQ(receive(*star.hub_to_b, 1s, &status), "b1");
  EXPECT_EQ(receive(*star.hub_to_b, 1s, &status), "b2");
  // The links still work both ways.
  ASSERT_TRUE(post_text(*star.hub_to_a, "after")->wait(1s).ok());
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "after");
  ASSERT_TRUE(post_text(*star.a_to_hub, "reply")->wait(1s).ok());
  EXPECT_EQ(receive(*star.hub_to_a, 1s, &status), "reply");
}

TEST(LoopbackMembers, ThawAfterTheTimeoutFindsTheLinksFailed) {
  Star star("member-thaw-late", 100ms);
  // A link nobody touches during the freeze: its peer's heartbeat timer would still have fired.
  auto c = make_transport("loop", with_patience(100ms));
  auto c_to_hub = c->connect(star.listener->local_url(), 1s);
  auto hub_to_c = star.listener->accept(1s);
  ASSERT_NE(hub_to_c, nullptr);
  Recv a_pending(*star.a_to_hub);
  freeze(*star.hub);
  auto held = post_text(*star.hub_to_a, "never");
  Recv hub_recv(*star.hub_to_b);
  std::this_thread::sleep_for(300ms);  // b never touches its link meanwhile
  EXPECT_FALSE(held->test());           // still frozen: not even a failure completes
  EXPECT_FALSE(hub_recv.request->test());
  thaw(*star.hub);
  EXPECT_EQ(held->wait(1s).code, Errc::connection);
  EXPECT_EQ(hub_recv.request->wait(1s).code, Errc::connection);
  expect_failed_now(*post_text(*star.hub_to_a, "after thaw"));
  EXPECT_EQ(a_pending.request->wait(1s).code, Errc::connection);
  expect_failed_now(*post_text(*star.b_to_hub, "to the thawed"));  // b's side was failed too
  expect_failed_now(*post_text(*hub_to_c, "untouched"));
  expect_failed_now(*post_text(*c_to_hub, "untouched"));
}

TEST(LoopbackMembers, ConnectToAFrozenListenerTimesOutUnlessThawed) {
  Star star("member-connect-frozen", 1s);
  auto c = make_transport("loop", with_patience(1s));
  freeze(*star.hub);
  auto start = Clock::now();
  EXPECT_EQ(thrown_code([&] { c->connect(star.listener->local_url(), 150ms); }), Errc::timeout);
  EXPECT_GE(Clock::now() - start, 150ms);
  // Thawed while a connect waits: it goes through.
  std::thread thawer([&] {
    std::this_thread::sleep_for(100ms);
    thaw(*star.hub);
  });
  auto c_to_hub = c->connect(star.listener->local_url(), 5s);
  thawer.join();
  // A connection queued at a listener is not handed out while its member is frozen.
  freeze(*star.hub);
  EXPECT_EQ(star.listener->accept(50ms), nullptr);
  thaw(*star.hub);
  auto hub_to_c = star.listener->accept(1s);
  ASSERT_NE(hub_to_c, nullptr);
  ASSERT_TRUE(post_text(*c_to_hub, "hi")->wait(1s).ok());
  Status status;
  EXPECT_EQ(receive(*hub_to_c, 1s, &status), "hi");
  // A frozen member's own connects hang too.
  freeze(*c);
  EXPECT_EQ(thrown_code([&] { c->connect(star.listener->local_url(), 50ms); }), Errc::timeout);
}

TEST(LoopbackMembers, FreezeByHookHoldsTheMessageUntilThaw) {
  Star star("member-hook-freeze", 2s);
  set_fault_hook(*star.hub_to_a, on_second(Fault{Fault::Kind::freeze}));
  ASSERT_TRUE(post_text(*star.hub_to_a, "first")->wait(1s).ok());
  auto second = post_text(*star.hub_to_a, "second");
  auto other = post_text(*star.hub_to_b, "other link");  // the whole member froze
  EXPECT_FALSE(second->test());
  EXPECT_FALSE(other->test());
  Status status;
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "first");
  receive(*star.a_to_hub, 50ms, &status);
  EXPECT_EQ(status.code, Errc::timeout);
  receive(*star.b_to_hub, 50ms, &status);
  EXPECT_EQ(status.code, Errc::timeout);
  thaw(*star.hub);
  EXPECT_TRUE(second->wait(1s).ok());
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "second");
  EXPECT_EQ(receive(*star.b_to_hub, 1s, &status), "other link");
}

TEST(LoopbackMembers, FreezeAfterDeliverySendsTheMessageFirst) {
  Star star("member-hook-freeze-after", 2s);
  set_fault_hook(*star.hub_to_a, on_second(Fault{Fault::Kind::freeze, 0ms, 0, true}));
  ASSERT_TRUE(post_text(*star.hub_to_a, "first")->wait(1s).ok());
  auto second = post_text(*star.hub_to_a, "second");
  ASSERT_TRUE(second->test());
  EXPECT_TRUE(second->status().ok());
  auto third = post_text(*star.hub_to_a, "third");
  EXPECT_FALSE(third->test());
  Status status;
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "first");
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "second");
  receive(*star.a_to_hub, 50ms, &status);
  EXPECT_EQ(status.code, Errc::timeout);
  thaw(*star.hub);
  EXPECT_EQ(receive(*star.a_to_hub, 1s, &status), "third");
}

// Freezes, thaws, a hook-triggered death and kill() race with traffic on every link of the member
// (the hook runs under one link's lock while the others are in use): nothing deadlocks, and in the
// end every link of the dead member has failed.
TEST(LoopbackMembers, PhaseChangesRaceWithTrafficWithoutDeadlock) {
  Star star("member-race", 30ms);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  auto sender = [&](Connection& connection) {
    threads.emplace_back([&stop, &connection] {
      while (!stop) post_text(connection, "tick")->wait(2ms);
    });
  };
  auto receiver = [&](Connection& connection) {
    threads.emplace_back([&stop, &connection] {
      while (!stop) {
        Recv recv(connection);
        recv.request->wait(2ms);
      }
    });
  };
  for (auto* connection : {star.hub_to_a.get(), star.hub_to_b.get(), star.a_to_hub.get(), star.b_to_hub.get()}) {
    sender(*connection);
    receiver(*connection);
  }
  for (int round = 0; round < 20; ++round) {
    freeze(*star.hub);
    std::this_thread::sleep_for(round % 2 ? 1ms : 40ms);  // odd rounds thaw before the timeout
    thaw(*star.hub);
    std::this_thread::sleep_for(2ms);
  }
  set_fault_hook(*star.hub_to_b, std::make_shared<FaultFunction>([](uint64_t, std::span<const std::byte>) {
    return Fault{Fault::Kind::die};
  }));
  std::this_thread::sleep_for(20ms);
  kill(*star.hub);
  stop = true;
  for (auto& thread : threads) thread.join();
  for (auto* connection : {star.hub_to_a.get(), star.hub_to_b.get(), star.a_to_hub.get(), star.b_to_hub.get()}) {
    expect_failed_now(*post_text(*connection, "after"));
  }
}

TEST(LoopbackMembers, MemberControlsOnlyAcceptLoopbackTransports) {
  auto tcp = make_transport("tcp", TransportOptions{});
  EXPECT_EQ(thrown_code([&] { kill(*tcp); }), Errc::invalid_argument);
  EXPECT_EQ(thrown_code([&] { freeze(*tcp); }), Errc::invalid_argument);
  EXPECT_EQ(thrown_code([&] { thaw(*tcp); }), Errc::invalid_argument);
}

}  // namespace
}  // namespace deltacast::transport::loopback
