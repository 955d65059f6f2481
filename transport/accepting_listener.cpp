#include "transport/accepting_listener.h"

#include "util/log.h"

namespace deltacast::transport::side {

AcceptingListener::AcceptingListener(const Url& url, std::string secret, std::chrono::milliseconds setup_timeout,
                                     Establish establish)
    : socket_(url.host, url.port), url_(url), secret_(std::move(secret)), setup_timeout_(setup_timeout),
      establish_(std::move(establish)) {
  url_.port = socket_.port();
  thread_ = std::thread([this] { accept_loop(); });
}

AcceptingListener::~AcceptingListener() {
  close();
  std::lock_guard lock(mutex_);
  queue_.clear();
}

void AcceptingListener::accept_loop() {
  using namespace std::chrono_literals;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (closed_) return;
    }
    Fd fd = socket_.accept_until(Clock::now() + 50ms);  // short slices so close() is prompt
    if (!fd) continue;
    try {
      const auto deadline = Clock::now() + setup_timeout_;
      server_handshake(fd.get(), secret_, deadline);
      auto connection = establish_(std::move(fd), deadline);
      std::lock_guard lock(mutex_);
      if (closed_) return;
      queue_.push_back(std::move(connection));
      ready_.notify_all();
    } catch (const Error& e) {
      logger("transport")->warn("dropped an incoming connection on {}: {}: {}", url_.str(), errc_name(e.code()), e.what());
    }
  }
}

std::unique_ptr<Connection> AcceptingListener::accept(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (closed_) throw Error(Errc::state, "listener " + url_.str() + " is closed");
  ready_.wait_for(lock, timeout, [this] { return closed_ || !queue_.empty(); });
  if (queue_.empty()) {
    if (closed_) throw Error(Errc::state, "listener " + url_.str() + " is closed");
    return nullptr;
  }
  auto connection = std::move(queue_.front());
  queue_.pop_front();
  return connection;
}

void AcceptingListener::close() {
  {
    std::lock_guard lock(mutex_);
    if (closed_ && !thread_.joinable()) return;
    closed_ = true;
    ready_.notify_all();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  socket_.close();
  // Connections set up but never accepted are closed now (as the tcp backend does), not when the
  // listener is destroyed: their clients would otherwise wait on a link nobody reads, which the
  // heartbeats keep alive.
  std::deque<std::unique_ptr<Connection>> unclaimed;
  {
    std::lock_guard lock(mutex_);
    unclaimed.swap(queue_);
  }
  for (auto& connection : unclaimed) connection->close();
}

}  // namespace deltacast::transport::side
