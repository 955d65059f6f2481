#pragma once
// A token bucket for egress pacing: `rate` bytes per second accrue up to `burst` bytes.
// A message of n bytes may start once the bucket holds min(n, burst) tokens; starting it takes n
// (the bucket may go negative for a message larger than the burst, and refills from there). Over
// any interval T the bytes started are at most burst + rate * T + one message beyond the burst.
// Not thread-safe: the pacer holds its lock around every call.
#include <algorithm>
#include <chrono>
#include <cstdint>

namespace deltacast::transport {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  // rate > 0 bytes per second; burst > 0 bytes. Starts full at `now`.
  TokenBucket(double rate, double burst, Clock::time_point now)
      : rate_(rate), burst_(burst), tokens_(burst), at_(now) {}

  // When a message of `bytes` may start (now or later; never before `now`).
  Clock::time_point ready_at(uint64_t bytes, Clock::time_point now) {
    refill(now);
    const double need = std::min(static_cast<double>(bytes), burst_);
    if (tokens_ >= need) return now;
    const double seconds = (need - tokens_) / rate_;
    return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)) +
           Clock::duration(1);
  }

  // Takes `bytes` tokens at `now` (call once ready_at(bytes, now) <= now).
  void take(uint64_t bytes, Clock::time_point now) {
    refill(now);
    tokens_ -= static_cast<double>(bytes);
  }

  double tokens() const { return tokens_; }
  double rate() const { return rate_; }
  double burst() const { return burst_; }

 private:
  void refill(Clock::time_point now) {
    if (now <= at_) return;
    tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - at_).count());
    at_ = now;
  }

  double rate_;
  double burst_;
  double tokens_;
  Clock::time_point at_;
};

// The burst a limit gets when none is configured: 10 ms at the rate, at least 64 KiB.
inline uint64_t default_egress_burst(uint64_t bytes_per_second) {
  return std::max<uint64_t>(64 * 1024, bytes_per_second / 100);
}

}  // namespace deltacast::transport
