#include "tree/relay_link.h"

#include "util/log.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;

}  // namespace

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
                  std::chrono::milliseconds timeout) {
  auto bytes = encode_message(message);
  send_message(connection, bytes, timeout);
}

std::vector<std::byte> recv_message(transport::Connection& connection, size_t max_bytes,
                                    std::chrono::milliseconds timeout) {
  std::vector<std::byte> buffer(max_bytes);
  auto request = connection.post_recv(buffer);
  Status status = request->wait(timeout);
  if (status.code == Errc::timeout) {
    cancel_and_wait(*request);
    if (request->status().ok()) {  // it raced to completion while being cancelled
      buffer.resize(request->bytes());
      return buffer;
    }
    throw Error(Errc::timeout, "no message from " + connection.peer() + " within " +
                                   std::to_string(timeout.count()) + " ms");
  }
  if (!status.ok()) throw Error(status);
  buffer.resize(request->bytes());
  return buffer;
}

OutboundLink::OutboundLink(std::unique_ptr<transport::Connection> connection, int peer_rank,
                           int tree)
    : connection_(std::move(connection)), peer_rank_(peer_rank), tree_(tree) {}

OutboundLink::~OutboundLink() { cancel_all(); }

void OutboundLink::cancel_all() noexcept {
  // The transport may still read from the buffers: cancel and wait before they are freed.
  drain_finished();
  if (pending_.empty()) return;
  for (auto& pending : pending_) cancel_and_wait(*pending.request);
  pending_.clear();
  inflight_bytes_ = 0;
  dead_ = true;
}

void OutboundLink::post(const SharedBytes& message) {
  if (dead_) return;
  auto request = connection_->post_send(*message);
  pending_.push_back({std::move(request), message, message->size()});
  inflight_bytes_ += message->size();
}

void OutboundLink::post_view(std::span<const std::byte> bytes) {
  if (dead_) return;
  auto request = connection_->post_send(bytes);
  pending_.push_back({std::move(request), nullptr, bytes.size()});
  inflight_bytes_ += bytes.size();
}

void OutboundLink::drain_finished() {
  while (!pending_.empty() && pending_.front().request->test()) {
    Status status = pending_.front().request->status();
    inflight_bytes_ -= pending_.front().size;
    pending_.pop_front();
    if (!status.ok()) mark_dead(status);
  }
}

void OutboundLink::mark_dead(const Status& status) {
  if (!dead_)
    logger("tree")->warn("link to member {} (tree {}) failed: {}", peer_rank_, tree_,
                         status.message);
  dead_ = true;
}

void OutboundLink::wait_below(size_t cap_bytes, std::chrono::milliseconds timeout) {
  drain_finished();
  while (!pending_.empty() && (inflight_bytes_ > cap_bytes || dead_)) {
    Status status = pending_.front().request->wait(timeout);
    if (status.code == Errc::timeout)
      throw Error(Errc::timeout, "member " + std::to_string(peer_rank_) +
                                     " accepted no data for " + std::to_string(timeout.count()) +
                                     " ms");
    drain_finished();
  }
}

ControlInbox::ControlInbox(std::vector<transport::Connection*> connections, size_t max_bytes)
    : connections_(std::move(connections)), max_bytes_(max_bytes) {
  for (size_t i = 0; i < connections_.size(); ++i)
    threads_.emplace_back([this, i] { read_loop(i); });
}

ControlInbox::~ControlInbox() { stop(); }

void ControlInbox::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  for (auto& thread : threads_)
    if (thread.joinable()) thread.join();
}

std::optional<ControlInbox::Item> ControlInbox::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return std::nullopt;
  Item item = std::move(items_.front());
  items_.pop_front();
  return item;
}

void ControlInbox::read_loop(size_t source) {
  std::vector<std::byte> buffer(max_bytes_);
  auto push = [&](Item item) {
    std::lock_guard lock(mutex_);
    items_.push_back(std::move(item));
    ready_.notify_all();
  };
  for (;;) {
    auto request = connections_[source]->post_recv(buffer);
    Status status;
    for (;;) {
      status = request->wait(200ms);
      if (status.code != Errc::timeout) break;
      std::lock_guard lock(mutex_);
      if (stopping_) break;
    }
    if (status.code == Errc::timeout) {  // stopping
      cancel_and_wait(*request);
      return;
    }
    if (!status.ok()) {
      push({source, std::nullopt, status});
      return;
    }
    try {
      push({source, decode_message(std::span(buffer.data(), request->bytes())), {}});
    } catch (const Error& e) {
      push({source, std::nullopt, e.status()});
      return;
    }
  }
}

}  // namespace deltacast::tree
