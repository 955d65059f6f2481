// The Asio TCP backend: one io_context thread per transport, connect/accept with the auth
// handshake (transport/auth.h) run as coroutines under a deadline, then a TcpConnection per socket.
#include <utility>  // before Asio: Boost 1.74 coroutines with GCC 12 need std::exchange

#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include <boost/asio.hpp>

#include "transport/auth.h"
#include "transport/host_region.h"
#include "transport/tcp/tcp_connection.h"
#include "transport/tcp/tcp_transport.h"
#include "util/log.h"

namespace deltacast::transport::tcp {
namespace {

using asio::awaitable;
using asio::use_awaitable;
using tcp_socket = asio::ip::tcp::socket;

// Closes the socket when the deadline passes, which makes the pending handshake operation fail.
// Disarmed on destruction: a completion already queued then leaves the (maybe moved or destroyed)
// socket alone. Everything runs on the io thread, so the flags need no lock.
class Deadline {
 public:
  Deadline(tcp_socket& socket, std::chrono::milliseconds timeout)
      : timer_(socket.get_executor()), state_(std::make_shared<State>()) {
    timer_.expires_after(timeout);
    timer_.async_wait([&socket, state = state_](boost::system::error_code ec) {
      if (ec || state->disarmed) return;
      state->expired = true;
      boost::system::error_code ignored;
      socket.close(ignored);
    });
  }
  ~Deadline() {
    state_->disarmed = true;
    timer_.cancel();
  }
  bool expired() const { return state_->expired; }

 private:
  struct State {
    bool expired = false;
    bool disarmed = false;
  };
  asio::steady_timer timer_;
  std::shared_ptr<State> state_;
};

awaitable<void> client_handshake(tcp_socket& socket, const std::string& secret) {
  auth::ClientHandshake handshake(secret);
  auto hello = handshake.hello();
  co_await asio::async_write(socket, asio::buffer(hello), use_awaitable);
  auth::Challenge challenge{};
  co_await asio::async_read(socket, asio::buffer(challenge), use_awaitable);
  auto proof = handshake.answer(challenge);  // throws Errc::auth before we prove anything
  co_await asio::async_write(socket, asio::buffer(proof), use_awaitable);
}

// Reads exactly HELLO and PROOF (fixed sizes) before any payload byte.
awaitable<void> server_handshake(tcp_socket& socket, const std::string& secret) {
  auth::ServerHandshake handshake(secret);
  auth::Hello hello{};
  co_await asio::async_read(socket, asio::buffer(hello), use_awaitable);
  auto challenge = handshake.challenge(hello);
  co_await asio::async_write(socket, asio::buffer(challenge), use_awaitable);
  auth::Proof proof{};
  co_await asio::async_read(socket, asio::buffer(proof), use_awaitable);
  handshake.verify(proof);
}

class IoEngine {
 public:
  IoEngine()
      : work_(asio::make_work_guard(context_)), ran_dry_(stopped_.get_future()), thread_([this] {
          context_.run();
          stopped_.set_value();
        }) {}
  ~IoEngine() {
    // Connections closed last may still be draining toward their peer's EOF (tcp_connection.h):
    // the context runs dry when they are done, each within kCloseDrainLimit of its close.
    work_.reset();
    if (ran_dry_.wait_for(kCloseDrainLimit + std::chrono::milliseconds(500)) != std::future_status::ready) {
      context_.stop();
    }
    thread_.join();
  }
  asio::io_context& context() { return context_; }

 private:
  asio::io_context context_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::promise<void> stopped_;
  std::future<void> ran_dry_;
  std::thread thread_;
};

class TcpConnectionHandle final : public Connection {
 public:
  explicit TcpConnectionHandle(std::shared_ptr<TcpConnection> impl) : impl_(std::move(impl)) {}
  ~TcpConnectionHandle() override { impl_->close(); }
  std::shared_ptr<Request> post_send(std::span<const std::byte> message, MemoryRegion*) override {
    return impl_->post_send(message);
  }
  std::shared_ptr<Request> post_recv(std::span<std::byte> buffer, MemoryRegion*) override {
    return impl_->post_recv(buffer);
  }
  void close() override { impl_->close(); }
  std::string peer() const override { return impl_->peer(); }

 private:
  std::shared_ptr<TcpConnection> impl_;
};

// Accepts in the background; authenticated connections wait in a queue for accept().
class TcpListener final : public Listener, public std::enable_shared_from_this<TcpListener> {
 public:
  TcpListener(asio::io_context& context, const Url& url, const TransportOptions& options)
      : context_(context), acceptor_(context), options_(options) {
    boost::system::error_code ec;
    auto address = asio::ip::make_address(url.host, ec);
    if (ec) {
      asio::ip::tcp::resolver resolver(context);
      auto results = resolver.resolve(url.host, std::to_string(url.port), ec);
      if (ec || results.empty()) throw Error(Errc::io, "tcp: cannot resolve listen host '" + url.host + "'");
      address = results.begin()->endpoint().address();
    }
    asio::ip::tcp::endpoint endpoint(address, url.port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw Error(Errc::io, "tcp: cannot listen on " + url.str() + ": " + ec.message());
    auto bound = acceptor_.local_endpoint();
    local_ = Url{"tcp", "", bound.address().to_string(), bound.port()};
  }

  void start() {
    asio::co_spawn(context_, [self = shared_from_this()] { return self->accept_loop(); }, asio::detached);
  }

  std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mutex_);
    if (closed_) throw Error(Errc::state, "tcp: accept on a closed listener " + local_.str());
    ready_cv_.wait_for(lock, timeout, [this] { return !ready_.empty() || closed_; });
    if (ready_.empty()) return nullptr;
    auto connection = std::move(ready_.front());
    ready_.pop_front();
    return std::make_unique<TcpConnectionHandle>(std::move(connection));
  }

  Url local_url() const override { return local_; }

  void close() override {
    {
      std::lock_guard lock(mutex_);
      if (closed_) return;
      closed_ = true;
    }
    ready_cv_.notify_all();
    // The closure owns the promise: it may run after the bounded wait below gave up.
    auto done = std::make_shared<std::promise<void>>();
    auto future = done->get_future();
    asio::post(context_, [self = shared_from_this(), done] {
      boost::system::error_code ignored;
      self->acceptor_.close(ignored);
      done->set_value();
    });
    if (!context_.stopped()) future.wait_for(std::chrono::seconds(5));
    std::lock_guard lock(mutex_);
    for (auto& connection : ready_) connection->close();
    ready_.clear();
  }

 private:
  awaitable<void> accept_loop() {
    auto self = shared_from_this();
    for (;;) {
      boost::system::error_code ec;
      tcp_socket socket(context_);
      co_await acceptor_.async_accept(socket, asio::redirect_error(use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      if (ec) {
        logger("transport")->warn("tcp: accept on {} failed: {}", local_.str(), ec.message());
        continue;
      }
      asio::co_spawn(context_, [self, s = std::make_shared<tcp_socket>(std::move(socket))]() {
        return self->authenticate(s);
      }, asio::detached);
    }
  }

  awaitable<void> authenticate(std::shared_ptr<tcp_socket> socket) {
    boost::system::error_code ec;
    auto remote = socket->remote_endpoint(ec);
    std::string who = ec ? "?" : remote.address().to_string() + ":" + std::to_string(remote.port());
    try {
      tune_socket(*socket, options_);
      {
        Deadline deadline(*socket, options_.connect_timeout);
        try {
          co_await server_handshake(*socket, options_.secret);
        } catch (const boost::system::system_error&) {
          if (deadline.expired()) throw Error(Errc::timeout, "handshake timed out");
          throw;
        }
      }
      auto connection = std::make_shared<TcpConnection>(context_, std::move(*socket), options_);
      connection->start();
      std::lock_guard lock(mutex_);
      if (closed_) {
        connection->close();
        co_return;
      }
      ready_.push_back(std::move(connection));
      ready_cv_.notify_one();
    } catch (const std::exception& e) {
      logger("transport")->warn("tcp: refused peer {} on {}: {}", who, local_.str(), e.what());
      boost::system::error_code ignored;
      socket->close(ignored);
    }
  }

  asio::io_context& context_;
  asio::ip::tcp::acceptor acceptor_;
  TransportOptions options_;
  Url local_;
  std::mutex mutex_;
  std::condition_variable ready_cv_;
  std::deque<std::shared_ptr<TcpConnection>> ready_;
  bool closed_ = false;
};

class ListenerHandle final : public Listener {
 public:
  explicit ListenerHandle(std::shared_ptr<TcpListener> impl) : impl_(std::move(impl)) {}
  ~ListenerHandle() override { impl_->close(); }
  std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) override { return impl_->accept(timeout); }
  Url local_url() const override { return impl_->local_url(); }
  void close() override { impl_->close(); }

 private:
  std::shared_ptr<TcpListener> impl_;
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportOptions& options) : options_(options) {}

  std::unique_ptr<Listener> listen(const Url& url) override {
    check_scheme(url);
    auto listener = std::make_shared<TcpListener>(engine_.context(), url, options_);
    listener->start();
    return std::make_unique<ListenerHandle>(std::move(listener));
  }

  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) override {
    check_scheme(url);
    auto result = std::make_shared<std::promise<std::shared_ptr<TcpConnection>>>();
    auto future = result->get_future();
    asio::co_spawn(engine_.context(), connect_coro(url, timeout),
                   [result](std::exception_ptr error, std::shared_ptr<TcpConnection> connection) {
                     if (error) result->set_exception(error);
                     else result->set_value(std::move(connection));
                   });
    return std::make_unique<TcpConnectionHandle>(future.get());
  }

  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override {
    if (kind != MemoryKind::host) throw Error(Errc::unsupported, "tcp: CUDA memory registration is not supported");
    return std::make_unique<HostRegion>(bytes);
  }

  Capabilities capabilities() const override {
    return Capabilities{"tcp", false, false, true, options_.max_message_bytes, !options_.secret.empty()};
  }

 private:
  static void check_scheme(const Url& url) {
    if (url.scheme != "tcp") throw Error(Errc::invalid_argument, "tcp transport given a '" + url.full_scheme() + "' URL");
  }

  awaitable<std::shared_ptr<TcpConnection>> connect_coro(Url url, std::chrono::milliseconds timeout) {
    auto& context = engine_.context();
    tcp_socket socket(context);
    boost::system::error_code ec;
    asio::ip::tcp::resolver resolver(context);
    auto endpoints = co_await resolver.async_resolve(url.host, std::to_string(url.port),
                                                     asio::redirect_error(use_awaitable, ec));
    if (ec) throw Error(Errc::connection, "tcp: cannot resolve " + url.str() + ": " + ec.message());
    {
      Deadline deadline(socket, timeout);
      co_await asio::async_connect(socket, endpoints, asio::redirect_error(use_awaitable, ec));
      if (deadline.expired()) throw Error(Errc::timeout, "tcp: connect to " + url.str() + " timed out");
      if (ec) throw Error(Errc::connection, "tcp: cannot connect to " + url.str() + ": " + ec.message());
      if (connected_to_itself(socket)) {
        socket.close(ec);
        throw Error(Errc::connection, "tcp: cannot connect to " + url.str() + ": nothing listens there (the " +
                                          "connect reached itself)");
      }
      tune_socket(socket, options_);
      try {
        co_await client_handshake(socket, options_.secret);
      } catch (const boost::system::system_error& e) {
        if (deadline.expired()) throw Error(Errc::timeout, "tcp: handshake with " + url.str() + " timed out");
        throw Error(Errc::auth, "tcp: " + url.str() + " dropped the connection during authentication (" +
                                    e.code().message() + ")");
      }
    }
    auto connection = std::make_shared<TcpConnection>(context, std::move(socket), options_);
    connection->start();
    co_return connection;
  }

  TransportOptions options_;
  IoEngine engine_;  // last member: its thread stops before the options go away
};

}  // namespace
}  // namespace deltacast::transport::tcp

namespace deltacast::transport {

std::unique_ptr<Transport> make_tcp_transport(const TransportOptions& options) {
  return std::make_unique<tcp::TcpTransport>(options);
}

}  // namespace deltacast::transport
