// The UCX engine's progress thread and its wakeups: ucp_worker_progress (with the deferred
// force-close of endpoints that failed inside it), liveness checks over the side channels, the
// reaping of ep close requests and of closed connections, and the sleep in epoll on the worker's
// event fd plus an eventfd that posts write.
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/ucx/ucx_engine.h"

namespace deltacast::transport::ucx {

using namespace std::chrono_literals;
using side::Clock;

unsigned UcxTransport::progress() {
  progressing_ = true;
  const unsigned events = ucp_worker_progress(worker_);
  // A forced close finishes the endpoint's requests, whose callbacks may fail more connections.
  while (!eps_to_close_.empty()) {
    const std::vector<ucp_ep_h> eps = std::move(eps_to_close_);
    eps_to_close_.clear();
    for (ucp_ep_h ep : eps) close_ep(ep);
  }
  progressing_ = false;
  return events;
}

void UcxTransport::check_connections(Clock::time_point now) {
  for (auto& conn : conns_) {
    Status alive = conn->check_alive(now, !conn->ops.empty());
    if (!alive.ok()) {
      fail(*conn, alive);
    } else if (conn->ep_failed && !conn->peer_gone() && now - conn->ep_failed_at > kEpErrorGrace) {
      fail(*conn, conn->ep_failed_status);  // no GOODBYE came: the endpoint's error stands
    }
  }
}

void UcxTransport::reap_closed_eps() {
  std::erase_if(closing_, [](void* request) {
    if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
    ucp_request_free(request);
    return true;
  });
}

void UcxTransport::setup_wakeup() {
  int worker_fd = -1;
  ucs_status_t status = ucp_worker_get_efd(worker_, &worker_fd);
  if (status != UCS_OK) throw Error(Errc::internal, "ucp_worker_get_efd: " + ucs_text(status));
  wake_fd_ = side::Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_fd_ = side::Fd(epoll_create1(EPOLL_CLOEXEC));
  if (!wake_fd_ || !epoll_fd_)
    throw Error(Errc::internal, std::string("eventfd/epoll_create1: ") + std::strerror(errno));
  for (int fd : {worker_fd, wake_fd_.get()}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      throw Error(Errc::internal, std::string("epoll_ctl: ") + std::strerror(errno));
    }
  }
}

void UcxTransport::wake() {
  if (!sleeping_) return;
  sleeping_ = false;
  uint64_t one = 1;
  // Fails only with EAGAIN when the counter is saturated, which still leaves the fd readable.
  [[maybe_unused]] ssize_t written = ::write(wake_fd_.get(), &one, sizeof one);
}

void UcxTransport::wait_for_events(std::chrono::milliseconds timeout) {
  epoll_event events[2];
  int count = epoll_wait(epoll_fd_.get(), events, 2, static_cast<int>(timeout.count()));
  for (int i = 0; i < count; ++i) {
    if (events[i].data.fd != wake_fd_.get()) continue;
    uint64_t drained = 0;
    [[maybe_unused]] ssize_t got = ::read(wake_fd_.get(), &drained, sizeof drained);
  }
}

// Spin (progress + sched_yield) while completions keep arriving: on a busy link the next event is
// microseconds away and a sleep/wake round trip would cost more. Once the link is quiet for
// kSpinWindow, arm the worker and sleep in epoll: UCX's event fd (or a post's wake()) ends the
// sleep at once. The epoll timeout only paces liveness checks and the reaping of ep close
// requests; it is 1 ms while requests are pending, a safety net should a transport not signal.
void UcxTransport::progress_loop() {
  constexpr auto kSpinWindow = 200us;
  constexpr int kMaxProgressBurst = 64;  // bounded so liveness checks still run under load
  auto last_activity = Clock::now();
  auto last_liveness = Clock::now();
  std::unique_lock lock(mutex_);
  while (!stop_) {
    int burst = 0;
    while (burst < kMaxProgressBurst && progress() != 0) ++burst;
    auto now = Clock::now();
    if (burst > 0) last_activity = now;
    if (now - last_liveness >= 2ms) {
      last_liveness = now;
      check_connections(now);
      reap_closed_eps();
      // Connections that are closed and have no UCX operation left are forgotten.
      std::erase_if(conns_, [](const std::shared_ptr<ConnState>& conn) {
        return conn->broken && conn->ops.empty() && conn.use_count() == 1;
      });
    }
    bool pending = !closing_.empty();
    for (auto& conn : conns_) pending = pending || !conn->ops.empty();
    if (pending && now - last_activity < kSpinWindow) {
      lock.unlock();
      sched_yield();
      lock.lock();
      continue;
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;  // events arrived since the last progress
    auto idle_slice = std::clamp<std::chrono::milliseconds>(options_.heartbeat_interval / 2, 1ms, 50ms);
    sleeping_ = true;
    lock.unlock();
    wait_for_events(pending ? 1ms : idle_slice);
    lock.lock();
    sleeping_ = false;
  }
}

}  // namespace deltacast::transport::ucx
