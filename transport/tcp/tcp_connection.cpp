#include "transport/tcp/tcp_connection.h"

#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <future>
#include <vector>

#include "util/bytes.h"
#include "util/log.h"

namespace deltacast::transport::tcp {
namespace {

using asio::awaitable;
using asio::redirect_error;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

// Receives are read in slices so a long message refreshes the liveness clock as it flows.
constexpr size_t kReadSlice = size_t{8} << 20;
constexpr int kSocketBufferBytes = 8 << 20;

// Asio's transfer_all() caps each read/write system call at 64 KiB; on loopback and fast links the
// per-call cost then dominates. This condition lets one call move everything that is ready. Given
// a clock, it stamps it before each call: bytes still arriving prove the peer alive, also in the
// middle of a slice (on a loaded host one slice can take longer than peer_timeout).
struct TransferAllUncapped {
  size_t total;
  Clock::time_point* progress = nullptr;
  size_t operator()(const boost::system::error_code& ec, size_t done) const {
    if (progress != nullptr) *progress = Clock::now();
    return ec ? 0 : total - done;
  }
};

}  // namespace

void tune_socket(asio::ip::tcp::socket& socket, const TransportOptions& options) {
  boost::system::error_code ec;
  socket.set_option(asio::ip::tcp::no_delay(true), ec);
  if (!ec) socket.set_option(asio::socket_base::send_buffer_size(kSocketBufferBytes), ec);
  if (!ec) socket.set_option(asio::socket_base::receive_buffer_size(kSocketBufferBytes), ec);
  if (ec) throw Error(Errc::io, "tcp: setting socket options failed: " + ec.message());
  unsigned int user_timeout = static_cast<unsigned int>(options.peer_timeout.count());
  ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

bool connected_to_itself(const asio::ip::tcp::socket& socket) {
  boost::system::error_code local_ec;
  boost::system::error_code remote_ec;
  auto local = socket.local_endpoint(local_ec);
  auto remote = socket.remote_endpoint(remote_ec);
  return !local_ec && !remote_ec && local == remote;
}

TcpConnection::TcpConnection(asio::io_context& context, asio::ip::tcp::socket socket, const TransportOptions& options)
    : context_(context),
      socket_(std::move(socket)),
      options_(options),
      writer_wake_(socket_.get_executor()),
      reader_wake_(socket_.get_executor()),
      heartbeat_timer_(socket_.get_executor()),
      drain_deadline_(socket_.get_executor()) {
  options_.secret.clear();  // the connection never needs it again
  boost::system::error_code ec;
  auto endpoint = socket_.remote_endpoint(ec);
  peer_ = ec ? "tcp://?" : Url{"tcp", "", endpoint.address().to_string(), endpoint.port()}.str();
  last_rx_ = last_tx_ = Clock::now();
}

void TcpConnection::start() {
  auto self = shared_from_this();
  asio::co_spawn(socket_.get_executor(), [self] { return self->write_loop(); }, asio::detached);
  asio::co_spawn(socket_.get_executor(), [self] { return self->read_loop(); }, asio::detached);
  asio::co_spawn(socket_.get_executor(), [self] { return self->heartbeat_loop(); }, asio::detached);
}

// A request whose cancel() withdraws it on the io thread if it is still queued.
std::shared_ptr<BasicRequest> TcpConnection::cancellable_request() {
  auto request = std::make_shared<BasicRequest>();
  std::weak_ptr<TcpConnection> weak_self = weak_from_this();
  std::weak_ptr<BasicRequest> weak_request = request;
  request->set_cancel_hook([weak_self, weak_request] {
    if (auto self = weak_self.lock()) {
      asio::post(self->socket_.get_executor(), [self, weak_request] {
        if (auto r = weak_request.lock()) self->cancel_queued(r);
      });
    }
  });
  return request;
}

std::shared_ptr<Request> TcpConnection::post_send(std::span<const std::byte> message) {
  if (message.size() > options_.max_message_bytes) {
    throw Error(Errc::invalid_argument, "tcp: message of " + std::to_string(message.size()) +
                                            " bytes exceeds max_message_bytes " + std::to_string(options_.max_message_bytes));
  }
  auto request = cancellable_request();
  SendOp op{request, message, {}};
  store_le<uint32_t>(op.header.data(), kFrameMagic);
  store_le<uint32_t>(op.header.data() + 4, static_cast<uint32_t>(FrameKind::data));
  store_le<uint64_t>(op.header.data() + 8, message.size());
  asio::post(socket_.get_executor(), [self = shared_from_this(), op = std::move(op)]() mutable {
    self->enqueue_send(std::move(op));
  });
  return request;
}

void TcpConnection::enqueue_send(SendOp op) {
  if (failed_) {
    if (op.request) op.request->complete(failure_, 0);
    return;
  }
  send_queue_.push_back(std::move(op));
  writer_wake_.cancel();
}

std::shared_ptr<Request> TcpConnection::post_recv(std::span<std::byte> buffer) {
  auto request = cancellable_request();
  asio::post(socket_.get_executor(), [self = shared_from_this(), request, buffer] {
    if (self->failed_) {
      request->complete(self->failure_, 0);
      return;
    }
    self->recv_queue_.push_back(RecvOp{request, buffer});
    self->reader_wake_.cancel();
  });
  return request;
}

void TcpConnection::cancel_queued(const std::shared_ptr<BasicRequest>& request) {
  Status cancelled{Errc::cancelled, "request cancelled"};
  auto send_it = std::find_if(send_queue_.begin(), send_queue_.end(), [&](const SendOp& op) { return op.request == request; });
  if (send_it != send_queue_.end()) {
    send_queue_.erase(send_it);
    request->complete(cancelled, 0);
    return;
  }
  auto recv_it = std::find_if(recv_queue_.begin(), recv_queue_.end(), [&](const RecvOp& op) { return op.request == request; });
  if (recv_it != recv_queue_.end()) {
    recv_queue_.erase(recv_it);
    request->complete(cancelled, 0);
  }
  // Otherwise it is moving bytes now (finishes normally) or already finished.
}

void TcpConnection::close() {
  auto executor = context_.get_executor();
  if (executor.running_in_this_thread() || context_.stopped()) {
    fail(Status{Errc::connection, "connection closed locally"}, true);
    return;
  }
  // The closure owns the promise: after the bounded wait below gives up, it may still run later,
  // and must not touch this stack frame (it did: a segfault or "promise already satisfied").
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  asio::post(executor, [self = shared_from_this(), done] {
    self->fail(Status{Errc::connection, "connection closed locally"}, true);
    done->set_value();
  });
  // The io thread may stop before running the closure (transport torn down): do not wait forever.
  if (future.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    logger("transport")->warn("tcp: close of {} did not complete on the io thread", peer_);
  }
}

void TcpConnection::fail(const Status& status, bool orderly) {
  if (failed_) return;
  failed_ = true;
  failure_ = status;
  boost::system::error_code ignored;
  if (orderly) {
    // Stops the reader and a writer mid-frame (that send fails: the peer sees a cut message, then
    // EOF); every completed send is already in the socket buffer, ahead of our FIN.
    socket_.cancel(ignored);
    socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    asio::co_spawn(
        socket_.get_executor(), [self = shared_from_this()] { return self->drain_then_close(); }, asio::detached);
  } else {
    logger("transport")->debug("tcp: connection to {} failed: {}", peer_, status.message);
    socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }
  writer_wake_.cancel();
  reader_wake_.cancel();
  heartbeat_timer_.cancel();
  if (current_send_) current_send_->complete(status, 0);
  if (current_recv_) current_recv_->complete(status, 0);
  current_send_.reset();
  current_recv_.reset();
  for (auto& op : send_queue_) {
    if (op.request) op.request->complete(status, 0);
  }
  for (auto& op : recv_queue_) op.request->complete(status, 0);
  send_queue_.clear();
  recv_queue_.clear();
}

// Reads and discards until the peer's EOF (it read our FIN and closed too), or until our unsent
// and unacknowledged bytes (SIOCOUTQ, our FIN included) stop shrinking for the drain limit: a peer
// frozen or gone quiet, or one that got everything and did not close. A slow reader that still
// takes our bytes keeps the drain going: closing under it would let its heartbeats (sent until it
// reads our FIN) draw a reset that drops the rest. After EOF nothing is unread, so the close sends
// no reset; at the limit, what arrived last is discarded first, which narrows the window.
awaitable<void> TcpConnection::drain_then_close() {
  auto self = shared_from_this();
  auto limit_passed = std::make_shared<bool>(false);
  watch_drain(limit_passed, unacknowledged_bytes());
  std::vector<std::byte> scratch(size_t{64} << 10);
  boost::system::error_code ec;
  while (!ec && !*limit_passed) {
    co_await socket_.async_read_some(asio::buffer(scratch), redirect_error(use_awaitable, ec));
  }
  drain_deadline_.cancel();
  boost::system::error_code ignored;
  if (*limit_passed) {
    logger("transport")->debug("tcp: {} did not close after our close", peer_);
    for (size_t n = socket_.available(ignored); n > 0 && !ignored; n = socket_.available(ignored)) {
      socket_.read_some(asio::buffer(scratch.data(), std::min(n, scratch.size())), ignored);
    }
  }
  socket_.close(ignored);
}

// Ends the drain (cancels its read) once a whole limit passed without our queue shrinking.
void TcpConnection::watch_drain(std::shared_ptr<bool> limit_passed, size_t unacknowledged) {
  drain_deadline_.expires_after(std::min(kCloseDrainLimit, options_.peer_timeout));
  drain_deadline_.async_wait(
      [self = shared_from_this(), limit_passed, unacknowledged](const boost::system::error_code& ec) {
        if (ec || !self->socket_.is_open()) return;
        size_t now_unacknowledged = self->unacknowledged_bytes();
        if (now_unacknowledged < unacknowledged) {
          self->watch_drain(limit_passed, now_unacknowledged);
          return;
        }
        *limit_passed = true;
        boost::system::error_code ignored;
        self->socket_.cancel(ignored);
      });
}

size_t TcpConnection::unacknowledged_bytes() {
  int bytes = 0;
  if (::ioctl(socket_.native_handle(), SIOCOUTQ, &bytes) != 0) return 0;
  return static_cast<size_t>(std::max(bytes, 0));
}

// The peer shut down its sending half (our socket saw its FIN, maybe behind unread data): it is
// draining toward its close, and a heartbeat arriving after that close would make its kernel
// answer with a reset, which fails our receives of the data still queued here.
bool TcpConnection::peer_closed_sending() {
  if (!peer_fin_seen_) {
    pollfd probe{socket_.native_handle(), POLLRDHUP, 0};
    peer_fin_seen_ = ::poll(&probe, 1, 0) == 1 && (probe.revents & POLLRDHUP) != 0;
  }
  return peer_fin_seen_;
}

awaitable<void> TcpConnection::write_loop() {
  auto self = shared_from_this();
  boost::system::error_code ec;
  while (!failed_) {
    if (send_queue_.empty()) {
      writer_wake_.expires_at(Clock::time_point::max());
      co_await writer_wake_.async_wait(redirect_error(use_awaitable, ec));
      continue;
    }
    SendOp op = std::move(send_queue_.front());
    send_queue_.pop_front();
    current_send_ = op.request;
    std::array<asio::const_buffer, 2> buffers{asio::buffer(op.header), asio::buffer(op.message.data(), op.message.size())};
    co_await asio::async_write(socket_, buffers, TransferAllUncapped{kFrameHeaderSize + op.message.size()},
                               redirect_error(use_awaitable, ec));
    if (failed_) co_return;
    if (ec) {
      fail(Status{Errc::connection, "tcp: send to " + peer_ + " failed: " + ec.message()});
      co_return;
    }
    last_tx_ = Clock::now();
    if (op.request) op.request->complete(Status::success(), op.message.size());
    current_send_.reset();
  }
}

awaitable<void> TcpConnection::read_loop() {
  auto self = shared_from_this();
  boost::system::error_code ec;
  while (!failed_) {
    co_await asio::async_read(socket_, asio::buffer(rx_header_), redirect_error(use_awaitable, ec));
    if (failed_) co_return;
    if (ec) {
      fail(Status{Errc::connection, ec == asio::error::eof ? "tcp: peer " + peer_ + " closed the connection"
                                                           : "tcp: receive from " + peer_ + " failed: " + ec.message()});
      co_return;
    }
    last_rx_ = Clock::now();
    uint32_t magic = load_le<uint32_t>(rx_header_.data());
    uint32_t kind = load_le<uint32_t>(rx_header_.data() + 4);
    uint64_t length = load_le<uint64_t>(rx_header_.data() + 8);
    if (magic != kFrameMagic || (kind != static_cast<uint32_t>(FrameKind::data) && kind != static_cast<uint32_t>(FrameKind::heartbeat))) {
      fail(Status{Errc::connection, "tcp: malformed frame header from " + peer_});
      co_return;
    }
    if (kind == static_cast<uint32_t>(FrameKind::heartbeat)) continue;
    if (length > options_.max_message_bytes) {
      fail(Status{Errc::connection, "tcp: peer " + peer_ + " sent a " + std::to_string(length) +
                                        "-byte message, above max_message_bytes " + std::to_string(options_.max_message_bytes)});
      co_return;
    }
    while (recv_queue_.empty() && !failed_) {
      reader_paused_ = true;  // no receive posted: leave the bytes in the kernel (flow control)
      reader_wake_.expires_at(Clock::time_point::max());
      co_await reader_wake_.async_wait(redirect_error(use_awaitable, ec));
    }
    reader_paused_ = false;
    if (failed_) co_return;
    last_rx_ = Clock::now();
    RecvOp op = std::move(recv_queue_.front());
    recv_queue_.pop_front();
    current_recv_ = op.request;
    if (length > op.buffer.size()) {
      current_recv_.reset();
      op.request->complete(Status{Errc::invalid_argument, "tcp: message of " + std::to_string(length) +
                                                              " bytes exceeds the posted buffer of " +
                                                              std::to_string(op.buffer.size()) + " bytes"},
                           0);
      fail(Status{Errc::connection, "tcp: connection closed after an oversize message"});
      co_return;
    }
    size_t done = 0;
    while (done < length) {
      size_t slice = std::min<size_t>(kReadSlice, length - done);
      co_await asio::async_read(socket_, asio::buffer(op.buffer.data() + done, slice),
                                TransferAllUncapped{slice, &last_rx_}, redirect_error(use_awaitable, ec));
      if (failed_) co_return;
      if (ec) {
        fail(Status{Errc::connection, "tcp: peer " + peer_ + " went away mid-message: " + ec.message()});
        co_return;
      }
      done += slice;
      last_rx_ = Clock::now();
    }
    current_recv_.reset();
    op.request->complete(Status::success(), length);
  }
}

awaitable<void> TcpConnection::heartbeat_loop() {
  auto self = shared_from_this();
  boost::system::error_code ec;
  auto tick = std::max(std::chrono::milliseconds(1), std::min(options_.heartbeat_interval, options_.peer_timeout / 4));
  while (!failed_) {
    heartbeat_timer_.expires_after(tick);
    co_await heartbeat_timer_.async_wait(redirect_error(use_awaitable, ec));
    if (failed_) co_return;
    auto now = Clock::now();
    if (!reader_paused_ && now - last_rx_ > options_.peer_timeout) {
      fail(Status{Errc::connection, "tcp: peer " + peer_ + " silent for more than " +
                                        std::to_string(options_.peer_timeout.count()) + " ms"});
      co_return;
    }
    if (send_queue_.empty() && !current_send_ && now - last_tx_ >= options_.heartbeat_interval &&
        !peer_closed_sending()) {
      SendOp beat{};
      store_le<uint32_t>(beat.header.data(), kFrameMagic);
      store_le<uint32_t>(beat.header.data() + 4, static_cast<uint32_t>(FrameKind::heartbeat));
      store_le<uint64_t>(beat.header.data() + 8, 0);
      last_tx_ = now;
      enqueue_send(std::move(beat));
    }
  }
}

}  // namespace deltacast::transport::tcp
