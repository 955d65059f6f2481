#pragma once
// TcpConnection: one authenticated TCP socket driven by three coroutines on the transport's single
// io_context thread: a writer (gathers a 16-byte frame header and the caller's buffer into one
// write, no staging copy), a reader (reads each frame straight into the posted receive buffer,
// pausing while no receive is posted so TCP flow control pushes back on the sender) and a
// heartbeat ticker (sends a heartbeat frame when idle; fails the connection when the peer stays
// silent longer than peer_timeout while we wait for its bytes).
// Every member that touches queues or the socket runs on the io thread; the public entry points
// post there. Failure completes every pending request with one Status and closes the socket.
// close() is orderly: it shuts down only the sending half (the peer reads every byte already in
// our socket buffer, then EOF) and reads on, discarding, until the peer's EOF, or until the peer
// takes none of our bytes for kCloseDrainLimit, and only then closes; a socket closed with unread
// bytes (the peer's heartbeats) makes the kernel send a reset, which drops what the peer has not
// read yet. The drain runs on the io thread after close() returned; the transport's destruction
// waits for it, up to kCloseDrainLimit. Every other failure (peer gone, silent, malformed) closes
// at once. A connection that sees the peer's FIN sends no more heartbeats.
#include <utility>  // before Asio: Boost 1.74 coroutines with GCC 12 need std::exchange

#include <array>
#include <chrono>
#include <deque>
#include <memory>
#include <span>
#include <string>

#include <boost/asio.hpp>

#include "transport/basic_request.h"
#include "transport/transport.h"

namespace deltacast::transport::tcp {

namespace asio = boost::asio;

// Wire frame header: magic, kind, payload length (little-endian, 16 bytes).
inline constexpr uint32_t kFrameMagic = 0x31544344;  // "DCT1"
inline constexpr size_t kFrameHeaderSize = 16;
enum class FrameKind : uint32_t { data = 1, heartbeat = 2 };

// How long an orderly close waits for the peer's EOF while the peer takes none of our bytes (also
// at most peer_timeout) before closing.
inline constexpr std::chrono::milliseconds kCloseDrainLimit{1000};

// Applies the socket options every deltacast TCP socket gets: TCP_NODELAY, large buffers, and
// TCP_USER_TIMEOUT = peer_timeout (a host that vanished with unacknowledged data is detected by
// the kernel even when we are not reading). Throws Errc::io.
void tune_socket(asio::ip::tcp::socket& socket, const TransportOptions& options);

// True when a connected socket's two ends are one endpoint: a connect to a loopback port nobody
// listens on can be given that same port as its source (TCP simultaneous open), and then holds
// the port its peer wants to listen on (a restarted producer would fail to bind). Callers close
// such a socket and report the peer unreachable.
bool connected_to_itself(const asio::ip::tcp::socket& socket);

class TcpConnection : public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(asio::io_context& context, asio::ip::tcp::socket socket, const TransportOptions& options);
  // Starts the coroutines. Call once, on the io thread.
  void start();
  std::shared_ptr<Request> post_send(std::span<const std::byte> message);
  std::shared_ptr<Request> post_recv(std::span<std::byte> buffer);
  // Fails the connection with Errc::connection "closed locally" and waits until done.
  void close();
  std::string peer() const { return peer_; }

 private:
  struct SendOp {
    std::shared_ptr<BasicRequest> request;  // null for heartbeats
    std::span<const std::byte> message;
    std::array<std::byte, kFrameHeaderSize> header{};
  };
  struct RecvOp {
    std::shared_ptr<BasicRequest> request;
    std::span<std::byte> buffer;
  };

  asio::awaitable<void> write_loop();
  asio::awaitable<void> read_loop();
  asio::awaitable<void> heartbeat_loop();
  void enqueue_send(SendOp op);
  // Completes every pending request with `status`; an orderly close drains, the rest close at once.
  void fail(const Status& status, bool orderly = false);
  asio::awaitable<void> drain_then_close();
  void watch_drain(std::shared_ptr<bool> limit_passed, size_t unacknowledged);
  size_t unacknowledged_bytes();
  bool peer_closed_sending();
  void cancel_queued(const std::shared_ptr<BasicRequest>& request);
  std::shared_ptr<BasicRequest> cancellable_request();

  asio::io_context& context_;
  asio::ip::tcp::socket socket_;
  TransportOptions options_;
  std::string peer_;
  asio::steady_timer writer_wake_;
  asio::steady_timer reader_wake_;
  asio::steady_timer heartbeat_timer_;
  asio::steady_timer drain_deadline_;
  std::deque<SendOp> send_queue_;
  std::deque<RecvOp> recv_queue_;
  std::shared_ptr<BasicRequest> current_send_;
  std::shared_ptr<BasicRequest> current_recv_;
  bool failed_ = false;
  Status failure_;
  bool reader_paused_ = false;
  bool peer_fin_seen_ = false;  // the peer shut down its sending half: we send no more heartbeats
  std::chrono::steady_clock::time_point last_rx_;
  std::chrono::steady_clock::time_point last_tx_;
  std::array<std::byte, kFrameHeaderSize> rx_header_{};
};

}  // namespace deltacast::transport::tcp
