#pragma once
// Tight protocol timeouts in tests (a peer found silent after 600 ms, a new root given 3 peer
// timeouts to join), stretched where every thread runs several times slower: scripts/test.sh
// --sanitize and scripts/tsan.sh export DELTACAST_TEST_TIME_SCALE (a factor >= 1); a normal run
// leaves it unset (1). Only durations that bound how long a healthy peer may take are scaled,
// never what a test asserts about the product's own speed.
#include <chrono>
#include <cstdint>
#include <cstdlib>

namespace deltacast::test_time {

// DELTACAST_TEST_TIME_SCALE, or 1 when unset, unparsable or below 1.
inline double scale() {
  static const double factor = [] {
    const char* text = std::getenv("DELTACAST_TEST_TIME_SCALE");
    const double value = text != nullptr ? std::strtod(text, nullptr) : 1.0;
    return value >= 1.0 ? value : 1.0;
  }();
  return factor;
}

// `d` times scale(), in milliseconds.
template <class Rep, class Period>
std::chrono::milliseconds scaled(std::chrono::duration<Rep, Period> d) {
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::chrono::duration<double, std::milli>(d).count() * scale()));
}

}  // namespace deltacast::test_time
