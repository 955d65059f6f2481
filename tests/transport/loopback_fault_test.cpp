// Fault injection on the loopback backend: each injected fault is seen by the receiver exactly as
// the tree layer must be ready to see it on a real link.
#include <cstring>
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

}  // namespace
}  // namespace deltacast::transport::loopback
