#pragma once
// Connection and Transport handles for backends built around one shared engine object (ofi, ucx):
// the engine owns every resource and does the work; a handle keeps the engine alive and forwards.
// Engine provides post_send / post_recv / post_write (conn, ...), close_connection(conn, Status)
// (orderly: may linger for the FIN), abort_connection(conn, Status) (at once),
// listen, connect, register_memory, capabilities and options(); Conn derives from
// EngineConnState (transport/engine_state.h).
// Rules the handles add, so each engine need not repeat them:
//  * EngineConnection::post_send refuses a message above options().max_message_bytes with
//    Errc::invalid_argument before the engine sees it; destroying the handle closes the connection.
//  * listen_over_side_channel / connect_over_side_channel are the engines' listen() and connect():
//    the side channel (transport/side_channel.h) is opened and authenticated, then
//    Engine::establish(fd, is_server, deadline) sets up the fabric's half of the connection over
//    it and returns the Conn, or throws. Both block the caller (connect) or the listener's accept
//    thread (transport/accepting_listener.h) until establish returns or the deadline passes.
#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "transport/accepting_listener.h"
#include "transport/side_channel.h"
#include "transport/transport.h"

namespace deltacast::transport {

template <class Engine, class Conn>
class EngineConnection final : public Connection {
 public:
  EngineConnection(std::shared_ptr<Engine> engine, std::shared_ptr<Conn> conn)
      : engine_(std::move(engine)), conn_(std::move(conn)) {}
  ~EngineConnection() override { close(); }
  std::shared_ptr<Request> post_send(std::span<const std::byte> message, MemoryRegion* mr) override {
    const size_t max = engine_->options().max_message_bytes;
    if (message.size() > max) {
      throw Error(Errc::invalid_argument, "message of " + std::to_string(message.size()) +
                                              " bytes exceeds max_message_bytes " + std::to_string(max));
    }
    return engine_->post_send(conn_, message, mr);
  }
  std::shared_ptr<Request> post_recv(std::span<std::byte> buffer, MemoryRegion* mr) override {
    return engine_->post_recv(conn_, buffer, mr);
  }
  std::shared_ptr<Request> post_write(std::span<const std::byte> local, MemoryRegion* local_mr,
                                      const RemoteBuffer& remote) override {
    return engine_->post_write(conn_, local, local_mr, remote);
  }
  void close() override { engine_->close_connection(conn_, Status{Errc::connection, "connection closed locally"}); }
  void abort() override { engine_->abort_connection(conn_, Status{Errc::connection, "connection aborted locally"}); }
  std::string peer() const override { return conn_->peer_url; }

 private:
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Conn> conn_;
};

template <class Engine>
class EngineTransport final : public Transport {
 public:
  explicit EngineTransport(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  std::unique_ptr<Listener> listen(const Url& url) override { return engine_->listen(url); }
  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) override {
    return engine_->connect(url, timeout);
  }
  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override {
    return engine_->register_memory(bytes, kind);
  }
  Capabilities capabilities() const override { return engine_->capabilities(); }

 private:
  std::shared_ptr<Engine> engine_;
};

// Listens on url.host:url.port (the caller checked the scheme): every peer that passes the
// handshake within options().connect_timeout is set up by engine->establish(fd, true, deadline)
// on the listener's thread and queued for accept(). The listener keeps the engine alive.
template <class Conn, class Engine>
std::unique_ptr<Listener> listen_over_side_channel(std::shared_ptr<Engine> engine, const Url& url) {
  const TransportOptions& options = engine->options();
  return std::make_unique<side::AcceptingListener>(
      url, options.secret, options.connect_timeout,
      [engine](side::Fd fd, side::Clock::time_point deadline) -> std::unique_ptr<Connection> {
        return std::make_unique<EngineConnection<Engine, Conn>>(engine,
                                                                engine->establish(std::move(fd), true, deadline));
      });
}

// Connects to url.host:url.port (the caller checked the scheme), authenticates, and sets the
// connection up with engine->establish(fd, false, deadline), all within `timeout`.
template <class Conn, class Engine>
std::unique_ptr<Connection> connect_over_side_channel(std::shared_ptr<Engine> engine, const Url& url,
                                                      std::chrono::milliseconds timeout) {
  const auto deadline = side::Clock::now() + timeout;
  side::Fd fd = side::connect_authenticated(url.host, url.port, engine->options().secret, deadline);
  return std::make_unique<EngineConnection<Engine, Conn>>(engine, engine->establish(std::move(fd), false, deadline));
}

}  // namespace deltacast::transport
