#include "tree/connect_retry.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <thread>

#include "util/log.h"

namespace deltacast::tree {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// "120 s", "1.5 s", "0.2 s": whole seconds without decimals, so messages read like the config.
std::string seconds_text(milliseconds d) {
  char text[32];
  if (d.count() % 1000 == 0) {
    std::snprintf(text, sizeof text, "%lld s", static_cast<long long>(d.count() / 1000));
  } else {
    std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  }
  return text;
}

// Waiting times for messages: tenths of a second below 10 s, whole seconds above.
milliseconds rounded(milliseconds d) {
  if (d >= std::chrono::seconds(10)) return std::chrono::duration_cast<std::chrono::seconds>(d);
  return milliseconds(d.count() / 100 * 100);
}

milliseconds since(Clock::time_point start) { return std::chrono::duration_cast<milliseconds>(Clock::now() - start); }

// The short reason for the log line: "connection refused" out of "tcp: cannot connect to
// tcp://h:1: Connection refused". Backends end their connection errors with the OS's words; a
// timeout is said plainly (its message repeats the URL).
std::string short_reason(const Error& e, milliseconds attempt_timeout) {
  if (e.code() == Errc::timeout) return "no answer within " + seconds_text(attempt_timeout);
  std::string message = e.what();
  const size_t colon = message.rfind(": ");
  std::string reason = colon == std::string::npos ? message : message.substr(colon + 2);
  if (!reason.empty()) reason[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(reason[0])));
  return reason;
}

std::string prefixed(const std::string& who, const std::string& text) { return who.empty() ? text : who + ": " + text; }

bool is_cancelled(const ConnectRetry& o) { return o.cancelled && o.cancelled(); }

[[noreturn]] void throw_cancelled(const ConnectRetry& o, const std::string& url) {
  throw Error(Errc::cancelled, prefixed(o.who, "stopped trying to reach " + o.what + " at " + url + ": cancelled"));
}

// Sleeps up to `pause`, but not past `deadline`, polling `cancelled` every few milliseconds.
void pause_until(const ConnectRetry& o, milliseconds pause, Clock::time_point deadline, const std::string& url) {
  const auto wake = std::min(Clock::now() + pause, deadline);
  while (Clock::now() < wake) {
    if (is_cancelled(o)) throw_cancelled(o, url);
    std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(20), wake - Clock::now()));
  }
}

// One attempt: on the calling thread, or (o.abandoned) on a thread of its own while `cancelled` is
// polled; a cancelled attempt goes to o.abandoned and the call throws Error(cancelled).
std::unique_ptr<transport::Connection> attempt_once(transport::Transport& transport, const transport::Url& url,
                                                    milliseconds timeout, const ConnectRetry& o,
                                                    const std::string& url_text) {
  if (!o.abandoned || !o.cancelled) return transport.connect(url, timeout);
  auto attempt = std::async(std::launch::async, [&transport, url, timeout] { return transport.connect(url, timeout); });
  while (attempt.wait_for(milliseconds(10)) != std::future_status::ready) {
    if (is_cancelled(o)) {
      o.abandoned->add(std::move(attempt));
      throw_cancelled(o, url_text);
    }
  }
  return attempt.get();
}

}  // namespace

void AbandonedAttempts::add(std::future<std::unique_ptr<transport::Connection>> attempt) {
  std::lock_guard lock(mutex_);
  std::erase_if(attempts_, [](const auto& a) { return a.wait_for(milliseconds(0)) == std::future_status::ready; });
  attempts_.push_back(std::move(attempt));
}

void AbandonedAttempts::wait() {
  std::vector<std::future<std::unique_ptr<transport::Connection>>> attempts;
  {
    std::lock_guard lock(mutex_);
    attempts.swap(attempts_);
  }
  for (auto& a : attempts) a.wait();  // (their connections, or errors, go with them)
}

std::unique_ptr<transport::Connection> connect_with_retry(transport::Transport& transport, const transport::Url& url,
                                                          const ConnectRetry& o) {
  auto log = logger("tree");
  const std::string url_text = url.str();
  const auto start = Clock::now();
  const auto deadline = start + o.give_up_after;
  auto last_report = start;
  int failures = 0;
  for (;;) {
    if (is_cancelled(o)) throw_cancelled(o, url_text);
    // After the first attempt, none may run past give_up_after.
    milliseconds attempt = o.attempt_timeout;
    if (failures > 0) {
      attempt = std::min(attempt, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      attempt = std::max(attempt, milliseconds(1));
    }
    try {
      auto connection = attempt_once(transport, url, attempt, o, url_text);
      if (failures > 0) {
        log->info("{}", prefixed(o.who, "reached " + o.what + " at " + url_text + " after " +
                                            seconds_text(rounded(since(start))) + " (" + std::to_string(failures + 1) +
                                            " attempts)"));
      }
      return connection;
    } catch (const Error& e) {
      if (e.code() != Errc::connection && e.code() != Errc::timeout) throw;
      ++failures;
      const auto waited = since(start);
      if (Clock::now() >= deadline) {
        throw Error(e.code(),
                    prefixed(o.who, "cannot reach " + o.what + " at " + url_text + " after " +
                                        seconds_text(std::max(o.give_up_after, rounded(waited))) + ": " + e.what()));
      }
      if (failures == 1) {
        log->warn("{}",
                  prefixed(o.who, "cannot reach " + o.what + " at " + url_text + " yet (" + short_reason(e, attempt) +
                                      "); retrying for up to " + seconds_text(o.give_up_after)));
        last_report = Clock::now();
      } else if (Clock::now() - last_report >= o.report_every) {
        log->warn("{}", prefixed(o.who, "still cannot reach " + o.what + " at " + url_text + " (" +
                                            short_reason(e, attempt) + "); waited " + seconds_text(rounded(waited)) +
                                            " of up to " + seconds_text(o.give_up_after)));
        last_report = Clock::now();
      }
    }
    pause_until(o, o.retry_interval, deadline, url_text);
  }
}

}  // namespace deltacast::tree
