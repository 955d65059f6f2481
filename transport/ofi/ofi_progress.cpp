// The libfabric engine's progress thread: it reads every connection's CQ and retries its
// backlog, checks the side channels' liveness, and decides how to wait for more (spin, a sleep in
// poll() on the CQs' wait fds, or the condition variable that posts and new connections notify).
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <rdma/fi_eq.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "transport/ofi/ofi_engine.h"

namespace deltacast::transport::ofi {

using namespace std::chrono_literals;
using side::Clock;

// Spins while requests are pending (manual-progress providers move data only inside
// fi_cq_read, so a sleeping thread stalls the transfer), and once nothing has completed for a
// while sleeps in poll() on the CQs' wait fds (fi_trywait first: the provider's sockets are in
// them, so data arriving ends the sleep at once), 5 ms at a time for the liveness checks; sleeps
// on the condition variable between heartbeats when idle. "A while" adapts to the transfer: 4x the
// last gap between completions (2..50 ms), so a stream of large messages (8 MiB at ~2 GB/s
// completes every ~4 ms) is never slept through. Before the poll() sleep, a receive posted for a
// message that did not come made the thread wake every 100 us and read every CQ: 8 processes of a
// tree on 2 cores spent both cores on it, and their listeners' handshakes timed out
// (bench/recovery/chaos.py's ofi+tcp trials took 20-90 s, the same on tcp 2-10 s).
void OfiTransport::progress_loop() {
  constexpr std::chrono::microseconds kMinSpin = 2ms;
  constexpr std::chrono::microseconds kMaxSpin = 50ms;
  auto last_activity = Clock::now();
  auto last_liveness = Clock::now();
  std::chrono::microseconds spin_window = kMinSpin;
  std::unique_lock lock(mutex_);
  while (!stop_) {
    bool pending = false;
    bool progressed = false;
    auto now = Clock::now();
    bool check_liveness = now - last_liveness >= 2ms;
    for (auto& conn : conns_) {
      if (conn->broken) continue;
      size_t before = conn->ops.size();
      drive(*conn);
      retry_backlog(*conn);
      progressed = progressed || conn->ops.size() != before;
      if (check_liveness) {
        Status alive = conn->check_alive(now, conn->has_pending());
        if (!alive.ok()) fail(*conn, alive);
      }
      pending = pending || conn->has_pending();
    }
    if (progressed) {
      auto gap = std::chrono::duration_cast<std::chrono::microseconds>(now - last_activity);
      spin_window = std::clamp<std::chrono::microseconds>(4 * gap, kMinSpin, kMaxSpin);
      last_activity = now;
    }
    if (check_liveness) last_liveness = now;
    if (!pending) {
      auto slice = std::max<std::chrono::milliseconds>(
          std::min<std::chrono::milliseconds>(options_.heartbeat_interval / 2, 50ms), 1ms);
      if (!sleep_in_poll(lock, slice)) wake_.wait_for(lock, slice);
      last_activity = Clock::now();
      spin_window = kMinSpin;
    } else if (now - last_activity > spin_window) {
      if (!sleep_in_poll(lock, 5ms)) {
        lock.unlock();
        std::this_thread::sleep_for(100us);
        lock.lock();
      }
    } else {
      lock.unlock();
      sched_yield();
      lock.lock();
    }
  }
}

bool OfiTransport::sleep_in_poll(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout) {
  if (!poll_ok_) return false;
  std::vector<fid*> fids;
  std::vector<pollfd> fds;
  for (const auto& conn : conns_) {
    if (conn->broken) continue;
    if (conn->cq_fd < 0) return false;
    fids.push_back(&conn->cq->fid);
    fds.push_back(pollfd{conn->cq_fd, POLLIN, 0});
  }
  if (fids.empty()) return false;
  const int rc = fi_trywait(fabric_, fids.data(), static_cast<int>(fids.size()));
  if (rc == -FI_EAGAIN) return true;  // something to read now: no sleep
  if (rc != 0) {
    poll_ok_ = false;
    log_->info("ofi+{}: fi_trywait failed ({}): the progress thread polls its CQs instead of sleeping on them",
               provider_, fi_text(rc));
    return false;
  }
  fds.push_back(pollfd{wake_fd_.get(), POLLIN, 0});
  in_poll_ = true;
  lock.unlock();
  ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  lock.lock();
  in_poll_ = false;
  uint64_t count = 0;
  while (::read(wake_fd_.get(), &count, sizeof count) > 0) {
  }
  return true;
}

void OfiTransport::wake() {
  wake_.notify_all();
  if (in_poll_) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_.get(), &one, sizeof one);
  }
}

}  // namespace deltacast::transport::ofi
