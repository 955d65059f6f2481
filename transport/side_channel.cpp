#include "transport/side_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/auth.h"
#include "util/bytes.h"

namespace deltacast::transport::side {
namespace {

constexpr std::byte kHeartbeat{'H'};
constexpr std::byte kGoodbye{'F'};

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<long long>(left, 1'000'000));
}

// Waits until fd is ready for `events`; throws Errc::timeout at the deadline.
void wait_ready(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return;
    if (n == 0) throw Error(Errc::timeout, std::string("side channel: timed out during ") + what);
    if (errno != EINTR) throw Error(Errc::connection, errno_text("side channel poll"));
  }
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

addrinfo* resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) throw Error(Errc::invalid_argument, "cannot resolve '" + host + "': " + gai_strerror(rc));
  return result;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

SideListener::SideListener(const std::string& host, uint16_t port) {
  addrinfo* list = resolve(host, port, true);
  std::string last_error = "no address";
  for (addrinfo* ai = list; ai != nullptr && !fd_; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0));
    if (!fd) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
      last_error = errno_text("bind/listen");
      continue;
    }
    fd_ = std::move(fd);
  }
  ::freeaddrinfo(list);
  if (!fd_) throw Error(Errc::io, "cannot listen on " + host + ":" + std::to_string(port) + ": " + last_error);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  set_nonblocking(fd_.get());
}

Fd SideListener::accept_until(Clock::time_point deadline) {
  for (;;) {
    if (!fd_) throw Error(Errc::state, "side channel listener is closed");
    pollfd p{fd_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n == 0) return Fd{};
    if (n < 0 && errno != EINTR) throw Error(Errc::io, errno_text("poll on listener"));
    Fd fd(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd) {
      set_nodelay(fd.get());
      return fd;
    }
    if (Clock::now() >= deadline) return Fd{};
  }
}

Fd connect_until(const std::string& host, uint16_t port, Clock::time_point deadline) {
  addrinfo* list = resolve(host, port, false);
  std::string last_error = "no address";
  Fd connected;
  for (addrinfo* ai = list; ai != nullptr && !connected; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) continue;
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last_error = errno_text("connect");
        continue;
      }
      pollfd p{fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) <= 0) {
        ::freeaddrinfo(list);
        throw Error(Errc::timeout, "connect to " + host + ":" + std::to_string(port) + " timed out");
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last_error = std::string("connect: ") + std::strerror(err);
        continue;
      }
    }
    connected = std::move(fd);
  }
  ::freeaddrinfo(list);
  if (!connected) throw Error(Errc::connection, "cannot connect to " + host + ":" + std::to_string(port) + ": " + last_error);
  set_nodelay(connected.get());
  return connected;
}

void write_exact(int fd, std::span<const std::byte> bytes, Clock::time_point deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_ready(fd, POLLOUT, deadline, "send");
    } else {
      throw Error(Errc::connection, errno_text("side channel send"));
    }
  }
}

void read_exact(int fd, std::span<std::byte> bytes, Clock::time_point deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::recv(fd, bytes.data() + done, bytes.size() - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      throw Error(Errc::connection, "side channel: peer closed during setup");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      wait_ready(fd, POLLIN, deadline, "receive");
    } else {
      throw Error(Errc::connection, errno_text("side channel recv"));
    }
  }
}

Fd connect_authenticated(const std::string& host, uint16_t port, const std::string& secret,
                         Clock::time_point deadline) {
  Fd fd = connect_until(host, port, deadline);
  client_handshake(fd.get(), secret, deadline);
  return fd;
}

void client_handshake(int fd, const std::string& secret, Clock::time_point deadline) {
  auth::ClientHandshake handshake(secret);
  auto hello = handshake.hello();
  write_exact(fd, hello, deadline);
  auth::Challenge challenge{};
  try {
    read_exact(fd, challenge, deadline);
  } catch (const Error& e) {
    // A server that drops us right after HELLO is one that refused our magic or us.
    if (e.code() == Errc::connection) throw Error(Errc::auth, std::string("server refused the handshake: ") + e.what());
    throw;
  }
  auto proof = handshake.answer(challenge);  // throws Errc::auth before we prove anything
  write_exact(fd, proof, deadline);
  // The server answers one byte after checking our proof, so a refused client learns it here
  // instead of at its first message.
  std::byte verdict{};
  try {
    read_exact(fd, std::span(&verdict, 1), deadline);
  } catch (const Error& e) {
    if (e.code() == Errc::connection) throw Error(Errc::auth, "server refused our proof of the shared secret");
    throw;
  }
  if (verdict != std::byte{'A'}) throw Error(Errc::auth, "server refused our proof of the shared secret");
}

void server_handshake(int fd, const std::string& secret, Clock::time_point deadline) {
  auth::ServerHandshake handshake(secret);
  auth::Hello hello{};
  read_exact(fd, hello, deadline);
  auto challenge = handshake.challenge(hello);
  write_exact(fd, challenge, deadline);
  auth::Proof proof{};
  read_exact(fd, proof, deadline);
  handshake.verify(proof);
  std::byte accepted{'A'};
  write_exact(fd, std::span(&accepted, 1), deadline);
}

void send_blob(int fd, std::span<const std::byte> blob, Clock::time_point deadline) {
  std::byte header[4];
  store_le<uint32_t>(header, static_cast<uint32_t>(blob.size()));
  write_exact(fd, header, deadline);
  write_exact(fd, blob, deadline);
}

std::vector<std::byte> recv_blob(int fd, size_t max_bytes, Clock::time_point deadline) {
  std::byte header[4];
  read_exact(fd, header, deadline);
  const uint32_t n = load_le<uint32_t>(header);
  if (n > max_bytes) {
    throw Error(Errc::corrupt_frame, "side channel: setup blob of " + std::to_string(n) + " bytes exceeds " + std::to_string(max_bytes));
  }
  std::vector<std::byte> blob(n);
  read_exact(fd, blob, deadline);
  return blob;
}

std::vector<std::byte> exchange_setup_blobs(int fd, bool is_server, std::span<const std::byte> mine, size_t max_bytes,
                                            Clock::time_point deadline) {
  std::vector<std::byte> theirs;
  if (is_server) {
    theirs = recv_blob(fd, max_bytes, deadline);
    send_blob(fd, mine, deadline);
  } else {
    send_blob(fd, mine, deadline);
    theirs = recv_blob(fd, max_bytes, deadline);
  }
  return theirs;
}

void exchange_ready(int fd, bool is_server, Clock::time_point deadline) {
  std::byte ready{'R'};
  if (is_server) {
    read_exact(fd, std::span(&ready, 1), deadline);
  } else {
    write_exact(fd, std::span(&ready, 1), deadline);
  }
}

Liveness::Liveness(Fd fd, std::chrono::milliseconds heartbeat_interval, std::chrono::milliseconds peer_timeout)
    : fd_(std::move(fd)), heartbeat_interval_(heartbeat_interval), peer_timeout_(peer_timeout),
      last_heard_(Clock::now()), last_sent_(Clock::now()) {
  set_nonblocking(fd_.get());
}

Status Liveness::poll(Clock::time_point now) {
  if (!fd_) return Status{Errc::connection, "connection closed"};
  std::byte sink[256];
  for (;;) {
    ssize_t n = ::recv(fd_.get(), sink, sizeof sink, MSG_DONTWAIT);
    if (n > 0) {
      last_heard_ = now;
      if (std::find(sink, sink + n, kGoodbye) != sink + n) peer_said_goodbye_ = true;
      continue;
    }
    if (n == 0) return Status{Errc::connection, "peer closed the connection"};
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    if (errno == EINTR) continue;
    return Status{Errc::connection, errno_text("peer connection failed")};
  }
  if (now - last_heard_ > peer_timeout_) {
    return Status{Errc::connection, "peer silent for more than " + std::to_string(peer_timeout_.count()) + " ms"};
  }
  if (now - last_sent_ >= heartbeat_interval_) {
    ssize_t n = ::send(fd_.get(), &kHeartbeat, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return Status{Errc::connection, errno_text("heartbeat to peer failed")};
    }
    last_sent_ = now;
  }
  return Status::success();
}

void Liveness::say_goodbye() {
  // One byte into a socket that carries a heartbeat a second: its send buffer has room.
  if (fd_) ::send(fd_.get(), &kGoodbye, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict for `"[" + std::string(host)`
  // (an overlap of 2^63 bytes inside char_traits::copy, GCC bug 105651).
  std::string out;
  if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    out.append("[").append(host).append("]:").append(std::to_string(ntohs(a->sin6_port)));
    return out;
  }
  auto* a = reinterpret_cast<sockaddr_in*>(&addr);
  ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  out.append(host).append(":").append(std::to_string(ntohs(a->sin_port)));
  return out;
}

}  // namespace deltacast::transport::side
