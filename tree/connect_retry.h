#pragma once
// connect_with_retry: reaching a peer that may not be listening yet. Launchers start the
// processes of a job in no particular order, and a restarted producer comes back after a while,
// so a receiver that finds nobody at the rendezvous address keeps trying for a bounded time
// instead of failing at once, and says so in the log while it waits.
//
// Rules:
//  * Retried: Errc::connection (refused, unreachable, reset, a name that does not resolve yet)
//    and Errc::timeout (one attempt ran out of attempt_timeout). Everything else is thrown at
//    once: Errc::auth (a wrong secret never becomes right), invalid_argument (a URL of another
//    scheme), ...
//  * Each attempt is bounded by attempt_timeout and, after the first, by what is left of
//    give_up_after: the call returns or throws within about give_up_after + retry_interval
//    (at least one whole attempt is always made).
//  * Logging (spdlog logger "tree"): a warning at the first failure, at once, then one every
//    report_every while it keeps failing, each saying how long it has waited; an info line when a
//    connection succeeds after failures. Nothing is logged when the first attempt succeeds.
//  * cancelled, when set, is polled before every attempt and during the pauses; once it returns
//    true the call throws Error(Errc::cancelled). An attempt in progress is not interrupted, unless
//    `abandoned` is set too: then each attempt runs on a thread of its own while the caller polls
//    cancelled every few milliseconds, and a cancelled attempt is left to end on its thread (within
//    attempt_timeout; a connection it makes is closed), kept in `abandoned` until then. A member
//    moved off a frozen parent stops waiting for that parent's handshake at once.
//
// Thread-safety: reentrant; blocks the calling thread. The transport's own rules apply to the
// concurrent use of `transport`.
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace deltacast::tree {

// Connection attempts given up on while in progress (ConnectRetry::abandoned): each ends on its
// own thread within its timeout; the destructor (or wait()) waits for them, so the transport they
// use must outlive this object. Thread-safe.
class AbandonedAttempts {
 public:
  AbandonedAttempts() = default;
  AbandonedAttempts(const AbandonedAttempts&) = delete;
  AbandonedAttempts& operator=(const AbandonedAttempts&) = delete;
  ~AbandonedAttempts() { wait(); }
  // Keeps `attempt` until it ends (forgetting those that ended already).
  void add(std::future<std::unique_ptr<transport::Connection>> attempt);
  // Waits until every attempt kept here ended; the connections they made are closed.
  void wait();

 private:
  std::mutex mutex_;
  std::vector<std::future<std::unique_ptr<transport::Connection>>> attempts_;
};

struct ConnectRetry {
  std::chrono::milliseconds attempt_timeout{5'000};  // one connect + handshake (timeouts.connect)
  std::chrono::milliseconds give_up_after{120'000};  // the whole patience (timeouts.join)
  std::chrono::milliseconds report_every{5'000};     // a warning this often while failing
  std::chrono::milliseconds retry_interval{200};     // pause between failed attempts
  std::string who;                                   // who connects, for messages ("rank 3"); may be empty
  std::string what = "the producer";                 // whom it is trying to reach, for messages
  std::function<bool()> cancelled;                   // optional: true stops retrying (Error(cancelled))
  AbandonedAttempts* abandoned = nullptr;            // optional, with cancelled: cancel attempts in progress
};

// Connects to `url` through `transport`, retrying as described above. Returns the connection.
// Throws Error(connection | timeout) after give_up_after with "cannot reach WHAT at URL after
// N s: <last error>" (the code is the last attempt's), Error(cancelled) when options.cancelled
// said so, and any other error of Transport::connect at once.
std::unique_ptr<transport::Connection> connect_with_retry(transport::Transport& transport, const transport::Url& url,
                                                          const ConnectRetry& options);

}  // namespace deltacast::tree
