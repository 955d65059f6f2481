#include "transport/paced/paced_transport.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "transport/paced/token_bucket.h"

namespace deltacast::transport {
namespace {

using Clock = std::chrono::steady_clock;

// The caller's view of a paced send: queued until the pacer posts it, then the backend's request.
class PacedRequest : public Request {
 public:
  // Hands over the backend's request once posted. Returns false when the send was withdrawn first.
  bool posted(std::shared_ptr<Request> inner) {
    std::lock_guard lock(mutex_);
    if (early_) return false;
    inner_ = std::move(inner);
    cv_.notify_all();
    return true;
  }
  // Finishes a send that was never posted (withdrawn, or its connection closed).
  void finish_unposted(Status status) {
    std::lock_guard lock(mutex_);
    if (inner_ || early_) return;
    early_ = std::move(status);
    cv_.notify_all();
  }
  bool withdrawn() const {
    std::lock_guard lock(mutex_);
    return early_.has_value();
  }

  bool test() override {
    auto inner = current();
    if (inner) return inner->test();
    return withdrawn();
  }
  Status wait(std::chrono::milliseconds timeout) override {
    timeout = std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 365)));
    const auto deadline = Clock::now() + timeout;
    std::shared_ptr<Request> inner;
    {
      std::unique_lock lock(mutex_);
      cv_.wait_until(lock, deadline, [&] { return inner_ || early_; });
      if (early_) return *early_;
      if (!inner_)
        return Status{Errc::timeout,
                      "send still waiting for the egress limit after " + std::to_string(timeout.count()) + " ms"};
      inner = inner_;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return inner->wait(std::max(left, std::chrono::milliseconds(0)));
  }
  void cancel() override {
    auto inner = current();
    if (inner) {
      inner->cancel();
      return;
    }
    finish_unposted(Status{Errc::cancelled, "send withdrawn before the egress limit let it start"});
  }
  Status status() override {
    std::lock_guard lock(mutex_);
    if (early_) return *early_;
    if (inner_) return inner_->status();
    return Status{Errc::state, "pending"};
  }
  size_t bytes() override {
    auto inner = current();
    return inner ? inner->bytes() : 0;
  }

 private:
  std::shared_ptr<Request> current() const {
    std::lock_guard lock(mutex_);
    return inner_;
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::shared_ptr<Request> inner_;
  std::optional<Status> early_;
};

// The shared bucket, the sends that may not start yet, and the thread that posts them. Each
// connection's sends wait in its own FIFO (their order, and that of writes before later sends, is
// kept); the connections with sends waiting take turns, one message each, as flows sharing one
// link do: a small control message is not held behind another connection's megabytes of chunks
// (a part rank's GROUP_SENT behind its part, a producer's EPOCH behind a chunk window).
class Pacer {
 public:
  Pacer(double rate, double burst) : bucket_(rate, burst, Clock::now()) {
    thread_ = std::thread([this] { run(); });
  }
  ~Pacer() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      for (auto& [owner, queue] : queues_)
        for (auto& item : queue) item.request->finish_unposted(Status{Errc::connection, "transport destroyed"});
      queues_.clear();
      turns_.clear();
    }
    cv_.notify_all();
    thread_.join();
  }

  // Posts now when nothing waits and the bucket allows; otherwise queues. `post` calls the backend.
  std::shared_ptr<Request> submit(const void* owner, size_t bytes, std::function<std::shared_ptr<Request>()> post) {
    std::unique_lock lock(mutex_);
    const auto now = Clock::now();
    if (turns_.empty() && bucket_.ready_at(bytes, now) <= now) {
      bucket_.take(bytes, now);
      return post();  // under the lock: keeps the order of posts (backends' posts do not block)
    }
    auto request = std::make_shared<PacedRequest>();
    auto& queue = queues_[owner];
    if (queue.empty()) turns_.push_back(owner);
    queue.push_back(Item{bytes, std::move(post), request});
    cv_.notify_all();
    return request;
  }

  // Finishes every queued send of `owner` with `status` (its connection closed).
  void drop(const void* owner, const Status& status) {
    std::lock_guard lock(mutex_);
    auto it = queues_.find(owner);
    if (it == queues_.end()) return;
    for (auto& item : it->second) item.request->finish_unposted(status);
    queues_.erase(it);
    std::erase(turns_, owner);
  }

 private:
  struct Item {
    size_t bytes;
    std::function<std::shared_ptr<Request>()> post;
    std::shared_ptr<PacedRequest> request;
  };

  // The queue whose turn it is, with withdrawn sends removed from the fronts; nullptr when none.
  std::deque<Item>* next_queue() {
    while (!turns_.empty()) {
      auto it = queues_.find(turns_.front());
      auto& queue = it->second;
      while (!queue.empty() && queue.front().request->withdrawn()) queue.pop_front();
      if (!queue.empty()) return &queue;
      queues_.erase(it);
      turns_.pop_front();
    }
    return nullptr;
  }

  void run() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      auto* queue = next_queue();
      if (queue == nullptr) {
        cv_.wait(lock);
        continue;
      }
      const auto now = Clock::now();
      const auto at = bucket_.ready_at(queue->front().bytes, now);
      if (at > now) {
        cv_.wait_until(lock, at);
        continue;
      }
      Item item = std::move(queue->front());
      queue->pop_front();
      // Its turn is over: to the back of the line while it has more, out of it when it has none.
      const void* owner = turns_.front();
      turns_.pop_front();
      if (queue->empty())
        queues_.erase(owner);
      else
        turns_.push_back(owner);
      bucket_.take(item.bytes, now);
      std::shared_ptr<Request> inner;
      try {
        inner = item.post();
      } catch (const Error& e) {
        item.request->finish_unposted(Status{e.code(), e.what()});
        continue;
      }
      if (!item.request->posted(inner)) inner->cancel();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  TokenBucket bucket_;
  std::unordered_map<const void*, std::deque<Item>> queues_;  // a connection's waiting sends, in order
  std::deque<const void*> turns_;  // the connections with sends waiting, whose turn is next first
  bool stop_ = false;
  std::thread thread_;
};

class PacedConnection : public Connection {
 public:
  PacedConnection(std::unique_ptr<Connection> inner, std::shared_ptr<Pacer> pacer)
      : inner_(std::move(inner)), pacer_(std::move(pacer)) {}
  ~PacedConnection() override { pacer_->drop(this, Status{Errc::connection, "connection destroyed"}); }

  std::shared_ptr<Request> post_send(std::span<const std::byte> message, MemoryRegion* mr) override {
    Connection* inner = inner_.get();
    return pacer_->submit(this, message.size(), [inner, message, mr] { return inner->post_send(message, mr); });
  }
  std::shared_ptr<Request> post_recv(std::span<std::byte> buffer, MemoryRegion* mr) override {
    return inner_->post_recv(buffer, mr);
  }
  std::shared_ptr<Request> post_write(std::span<const std::byte> local, MemoryRegion* local_mr,
                                      const RemoteBuffer& remote) override {
    Connection* inner = inner_.get();
    return pacer_->submit(this, local.size(),
                          [inner, local, local_mr, remote] { return inner->post_write(local, local_mr, remote); });
  }
  void close() override {
    pacer_->drop(this, Status{Errc::connection, "connection closed"});
    inner_->close();
  }
  void abort() override {
    pacer_->drop(this, Status{Errc::connection, "connection aborted"});
    inner_->abort();
  }
  std::string peer() const override { return inner_->peer(); }

 private:
  std::unique_ptr<Connection> inner_;
  std::shared_ptr<Pacer> pacer_;
};

class PacedListener : public Listener {
 public:
  PacedListener(std::unique_ptr<Listener> inner, std::shared_ptr<Pacer> pacer)
      : inner_(std::move(inner)), pacer_(std::move(pacer)) {}
  std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) override {
    auto connection = inner_->accept(timeout);
    if (!connection) return nullptr;
    return std::make_unique<PacedConnection>(std::move(connection), pacer_);
  }
  Url local_url() const override { return inner_->local_url(); }
  void close() override { inner_->close(); }

 private:
  std::unique_ptr<Listener> inner_;
  std::shared_ptr<Pacer> pacer_;
};

class PacedTransport : public Transport {
 public:
  PacedTransport(std::unique_ptr<Transport> inner, double rate, double burst)
      : inner_(std::move(inner)), pacer_(std::make_shared<Pacer>(rate, burst)) {}
  std::unique_ptr<Listener> listen(const Url& url) override {
    return std::make_unique<PacedListener>(inner_->listen(url), pacer_);
  }
  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) override {
    return std::make_unique<PacedConnection>(inner_->connect(url, timeout), pacer_);
  }
  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override {
    return inner_->register_memory(bytes, kind);
  }
  Capabilities capabilities() const override { return inner_->capabilities(); }

 private:
  // Connections and listeners hold the pacer, so it outlives them; the backend outlives both
  // because the transport must outlive what it made (transport.h).
  std::unique_ptr<Transport> inner_;
  std::shared_ptr<Pacer> pacer_;
};

}  // namespace

std::unique_ptr<Transport> make_paced_transport(std::unique_ptr<Transport> inner, const TransportOptions& options) {
  if (options.egress_bytes_per_second == 0) throw Error(Errc::invalid_argument, "an egress limit needs a rate above 0");
  const uint64_t burst = options.egress_burst_bytes > 0 ? options.egress_burst_bytes
                                                        : default_egress_burst(options.egress_bytes_per_second);
  return std::make_unique<PacedTransport>(std::move(inner), static_cast<double>(options.egress_bytes_per_second),
                                          static_cast<double>(burst));
}

}  // namespace deltacast::transport
