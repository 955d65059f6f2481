#include "tools/bench/tree_member.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "codec/digest.h"
#include "tree/connect_retry.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Roll-call messages: {magic, kind, rank, 0} as four 32-bit words. Both ends run this build.
constexpr uint32_t kMagic = 0x54424344;  // "DCBT"
constexpr uint32_t kReport = 1;          // member -> rank 0: "rank R is here"
constexpr uint32_t kGo = 2;              // rank 0 -> member: "every rank is here"
using RollCallMessage = std::array<uint32_t, 4>;

// One message exchange bounded by `timeout`; on any failure the connection is closed and the
// request finished before returning, so `message` may go out of scope. Returns the error text, or
// nothing on success.
std::optional<std::string> exchange(transport::Connection& connection, RollCallMessage& message, bool send,
                                    std::chrono::milliseconds timeout) {
  auto request = send ? connection.post_send(std::as_bytes(std::span(message)))
                      : connection.post_recv(std::as_writable_bytes(std::span(message)));
  Status status = request->wait(timeout);
  if (status.ok() && (send || request->bytes() == sizeof message)) return std::nullopt;
  connection.close();
  request->cancel();
  request->wait(10s);
  if (status.code == Errc::timeout) return "no answer within " + std::to_string(timeout.count()) + " ms";
  return status.ok() ? std::string("a message of the wrong size") : status.message;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

template <class Duration>
long long whole_seconds(Duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

}  // namespace

void roll_call_coordinator(transport::Transport& transport, const std::string& url, int members,
                           std::chrono::milliseconds patience, std::chrono::milliseconds connect_timeout) {
  auto log = logger("bench");
  auto listener = transport.listen(transport::Url::parse(url));
  std::vector<std::unique_ptr<transport::Connection>> present(static_cast<size_t>(members) + 1);
  int count = 0;
  const auto deadline = Clock::now() + patience;
  while (count < members && Clock::now() < deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto connection = listener->accept(std::clamp(left, 1ms, std::chrono::milliseconds(500)));
    if (!connection) continue;
    RollCallMessage report{};
    if (auto error = exchange(*connection, report, false, connect_timeout)) {
      log->warn("roll call: a peer at {} sent nothing usable: {}", connection->peer(), *error);
      continue;
    }
    const int rank = static_cast<int>(report[2]);
    if (report[0] != kMagic || report[1] != kReport || rank < 1 || rank > members ||
        present[static_cast<size_t>(rank)]) {
      log->warn("roll call: ignoring {} (not a new rank 1..{} of this bench)", connection->peer(), members);
      connection->close();
      continue;
    }
    present[static_cast<size_t>(rank)] = std::move(connection);
    ++count;
  }
  if (count < members) {
    std::vector<int> missing;
    for (int r = 1; r <= members; ++r)
      if (!present[static_cast<size_t>(r)]) missing.push_back(r);
    for (auto& c : present)
      if (c) c->close();
    throw Error(Errc::timeout, std::string(missing.size() == 1 ? "rank " : "ranks ") + rank_list(missing) +
                                   " did not report within timeouts.join (" + std::to_string(whole_seconds(patience)) +
                                   " s): " + (missing.size() == 1 ? "it never started" : "they never started") +
                                   ", or cannot reach rank 0 at " + url + " (" + std::to_string(count) + " of " +
                                   std::to_string(members) + " ranks reported)");
  }
  // The listener closes before anyone hears GO: a member's first HELLO then finds the port closed
  // (and retries) instead of a listener about to vanish.
  listener->close();
  for (int r = 1; r <= members; ++r) {
    RollCallMessage go{kMagic, kGo, static_cast<uint32_t>(r), 0};
    auto& connection = present[static_cast<size_t>(r)];
    if (auto error = exchange(*connection, go, true, connect_timeout))
      throw Error(Errc::connection, "rank " + std::to_string(r) + " left during the roll call: " + *error);
  }
  for (auto& c : present)
    if (c) c->close();
}

void roll_call_member(transport::Transport& transport, const std::string& url, int rank,
                      std::chrono::milliseconds patience, std::chrono::milliseconds connect_timeout) {
  tree::ConnectRetry retry;
  retry.attempt_timeout = connect_timeout;
  retry.give_up_after = patience;
  retry.who = "rank " + std::to_string(rank);
  retry.what = "rank 0 (the bench's producer)";
  auto connection = tree::connect_with_retry(transport, transport::Url::parse(url), retry);
  RollCallMessage report{kMagic, kReport, static_cast<uint32_t>(rank), 0};
  if (auto error = exchange(*connection, report, true, connect_timeout))
    throw Error(Errc::connection, "rank " + std::to_string(rank) + ": roll call with rank 0 failed: " + *error);
  RollCallMessage go{};
  if (auto error = exchange(*connection, go, false, 2 * patience + 30s))
    throw Error(Errc::connection, "rank " + std::to_string(rank) +
                                      ": rank 0 gave up before the sweep started (see its error; another rank may "
                                      "be missing): " +
                                      *error);
  if (go[0] != kMagic || go[1] != kGo)
    throw Error(Errc::corrupt_frame, "rank " + std::to_string(rank) + ": rank 0's roll-call answer is not GO");
  // Rank 0 closes this connection once every member heard GO; waiting for that (briefly) keeps the
  // first session's HELLOs from racing rank 0's last roll-call steps.
  RollCallMessage end{};
  exchange(*connection, end, false, connect_timeout);
  connection->close();
}

namespace {

struct JoinedSession {
  std::unique_ptr<tree::Receiver> receiver;
  const codec::Manifest* manifest = nullptr;
};

// The next session: a new Receiver on the member URL, joined. A HELLO can reach the previous
// session's producer in the moment between its BYE and its listener closing; that connection then
// fails (Errc::connection), and the join is tried again until `patience` is spent.
JoinedSession join_session(transport::Transport& transport, const tree::ReceiverOptions& options,
                           std::chrono::milliseconds patience, uint64_t session) {
  const auto deadline = Clock::now() + patience;
  for (;;) {
    JoinedSession s;
    try {
      s.receiver = std::make_unique<tree::Receiver>(transport, options);
      s.manifest = &s.receiver->join();
      return s;
    } catch (const Error& e) {
      // connection, io: a producer's listener closing as this member reached it, or this member's
      // port not yet free; auth: the same race caught during the handshake (the roll call already
      // proved the secret right).
      const bool again = e.code() == Errc::connection || e.code() == Errc::io || e.code() == Errc::auth;
      if (!again || Clock::now() >= deadline) {
        throw Error(e.code(), "rank " + std::to_string(options.rank) + ": no session " + std::to_string(session) +
                                  " from rank 0 within timeouts.join (" + std::to_string(whole_seconds(patience)) +
                                  " s)" + (session > 1 ? ": rank 0 stopped the sweep (see its error)" : "") + ": " +
                                  e.what());
      }
    }
    std::this_thread::sleep_for(100ms);
  }
}

// `fn()` with the tree's "cannot reach the producer yet" warnings held back: between sessions the
// next producer is not listening yet for a moment, every time. Only at the default levels (warn,
// info); a user who asked for debug sees everything.
template <class Fn>
auto quietly(Fn&& fn) {
  auto tree_log = logger("tree");
  const auto level = tree_log->level();
  const bool quiet = level == spdlog::level::warn || level == spdlog::level::info;
  if (quiet) tree_log->set_level(spdlog::level::err);
  try {
    auto result = fn();
    if (quiet) tree_log->set_level(level);
    return result;
  } catch (...) {
    if (quiet) tree_log->set_level(level);
    throw;
  }
}

JoinedSession quiet_join(transport::Transport& transport, const tree::ReceiverOptions& options,
                         std::chrono::milliseconds patience, uint64_t session) {
  return quietly([&] { return join_session(transport, options, patience, session); });
}

}  // namespace

void serve_sessions(transport::Transport& transport, const MemberSessionOptions& o) {
  auto log = logger("bench");
  std::vector<std::vector<std::byte>> buffers;
  std::optional<uint64_t> buffers_manifest;  // the manifest digest the buffers are laid out for
  std::optional<codec::StateDigest> zero_digest;
  for (uint64_t session = 1;; ++session) {
    tree::ReceiverOptions options = o.receiver;
    if (session == o.fault_session) {
      auto seen = std::make_shared<std::atomic<uint64_t>>(0);
      const uint64_t after = o.fault_after;
      const uint32_t rank = options.rank;
      options.on_data = [seen, after, rank, session](uint64_t, uint64_t) {
        if (seen->fetch_add(1) + 1 != after) return;
        logger("bench")->warn("rank {}: --fault kill@{}:{}: killing this process now", rank, session, after);
        logger("bench")->flush();
        std::raise(SIGKILL);
      };
    }
    JoinedSession s = quiet_join(transport, options, o.patience, session);
    const codec::Manifest& manifest = *s.manifest;
    if (buffers_manifest != manifest.digest()) {
      buffers.clear();
      buffers.reserve(manifest.size());
      for (const auto& t : manifest.tensors()) buffers.emplace_back(t.nbytes());  // zeroed, pages touched
      buffers_manifest = manifest.digest();
      zero_digest.reset();
    } else {
      for (auto& b : buffers) std::fill(b.begin(), b.end(), std::byte{0});
    }
    codec::MutableWeights weights{&manifest, {}};
    weights.tensors.reserve(buffers.size());
    for (auto& b : buffers) weights.tensors.emplace_back(b.data(), b.size());
    if (!zero_digest)
      zero_digest =
          codec::StateDigest::full_scan(weights.as_const(), std::max(1u, std::thread::hardware_concurrency()));
    s.receiver->attach(weights, 0, zero_digest);
    const tree::RunSummary summary = s.receiver->run();
    if (summary.stats.versions_aborted > 0)
      throw Error(Errc::verify_failed, "rank " + std::to_string(o.receiver.rank) + ": session " +
                                           std::to_string(session) + " aborted " +
                                           std::to_string(summary.stats.versions_aborted) + " versions here");
    log->debug("rank {}: session {} ended at version {}", o.receiver.rank, session, summary.version);
    if (manifest.find(kEndTensor)) return;
  }
}

std::unique_ptr<tree::Producer> start_part_session(transport::Transport& transport, const codec::Manifest& manifest,
                                                   const tree::ProducerOptions& options,
                                                   std::chrono::milliseconds patience, uint64_t session) {
  const auto deadline = Clock::now() + patience;
  const std::string who = "producer rank " + std::to_string(options.group.rank);
  return quietly([&] {
    for (;;) {
      try {
        auto producer = std::make_unique<tree::Producer>(transport, manifest, options);
        producer->start(std::chrono::duration_cast<std::chrono::milliseconds>(
            std::max<Clock::duration>(deadline - Clock::now(), std::chrono::seconds(1))));
        return producer;
      } catch (const Error& e) {
        // As join_session: this rank's own port not yet free (io), a handshake cut by rank 0's
        // previous producer closing (auth, connection; a GROUP_HELLO hung up on is already tried
        // again inside start()).
        const bool again = e.code() == Errc::connection || e.code() == Errc::io || e.code() == Errc::auth;
        if (!again || Clock::now() >= deadline)
          throw Error(e.code(), who + ": no session " + std::to_string(session) +
                                    " from rank 0 within timeouts.join (" + std::to_string(whole_seconds(patience)) +
                                    " s)" + (session > 1 ? ": rank 0 stopped the sweep (see its error)" : "") + ": " +
                                    e.what());
      }
      std::this_thread::sleep_for(100ms);
    }
  });
}

}  // namespace deltacast::tools
