#pragma once
// The in-process loopback backend (scheme loop://NAME): both ends live in one process, messages
// are copied through a shared queue. Built for tests: a FaultHook set on a connection decides, for
// each message that connection sends, whether it is delivered, dropped, delayed, corrupted,
// truncated, or whether the link closes instead. It runs the same auth handshake as the network
// backends (so a wrong secret is refused) and keeps their message rules; there is no heartbeat
// because a closed peer is seen at once. Progress is made by the calls themselves (post, test,
// wait): there is no thread.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "transport/transport.h"

namespace deltacast::transport::loopback {

struct Fault {
  enum class Kind { deliver, drop, delay, corrupt, truncate, close };
  Kind kind = Kind::deliver;
  std::chrono::milliseconds delay{0};  // delay: the message (and all after it) arrives this late
  size_t offset = 0;                   // corrupt: byte flipped (mod size); truncate: bytes kept
};

// Decides the fate of each message a connection sends. Called under the link's lock, in send
// order; `index` counts this connection's sends from 0. Must not call back into the transport.
class FaultHook {
 public:
  virtual ~FaultHook() = default;
  virtual Fault on_send(uint64_t index, std::span<const std::byte> message) = 0;
};

// A FaultHook from a function.
class FaultFunction final : public FaultHook {
 public:
  explicit FaultFunction(std::function<Fault(uint64_t, std::span<const std::byte>)> decide) : decide_(std::move(decide)) {}
  Fault on_send(uint64_t index, std::span<const std::byte> message) override { return decide_(index, message); }

 private:
  std::function<Fault(uint64_t, std::span<const std::byte>)> decide_;
};

// Installs (or, with nullptr, removes) the hook on a loopback connection's sending side.
// Throws Errc::invalid_argument when `connection` is not a loopback connection. Thread-safe.
void set_fault_hook(Connection& connection, std::shared_ptr<FaultHook> hook);

}  // namespace deltacast::transport::loopback
