// The transport conformance suite: every rule of transport/transport.h, run over every backend.
// To cover a new backend, add its scheme to kConformanceSchemes; schemes not built are skipped.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/time_scale.h"
#include "tests/transport/peer_process.h"
#include "transport/transport.h"

namespace deltacast::transport {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kConformanceSchemes = {"tcp", "loop", "ofi+tcp", "ofi+shm", "ucx"};

constexpr auto kWait = 30s;  // generous bound: a hang fails the test instead of blocking ctest

TransportOptions test_options(std::string secret = "conformance-secret") {
  TransportOptions options;
  options.secret = std::move(secret);
  options.connect_timeout = test_time::scaled(5s);  // the ofi side channel is slow under TSan
  options.heartbeat_interval = 100ms;
  options.peer_timeout = test_time::scaled(1500ms);  // heartbeats come late under sanitizers
  return options;
}

std::string listen_text(const std::string& scheme) {
  static std::atomic<int> counter{0};
  if (scheme == "loop") return "loop://conformance-" + std::to_string(counter++);
  return scheme + "://127.0.0.1:0";
}

std::vector<std::byte> pattern(size_t size, uint64_t seed) {
  std::vector<std::byte> bytes(size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    bytes[i] = static_cast<std::byte>(x);
  }
  return bytes;
}

void expect_ok(const std::shared_ptr<Request>& request) {
  auto status = request->wait(kWait);
  ASSERT_TRUE(status.ok()) << errc_name(status.code) << ": " << status.message;
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!backend_built(GetParam())) GTEST_SKIP() << GetParam() << " is not built";
    server_ = make_transport(GetParam(), test_options());
    client_ = make_transport(GetParam(), test_options());
    listener_ = server_->listen(Url::parse(listen_text(GetParam())));
  }

  // Connects one client and accepts it: {client end, server end}.
  std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> connect_pair() {
    auto client = client_->connect(listener_->local_url(), test_time::scaled(5s));
    auto server = listener_->accept(test_time::scaled(10s));
    if (!server) throw Error(Errc::timeout, "accept returned no connection");
    return {std::move(client), std::move(server)};
  }

  std::unique_ptr<Connection> connect_to_forked_peer(std::optional<testing::StreamingPeer>& peer, size_t message_bytes);

  std::unique_ptr<Transport> server_;
  std::unique_ptr<Transport> client_;
  std::unique_ptr<Listener> listener_;
};

TEST_P(Conformance, ListenerReportsBoundAddress) {
  auto url = listener_->local_url();
  EXPECT_EQ(url.full_scheme(), GetParam());
  if (GetParam() != "loop") {
    EXPECT_NE(url.port, 0);
  }
  EXPECT_EQ(server_->capabilities().backend.substr(0, url.scheme.size()), url.scheme);
}

TEST_P(Conformance, MessagesArriveWholeAndInOrder) {
  auto [a, b] = connect_pair();
  const std::vector<size_t> sizes = {0, 1, 7, 4096, 65537, 1 << 20, 3, (3 << 20) + 5};
  std::vector<std::vector<std::byte>> sent;
  std::vector<std::shared_ptr<Request>> sends;
  for (size_t k = 0; k < sizes.size(); ++k) sent.push_back(pattern(sizes[k], k));
  for (auto& message : sent) sends.push_back(a->post_send(message));
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<std::byte> buffer(4 << 20);
    auto recv = b->post_recv(buffer);
    expect_ok(recv);
    ASSERT_EQ(recv->bytes(), sizes[k]) << "message " << k;
    // std::equal, not memcmp: the empty message's vector has no storage (memcmp of null is UB).
    EXPECT_TRUE(std::equal(sent[k].begin(), sent[k].end(), buffer.begin())) << "message " << k;
  }
  for (size_t k = 0; k < sends.size(); ++k) {
    expect_ok(sends[k]);
    EXPECT_EQ(sends[k]->bytes(), sizes[k]);
  }
}

TEST_P(Conformance, BothDirectionsAtOnce) {
  auto [a, b] = connect_pair();
  auto ab = pattern(1 << 20, 1), ba = pattern(1 << 20, 2);
  std::vector<std::byte> at_a(1 << 20), at_b(1 << 20);
  auto ra = a->post_recv(at_a), rb = b->post_recv(at_b);
  auto sa = a->post_send(ab), sb = b->post_send(ba);
  for (auto& r : {ra, rb, sa, sb}) expect_ok(r);
  EXPECT_EQ(at_b, ab);
  EXPECT_EQ(at_a, ba);
}

TEST_P(Conformance, LargeMessage256MiBIsBitExact) {
  auto [a, b] = connect_pair();
  const size_t size = size_t{256} << 20;
  std::vector<uint64_t> words(size / 8);
  std::iota(words.begin(), words.end(), uint64_t{0x1234567});
  std::span<const std::byte> message(reinterpret_cast<const std::byte*>(words.data()), size);
  std::vector<std::byte> buffer(size);
  auto recv = b->post_recv(buffer);
  auto send = a->post_send(message);
  expect_ok(send);
  expect_ok(recv);
  ASSERT_EQ(recv->bytes(), size);
  EXPECT_EQ(std::memcmp(buffer.data(), message.data(), size), 0);
}

TEST_P(Conformance, ManySmallMessages) {
  auto [a, b] = connect_pair();
  constexpr int kCount = 20000;
  std::vector<uint32_t> received(kCount, 0xffffffff);
  std::vector<std::shared_ptr<Request>> recvs;
  for (int k = 0; k < kCount; ++k) recvs.push_back(b->post_recv(std::as_writable_bytes(std::span(&received[k], 1))));
  std::vector<uint32_t> values(kCount);
  std::iota(values.begin(), values.end(), 0u);
  std::vector<std::shared_ptr<Request>> sends;
  for (int k = 0; k < kCount; ++k) sends.push_back(a->post_send(std::as_bytes(std::span(&values[k], 1))));
  for (auto& r : recvs) expect_ok(r);
  for (auto& s : sends) expect_ok(s);
  EXPECT_EQ(received, values);
}

TEST_P(Conformance, ConcurrentConnections) {
  constexpr int kClients = 6, kMessages = 200;
  std::vector<std::thread> threads;
  // An ASSERT below returns early: join the clients anyway (each ends within its own timeouts),
  // or the joinable threads terminate the process.
  struct Joiner {
    std::vector<std::thread>& threads;
    ~Joiner() {
      for (auto& t : threads)
        if (t.joinable()) t.join();
    }
  } joiner{threads};
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        auto connection = client_->connect(listener_->local_url(), test_time::scaled(5s));
        for (uint32_t k = 0; k < kMessages; ++k) {
          uint32_t value[2] = {static_cast<uint32_t>(c), k};
          if (!connection->post_send(std::as_bytes(std::span(value)))->wait(kWait).ok()) failures++;
        }
        uint32_t done = 0;  // hold the connection until the server has read everything
        connection->post_recv(std::as_writable_bytes(std::span(&done, 1)))->wait(kWait);
      } catch (const std::exception&) {
        failures++;
      }
    });
  }
  std::vector<std::unique_ptr<Connection>> servers;
  for (int c = 0; c < kClients; ++c) {
    auto connection = listener_->accept(test_time::scaled(10s));  // stretched under sanitizers
    ASSERT_TRUE(connection) << "accept " << c;
    servers.push_back(std::move(connection));
  }
  std::vector<int> seen(kClients, 0);
  for (auto& connection : servers) {
    int client = -1;
    for (uint32_t k = 0; k < kMessages; ++k) {
      uint32_t value[2] = {};
      auto recv = connection->post_recv(std::as_writable_bytes(std::span(value)));
      expect_ok(recv);
      if (client < 0) client = static_cast<int>(value[0]);
      EXPECT_EQ(value[0], static_cast<uint32_t>(client));
      EXPECT_EQ(value[1], k);  // in order per connection
    }
    ASSERT_GE(client, 0);
    seen[client]++;
    uint32_t done = 1;
    expect_ok(connection->post_send(std::as_bytes(std::span(&done, 1))));
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(seen, std::vector<int>(kClients, 1));
}

TEST_P(Conformance, MessageLargerThanBufferFailsAndCloses) {
  auto [a, b] = connect_pair();
  auto big = pattern(1000, 3);
  expect_ok(a->post_send(big));
  std::vector<std::byte> small(10);
  auto status = b->post_recv(small)->wait(kWait);
  EXPECT_EQ(status.code, Errc::invalid_argument) << status.message;
  auto next = b->post_recv(small)->wait(kWait);
  EXPECT_EQ(next.code, Errc::connection) << next.message;
}

TEST_P(Conformance, SendAboveMaxMessageIsRefused) {
  auto options = test_options();
  options.max_message_bytes = 1024;
  auto transport = make_transport(GetParam(), options);
  auto listener = transport->listen(Url::parse(listen_text(GetParam())));
  auto a = transport->connect(listener->local_url(), test_time::scaled(5s));
  std::vector<std::byte> message(1025);
  try {
    a->post_send(message);
    FAIL() << "post_send of 1025 bytes with a 1024-byte limit did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
}

TEST_P(Conformance, WrongSecretIsRefused) {
  auto intruder = make_transport(GetParam(), test_options("not-the-secret"));
  try {
    intruder->connect(listener_->local_url(), test_time::scaled(5s));
    FAIL() << "connect with a wrong secret succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::auth) << e.what();
  }
  EXPECT_EQ(listener_->accept(300ms), nullptr);
  auto [a, b] = connect_pair();  // the listener still serves honest peers
  EXPECT_TRUE(a && b);
}

TEST_P(Conformance, WaitTimesOutAndRequestStaysPending) {
  auto [a, b] = connect_pair();
  uint64_t value = 0;
  auto recv = b->post_recv(std::as_writable_bytes(std::span(&value, 1)));
  EXPECT_EQ(recv->wait(50ms).code, Errc::timeout);
  EXPECT_FALSE(recv->test());
  EXPECT_EQ(recv->status().code, Errc::state);
  uint64_t sent = 0xfeedface;
  expect_ok(a->post_send(std::as_bytes(std::span(&sent, 1))));
  expect_ok(recv);
  EXPECT_EQ(value, sent);
}

TEST_P(Conformance, CancelledReceiveDoesNotConsumeAMessage) {
  auto [a, b] = connect_pair();
  uint64_t first = 0, second = 0;
  auto cancelled = b->post_recv(std::as_writable_bytes(std::span(&first, 1)));
  cancelled->cancel();
  EXPECT_EQ(cancelled->wait(kWait).code, Errc::cancelled);
  auto recv = b->post_recv(std::as_writable_bytes(std::span(&second, 1)));
  uint64_t sent = 42;
  expect_ok(a->post_send(std::as_bytes(std::span(&sent, 1))));
  expect_ok(recv);
  EXPECT_EQ(second, 42u);
  EXPECT_EQ(first, 0u);
}

TEST_P(Conformance, CloseFailsPendingRequestsOnBothEnds) {
  auto [a, b] = connect_pair();
  uint64_t value = 0;
  auto pending_a = a->post_recv(std::as_writable_bytes(std::span(&value, 1)));
  auto pending_b = b->post_recv(std::as_writable_bytes(std::span(&value, 1)));
  a->close();
  EXPECT_EQ(pending_a->wait(kWait).code, Errc::connection);
  EXPECT_EQ(pending_b->wait(kWait).code, Errc::connection);
  EXPECT_EQ(a->post_send(std::as_bytes(std::span(&value, 1)))->wait(kWait).code, Errc::connection);
}

// Close never overtakes data: messages whose sends completed before close() all reach the peer,
// whole and in order, before the peer sees the close (Errc::connection on its next receive). The
// ofi and ucx backends carry the close on a side channel next to the data path, so this needs
// their close to be ordered after the data (issue 35: ofi lost the end of a snapshot this way).
enum class ReceiverPace {
  posted_first,        // every receive posted before the first send
  posted_after_close,  // every receive posted after close(): only for messages a send completes
                       // without a posted receive (eager sizes; larger ones wait for the receiver)
  one_at_a_time,       // a thread posts the next receive once the last finished, racing the close
};

void expect_last_messages_arrive(Connection& sender, Connection& receiver, const std::vector<size_t>& sizes,
                                 uint64_t seed, ReceiverPace pace) {
  std::vector<std::vector<std::byte>> sent;
  size_t largest = 1;
  for (size_t k = 0; k < sizes.size(); ++k) {
    sent.push_back(pattern(sizes[k], seed + k));
    largest = std::max(largest, sizes[k]);
  }
  // One receive per message, then one that must see the close.
  std::vector<std::vector<std::byte>> buffers(sizes.size() + 1, std::vector<std::byte>(largest));
  std::vector<Status> statuses(buffers.size());
  std::vector<size_t> lengths(buffers.size());
  std::vector<std::shared_ptr<Request>> recvs;
  auto post_receives = [&] {
    for (auto& buffer : buffers) recvs.push_back(receiver.post_recv(buffer));
  };
  auto settle_receives = [&] {
    for (size_t k = 0; k < recvs.size(); ++k) {
      statuses[k] = recvs[k]->wait(kWait);
      lengths[k] = recvs[k]->bytes();
    }
  };
  std::thread one_at_a_time;
  if (pace == ReceiverPace::posted_first) post_receives();
  if (pace == ReceiverPace::one_at_a_time) {
    one_at_a_time = std::thread([&] {
      for (size_t k = 0; k < buffers.size(); ++k) {
        auto recv = receiver.post_recv(buffers[k]);
        statuses[k] = recv->wait(kWait);
        lengths[k] = recv->bytes();
        if (!statuses[k].ok()) break;
      }
    });
  }
  for (auto& message : sent) expect_ok(sender.post_send(message));  // each completed before close
  sender.close();
  if (pace == ReceiverPace::posted_after_close) post_receives();
  if (pace == ReceiverPace::one_at_a_time) {
    one_at_a_time.join();
  } else {
    settle_receives();
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    ASSERT_TRUE(statuses[k].ok()) << "message " << k << " of " << sizes.size() << " (" << sizes[k]
                                  << " bytes) lost to the close: " << errc_name(statuses[k].code) << ": "
                                  << statuses[k].message;
    ASSERT_EQ(lengths[k], sizes[k]) << "message " << k;
    ASSERT_TRUE(std::equal(sent[k].begin(), sent[k].end(), buffers[k].begin())) << "message " << k;
  }
  EXPECT_EQ(statuses.back().code, Errc::connection)
      << "the receive after the last message: " << statuses.back().message;
}

TEST_P(Conformance, SmallMessagesSentBeforeCloseArrive) {
  // Repeated: the close overtook the data in a few percent of closes on ofi+tcp.
  const ReceiverPace paces[] = {ReceiverPace::posted_first, ReceiverPace::posted_after_close,
                                ReceiverPace::one_at_a_time};
  for (int round = 0; round < 60; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto [a, b] = connect_pair();
    expect_last_messages_arrive(*a, *b, {1, 4096, 0, 3000, 8}, static_cast<uint64_t>(round), paces[round % 3]);
    if (HasFatalFailure()) return;
  }
}

TEST_P(Conformance, LargeMessagesSentBeforeCloseArrive) {
  // tcp lost the tail here ~1 run in 3 ("went away mid-message: Connection reset by peer"): its
  // close shut down a socket that held unread heartbeats, so the kernel reset the link and dropped
  // the end of a send already completed into the socket buffer. Its close now drains to EOF first.
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto [a, b] = connect_pair();
    expect_last_messages_arrive(*a, *b, {4096, size_t{64} << 20, (size_t{1} << 20) + 3}, static_cast<uint64_t>(round),
                                round % 2 == 0 ? ReceiverPace::posted_first : ReceiverPace::one_at_a_time);
    if (HasFatalFailure()) return;
  }
}

// The accepting side closing is the same rule.
TEST_P(Conformance, MessagesSentBeforeServerCloseArrive) {
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto [a, b] = connect_pair();
    expect_last_messages_arrive(*b, *a, {4096, 1, 300000}, static_cast<uint64_t>(round),
                                round % 2 == 0 ? ReceiverPace::posted_first : ReceiverPace::one_at_a_time);
    if (HasFatalFailure()) return;
  }
}

// A connection the listener completed but nobody took with accept() is closed with the listener:
// its client sees the failure at once (a producer that stops listening must not leave a member
// waiting for an answer on a connection nobody will read; the heartbeats alone would keep it up).
TEST_P(Conformance, ClosingAListenerClosesTheConnectionsNobodyAccepted) {
  auto client = client_->connect(listener_->local_url(), test_time::scaled(5s));
  uint64_t value = 0;
  auto pending = client->post_recv(std::as_writable_bytes(std::span(&value, 1)));
  std::this_thread::sleep_for(200ms);  // the server side has queued it (connect returned: set up)
  listener_->close();
  const auto status = pending->wait(kWait);
  EXPECT_EQ(status.code, Errc::connection) << errc_name(status.code) << ": " << status.message;
  EXPECT_THROW(listener_->accept(0ms), Error);
}

// Receives from the streaming peer until a request fails; returns that failure.
Status drain_until_failure(Connection& connection, size_t message_bytes, int* good_messages) {
  std::vector<std::byte> buffer(message_bytes);
  for (int k = 0; k < 100000; ++k) {
    auto status = connection.post_recv(buffer)->wait(kWait);
    if (!status.ok()) return status;
    ++*good_messages;
  }
  return Status{Errc::internal, "peer never failed"};
}

// A StreamingPeer of kMessage-byte messages in a forked process, and a connection to it. The fork
// comes before any transport thread exists in this process (libfabric/UCX dislike forking late).
std::unique_ptr<Connection> Conformance::connect_to_forked_peer(std::optional<testing::StreamingPeer>& peer,
                                                                size_t message_bytes) {
  listener_.reset();
  server_.reset();
  client_.reset();
  peer.emplace(GetParam(), test_options(), message_bytes);
  client_ = make_transport(GetParam(), test_options());
  return client_->connect(peer->url(), test_time::scaled(5s));
}

TEST_P(Conformance, PeerProcessKilledMidTransferGivesAnError) {
  if (GetParam() == "loop") GTEST_SKIP() << "loopback peers live in one process";
  constexpr size_t kMessage = 16 << 20;
  std::optional<testing::StreamingPeer> peer;
  auto connection = connect_to_forked_peer(peer, kMessage);
  std::vector<std::byte> buffer(kMessage);
  for (uint64_t k = 0; k < 2; ++k) {
    auto recv = connection->post_recv(buffer);
    expect_ok(recv);
    ASSERT_EQ(recv->bytes(), kMessage);
    EXPECT_EQ(buffer[5], static_cast<std::byte>((k + 5) & 0xff));
  }
  peer->signal(SIGKILL);
  int good = 0;
  auto status = drain_until_failure(*connection, kMessage, &good);
  EXPECT_EQ(status.code, Errc::connection) << status.message;
}

TEST_P(Conformance, SilentPeerTimesOut) {
  if (GetParam() == "loop") GTEST_SKIP() << "loopback peers live in one process";
  constexpr size_t kMessage = 1 << 20;
  std::optional<testing::StreamingPeer> peer;
  auto connection = connect_to_forked_peer(peer, kMessage);
  std::vector<std::byte> buffer(kMessage);
  expect_ok(connection->post_recv(buffer));
  peer->signal(SIGSTOP);  // alive for the kernel, silent for us
  int good = 0;
  auto status = drain_until_failure(*connection, kMessage, &good);
  EXPECT_EQ(status.code, Errc::connection) << status.message;
}

// abort() gives a link up at once: a frozen peer (SIGSTOP) takes nothing, and an orderly close()
// may linger for it (ofi, ucx: up to min(1 s, peer_timeout) for the FIN); abort must not, and
// every request pending on the link must be finished when it returns.
TEST_P(Conformance, AbortGivesUpOnAFrozenPeerAtOnce) {
  if (GetParam() == "loop") GTEST_SKIP() << "loopback peers live in one process";
  constexpr size_t kMessage = 1 << 20;
  std::optional<testing::StreamingPeer> peer;
  auto connection = connect_to_forked_peer(peer, kMessage);
  std::vector<std::byte> buffer(kMessage);
  expect_ok(connection->post_recv(buffer));
  peer->signal(SIGSTOP);
  const std::vector<std::byte> out(4096, std::byte{7});
  auto send = connection->post_send(out);  // may finish locally; its FIN would not
  auto recv = connection->post_recv(buffer);
  const auto start = std::chrono::steady_clock::now();
  connection->abort();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, test_time::scaled(300ms)) << "abort lingered for the frozen peer";
  EXPECT_TRUE(send->test());
  EXPECT_TRUE(recv->test());
  connection->abort();  // idempotent
  connection->close();
}

// Opens a TCP connection to `url`'s port on 127.0.0.1 and sends nothing: a peer frozen in its
// setup (SIGSTOP between connect and the handshake, a link cut after the SYN). Returns its socket.
int connect_silently(const Url& url) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(url.port);
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw Error(Errc::connection, "raw connect to " + url.str() + " failed");
  }
  return fd;
}

// A peer stalled in its setup holds only its own connection: one behind it is accepted at once
// (not after the stalled one's connect_timeout), and closing the listener ends the stalled setup
// instead of waiting for it. Found by chaos (seed 34 trial 17, ofi+tcp): a member frozen while it
// connected to the producer held the producer's listener for 5 s, and a member moved by that very
// failure waited behind it (0.59 s after the verdict; up to connect_timeout). The ofi and ucx
// listeners set peers up one at a time before; tcp's handshakes were already concurrent.
TEST_P(Conformance, AStalledSetupHoldsNoOtherConnection) {
  if (GetParam() == "loop") GTEST_SKIP() << "loopback peers have no socket to stall";
  const auto setup_timeout = test_options().connect_timeout;
  // Setting a connection up takes milliseconds here; the stalled one's runs to setup_timeout
  // (5 s): half of it is the margin.
  const auto bound = setup_timeout / 2;
  const int stalled = connect_silently(listener_->local_url());
  std::this_thread::sleep_for(200ms);  // the listener has taken it up
  const auto start = std::chrono::steady_clock::now();
  auto [client, server] = connect_pair();
  EXPECT_LT(std::chrono::steady_clock::now() - start, bound) << "a stalled setup held the connection behind it";
  const auto message = pattern(4096, 11);
  std::vector<std::byte> received(message.size());
  auto recv = server->post_recv(received);
  expect_ok(client->post_send(message));
  expect_ok(recv);
  EXPECT_EQ(received, message);

  const int stalled_at_close = connect_silently(listener_->local_url());
  std::this_thread::sleep_for(200ms);
  const auto close_start = std::chrono::steady_clock::now();
  listener_->close();
  EXPECT_LT(std::chrono::steady_clock::now() - close_start, bound) << "close waited for a stalled setup";
  ::close(stalled);
  ::close(stalled_at_close);
}

TEST_P(Conformance, ConnectToNothingFails) {
  if (GetParam() == "loop") {
    EXPECT_THROW(client_->connect(Url::parse("loop://nobody-listens-here"), 1s), Error);
    return;
  }
  auto url = listener_->local_url();
  listener_->close();
  try {
    client_->connect(url, 2s);
    FAIL() << "connect to a closed listener succeeded";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == Errc::connection || e.code() == Errc::timeout) << e.what();
  }
}

TEST_P(Conformance, CudaMemoryIsUnsupportedUnlessAdvertised) {
  std::vector<std::byte> bytes(64);
  const auto caps = server_->capabilities();
  // Every backend says how it registers CUDA memory or why it can not; ucx and ofi from what the
  // library reports at run time (this machine's UCX and libfabric have no CUDA).
  ASSERT_FALSE(caps.cuda_memory_detail.empty());
  if (GetParam() == "ucx") {
    EXPECT_NE(caps.cuda_memory_detail.find("memory types host"), std::string::npos) << caps.cuda_memory_detail;
  }
  if (GetParam().starts_with("ofi+")) {
    EXPECT_NE(caps.cuda_memory_detail.find("provider " + GetParam().substr(4)), std::string::npos)
        << caps.cuda_memory_detail;
  }
  if (caps.cuda_memory) GTEST_SKIP() << "backend advertises CUDA memory: " << caps.cuda_memory_detail;
  try {
    server_->register_memory(bytes, MemoryKind::cuda);
    FAIL() << "CUDA registration did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
    if (GetParam() == "ucx" || GetParam().starts_with("ofi+")) {  // the library's own answer, in the error
      EXPECT_NE(std::string(e.what()).find(caps.cuda_memory_detail), std::string::npos) << e.what();
    }
  }
  auto region = server_->register_memory(bytes, MemoryKind::host);
  EXPECT_EQ(region->bytes().data(), bytes.data());
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(kConformanceSchemes),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string name = param_info.param;
                           for (auto& ch : name) if (ch == '+') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace deltacast::transport
