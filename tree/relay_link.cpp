#include "tree/relay_link.h"

#include <atomic>
#include <random>

#include "util/log.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;

}  // namespace

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void cancel_and_wait(transport::Request& request) {
  request.cancel();
  while (request.wait(1s).code == Errc::timeout) {
  }
}

void send_message(transport::Connection& connection, std::span<const std::byte> message,
                  std::chrono::milliseconds timeout) {
  auto request = connection.post_send(message);
  Status status = request->wait(timeout);
  if (status.code == Errc::timeout) {
    cancel_and_wait(*request);
    throw Error(Errc::timeout, "sending a " + std::to_string(message.size()) + "-byte message to " +
                                   connection.peer() + " took longer than " +
                                   std::to_string(timeout.count()) + " ms");
  }
  if (!status.ok()) throw Error(status);
}

void send_control(transport::Connection& connection, const Message& message,
                  std::chrono::milliseconds timeout, uint64_t epoch) {
  auto bytes = encode_message(message, epoch);
  send_message(connection, bytes, timeout);
}

std::vector<std::byte> recv_message(transport::Connection& connection, size_t max_bytes,
                                    std::chrono::milliseconds timeout) {
  // Default-initialised (not zeroed): a large bound is an mmap whose untouched pages cost nothing.
  const std::unique_ptr<std::byte[]> storage(new std::byte[max_bytes]);
  auto request = connection.post_recv(std::span<std::byte>(storage.get(), max_bytes));
  const auto received = [&] { return std::vector<std::byte>(storage.get(), storage.get() + request->bytes()); };
  Status status = request->wait(timeout);
  if (status.code == Errc::timeout) {
    cancel_and_wait(*request);
    if (request->status().ok()) return received();  // it raced to completion while being cancelled
    throw Error(Errc::timeout, "no message from " + connection.peer() + " within " +
                                   std::to_string(timeout.count()) + " ms");
  }
  if (!status.ok()) throw Error(status);
  return received();
}

uint64_t random_instance() {
  std::random_device seed;
  return (static_cast<uint64_t>(seed()) << 32) ^ seed() ^
         static_cast<uint64_t>(Clock::now().time_since_epoch().count());
}

FailureCause failure_cause_of(const Status& status) {
  // Every backend words a heartbeat timeout as "... silent for more than N ms".
  return status.message.find("silent") != std::string::npos ? FailureCause::silent
                                                              : FailureCause::link_closed;
}

OutboundLink::OutboundLink(std::unique_ptr<transport::Connection> connection, uint32_t peer_rank,
                           int tree)
    : connection_(std::move(connection)), peer_rank_(peer_rank), tree_(tree) {}

OutboundLink::~OutboundLink() { cancel_all(); }  // (a no-op after an earlier cancel_all)

void OutboundLink::cancel_all(bool peer_failed) noexcept {
  std::deque<Pending> pending;
  {
    std::lock_guard lock(mutex_);
    dead_ = true;             // (before the drain: a failed send found now is not logged again)
    drain_finished_locked();  // what finished needs no abort
    pending.swap(pending_);
    inflight_bytes_ = 0;
  }
  // Closing fails every pending send at once; the transport may still read from the buffers
  // until each request finished, so wait before they are freed. Sends that will not finish (a
  // frozen or failed peer) are given up on: abort, which does not linger for the peer to take
  // them; so is a peer the caller declared failed (a frozen peer's orderly close lingered: ucx
  // waited 0.3-0.45 s for a frozen root's FIN, on the producer's driving thread). Else an orderly
  // close, so that a live peer still gets everything sent.
  if (pending.empty() && !peer_failed)
    connection_->close();
  else
    connection_->abort();
  for (auto& p : pending) cancel_and_wait(*p.request);
}

bool OutboundLink::dead() const noexcept {
  std::lock_guard lock(mutex_);
  return dead_;
}

size_t OutboundLink::inflight_bytes() noexcept {
  std::lock_guard lock(mutex_);
  drain_finished_locked();
  return inflight_bytes_;
}

void OutboundLink::post_locked(std::span<const std::byte> bytes, SharedBytes owned) {
  if (dead_) return;
  if (pending_.empty()) last_progress_ = Clock::now();
  auto request = connection_->post_send(bytes);
  pending_.push_back({std::move(request), std::move(owned), bytes.size()});
  inflight_bytes_ += bytes.size();
}

void OutboundLink::post(const SharedBytes& message) {
  std::lock_guard lock(mutex_);
  post_locked(*message, message);
}

void OutboundLink::post_view(std::span<const std::byte> bytes) {
  std::lock_guard lock(mutex_);
  post_locked(bytes, nullptr);
}

void OutboundLink::post_pair(const SharedBytes& message, std::span<const std::byte> body,
                             SharedBytes body_owner) {
  std::lock_guard lock(mutex_);
  post_locked(*message, message);
  post_locked(body, std::move(body_owner));
}

void OutboundLink::drain_finished_locked() {
  while (!pending_.empty() && pending_.front().request->test()) {
    Status status = pending_.front().request->status();
    inflight_bytes_ -= pending_.front().size;
    pending_.pop_front();
    last_progress_ = Clock::now();
    if (!status.ok()) mark_dead_locked(status);
  }
}

void OutboundLink::mark_dead_locked(const Status& status) {
  if (!dead_)
    logger("tree")->warn("link to rank {} (tree {}) failed: {}", peer_rank_, tree_, status.message);
  dead_ = true;
}

bool OutboundLink::wait_below(size_t cap_bytes, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::shared_ptr<transport::Request> front;
    {
      std::lock_guard lock(mutex_);
      drain_finished_locked();
      if (pending_.empty() || inflight_bytes_ <= cap_bytes || dead_) return true;
      front = pending_.front().request;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left <= 0ms) return false;
    front->wait(std::min<std::chrono::milliseconds>(left, 100ms));
  }
}

std::chrono::milliseconds OutboundLink::stalled_for() {
  std::lock_guard lock(mutex_);
  drain_finished_locked();
  if (pending_.empty()) return 0ms;
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_progress_);
}

bool OutboundLink::flush(std::chrono::milliseconds stall_timeout) {
  while (!wait_below(0, 100ms))
    if (stalled_for() > stall_timeout) return false;
  return true;
}

void TaskThreads::spawn(std::function<void()> task) {
  std::vector<std::thread> finished;
  std::lock_guard lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->done->load()) {
      finished.push_back(std::move(it->thread));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& t : finished) t.join();
  auto done = std::make_shared<std::atomic<bool>>(false);
  entries_.push_back({std::thread([task = std::move(task), done] {
                        task();
                        done->store(true);
                      }),
                      done});
}

size_t TaskThreads::size() {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

void TaskThreads::join_all() {
  std::vector<Entry> entries;
  {
    std::lock_guard lock(mutex_);
    entries.swap(entries_);
  }
  for (auto& e : entries)
    if (e.thread.joinable()) e.thread.join();
}

ControlReaders::ControlReaders(size_t max_bytes, std::function<void(ControlEvent)> sink)
    : max_bytes_(max_bytes), sink_(std::move(sink)) {}

ControlReaders::~ControlReaders() { stop(); }

void ControlReaders::add(uint32_t rank, uint64_t generation, std::shared_ptr<transport::Connection> connection,
                         size_t max_bytes) {
  std::lock_guard lock(mutex_);
  if (stopping_) return;
  if (max_bytes == 0) max_bytes = max_bytes_;
  // (Before, each reader's thread was kept until stop(): a producer held an ended thread, and its
  // stack, for every member connection that ever closed, each rejoin included.)
  threads_.spawn([this, rank, generation, max_bytes, connection = std::move(connection)] {
    read_loop(rank, generation, connection, max_bytes);
  });
}

void ControlReaders::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  threads_.join_all();
}

void ControlReaders::read_loop(uint32_t rank, uint64_t generation,
                               const std::shared_ptr<transport::Connection>& connection, size_t max_bytes) {
  const auto storage = std::make_unique_for_overwrite<std::byte[]>(max_bytes);
  const std::span<std::byte> buffer(storage.get(), max_bytes);
  auto stopping = [&] {
    std::lock_guard lock(mutex_);
    return stopping_;
  };
  for (;;) {
    auto request = connection->post_recv(buffer);
    Status status;
    while ((status = request->wait(200ms)).code == Errc::timeout) {
      if (stopping()) {
        cancel_and_wait(*request);
        return;
      }
    }
    ControlEvent event;
    event.rank = rank;
    event.generation = generation;
    if (!status.ok()) {
      event.status = status;
      sink_(std::move(event));
      return;
    }
    try {
      std::span<const std::byte> bytes(buffer.data(), request->bytes());
      event.epoch = message_header(bytes).epoch;
      event.message = decode_message(bytes);
    } catch (const Error& e) {
      event.message.reset();
      event.status = Status{Errc::corrupt_frame, e.what()};
      connection->close();
      sink_(std::move(event));
      return;
    }
    sink_(std::move(event));
  }
}

}  // namespace deltacast::tree
