// dc_delay_shim: a layer-2 forwarder that adds a fixed one-way delay between two interfaces of
// one network namespace. This kernel has no netem (and no fq/etf), so scripts/wan.sh puts this
// program between the trainer side and the rollout side of an emulated WAN (docs/wan.md).
//
//   dc_delay_shim [--delay-ms MS] [--delay-ms-ab MS] [--delay-ms-ba MS] [--queue-bytes N]
//                 [--stats-interval S] [--rt-priority P] IF_A IF_B
//
// Rules it keeps:
// - Every frame read on IF_A leaves on IF_B (and the reverse) no earlier than its arrival plus the
//   direction's delay, in arrival order (one FIFO per direction: never reordered). Frames are sent
//   verbatim: no parsing, so ARP, IPv4 and anything else cross alike.
// - It never re-reads what it sent: PACKET_IGNORE_OUTGOING, plus a check of sll_pkttype.
// - A direction holds at most --queue-bytes (default 64 MiB) of frames; a frame that does not fit
//   is dropped and counted (a router's tail drop), never blocks the reader.
// - Offloads must be off on both interfaces: a frame longer than the receive buffer (GRO hands
//   up to 64 KiB) is dropped and counted as truncated, with a warning naming the interface.
// - SIGTERM or SIGINT: both directions stop, frames still queued are counted as left, the
//   counters are printed on stdout, exit 0. Opening failures name the interface and the errno
//   text and exit 1; bad arguments exit 2.
// Time base: CLOCK_MONOTONIC at the moment the frame is read (after poll wakes), so a scheduling
// delay before the read adds to the delay; the counters report how late frames left.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

namespace {

std::atomic<bool> g_stop{false};

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

// One AF_PACKET raw socket bound to one interface, receiving every protocol, promiscuous.
class PacketSocket {
 public:
  explicit PacketSocket(const std::string& ifname) : name_(ifname) {
    ifindex_ = static_cast<int>(if_nametoindex(ifname.c_str()));
    if (ifindex_ == 0) fail("no such interface", errno);
    // Protocol 0 at creation: the socket receives nothing until bind() names the interface, so no
    // frame of another interface slips into its queue in between.
    fd_ = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail("socket(AF_PACKET, SOCK_RAW) failed (needs CAP_NET_RAW)", errno);
    sockaddr_ll addr{};
    addr.sll_family = AF_PACKET;
    addr.sll_protocol = htons(ETH_P_ALL);
    addr.sll_ifindex = ifindex_;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("bind failed", errno);
    const int one = 1;
    if (setsockopt(fd_, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) != 0)
      fail("setsockopt(PACKET_IGNORE_OUTGOING) failed (kernel older than 4.20?)", errno);
    packet_mreq mreq{};
    mreq.mr_ifindex = ifindex_;
    mreq.mr_type = PACKET_MR_PROMISC;
    if (setsockopt(fd_, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mreq, sizeof mreq) != 0)
      fail("setsockopt(PACKET_ADD_MEMBERSHIP, PACKET_MR_PROMISC) failed", errno);
    // Large buffers: the reader may be descheduled for a few ms on a loaded machine. FORCE needs
    // CAP_NET_ADMIN; without it the capped size is still better than the default.
    const int bytes = 16 << 20;
    if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) != 0)
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    if (setsockopt(fd_, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) != 0)
      setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  }
  ~PacketSocket() {
    if (fd_ >= 0) close(fd_);
  }
  PacketSocket(const PacketSocket&) = delete;
  PacketSocket& operator=(const PacketSocket&) = delete;

  int fd() const { return fd_; }
  const std::string& name() const { return name_; }

 private:
  [[noreturn]] void fail(const char* what, int err) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    throw std::runtime_error("interface '" + name_ + "': " + what + ": " + errno_text(err));
  }

  std::string name_;
  int ifindex_ = 0;
  int fd_ = -1;
};

// Frames of one direction in arrival order, their bytes in one ring of fixed capacity. The ring's
// occupied bytes run from the oldest frame's offset to `tail_` (wrapping once); a frame is never
// split, so the bytes after the last frame before a wrap are skipped.
class FrameQueue {
 public:
  struct Entry {
    int64_t due_ns;
    size_t offset;
    uint32_t length;
  };

  explicit FrameQueue(size_t capacity) : ring_(capacity) {}

  // Copies the frame in; false (nothing stored) when it does not fit.
  bool push(const uint8_t* data, uint32_t length, int64_t due_ns) {
    size_t at;
    if (length == 0) return true;
    if (entries_.empty()) {
      tail_ = 0;
      at = 0;
      if (length > ring_.size()) return false;
    } else {
      const size_t head = entries_.front().offset;
      if (tail_ > head) {  // not wrapped: free bytes are [tail_, end) and [0, head)
        if (length <= ring_.size() - tail_)
          at = tail_;
        else if (length < head)
          at = 0;
        else
          return false;
      } else {  // wrapped: free bytes are [tail_, head)
        if (length < head - tail_)
          at = tail_;
        else
          return false;
      }
    }
    std::memcpy(ring_.data() + at, data, length);
    entries_.push_back({due_ns, at, length});
    tail_ = at + length;
    bytes_ += length;
    return true;
  }

  bool empty() const { return entries_.empty(); }
  const Entry& front() const { return entries_.front(); }
  const uint8_t* data(const Entry& e) const { return ring_.data() + e.offset; }
  size_t size() const { return entries_.size(); }
  const Entry& at(size_t i) const { return entries_[i]; }
  void pop() {
    bytes_ -= entries_.front().length;
    entries_.pop_front();
  }
  uint64_t bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> ring_;
  std::deque<Entry> entries_;
  size_t tail_ = 0;
  uint64_t bytes_ = 0;
};

struct Counters {
  uint64_t frames_in = 0, bytes_in = 0;
  uint64_t frames_out = 0, bytes_out = 0;
  uint64_t dropped_queue_full = 0, dropped_truncated = 0, send_errors = 0;
  uint64_t max_queue_bytes = 0;
  int64_t late_max_ns = 0;
  double late_sum_ns = 0;
  int last_send_errno = 0;
};

// One direction: reads `in`, holds each frame for `delay_ns`, writes it to `out`.
class Direction {
 public:
  Direction(std::string label, PacketSocket& in, PacketSocket& out, int64_t delay_ns, size_t queue_bytes)
      : label_(std::move(label)), in_(in), out_(out), delay_ns_(delay_ns), queue_(queue_bytes) {}

  void run() {
    constexpr int kBatch = 64;
    constexpr size_t kFrameBuffer = size_t{16} * 1024;  // > a 9000-byte jumbo frame; GRO aggregates are truncated
    std::vector<uint8_t> buffers(kBatch * kFrameBuffer);
    std::vector<mmsghdr> rx(kBatch);
    std::vector<iovec> rx_iov(kBatch);
    std::vector<sockaddr_ll> rx_from(kBatch);
    std::vector<mmsghdr> tx(kBatch);
    std::vector<iovec> tx_iov(kBatch);
    bool warned_truncated = false;
    while (!g_stop.load(std::memory_order_relaxed)) {
      // Sleep until a frame arrives, the oldest queued frame is due, or 100 ms (to see g_stop).
      int64_t wait_ns = 100'000'000;
      if (!queue_.empty()) wait_ns = std::clamp<int64_t>(queue_.front().due_ns - now_ns(), 0, wait_ns);
      pollfd p{in_.fd(), POLLIN, 0};
      if (wait_ns > 0) {
        timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
        if (ppoll(&p, 1, &ts, nullptr) < 0 && errno != EINTR) throw std::runtime_error("ppoll: " + errno_text(errno));
      } else {
        p.revents = POLLIN;  // due frames to send: read what is there without waiting
      }
      if (p.revents & POLLIN) {
        for (int rounds = 0; rounds < 16; ++rounds) {  // bounded, so due frames are not starved
          for (int i = 0; i < kBatch; ++i) {
            rx_iov[i] = {buffers.data() + i * kFrameBuffer, kFrameBuffer};
            rx[i] = {};
            rx[i].msg_hdr.msg_iov = &rx_iov[i];
            rx[i].msg_hdr.msg_iovlen = 1;
            rx[i].msg_hdr.msg_name = &rx_from[i];
            rx[i].msg_hdr.msg_namelen = sizeof(sockaddr_ll);
          }
          const int n = recvmmsg(in_.fd(), rx.data(), kBatch, MSG_DONTWAIT | MSG_TRUNC, nullptr);
          if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            throw std::runtime_error("recvmmsg on '" + in_.name() + "': " + errno_text(errno));
          }
          const int64_t arrived = now_ns();
          for (int i = 0; i < n; ++i) {
            if (rx_from[i].sll_pkttype == PACKET_OUTGOING) continue;
            const uint32_t length = rx[i].msg_len;
            ++counters_.frames_in;
            counters_.bytes_in += length;
            if (length > kFrameBuffer || (rx[i].msg_hdr.msg_flags & MSG_TRUNC)) {
              ++counters_.dropped_truncated;
              if (!warned_truncated) {
                std::fprintf(stderr,
                             "dc_delay_shim: %s: a %u-byte frame exceeds %zu bytes and is dropped: turn "
                             "offloads off (ethtool -K %s gro off gso off tso off)\n",
                             in_.name().c_str(), length, kFrameBuffer, in_.name().c_str());
                warned_truncated = true;
              }
              continue;
            }
            if (!queue_.push(buffers.data() + i * kFrameBuffer, length, arrived + delay_ns_))
              ++counters_.dropped_queue_full;
          }
          counters_.max_queue_bytes = std::max(counters_.max_queue_bytes, queue_.bytes());
          if (n < kBatch) break;
        }
      }
      send_due();
    }
  }

  void print(std::FILE* f) const {
    const Counters& c = counters_;
    std::fprintf(f,
                 "%s: in %llu frames %llu bytes, out %llu frames %llu bytes, dropped %llu (queue full) + %llu "
                 "(truncated), send errors %llu%s%s, left queued %zu, max queue %llu bytes, late max %.3f ms mean "
                 "%.3f ms\n",
                 label_.c_str(), static_cast<unsigned long long>(c.frames_in),
                 static_cast<unsigned long long>(c.bytes_in), static_cast<unsigned long long>(c.frames_out),
                 static_cast<unsigned long long>(c.bytes_out), static_cast<unsigned long long>(c.dropped_queue_full),
                 static_cast<unsigned long long>(c.dropped_truncated), static_cast<unsigned long long>(c.send_errors),
                 c.send_errors ? " last: " : "", c.send_errors ? errno_text(c.last_send_errno).c_str() : "",
                 queue_.size(), static_cast<unsigned long long>(c.max_queue_bytes), c.late_max_ns / 1e6,
                 c.frames_out ? c.late_sum_ns / static_cast<double>(c.frames_out) / 1e6 : 0.0);
  }

 private:
  void send_due() {
    constexpr size_t kBatch = 64;
    mmsghdr tx[kBatch];
    iovec iov[kBatch];
    for (;;) {
      const int64_t now = now_ns();
      size_t n = 0;
      while (n < kBatch && n < queue_.size() && queue_.at(n).due_ns <= now) {
        const FrameQueue::Entry& e = queue_.at(n);
        iov[n] = {const_cast<uint8_t*>(queue_.data(e)), e.length};
        tx[n] = {};
        tx[n].msg_hdr.msg_iov = &iov[n];
        tx[n].msg_hdr.msg_iovlen = 1;
        ++n;
      }
      if (n == 0) return;
      int sent = sendmmsg(out_.fd(), tx, static_cast<unsigned>(n), 0);
      if (sent <= 0) {
        if (sent < 0 && errno == EINTR) continue;
        // The frame at the head cannot be sent (ENOBUFS, ENETDOWN, EMSGSIZE...): drop it and go on.
        ++counters_.send_errors;
        counters_.last_send_errno = sent < 0 ? errno : 0;
        queue_.pop();
        continue;
      }
      for (int i = 0; i < sent; ++i) {
        const FrameQueue::Entry& e = queue_.front();
        const int64_t late = now - e.due_ns;
        counters_.late_max_ns = std::max(counters_.late_max_ns, late);
        counters_.late_sum_ns += static_cast<double>(late);
        ++counters_.frames_out;
        counters_.bytes_out += e.length;
        queue_.pop();
      }
    }
  }

  std::string label_;
  PacketSocket& in_;
  PacketSocket& out_;
  int64_t delay_ns_;
  FrameQueue queue_;
  Counters counters_;
};

struct Options {
  std::string if_a, if_b;
  double delay_ab_ms = -1, delay_ba_ms = -1, delay_ms = 0;
  size_t queue_bytes = 64u << 20;
  double stats_interval_s = 0;
  int rt_priority = 0;
};

[[noreturn]] void usage(const char* why) {
  if (why) std::fprintf(stderr, "dc_delay_shim: %s\n", why);
  std::fprintf(stderr,
               "usage: dc_delay_shim [--delay-ms MS] [--delay-ms-ab MS] [--delay-ms-ba MS] [--queue-bytes N]\n"
               "                     [--stats-interval S] [--rt-priority P] IF_A IF_B\n"
               "  forwards every frame between IF_A and IF_B after a one-way delay (default 0 ms;\n"
               "  -ab: IF_A -> IF_B, -ba: IF_B -> IF_A, each defaults to --delay-ms); --queue-bytes per\n"
               "  direction (default 64 MiB, suffixes K/M/G = KiB/MiB/GiB); SIGTERM/SIGINT print counters.\n");
  std::exit(2);
}

double parse_number(const std::string& flag, const char* text, double min, double max) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= min && v <= max))
    usage((flag + ": '" + text + "' is not a number in [" + std::to_string(min) + ", " + std::to_string(max) + "]")
              .c_str());
  return v;
}

size_t parse_size(const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  unsigned shift = 0;
  if (end && (*end == 'K' || *end == 'k'))
    shift = 10, ++end;
  else if (end && (*end == 'M' || *end == 'm'))
    shift = 20, ++end;
  else if (end && (*end == 'G' || *end == 'g'))
    shift = 30, ++end;
  if (end && (*end == 'i' || *end == 'B')) ++end;
  if (end && *end == 'B') ++end;
  if (errno != 0 || end == text || *end != '\0' || v == 0 || v > (1ull << 40) >> shift)
    usage((std::string("--queue-bytes: '") + text + "' is not a size between 1 and 1 TiB").c_str());
  return static_cast<size_t>(v << shift);
}

Options parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--delay-ms")
      o.delay_ms = parse_number(a, value(), 0, 600'000);
    else if (a == "--delay-ms-ab")
      o.delay_ab_ms = parse_number(a, value(), 0, 600'000);
    else if (a == "--delay-ms-ba")
      o.delay_ba_ms = parse_number(a, value(), 0, 600'000);
    else if (a == "--queue-bytes")
      o.queue_bytes = parse_size(value());
    else if (a == "--stats-interval")
      o.stats_interval_s = parse_number(a, value(), 0, 86'400);
    else if (a == "--rt-priority")
      o.rt_priority = static_cast<int>(parse_number(a, value(), 0, 99));
    else if (a == "-h" || a == "--help")
      usage(nullptr);
    else if (!a.empty() && a[0] == '-')
      usage(("unknown option " + a).c_str());
    else
      positional.push_back(a);
  }
  if (positional.size() != 2) usage("expected two interface names");
  o.if_a = positional[0];
  o.if_b = positional[1];
  if (o.if_a == o.if_b) usage("the two interfaces must differ");
  if (o.delay_ab_ms < 0) o.delay_ab_ms = o.delay_ms;
  if (o.delay_ba_ms < 0) o.delay_ba_ms = o.delay_ms;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // SIGINT/SIGTERM are taken by sigtimedwait below, in this thread only: block them before the
  // forwarding threads start so they inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  try {
    PacketSocket a(o.if_a), b(o.if_b);
    Direction ab(o.if_a + "->" + o.if_b, a, b, static_cast<int64_t>(o.delay_ab_ms * 1e6), o.queue_bytes);
    Direction ba(o.if_b + "->" + o.if_a, b, a, static_cast<int64_t>(o.delay_ba_ms * 1e6), o.queue_bytes);
    std::atomic<int> failed{0};
    auto runner = [&](Direction& d) {
      if (o.rt_priority > 0) {
        sched_param sp{};
        sp.sched_priority = o.rt_priority;
        if (int err = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp); err != 0)
          std::fprintf(stderr, "dc_delay_shim: SCHED_FIFO %d not set: %s\n", o.rt_priority, errno_text(err).c_str());
      }
      try {
        d.run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "dc_delay_shim: %s\n", e.what());
        failed.store(1);
        g_stop.store(true);
        kill(getpid(), SIGTERM);  // wake the main thread's sigtimedwait
      }
    };
    std::thread t_ab(runner, std::ref(ab)), t_ba(runner, std::ref(ba));
    std::printf(
        "dc_delay_shim: ready: %s <-> %s, one-way delay %.3f ms (%s->%s) / %.3f ms (%s->%s), queue %zu bytes "
        "per direction\n",
        o.if_a.c_str(), o.if_b.c_str(), o.delay_ab_ms, o.if_a.c_str(), o.if_b.c_str(), o.delay_ba_ms, o.if_b.c_str(),
        o.if_a.c_str(), o.queue_bytes);
    std::fflush(stdout);
    for (;;) {
      int sig;
      if (o.stats_interval_s > 0) {
        timespec ts{static_cast<time_t>(o.stats_interval_s),
                    static_cast<long>(
                        (o.stats_interval_s - static_cast<double>(static_cast<time_t>(o.stats_interval_s))) * 1e9)};
        sig = sigtimedwait(&signals, nullptr, &ts);
        if (sig < 0) {
          // Counters read racily from another thread: figures for a human, not exact.
          ab.print(stdout);
          ba.print(stdout);
          std::fflush(stdout);
          continue;
        }
      } else if (sigwait(&signals, &sig) != 0) {
        continue;
      }
      break;
    }
    g_stop.store(true);
    t_ab.join();
    t_ba.join();
    std::printf("dc_delay_shim: stopped\n");
    ab.print(stdout);
    ba.print(stdout);
    std::fflush(stdout);
    return failed.load() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dc_delay_shim: %s\n", e.what());
    return 1;
  }
}
