#pragma once
// Connection and Transport handles for backends built around one shared engine object (ofi, ucx):
// the engine owns every resource and does the work; a handle keeps the engine alive and forwards.
// Engine provides post_send / post_recv / post_write (conn, ...), close_connection(conn, Status),
// listen, connect, register_memory and capabilities; Conn has a `peer_url` member.
#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "transport/transport.h"

namespace deltacast::transport {

template <class Engine, class Conn>
class EngineConnection final : public Connection {
 public:
  EngineConnection(std::shared_ptr<Engine> engine, std::shared_ptr<Conn> conn)
      : engine_(std::move(engine)), conn_(std::move(conn)) {}
  ~EngineConnection() override { close(); }
  std::shared_ptr<Request> post_send(std::span<const std::byte> message, MemoryRegion* mr) override {
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

}  // namespace deltacast::transport
