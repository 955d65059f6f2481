// Raw-socket checks of the tcp listener (nothing reaches the application before authentication)
// and tcp-only close behaviour the conformance suite does not reach.
#include <utility>  // before Asio: Boost 1.74 coroutines with GCC 12 need std::exchange

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "transport/auth.h"
#include "transport/tcp/tcp_connection.h"
#include "transport/transport.h"

namespace deltacast::transport {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;

TransportOptions options_with(std::string secret) {
  TransportOptions options;
  options.secret = std::move(secret);
  options.connect_timeout = 500ms;
  return options;
}

asio::ip::tcp::socket raw_connect(asio::io_context& io, const Url& url) {
  asio::ip::tcp::socket socket(io);
  socket.connect({asio::ip::make_address(url.host), url.port});
  return socket;
}

// A client that skips the handshake and writes a data frame is never accepted, and the server
// closes it after reading only the fixed-size HELLO.
TEST(TcpWire, PayloadWithoutHandshakeIsDropped) {
  auto transport = make_transport("tcp", options_with("secret"));
  auto listener = transport->listen(Url::parse("tcp://127.0.0.1:0"));
  asio::io_context io;
  auto socket = raw_connect(io, listener->local_url());
  std::vector<char> payload(1 << 16, 'x');
  boost::system::error_code ec;
  asio::write(socket, asio::buffer(payload), ec);
  EXPECT_EQ(listener->accept(300ms), nullptr);
  char byte;
  socket.read_some(asio::buffer(&byte, 1), ec);  // server hung up without answering
  EXPECT_TRUE(ec) << "server answered an unauthenticated peer";
}

// A peer that knows the secret but announces a frame above max_message_bytes is cut off before
// the server allocates or reads the body.
TEST(TcpWire, OversizeFrameHeaderClosesTheConnection) {
  auto options = options_with("secret");
  options.max_message_bytes = 4096;
  auto transport = make_transport("tcp", options);
  auto listener = transport->listen(Url::parse("tcp://127.0.0.1:0"));
  asio::io_context io;
  auto socket = raw_connect(io, listener->local_url());
  auth::ClientHandshake handshake("secret");
  asio::write(socket, asio::buffer(handshake.hello()));
  auth::Challenge challenge{};
  asio::read(socket, asio::buffer(challenge));
  asio::write(socket, asio::buffer(handshake.answer(challenge)));
  auto connection = listener->accept(2s);
  ASSERT_TRUE(connection);
  std::vector<std::byte> buffer(4096);
  auto recv = connection->post_recv(buffer);
  uint32_t header[4] = {0x31544344, 1, 0, 0};
  uint64_t huge = uint64_t{1} << 40;
  std::memcpy(&header[2], &huge, 8);
  asio::write(socket, asio::buffer(header, sizeof header));
  auto status = recv->wait(5s);
  EXPECT_EQ(status.code, Errc::connection) << status.message;
  EXPECT_NE(status.message.find("max_message_bytes"), std::string::npos) << status.message;
}

// Sends `sizes` (each send completes before the next is posted), closes, then receives them,
// waiting `first` before the first receive and `between` before each other; every message must
// arrive, then the close.
void expect_all_arrive_after_close(const std::vector<size_t>& sizes, std::chrono::milliseconds first,
                                   std::chrono::milliseconds between) {
  auto options = options_with("secret");
  options.heartbeat_interval = 20ms;
  options.peer_timeout = 1500ms;
  auto server = make_transport("tcp", options);
  auto client = make_transport("tcp", options);
  auto listener = server->listen(Url::parse("tcp://127.0.0.1:0"));
  auto sender = client->connect(listener->local_url(), 2s);
  auto receiver = listener->accept(2s);
  ASSERT_TRUE(receiver);
  std::vector<std::vector<std::byte>> sent;
  size_t largest = 1;
  for (size_t k = 0; k < sizes.size(); ++k) {
    sent.emplace_back(sizes[k], static_cast<std::byte>(k + 1));
    largest = std::max(largest, sizes[k]);
  }
  for (auto& message : sent) ASSERT_TRUE(sender->post_send(message)->wait(5s).ok());
  auto started = std::chrono::steady_clock::now();
  sender->close();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 500ms) << "close waited for the peer";
  std::vector<std::byte> buffer(largest);
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::this_thread::sleep_for(k == 0 ? first : between);
    auto recv = receiver->post_recv(buffer);
    auto status = recv->wait(5s);
    ASSERT_TRUE(status.ok()) << "message " << k << ": " << status.message;
    ASSERT_EQ(recv->bytes(), sizes[k]);
    EXPECT_TRUE(std::equal(sent[k].begin(), sent[k].end(), buffer.begin())) << "message " << k;
  }
  auto last = receiver->post_recv(buffer)->wait(5s);
  EXPECT_EQ(last.code, Errc::connection) << last.message;
}

// A receiver that posts its receives only after the closer's drain gave up (kCloseDrainLimit)
// still gets every message: it saw the closer's FIN and stopped its heartbeats, which would
// otherwise reach the closed socket, draw a reset and fail its receives ("send ... failed: Broken
// pipe"). The close itself does not wait for the slow receiver.
TEST(TcpWire, AReceiverThatReadsLongAfterTheCloseGetsEverything) {
  expect_all_arrive_after_close({4096, size_t{1} << 20, 7}, tcp::kCloseDrainLimit + 600ms, 0ms);
}

// More than the peer's socket buffer holds, read slowly: the closer's drain lasts while the
// receiver still takes bytes (it sees the FIN only behind them, and heartbeats until then).
TEST(TcpWire, AReceiverThatReadsSlowlyAfterTheCloseGetsEverything) {
  expect_all_arrive_after_close(std::vector<size_t>(12, size_t{1} << 20), 250ms, 250ms);
}

TEST(TcpWire, ClientGivesUpOnAServerThatNeverAnswers) {
  asio::io_context io;
  asio::ip::tcp::acceptor mute(io, {asio::ip::make_address("127.0.0.1"), 0});
  Url url{"tcp", "", "127.0.0.1", mute.local_endpoint().port()};
  auto transport = make_transport("tcp", options_with("secret"));
  try {
    transport->connect(url, 300ms);
    FAIL() << "connect to a silent server succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout) << e.what();
  }
}

// A socket whose connect reached its own port (what the kernel can do to a connect to a loopback
// port nobody listens on) is told apart from a real connection; the transport refuses it.
TEST(TcpWire, AConnectThatReachedItselfIsSeen) {
  asio::io_context io;
  // Made on purpose: bound to a free port, then connected to that same port (simultaneous open).
  asio::ip::tcp::socket self(io);
  self.open(asio::ip::tcp::v4());
  self.set_option(asio::socket_base::reuse_address(true));
  self.bind({asio::ip::make_address("127.0.0.1"), 0});
  auto port = self.local_endpoint().port();
  self.connect({asio::ip::make_address("127.0.0.1"), port});
  EXPECT_TRUE(tcp::connected_to_itself(self));

  asio::ip::tcp::acceptor listener(io, {asio::ip::make_address("127.0.0.1"), 0});
  auto client = raw_connect(io, Url{"tcp", "", "127.0.0.1", listener.local_endpoint().port()});
  auto server = listener.accept();
  EXPECT_FALSE(tcp::connected_to_itself(client));
  EXPECT_FALSE(tcp::connected_to_itself(server));
  asio::ip::tcp::socket unconnected(io);
  EXPECT_FALSE(tcp::connected_to_itself(unconnected));
}

}  // namespace
}  // namespace deltacast::transport
