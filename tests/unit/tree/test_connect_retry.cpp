// connect_with_retry over the real tcp transport on 127.0.0.1: a producer that starts listening
// late is reached, nobody listening fails after give_up_after naming the URL, the first warning is
// logged at once and repeated every report_every, a wrong secret fails at once, cancel stops it,
// also in the middle of a handshake with a silent (frozen) peer when attempts may be abandoned.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include "transport/transport.h"
#include "tree/connect_retry.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

transport::TransportOptions options_with_secret(std::string secret) {
  transport::TransportOptions o;
  o.secret = std::move(secret);
  o.connect_timeout = 2s;
  return o;
}

// A loopback URL whose port nobody listens on right now (bound once by the transport, then freed).
transport::Url unused_url(transport::Transport& t) {
  auto listener = t.listen(transport::Url::parse("tcp://127.0.0.1:0"));
  transport::Url url = listener->local_url();
  listener->close();
  return url;
}

// Captures what logger("tree") writes while a test runs.
class TreeLog {
 public:
  TreeLog() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    log_ = logger("tree");
    old_level_ = log_->level();
    log_->set_level(spdlog::level::info);
    sink_->set_pattern("%l %v");
    log_->sinks().push_back(sink_);
  }
  ~TreeLog() {
    auto& sinks = log_->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    log_->set_level(old_level_);
  }
  std::vector<std::string> lines() const { return sink_->last_formatted(); }
  size_t count(const std::string& needle) const {
    auto all = lines();
    return static_cast<size_t>(std::count_if(
        all.begin(), all.end(), [&](const std::string& line) { return line.find(needle) != std::string::npos; }));
  }
  std::string text() const {
    std::string out;
    for (const auto& line : lines()) out += line;
    return out;
  }

 private:
  std::shared_ptr<spdlog::logger> log_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  spdlog::level::level_enum old_level_ = spdlog::level::info;
};

ConnectRetry quick(std::chrono::milliseconds give_up_after) {
  ConnectRetry o;
  o.attempt_timeout = 1s;
  o.give_up_after = give_up_after;
  o.report_every = 300ms;
  o.retry_interval = 50ms;
  o.who = "rank 3";
  return o;
}

TEST(ConnectRetry, ReachesAListenerThatStartsLate) {
  auto server = transport::make_transport("tcp", options_with_secret(""));
  auto client = transport::make_transport("tcp", options_with_secret(""));
  const transport::Url url = unused_url(*server);
  TreeLog log;
  std::promise<void> accepted;
  std::thread late([&] {
    std::this_thread::sleep_for(700ms);
    auto listener = server->listen(url);
    auto connection = listener->accept(10s);
    EXPECT_NE(connection, nullptr);
    accepted.set_value();
  });
  const auto start = Clock::now();
  auto connection = connect_with_retry(*client, url, quick(10s));
  const auto took = Clock::now() - start;
  ASSERT_NE(connection, nullptr);
  accepted.get_future().wait();
  late.join();
  EXPECT_GE(took, 600ms);
  EXPECT_LT(took, 5s);
  EXPECT_EQ(log.count("rank 3: cannot reach the producer at " + url.str() +
                      " yet (connection refused); "
                      "retrying for up to 10 s"),
            1u)
      << log.text();
  EXPECT_EQ(log.count("rank 3: reached the producer at " + url.str() + " after"), 1u) << log.text();
}

TEST(ConnectRetry, FirstAttemptSucceedsSilently) {
  auto server = transport::make_transport("tcp", options_with_secret(""));
  auto client = transport::make_transport("tcp", options_with_secret(""));
  auto listener = server->listen(transport::Url::parse("tcp://127.0.0.1:0"));
  TreeLog log;
  auto connection = connect_with_retry(*client, listener->local_url(), quick(5s));
  ASSERT_NE(connection, nullptr);
  EXPECT_NE(listener->accept(5s), nullptr);
  EXPECT_EQ(log.count("reach"), 0u) << log.text();
}

TEST(ConnectRetry, NobodyListeningThrowsAfterGiveUpNamingTheUrl) {
  auto client = transport::make_transport("tcp", options_with_secret(""));
  const transport::Url url = unused_url(*client);
  TreeLog log;
  const auto start = Clock::now();
  try {
    connect_with_retry(*client, url, quick(1200ms));
    FAIL() << "connected to nobody";
  } catch (const Error& e) {
    const auto took = Clock::now() - start;
    EXPECT_EQ(e.code(), Errc::connection) << e.what();
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 3: cannot reach the producer at " + url.str() + " after 1.2 s: "), std::string::npos) << m;
    EXPECT_NE(m.find("efused"), std::string::npos) << m;  // the last error: "Connection refused"
    EXPECT_GE(took, 1200ms);
    EXPECT_LT(took, 3s);
  }
  // The first warning, then one every report_every (300 ms) for 1.2 s.
  EXPECT_EQ(log.count("yet (connection refused); retrying for up to 1.2 s"), 1u) << log.text();
  EXPECT_GE(log.count("rank 3: still cannot reach the producer at " + url.str() + " (connection refused); waited "), 2u)
      << log.text();
  EXPECT_LE(log.count("still cannot reach"), 4u) << log.text();
}

TEST(ConnectRetry, WarnsAtOnceAndStopsWhenCancelled) {
  auto client = transport::make_transport("tcp", options_with_secret(""));
  const transport::Url url = unused_url(*client);
  TreeLog log;
  std::atomic<bool> stop{false};
  ConnectRetry o = quick(30s);
  o.what = "the parent";
  o.cancelled = [&] { return stop.load(); };
  auto result = std::async(std::launch::async, [&] { return connect_with_retry(*client, url, o); });
  const auto start = Clock::now();
  while (log.count("cannot reach the parent") == 0 && Clock::now() - start < 2s) std::this_thread::sleep_for(5ms);
  EXPECT_LT(Clock::now() - start, 500ms) << "the first warning must come at once";
  EXPECT_EQ(log.count("rank 3: cannot reach the parent at " + url.str() +
                      " yet (connection refused); "
                      "retrying for up to 30 s"),
            1u)
      << log.text();
  stop = true;
  ASSERT_EQ(result.wait_for(2s), std::future_status::ready);
  try {
    result.get();
    FAIL() << "not cancelled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::cancelled) << e.what();
    EXPECT_NE(std::string(e.what()).find(url.str()), std::string::npos) << e.what();
  }
}

// A frozen parent: the kernel completes the TCP handshake (the backlog), nobody ever answers the
// transport's. A cancel during that attempt returns at once when attempts may be abandoned, and
// the abandoned attempt ends on its own within attempt_timeout; without `abandoned` the call waits
// for the attempt's timeout (what a member moved off a frozen parent used to wait).
TEST(ConnectRetry, CancelAbandonsAHandshakeWithASilentPeer) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const auto url = transport::Url::parse("tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  auto client = transport::make_transport("tcp", options_with_secret(""));
  for (const bool abandon : {true, false}) {
    AbandonedAttempts abandoned;
    std::atomic<bool> stop{false};
    ConnectRetry o = quick(30s);
    o.attempt_timeout = 2s;
    o.cancelled = [&] { return stop.load(); };
    if (abandon) o.abandoned = &abandoned;
    auto result = std::async(std::launch::async, [&] { return connect_with_retry(*client, url, o); });
    std::this_thread::sleep_for(300ms);  // well inside the first attempt's handshake
    ASSERT_NE(result.wait_for(0ms), std::future_status::ready) << "a silent peer's handshake succeeded";
    const auto cancelled_at = Clock::now();
    stop = true;
    ASSERT_EQ(result.wait_for(5s), std::future_status::ready);
    const auto took = Clock::now() - cancelled_at;
    try {
      result.get();
      FAIL() << "connected to a silent peer";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::cancelled) << e.what();
    }
    if (abandon) {
      EXPECT_LT(took, 300ms) << "the cancel waited for the handshake";
      const auto waiting = Clock::now();
      abandoned.wait();  // the attempt ends by its own timeout
      EXPECT_LT(Clock::now() - waiting, 3s);
    } else {
      EXPECT_GT(took, 1s) << "without `abandoned` the attempt in progress is waited for";
    }
  }
  ::close(fd);
}

TEST(ConnectRetry, WrongSecretFailsAtOnce) {
  auto server = transport::make_transport("tcp", options_with_secret("the right secret"));
  auto client = transport::make_transport("tcp", options_with_secret("a wrong secret"));
  auto listener = server->listen(transport::Url::parse("tcp://127.0.0.1:0"));
  TreeLog log;
  const auto start = Clock::now();
  try {
    connect_with_retry(*client, listener->local_url(), quick(30s));
    FAIL() << "a wrong secret was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::auth) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(log.count("retrying"), 0u) << log.text();
}

TEST(ConnectRetry, OtherSchemeFailsAtOnce) {
  auto client = transport::make_transport("tcp", options_with_secret(""));
  EXPECT_THROW(
      {
        try {
          connect_with_retry(*client, transport::Url::parse("loop://elsewhere"), quick(30s));
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace deltacast::tree
