#include "transport/accepting_listener.h"

#include <sys/socket.h>
#include <unistd.h>

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
    reap_setups();
    {
      std::unique_lock lock(mutex_);
      if (closed_) return;
      if (setups_.size() >= kMaxSetups) {  // the rest wait in the backlog
        lock.unlock();
        std::this_thread::sleep_for(10ms);
        continue;
      }
    }
    Fd fd = socket_.accept_until(Clock::now() + 50ms);  // short slices so close() is prompt
    if (!fd) continue;
    Fd watch(::dup(fd.get()));
    if (!watch) {
      logger("transport")->warn("dropped an incoming connection on {}: dup failed", url_.str());
      continue;
    }
    std::lock_guard lock(mutex_);
    if (closed_) return;
    auto setup = setups_.insert(setups_.end(), Setup{std::move(watch), {}, false});
    setup->thread = std::thread([this, fd = std::move(fd), setup]() mutable { set_up(std::move(fd), setup); });
  }
}

void AcceptingListener::set_up(Fd fd, std::list<Setup>::iterator setup) {
  std::unique_ptr<Connection> connection;
  try {
    const auto deadline = Clock::now() + setup_timeout_;
    server_handshake(fd.get(), secret_, deadline);
    connection = establish_(std::move(fd), deadline);
  } catch (const Error& e) {
    logger("transport")
        ->warn("dropped an incoming connection on {}: {}: {}", url_.str(), errc_name(e.code()), e.what());
  } catch (const std::exception& e) {
    logger("transport")->warn("dropped an incoming connection on {}: {}", url_.str(), e.what());
  }
  std::unique_ptr<Connection> unclaimed;  // the listener closed while this peer was set up
  {
    std::lock_guard lock(mutex_);
    setup->watch.reset();
    setup->done = true;
    if (connection && closed_) {
      unclaimed = std::move(connection);
    } else if (connection) {
      queue_.push_back(std::move(connection));
      ready_.notify_all();
    }
  }
  if (unclaimed) unclaimed->close();
}

void AcceptingListener::reap_setups() {
  std::list<Setup> finished;
  {
    std::lock_guard lock(mutex_);
    for (auto it = setups_.begin(); it != setups_.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), setups_, it);
      it = next;
    }
  }
  for (auto& setup : finished) setup.thread.join();
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
  // Setups in flight end now: their sockets shut down, a handshake or an exchange waiting on the
  // peer fails at once instead of at its deadline.
  std::list<Setup> setups;
  {
    std::lock_guard lock(mutex_);
    for (auto& setup : setups_) {
      if (setup.watch) ::shutdown(setup.watch.get(), SHUT_RDWR);
    }
    setups.swap(setups_);
  }
  for (auto& setup : setups) {
    if (setup.thread.joinable() && setup.thread.get_id() != std::this_thread::get_id()) setup.thread.join();
  }
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
