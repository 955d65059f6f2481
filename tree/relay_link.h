#pragma once
// Building blocks shared by the producer and the receiver: blocking message helpers over a
// transport::Connection, an outbound link with a cap on bytes in flight (back-pressure), a
// blocking event queue, and control readers that turn connections into queued events.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
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
using Clock = std::chrono::steady_clock;

// Seconds from `start` until now.
double seconds_since(Clock::time_point start);

// A Connection that shares ownership of another (so an OutboundLink can own a connection that a
// reader or the acceptor also holds). Forwards every call.
class SharedConnection final : public transport::Connection {
 public:
  explicit SharedConnection(std::shared_ptr<transport::Connection> inner) : inner_(std::move(inner)) {}
  std::shared_ptr<transport::Request> post_send(std::span<const std::byte> message,
                                                transport::MemoryRegion* mr = nullptr) override {
    return inner_->post_send(message, mr);
  }
  std::shared_ptr<transport::Request> post_recv(std::span<std::byte> buffer,
                                                transport::MemoryRegion* mr = nullptr) override {
    return inner_->post_recv(buffer, mr);
  }
  void close() override { inner_->close(); }
  void abort() override { inner_->abort(); }
  std::string peer() const override { return inner_->peer(); }

 private:
  std::shared_ptr<transport::Connection> inner_;
};

// Cancels a request and waits until it finished (only then may its buffer be reused or freed).
void cancel_and_wait(transport::Request& request);

// Sends one message and waits for it. Throws Error(connection | timeout | ...) with the
// request's status. Thread-safe as far as Connection is.
void send_message(transport::Connection& connection, std::span<const std::byte> message,
                  std::chrono::milliseconds timeout);
// Encodes (in `epoch`) and sends a control message (see send_message).
void send_control(transport::Connection& connection, const Message& message,
                  std::chrono::milliseconds timeout, uint64_t epoch = 0);
// Receives one message of at most max_bytes, returned in a vector of its own size (the receive
// buffer is neither zeroed nor kept: a WELCOME's 64 MiB bound costs only the pages the message
// fills, and only while it arrives). Throws Error(timeout) when none arrived in time (the receive
// is cancelled), Error(connection) when the link failed.
std::vector<std::byte> recv_message(transport::Connection& connection, size_t max_bytes,
                                    std::chrono::milliseconds timeout);

// A random id for a process's link (Hello::instance, GroupHello::instance): a new instance of a
// rank replaces (or is refused beside) the old one.
uint64_t random_instance();

// Classifies a failed link's status: `silent` when the transport declared the peer silent
// (heartbeats missing for timeouts.peer), `link_closed` otherwise.
FailureCause failure_cause_of(const Status& status);

// A link to one downstream peer (a child, or a tree root seen from the producer). post() sends
// a shared buffer without copying and keeps it alive until the send finished; wait_below() is the
// back-pressure point. Thread-safe: a relay's reader thread and its acceptor (serving a RESUME)
// may post at once; sends keep the order of the post calls.
class OutboundLink {
 public:
  OutboundLink(std::unique_ptr<transport::Connection> connection, uint32_t peer_rank, int tree);
  ~OutboundLink();
  OutboundLink(const OutboundLink&) = delete;
  OutboundLink& operator=(const OutboundLink&) = delete;

  // Posts the bytes. A link that failed before ignores posts (dead() tells).
  void post(const SharedBytes& message);
  // Posts bytes the caller owns (a RAW body sent from the weights): they must stay alive and
  // unchanged until this send finished (wait_below, flush or the destructor tell).
  void post_view(std::span<const std::byte> bytes);
  // Posts a message and, right after it, `body`, with nothing in between (a RAW header and its
  // body). `body_owner`, when given, keeps the body alive until sent; otherwise the caller does.
  void post_pair(const SharedBytes& message, std::span<const std::byte> body,
                 SharedBytes body_owner = nullptr);
  // Waits up to `timeout` for the bytes still in flight to drop to cap_bytes or below. Returns
  // true when they did or the link is dead (a failed send marks it dead, logged, instead of
  // throwing: losing a child must not stop its parent); false while still above the cap.
  bool wait_below(size_t cap_bytes, std::chrono::milliseconds timeout);
  // How long sends have been pending without any of them finishing (zero when none is pending):
  // a peer that drains nothing for timeouts.peer is stalled.
  std::chrono::milliseconds stalled_for();
  // Waits until every posted send finished or the peer stalled for `stall_timeout`; true when
  // all finished (or the link is dead).
  bool flush(std::chrono::milliseconds stall_timeout);
  // Closes the connection, then waits until the transport no longer reads the posted buffers. The
  // close is orderly when every send finished and the peer is not known to have failed; else
  // Connection::abort (peer_failed: the caller declared the peer failed, frozen or stalled), which
  // does not linger for a peer that will not take anything. The link is dead afterwards.
  void cancel_all(bool peer_failed = false) noexcept;
  bool dead() const noexcept;
  // The bytes of sends not finished yet (finished ones are taken off first: a caller that only
  // asks this, say a re-send waiting for room, sees the room as the peer drains).
  size_t inflight_bytes() noexcept;
  uint32_t peer_rank() const noexcept { return peer_rank_; }
  int tree() const noexcept { return tree_; }

 private:
  struct Pending {
    std::shared_ptr<transport::Request> request;
    SharedBytes owned;  // null for post_view
    size_t size = 0;
  };
  void post_locked(std::span<const std::byte> bytes, SharedBytes owned);
  void drain_finished_locked();
  void mark_dead_locked(const Status& status);

  std::unique_ptr<transport::Connection> connection_;
  const uint32_t peer_rank_;
  const int tree_;
  mutable std::mutex mutex_;
  std::deque<Pending> pending_;
  size_t inflight_bytes_ = 0;
  Clock::time_point last_progress_ = Clock::now();
  bool dead_ = false;
};

// A multi-producer queue that one thread drains. push() never blocks.
template <typename T>
class EventQueue {
 public:
  void push(T item) {
    {
      std::lock_guard lock(mutex_);
      items_.push_back(std::move(item));
    }
    ready_.notify_all();
  }
  // Waits up to `timeout` until an item is queued, without taking it; false on timeout.
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return ready_.wait_for(lock, timeout, [&] { return !items_.empty(); });
  }
  // Waits up to `timeout` for the next item; nullopt on timeout.
  std::optional<T> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;
};

// Threads for short tasks (serving one accepted connection). spawn() starts one and joins the
// ones that finished before; join_all() waits for the rest. Thread-safe.
class TaskThreads {
 public:
  ~TaskThreads() { join_all(); }
  // Runs `task` on a thread of its own; first joins the threads whose task has returned.
  void spawn(std::function<void()> task);
  void join_all();
  // Threads held: running, or ended since the last spawn (for tests).
  size_t size();

 private:
  struct Entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

// One control message from a member, or the failure of its link (message empty).
struct ControlEvent {
  uint32_t rank = 0;
  uint64_t generation = 0;  // which connection of that rank (a rejoin opens a new one)
  std::optional<Message> message;
  uint64_t epoch = 0;       // the message header's
  Status status;            // why the link failed
  Clock::time_point at = Clock::now();
};

// Reads control connections on one thread each and hands every decoded message (or the link's
// failure, once) to `sink`. A connection's reader ends when its link fails or at stop().
class ControlReaders {
 public:
  ControlReaders(size_t max_bytes, std::function<void(ControlEvent)> sink);
  ~ControlReaders();
  ControlReaders(const ControlReaders&) = delete;
  ControlReaders& operator=(const ControlReaders&) = delete;
  // Starts reading `connection` for `rank` under `generation`. The reader shares ownership.
  // max_bytes: the largest message this link may carry (0: the constructor's). Its receive buffer
  // is allocated uninitialised, so pages a message never reached cost no memory.
  void add(uint32_t rank, uint64_t generation, std::shared_ptr<transport::Connection> connection, size_t max_bytes = 0);
  // Stops every reader (their current receives are cancelled) and joins them.
  void stop();
  // Reader threads held: those reading, and those that ended since the last add() (each add joins
  // the ended ones: a producer adds one per member connection, every rejoin included).
  size_t threads_held() { return threads_.size(); }

 private:
  void read_loop(uint32_t rank, uint64_t generation, const std::shared_ptr<transport::Connection>& connection,
                 size_t max_bytes);

  const size_t max_bytes_;
  std::function<void(ControlEvent)> sink_;
  std::mutex mutex_;
  bool stopping_ = false;
  TaskThreads threads_;
};

}  // namespace deltacast::tree
