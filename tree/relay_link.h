#pragma once
// Building blocks shared by the producer and the receiver: blocking message helpers over a
// transport::Connection, an outbound link with a cap on bytes in flight (back-pressure), and an
// inbox that turns several control connections into one queue of decoded messages.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "transport/transport.h"
#include "tree/protocol.h"

namespace deltacast::tree {

using SharedBytes = std::shared_ptr<const std::vector<std::byte>>;

// Cancels a request and waits until it finished (only then may its buffer be reused or freed).
void cancel_and_wait(transport::Request& request);

// Sends one message and waits for it. Throws Error(connection | timeout | ...) with the
// request's status. Thread-safe as far as Connection is.
void send_message(transport::Connection& connection, std::span<const std::byte> message,
                  std::chrono::milliseconds timeout);
// Encodes and sends a control message (see send_message).
void send_control(transport::Connection& connection, const Message& message,
                  std::chrono::milliseconds timeout);
// Receives one message of at most max_bytes. Throws Error(timeout) when none arrived in time
// (the receive is cancelled), Error(connection) when the link failed.
std::vector<std::byte> recv_message(transport::Connection& connection, size_t max_bytes,
                                    std::chrono::milliseconds timeout);

// A link to one downstream peer (a child, or a tree root seen from the producer). post() sends
// a shared buffer without copying and keeps it alive until the send finished; wait_below() is the
// back-pressure point. Used by one thread at a time (its owner); not thread-safe.
class OutboundLink {
 public:
  OutboundLink(std::unique_ptr<transport::Connection> connection, int peer_rank, int tree);
  ~OutboundLink();

  // Posts the bytes. A link that failed before ignores posts (dead() tells).
  void post(const SharedBytes& message);
  // Posts bytes the caller owns (a RAW body sent from the weights): they must stay alive and
  // unchanged until this send finished (wait_below, flush or the destructor tell).
  void post_view(std::span<const std::byte> bytes);
  // Drops finished sends; waits while more than cap_bytes are still in flight. A failed send
  // marks the link dead (logged) instead of throwing: losing a child must not stop its parent.
  // Throws Error(timeout) when the peer made no progress for `timeout`.
  void wait_below(size_t cap_bytes, std::chrono::milliseconds timeout);
  // Waits for every posted send (wait_below(0, ...)).
  void flush(std::chrono::milliseconds timeout) { wait_below(0, timeout); }
  // Cancels every posted send and waits until the transport no longer reads their buffers.
  // A cancelled send may have left half a message on the wire: the link is dead afterwards
  // when anything was still pending.
  void cancel_all() noexcept;
  bool dead() const noexcept { return dead_; }
  size_t inflight_bytes() const noexcept { return inflight_bytes_; }
  int peer_rank() const noexcept { return peer_rank_; }
  int tree() const noexcept { return tree_; }
  transport::Connection& connection() { return *connection_; }

 private:
  struct Pending {
    std::shared_ptr<transport::Request> request;
    SharedBytes owned;  // null for post_view
    size_t size = 0;
  };
  void drain_finished();
  void mark_dead(const Status& status);

  std::unique_ptr<transport::Connection> connection_;
  int peer_rank_;
  int tree_;
  std::deque<Pending> pending_;
  size_t inflight_bytes_ = 0;
  bool dead_ = false;
};

// Receives control messages from several connections on one thread each and queues them
// (source index, message). A link failure is queued as an Error status for that source.
// pop() is thread-safe; the connections must outlive the inbox (call stop() first).
class ControlInbox {
 public:
  struct Item {
    size_t source = 0;
    std::optional<Message> message;  // empty when the link failed
    Status status;                   // why the link failed
  };
  ControlInbox(std::vector<transport::Connection*> connections, size_t max_bytes);
  ~ControlInbox();
  // Waits up to `timeout` for the next message; nullopt on timeout.
  std::optional<Item> pop(std::chrono::milliseconds timeout);
  // Stops the reader threads (they finish their current receive by cancelling it).
  void stop();

 private:
  void read_loop(size_t source);

  std::vector<transport::Connection*> connections_;
  size_t max_bytes_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Item> items_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace deltacast::tree
