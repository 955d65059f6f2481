#include "tools/probe/measure.h"

#include <algorithm>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>

#include "tree/connect_retry.h"
#include "util/error.h"
#include "util/json.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
constexpr size_t kControlBytes = size_t{64} * 1024;

nlohmann::json parse(const std::vector<std::byte>& buffer, size_t bytes) {
  return util::parse_json_bounded(std::string_view(reinterpret_cast<const char*>(buffer.data()), bytes));
}

// Waits in short steps until `request` finished or `timeout` passed (Errc::timeout).
Status wait_bounded(transport::Request& request, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    Status s = request.wait(500ms);
    if (s.code != Errc::timeout || request.test()) return s;
    if (Clock::now() >= deadline)
      return {Errc::timeout, "no answer within " + std::to_string(timeout.count() / 1000.0) + " s"};
  }
}

nlohmann::json flow_json(const FlowResult& r) {
  nlohmann::json j{{"to", r.to}, {"seconds", r.seconds}, {"messages", r.messages}};
  if (r.gbit) j["gbit"] = *r.gbit;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

FlowResult flow_from_json(const nlohmann::json& j) {
  FlowResult r;
  r.to = j.value("to", -1);
  r.seconds = j.value("seconds", 0.0);
  r.messages = j.value("messages", uint64_t{0});
  if (j.contains("gbit")) r.gbit = j["gbit"].get<double>();
  r.error = j.value("error", "");
  if (!r.gbit && r.error.empty()) r.error = "no figure";
  return r;
}

// Rank 0's side of one probe.
class Coordinator {
 public:
  Coordinator(transport::Transport& transport, const LinkOptions& link, const ProbeSettings& settings)
      : link_(link), settings_(settings), log_(logger("probe")) {
    node_ = std::make_unique<ProbeNode>(transport, link, [this](int rank, std::unique_ptr<transport::Connection> c) {
      on_control(rank, std::move(c));
    });
    out_.ranks = static_cast<int>(link.urls.size());
    out_.bandwidth_gbit.assign(out_.ranks, std::vector<std::optional<double>>(out_.ranks));
    out_.latency_us = out_.bandwidth_gbit;
  }

  ~Coordinator() { node_->stop(); }

  Measurements run() {
    const auto start = Clock::now();
    join();
    const auto pairs =
        settings_.quick ? quick_pairs(out_.ranks, settings_.seed) : sample_pairs(out_.ranks, settings_.seed);
    measure_latency(unordered_pairs(pairs));
    measure_bandwidth(pairs);
    if (!settings_.quick) measure_shared();
    out_.clusters = find_clusters(out_.bandwidth_gbit, out_.latency_us, out_.present).clusters;
    // Stop listening before "done": a member told it is done may connect to rank 0's URL at once
    // (`run` with clusters: auto starts the tree on the same port), and must find nobody there
    // (refused: it retries until the producer listens), not this listener, which would take its
    // HELLO for a probe connection and close it.
    node_->stop();
    finish();
    out_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return std::move(out_);
  }

 private:
  struct MemberLink {
    std::unique_ptr<transport::Connection> connection;
    std::vector<std::byte> buffer = std::vector<std::byte>(kControlBytes);
    std::string lost;  // why, once lost
  };

  void on_control(int rank, std::unique_ptr<transport::Connection> connection) {
    std::unique_lock lock(mutex_);
    if (join_closed_ || rank < 1 || rank >= out_.ranks || members_.count(rank)) {
      lock.unlock();
      const std::string reason = rank < 1 || rank >= out_.ranks ? "rank " + std::to_string(rank) + " is not in this job"
                                 : join_closed_                 ? "it joined after the join window closed"
                                                                : "rank " + std::to_string(rank) + " joined twice";
      log_->warn("refusing a control connection from {}: {}", connection->peer(), reason);
      try {
        send_json(*connection, {{"op", "refused"}, {"reason", reason}}, link_.connect_timeout);
      } catch (const Error&) {
      }
      return;
    }
    members_[rank].connection = std::move(connection);
    joined_.notify_all();
  }

  void join() {
    const int expected = out_.ranks - 1;
    std::unique_lock lock(mutex_);
    joined_.wait_for(lock, settings_.join_timeout, [&] { return static_cast<int>(members_.size()) == expected; });
    join_closed_ = true;
    out_.present.push_back(0);
    for (int r = 1; r < out_.ranks; ++r) (members_.count(r) ? out_.present : out_.unreachable).push_back(r);
    log_->info("{} of {} members joined{}", members_.size(), expected,
               out_.unreachable.empty() ? "" : " (the others are unreachable)");
  }

  bool usable(int rank) {
    std::lock_guard lock(mutex_);
    if (rank == 0) return true;
    const auto it = members_.find(rank);
    return it != members_.end() && it->second.lost.empty();
  }

  std::string why_unusable(int rank) {
    std::lock_guard lock(mutex_);
    const auto it = members_.find(rank);
    if (it == members_.end()) return "rank " + std::to_string(rank) + " is unreachable";
    return "rank " + std::to_string(rank) + " was lost: " + it->second.lost;
  }

  void mark_lost(int rank, const std::string& why) {
    std::lock_guard lock(mutex_);
    auto& m = members_.at(rank);
    if (!m.lost.empty()) return;
    m.lost = why;
    m.connection->close();
    out_.lost.push_back(rank);
    log_->warn("rank {} lost: {}", rank, why);
  }

  // One command to member `rank` and its answer, within `timeout`; nullopt (and the member lost)
  // when it fails. Never called twice at once for one member.
  std::optional<nlohmann::json> command(int rank, nlohmann::json message, std::chrono::milliseconds timeout) {
    MemberLink* m = nullptr;
    {
      std::lock_guard lock(mutex_);
      m = &members_.at(rank);
      if (!m->lost.empty()) return std::nullopt;
    }
    const uint64_t id = next_id_++;
    message["id"] = id;
    auto reply = m->connection->post_recv(m->buffer);
    Status s;
    try {
      send_json(*m->connection, message, link_.peer_timeout);
      s = wait_bounded(*reply, timeout);
    } catch (const Error& e) {
      s = e.status();
    }
    if (s.ok()) {
      auto answer = parse(m->buffer, reply->bytes());
      if (answer.is_object() && answer.value("id", uint64_t{0}) == id) return answer;
      s = {Errc::connection, "an answer that is not to command " + std::to_string(id)};
    }
    mark_lost(rank, s.message.empty() ? std::string(errc_name(s.code)) : s.message);
    reply->wait(link_.peer_timeout);  // the buffer outlives the request
    return std::nullopt;
  }

  std::chrono::milliseconds flow_bound() const {
    return 4 * settings_.flow_time + link_.connect_timeout + 2 * link_.peer_timeout + 35s;
  }

  std::vector<FlowResult> flows(int from, const std::vector<int>& to) {
    if (from == 0) return node_->run_flows(to, settings_.flow_time);
    auto answer = command(from, {{"op", "flows"}, {"to", to}, {"ms", settings_.flow_time.count()}}, flow_bound());
    std::vector<FlowResult> results;
    if (answer && answer->contains("results"))
      for (const auto& r : (*answer)["results"]) results.push_back(flow_from_json(r));
    if (results.size() != to.size()) {
      results.clear();
      for (int r : to) results.push_back(FlowResult{r, std::nullopt, 0, 0, why_unusable(from)});
    }
    return results;
  }

  PingResult ping(int from, int to) {
    if (from == 0) return node_->run_ping(to, settings_.latency_reps);
    auto answer = command(from, {{"op", "ping"}, {"to", to}, {"reps", settings_.latency_reps}},
                          link_.connect_timeout + link_.peer_timeout * 2 + 10s);
    if (!answer) return {std::nullopt, why_unusable(from)};
    PingResult r;
    if (answer->contains("median_us")) r.median_us = (*answer)["median_us"].get<double>();
    r.error = answer->value("error", r.median_us ? "" : "no figure");
    return r;
  }

  // After a failed figure: is `rank` still answering? (A killed member's control link fails at
  // once; a frozen one does not answer.)
  void check_alive(int rank) {
    if (rank != 0 && usable(rank))
      command(rank, {{"op", "alive"}}, std::min<std::chrono::milliseconds>(link_.peer_timeout, 5s));
  }

  // Skips (with an entry in failed) a figure whose endpoint is unreachable or lost.
  bool skip(int from, int to) {
    for (int r : {from, to}) {
      if (usable(r)) continue;
      std::lock_guard lock(mutex_);
      if (members_.count(r)) out_.failed.push_back({from, to, why_unusable_locked(r)});
      return true;  // pairs with an unreachable member are not failures: it is listed already
    }
    return false;
  }

  std::string why_unusable_locked(int rank) {
    const auto it = members_.find(rank);
    return it == members_.end() ? "rank " + std::to_string(rank) + " is unreachable"
                                : "rank " + std::to_string(rank) + " was lost: " + it->second.lost;
  }

  void fail(int from, int to, const std::string& error) {
    log_->warn("{} -> {}: {}", from, to, error);
    {
      std::lock_guard lock(mutex_);
      out_.failed.push_back({from, to, error});
    }
    check_alive(from);
    check_alive(to);
  }

  void measure_latency(const std::vector<RankPair>& pairs) {
    for (const auto& p : pairs) {
      if (skip(p.from, p.to)) continue;
      const PingResult r = ping(p.from, p.to);
      if (!r.median_us) {
        fail(p.from, p.to, "latency: " + r.error);
        continue;
      }
      out_.latency_us[p.from][p.to] = out_.latency_us[p.to][p.from] = *r.median_us;
    }
  }

  void measure_bandwidth(const std::vector<RankPair>& pairs) {
    size_t done = 0;
    for (const auto& p : pairs) {
      if (++done % std::max<size_t>(1, pairs.size() / 4) == 0)
        log_->info("bandwidth: {} of {} pairs", done, pairs.size());
      if (skip(p.from, p.to)) continue;
      const FlowResult r = flows(p.from, {p.to}).front();
      if (!r.gbit) {
        fail(p.from, p.to, "bandwidth: " + r.error);
        continue;
      }
      out_.bandwidth_gbit[p.from][p.to] = *r.gbit;
    }
  }

  std::vector<int> usable_present() {
    std::vector<int> ranks;
    for (int r : out_.present)
      if (usable(r)) ranks.push_back(r);
    return ranks;
  }

  // Sum of the figures, or nullopt (with failures recorded) when any flow failed.
  std::optional<double> total(int from, const std::vector<FlowResult>& results, bool from_is_source) {
    double sum = 0;
    bool ok = true;
    for (const auto& r : results) {
      if (r.gbit) {
        sum += *r.gbit;
        continue;
      }
      ok = false;
      fail(from_is_source ? from : r.to, from_is_source ? r.to : from, "concurrent flows: " + r.error);
    }
    return ok ? std::optional(sum) : std::nullopt;
  }

  void measure_shared() {
    auto ranks = usable_present();
    for (int source : concurrency_sample(ranks)) {
      const auto peers = concurrency_peers(out_.bandwidth_gbit, usable_present(), source, true, 4);
      if (peers.size() < 4 || !usable(source)) continue;
      const auto single = total(source, flows(source, {peers.front()}), true);
      if (!single) continue;
      const auto parallel = total(source, flows(source, peers), true);
      if (!parallel) continue;
      out_.shared_links.push_back({{"direction", "uplink"},
                                   {"from", source},
                                   {"to", peers},
                                   {"single_gbit", *single},
                                   {"parallel_total_gbit", *parallel},
                                   {"shared", *parallel < 1.5 * *single}});
    }
    ranks = usable_present();
    for (int destination : concurrency_sample(ranks)) {
      const auto sources = concurrency_peers(out_.bandwidth_gbit, usable_present(), destination, false, 4);
      if (sources.size() < 4 || !usable(destination)) continue;
      const auto single = flows(sources.front(), {destination});
      if (!single.front().gbit) {
        fail(sources.front(), destination, "concurrent flows: " + single.front().error);
        continue;
      }
      std::vector<std::future<std::vector<FlowResult>>> running;
      running.reserve(sources.size());
      for (int s : sources)
        running.push_back(std::async(std::launch::async, [this, s, destination] { return flows(s, {destination}); }));
      std::vector<FlowResult> results;
      for (size_t k = 0; k < running.size(); ++k) {
        auto r = running[k].get().front();
        r.to = sources[k];  // total() names the source for a downlink
        results.push_back(r);
      }
      const auto parallel = total(destination, results, false);
      if (!parallel) continue;
      out_.shared_links.push_back({{"direction", "downlink"},
                                   {"from", sources},
                                   {"to", destination},
                                   {"single_gbit", *single.front().gbit},
                                   {"parallel_total_gbit", *parallel},
                                   {"shared", *parallel < 1.5 * *single.front().gbit}});
    }
  }

  void finish() {
    std::lock_guard lock(mutex_);
    for (auto& [rank, m] : members_) {
      if (!m.lost.empty()) continue;
      try {
        send_json(*m.connection, {{"op", "done"}, {"clusters", out_.clusters}}, link_.peer_timeout);
      } catch (const Error& e) {
        log_->warn("rank {}: cannot send done: {}", rank, e.what());
      }
    }
  }

  LinkOptions link_;
  ProbeSettings settings_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<ProbeNode> node_;
  std::mutex mutex_;  // members_, join_closed_, out_.failed, out_.lost
  std::condition_variable joined_;
  bool join_closed_ = false;
  std::map<int, MemberLink> members_;
  std::atomic<uint64_t> next_id_{1};
  Measurements out_;
};

}  // namespace

Measurements coordinate_probe(transport::Transport& transport, const LinkOptions& link, const ProbeSettings& settings) {
  Coordinator coordinator(transport, link, settings);
  return coordinator.run();
}

std::vector<std::vector<int>> serve_probe_member(transport::Transport& transport, const LinkOptions& link,
                                                 const ProbeSettings& settings) {
  auto log = logger("probe");
  ProbeNode node(transport, link);
  const std::string who = "rank " + std::to_string(link.rank);
  tree::ConnectRetry retry;
  retry.attempt_timeout = link.connect_timeout;
  retry.give_up_after = settings.join_timeout;
  retry.who = who;
  retry.what = "the probe coordinator (rank 0)";
  auto control = tree::connect_with_retry(transport, transport::Url::parse(link.urls.at(0)), retry);
  send_json(*control, {{"kind", "control"}, {"rank", link.rank}}, link.connect_timeout);
  std::vector<std::byte> buffer(kControlBytes);
  for (;;) {
    auto request = control->post_recv(buffer);
    // Rank 0 may be busy with other pairs for long: the transport's heartbeats (peer_timeout)
    // bound how long a lost rank 0 goes unnoticed.
    Status s;
    while ((s = request->wait(1s)).code == Errc::timeout && !request->test()) {
    }
    if (!s.ok())
      throw Error(Errc::connection,
                  who + ": rank 0 (the probe coordinator at " + link.urls.at(0) + ") disappeared: " + s.message);
    const auto message = parse(buffer, request->bytes());
    const std::string op = message.is_object() ? message.value("op", "") : "";
    nlohmann::json answer{{"id", message.is_object() ? message.value("id", uint64_t{0}) : 0}};
    if (op == "done") {
      log->info("{}: rank 0 says the probe is done", who);
      node.stop();
      std::vector<std::vector<int>> clusters;
      try {
        if (message.contains("clusters")) clusters = message.at("clusters").get<std::vector<std::vector<int>>>();
      } catch (const nlohmann::json::exception& e) {
        throw Error(Errc::corrupt_frame, who + ": rank 0's clusters are malformed: " + e.what());
      }
      return clusters;
    }
    if (op == "refused")
      throw Error(Errc::state, who + ": rank 0 refused this member: " + message.value("reason", std::string("?")));
    try {
      if (op == "flows") {
        const auto results = node.run_flows(message.at("to").get<std::vector<int>>(),
                                            std::chrono::milliseconds(message.value("ms", 300)));
        answer["results"] = nlohmann::json::array();
        for (const auto& r : results) answer["results"].push_back(flow_json(r));
      } else if (op == "ping") {
        const auto r = node.run_ping(message.value("to", 0), message.value("reps", 20));
        if (r.median_us) answer["median_us"] = *r.median_us;
        if (!r.error.empty()) answer["error"] = r.error;
      } else if (op != "alive") {
        answer["error"] = "unknown command '" + op + "'";
      }
    } catch (const nlohmann::json::exception& e) {
      // A malformed command (wrong field types) gets an error answer, not a crash of the member.
      answer["error"] = std::string("malformed command '") + op + "': " + e.what();
    }
    send_json(*control, answer, link.peer_timeout);
  }
}

}  // namespace deltacast::tools
