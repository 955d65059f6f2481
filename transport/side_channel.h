#pragma once
// The side channel: a plain TCP socket that the ofi and ucx backends open next to their fabric
// endpoint. It carries, in this order,
//   1. the auth handshake of transport/auth.h (HELLO, CHALLENGE, PROOF), before anything else;
//   2. one length-prefixed "setup blob" each way (fabric address / UCX worker address + ids);
//   3. one READY byte from the client (its side of the fabric is wired), then
//   4. heartbeat bytes every heartbeat_interval, in both directions, until one side closes;
//   5. on an orderly close, one GOODBYE byte before the EOF: the closing side has sent its last
//      message and a FIN behind it on the fabric, so the peer drains the fabric up to that FIN
//      instead of failing at the EOF (the two sockets race: the EOF may overtake the data).
//      An EOF without GOODBYE (a killed peer) fails the connection at once.
// Why a side channel: the fabric APIs (RDM endpoints, UCX worker addresses) tell a sender nothing
// when the peer process is SIGKILLed or SIGSTOPped, and a closed peer is not signalled at all. A
// TCP socket gives EOF/RST on death and silence we can time, and lets us authenticate before any
// fabric resource is created for the peer.
// Setup calls are blocking with a deadline; the liveness part (Liveness) is polled by a progress
// thread. Not thread-safe: one owner per object.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/error.h"

namespace deltacast::transport::side {

using Clock = std::chrono::steady_clock;

// An owned file descriptor (closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  int get() const { return fd_; }
  int release() { int fd = fd_; fd_ = -1; return fd; }
  void reset();
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// A listening TCP socket. Throws Errc::io when the address can not be bound,
// Errc::invalid_argument when `host` is not a numeric IPv4/IPv6 address or resolvable name.
class SideListener {
 public:
  SideListener(const std::string& host, uint16_t port);
  uint16_t port() const { return port_; }
  // Accepts one raw socket, or returns an empty Fd when `deadline` passes first.
  Fd accept_until(Clock::time_point deadline);
  void close() { fd_.reset(); }

 private:
  Fd fd_;
  uint16_t port_ = 0;
};

// Connects to host:port. Throws Errc::connection (refused / unreachable), Errc::timeout.
Fd connect_until(const std::string& host, uint16_t port, Clock::time_point deadline);

// Runs the client / server side of the auth handshake. Throws Errc::auth on a secret mismatch,
// Errc::connection when the peer hangs up, Errc::timeout at the deadline.
void client_handshake(int fd, const std::string& secret, Clock::time_point deadline);
// connect_until, then client_handshake: a side channel to host:port whose peer proved the secret.
Fd connect_authenticated(const std::string& host, uint16_t port, const std::string& secret,
                         Clock::time_point deadline);
void server_handshake(int fd, const std::string& secret, Clock::time_point deadline);

// Length-prefixed blob exchange (u32 little-endian length). recv_blob refuses lengths above
// `max_bytes` (Errc::corrupt_frame) so a peer can not make us allocate at will.
void send_blob(int fd, std::span<const std::byte> blob, Clock::time_point deadline);
std::vector<std::byte> recv_blob(int fd, size_t max_bytes, Clock::time_point deadline);
// Step 2 of the side channel, both roles in one call: sends our setup blob and returns the
// peer's (at most `max_bytes`); the client sends first, the server receives first. Throws as
// send_blob / recv_blob.
std::vector<std::byte> exchange_setup_blobs(int fd, bool is_server, std::span<const std::byte> mine, size_t max_bytes,
                                            Clock::time_point deadline);
// Step 3: the client writes the READY byte (its side of the fabric is wired), the server reads it.
// Throws Errc::connection when the peer hangs up, Errc::timeout at the deadline.
void exchange_ready(int fd, bool is_server, Clock::time_point deadline);
void write_exact(int fd, std::span<const std::byte> bytes, Clock::time_point deadline);
void read_exact(int fd, std::span<std::byte> bytes, Clock::time_point deadline);

// The heartbeat half of an established side channel. poll() reads whatever arrived, sends a
// heartbeat when one is due and reports the peer as dead (Errc::connection) on EOF, a socket
// error or silence longer than peer_timeout; after such a failure peer_said_goodbye() tells an
// orderly close (GOODBYE came before the EOF) from a death. Owned by one progress thread.
class Liveness {
 public:
  Liveness(Fd fd, std::chrono::milliseconds heartbeat_interval, std::chrono::milliseconds peer_timeout);
  Status poll(Clock::time_point now);
  int fd() const { return fd_.get(); }
  // True once the peer's GOODBYE byte was read: its EOF is an orderly close.
  bool peer_said_goodbye() const { return peer_said_goodbye_; }
  // Sends the GOODBYE byte (best effort, never blocks): call it just before shutdown() on an
  // orderly close, once everything sent on the fabric, FIN included, has left.
  void say_goodbye();
  // Closes the socket: the peer sees EOF at once.
  void shutdown() { fd_.reset(); }

 private:
  Fd fd_;
  std::chrono::milliseconds heartbeat_interval_;
  std::chrono::milliseconds peer_timeout_;
  Clock::time_point last_heard_;
  Clock::time_point last_sent_;
  bool peer_said_goodbye_ = false;
};

// "host:port" of the peer of a connected socket, for logs.
std::string peer_address(int fd);

}  // namespace deltacast::transport::side
