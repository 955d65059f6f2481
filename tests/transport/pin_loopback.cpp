// Linked into every transport test binary: pins libfabric and UCX to the loopback interface before
// any test runs (this machine also has an eth0 they would pick). Values already set win, so a run
// can still choose, e.g., UCX_TLS=shm. Done here rather than through ctest's ENVIRONMENT property
// because gtest_discover_tests splits list-valued properties.
#include <cstdlib>

namespace {
struct PinLoopback {
  PinLoopback() {
    ::setenv("UCX_TLS", "tcp,self", 0);
    ::setenv("UCX_NET_DEVICES", "lo", 0);
    ::setenv("FI_TCP_IFACE", "lo", 0);
    ::setenv("FI_SOCKETS_IFACE", "lo", 0);
  }
} const pin_loopback;
}  // namespace
