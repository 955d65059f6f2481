// The libfabric engine's progress thread: it reads every connection's CQ and retries its
// backlog, checks the side channels' liveness, and decides how to wait for more (spin, short
// sleeps, or the condition variable that posts and new connections notify).
#include <sched.h>

#include <algorithm>
#include <thread>

#include "transport/ofi/ofi_engine.h"

namespace deltacast::transport::ofi {

using namespace std::chrono_literals;
using side::Clock;

// Spins while requests are pending (manual-progress providers move data only inside
// fi_cq_read, so a sleeping thread stalls the transfer), backs off to short sleeps once nothing
// has completed for a while, and sleeps on the condition variable between heartbeats when idle.
// "A while" adapts to the transfer: 4x the last gap between completions (2..50 ms), so a stream
// of large messages (8 MiB at ~2 GB/s completes every ~4 ms) is never slept through, while a
// receive posted for a message that does not come stops burning CPU after at most 50 ms.
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
      auto slice = std::min<std::chrono::milliseconds>(options_.heartbeat_interval / 2, 50ms);
      wake_.wait_for(lock, std::max<std::chrono::milliseconds>(slice, 1ms));
      last_activity = Clock::now();
      spin_window = kMinSpin;
    } else if (now - last_activity > spin_window) {
      lock.unlock();
      std::this_thread::sleep_for(100us);
      lock.lock();
    } else {
      lock.unlock();
      sched_yield();
      lock.lock();
    }
  }
}

}  // namespace deltacast::transport::ofi
