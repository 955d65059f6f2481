#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "transport/host_region.h"
#include "transport/auth.h"
#include "transport/basic_request.h"
#include "transport/loopback/loopback.h"

namespace deltacast::transport::loopback {
namespace {

using Clock = std::chrono::steady_clock;

class LoopRecvRequest;

// Both directions of one connection, under one lock. side 0 = connecting end, 1 = accepting end.
struct Link {
  struct Message {
    std::vector<std::byte> bytes;
    Clock::time_point deliver_at;
  };
  struct PostedRecv {
    std::shared_ptr<BasicRequest> request;
    std::span<std::byte> buffer;
  };
  std::mutex mutex;
  std::deque<Message> inbox[2];  // messages waiting for side i
  std::deque<PostedRecv> posted[2];
  std::shared_ptr<FaultHook> hooks[2];
  uint64_t sent[2] = {0, 0};
  bool closed = false;
  Status failure;
  size_t max_message = 0;

  // Fails every posted receive; caller holds the lock.
  void close_locked(const Status& status) {
    if (closed) return;
    closed = true;
    failure = status;
    for (auto& queue : posted) {
      for (auto& recv : queue) recv.request->complete(status, 0);
      queue.clear();
    }
    inbox[0].clear();
    inbox[1].clear();
  }

  // Matches ready messages with posted receives for `side`; caller holds the lock.
  void pump_locked(int side) {
    auto now = Clock::now();
    while (!closed && !inbox[side].empty() && !posted[side].empty() && inbox[side].front().deliver_at <= now) {
      Message message = std::move(inbox[side].front());
      inbox[side].pop_front();
      PostedRecv recv = std::move(posted[side].front());
      posted[side].pop_front();
      if (message.bytes.size() > recv.buffer.size()) {
        recv.request->complete(Status{Errc::invalid_argument, "loop: message of " + std::to_string(message.bytes.size()) +
                                                                  " bytes exceeds the posted buffer of " +
                                                                  std::to_string(recv.buffer.size()) + " bytes"},
                               0);
        close_locked(Status{Errc::connection, "loop: connection closed after an oversize message"});
        return;
      }
      if (!message.bytes.empty()) std::memcpy(recv.buffer.data(), message.bytes.data(), message.bytes.size());
      recv.request->complete(Status::success(), message.bytes.size());
    }
  }
};

class LoopRecvRequest final : public BasicRequest {
 public:
  LoopRecvRequest(std::shared_ptr<Link> link, int side) : link_(std::move(link)), side_(side) {}

 protected:
  void progress() override {
    std::lock_guard lock(link_->mutex);
    link_->pump_locked(side_);
  }
  std::chrono::milliseconds progress_interval() const override { return std::chrono::milliseconds(1); }

 private:
  std::shared_ptr<Link> link_;
  int side_;
};

class LoopConnection final : public Connection {
 public:
  LoopConnection(std::shared_ptr<Link> link, int side, std::string peer)
      : link_(std::move(link)), side_(side), peer_(std::move(peer)) {}
  ~LoopConnection() override { close(); }

  std::shared_ptr<Request> post_send(std::span<const std::byte> message, MemoryRegion*) override {
    if (message.size() > link_->max_message) {
      throw Error(Errc::invalid_argument, "loop: message of " + std::to_string(message.size()) +
                                              " bytes exceeds max_message_bytes " + std::to_string(link_->max_message));
    }
    auto request = std::make_shared<BasicRequest>();
    std::lock_guard lock(link_->mutex);
    if (link_->closed) {
      request->complete(link_->failure, 0);
      return request;
    }
    int other = 1 - side_;
    Fault fault;
    if (link_->hooks[side_]) fault = link_->hooks[side_]->on_send(link_->sent[side_], message);
    link_->sent[side_]++;
    Link::Message copy{std::vector<std::byte>(message.begin(), message.end()), Clock::now()};
    // Ordering holds even when delayed: a later message never overtakes an earlier one.
    if (!link_->inbox[other].empty()) copy.deliver_at = std::max(copy.deliver_at, link_->inbox[other].back().deliver_at);
    switch (fault.kind) {
      case Fault::Kind::deliver:
        break;
      case Fault::Kind::drop:
        request->complete(Status::success(), message.size());
        return request;
      case Fault::Kind::delay:
        copy.deliver_at += fault.delay;
        break;
      case Fault::Kind::corrupt:
        if (!copy.bytes.empty()) copy.bytes[fault.offset % copy.bytes.size()] ^= std::byte{0x5a};
        break;
      case Fault::Kind::truncate:
        copy.bytes.resize(std::min(fault.offset, copy.bytes.size()));
        break;
      case Fault::Kind::close:
        link_->close_locked(Status{Errc::connection, "loop: link closed by fault injection"});
        request->complete(link_->failure, 0);
        return request;
    }
    link_->inbox[other].push_back(std::move(copy));
    link_->pump_locked(other);
    request->complete(Status::success(), message.size());
    return request;
  }

  std::shared_ptr<Request> post_recv(std::span<std::byte> buffer, MemoryRegion*) override {
    auto request = std::make_shared<LoopRecvRequest>(link_, side_);
    std::weak_ptr<Link> weak_link = link_;
    std::weak_ptr<BasicRequest> weak_request = request;
    int side = side_;
    request->set_cancel_hook([weak_link, weak_request, side] {
      auto link = weak_link.lock();
      auto r = weak_request.lock();
      if (!link || !r) return;
      std::lock_guard lock(link->mutex);
      auto& queue = link->posted[side];
      auto it = std::find_if(queue.begin(), queue.end(), [&](const Link::PostedRecv& p) { return p.request == r; });
      if (it != queue.end()) {
        queue.erase(it);
        r->complete(Status{Errc::cancelled, "request cancelled"}, 0);
      }
    });
    std::lock_guard lock(link_->mutex);
    if (link_->closed) {
      request->complete(link_->failure, 0);
      return request;
    }
    link_->posted[side_].push_back(Link::PostedRecv{request, buffer});
    link_->pump_locked(side_);
    return request;
  }

  void close() override {
    std::lock_guard lock(link_->mutex);
    link_->close_locked(Status{Errc::connection, "loop: connection closed"});
  }

  std::string peer() const override { return peer_; }

  void set_hook(std::shared_ptr<FaultHook> hook) {
    std::lock_guard lock(link_->mutex);
    link_->hooks[side_] = std::move(hook);
  }

 private:
  std::shared_ptr<Link> link_;
  int side_;
  std::string peer_;
};

// A listening name: pending connections wait here for accept().
struct Endpoint {
  std::mutex mutex;
  std::condition_variable ready_cv;
  std::deque<std::unique_ptr<Connection>> ready;
  std::string secret;
  size_t max_message = 0;
  bool closed = false;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<std::string, std::weak_ptr<Endpoint>>& registry() {
  static std::map<std::string, std::weak_ptr<Endpoint>> names;
  return names;
}

class LoopListener final : public Listener {
 public:
  LoopListener(std::shared_ptr<Endpoint> endpoint, Url url) : endpoint_(std::move(endpoint)), url_(std::move(url)) {}
  ~LoopListener() override { close(); }

  std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(endpoint_->mutex);
    if (endpoint_->closed) throw Error(Errc::state, "loop: accept on a closed listener " + url_.str());
    endpoint_->ready_cv.wait_for(lock, timeout, [this] { return !endpoint_->ready.empty() || endpoint_->closed; });
    if (endpoint_->ready.empty()) return nullptr;
    auto connection = std::move(endpoint_->ready.front());
    endpoint_->ready.pop_front();
    return connection;
  }

  Url local_url() const override { return url_; }

  void close() override {
    {
      std::lock_guard lock(registry_mutex());
      auto it = registry().find(url_.host);
      if (it != registry().end() && it->second.lock() == endpoint_) registry().erase(it);
    }
    std::lock_guard lock(endpoint_->mutex);
    endpoint_->closed = true;
    endpoint_->ready.clear();
    endpoint_->ready_cv.notify_all();
  }

 private:
  std::shared_ptr<Endpoint> endpoint_;
  Url url_;
};

class LoopTransport final : public Transport {
 public:
  explicit LoopTransport(const TransportOptions& options) : options_(options) {}

  std::unique_ptr<Listener> listen(const Url& url) override {
    check_scheme(url);
    auto endpoint = std::make_shared<Endpoint>();
    endpoint->secret = options_.secret;
    endpoint->max_message = options_.max_message_bytes;
    std::lock_guard lock(registry_mutex());
    auto& slot = registry()[url.host];
    if (slot.lock()) throw Error(Errc::io, "loop: name '" + url.host + "' is already listening");
    slot = endpoint;
    return std::make_unique<LoopListener>(endpoint, url);
  }

  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds) override {
    check_scheme(url);
    std::shared_ptr<Endpoint> endpoint;
    {
      std::lock_guard lock(registry_mutex());
      auto it = registry().find(url.host);
      if (it != registry().end()) endpoint = it->second.lock();
    }
    if (!endpoint) throw Error(Errc::connection, "loop: nothing listens on " + url.str());
    std::lock_guard lock(endpoint->mutex);
    if (endpoint->closed) throw Error(Errc::connection, "loop: " + url.str() + " stopped listening");
    // The same three messages the network backends exchange, run in-process.
    auth::ClientHandshake client(options_.secret);
    auth::ServerHandshake server(endpoint->secret);
    auto challenge = server.challenge(client.hello());
    auto proof = client.answer(challenge);  // throws Errc::auth on a secret mismatch
    server.verify(proof);
    auto link = std::make_shared<Link>();
    link->max_message = std::min(options_.max_message_bytes, endpoint->max_message);
    endpoint->ready.push_back(std::make_unique<LoopConnection>(link, 1, "loop://" + url.host + "#client"));
    endpoint->ready_cv.notify_one();
    return std::make_unique<LoopConnection>(link, 0, url.str());
  }

  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override {
    if (kind != MemoryKind::host) throw Error(Errc::unsupported, "loop: CUDA memory registration is not supported");
    return std::make_unique<HostRegion>(bytes);
  }

  Capabilities capabilities() const override { return Capabilities{"loop", false, false, false, options_.max_message_bytes}; }

 private:
  static void check_scheme(const Url& url) {
    if (url.scheme != "loop") throw Error(Errc::invalid_argument, "loop transport given a '" + url.full_scheme() + "' URL");
  }
  TransportOptions options_;
};

}  // namespace

void set_fault_hook(Connection& connection, std::shared_ptr<FaultHook> hook) {
  auto* loop = dynamic_cast<LoopConnection*>(&connection);
  if (loop == nullptr) throw Error(Errc::invalid_argument, "set_fault_hook: not a loopback connection");
  loop->set_hook(std::move(hook));
}

}  // namespace deltacast::transport::loopback

namespace deltacast::transport {

std::unique_ptr<Transport> make_loopback_transport(const TransportOptions& options) {
  return std::make_unique<loopback::LoopTransport>(options);
}

}  // namespace deltacast::transport
