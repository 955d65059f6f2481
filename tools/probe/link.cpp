#include "tools/probe/link.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <random>

#include "tools/probe/analysis.h"
#include "util/error.h"
#include "util/json.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr size_t kSmallMessageBytes = size_t{64} * 1024;
constexpr int kMinFlowMessages = 8;
constexpr int kPingWarmups = 2;

// Waits for `request` in short steps (so a stopping node is not held up) until `timeout`.
Status wait_for(transport::Request& request, std::chrono::milliseconds timeout,
                const std::atomic<bool>* stopping = nullptr) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    Status s = request.wait(std::clamp(left, 1ms, std::chrono::milliseconds(200)));
    if (s.code != Errc::timeout) return s;
    // It may have finished between wait's timeout and now: its own status, not the timeout (the
    // timeout's "still pending" failed a healthy flow: probe_wan_clusters under load).
    if (request.test()) return request.status();
    if (Clock::now() >= deadline) return {Errc::timeout, "no answer within " + std::to_string(timeout.count()) + " ms"};
    if (stopping && stopping->load()) return {Errc::cancelled, "stopping"};
  }
}

nlohmann::json parse(std::span<const std::byte> bytes) {
  return util::parse_json_bounded(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// The steady-state rate of a flow (see the header): arrivals relative to the flow's start.
nlohmann::json flow_result(uint64_t id, Clock::time_point start, const std::vector<Clock::time_point>& arrivals,
                           uint64_t announced) {
  if (arrivals.empty()) return {{"id", id}, {"error", "no payload arrived"}};
  if (arrivals.size() != announced)
    return {
        {"id", id},
        {"error", std::to_string(arrivals.size()) + " messages arrived, " + std::to_string(announced) + " were sent"}};
  const double total = std::chrono::duration<double>(arrivals.back() - start).count();
  const auto cut = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(0.25 * total));
  const size_t first = static_cast<size_t>(std::lower_bound(arrivals.begin(), arrivals.end(), cut) - arrivals.begin());
  double bytes = static_cast<double>(arrivals.size()) * kFlowMessageBytes;
  double seconds = total;
  if (first + 2 < arrivals.size()) {  // at least two intervals after the cut
    bytes = static_cast<double>(arrivals.size() - 1 - first) * kFlowMessageBytes;
    seconds = std::chrono::duration<double>(arrivals.back() - arrivals[first]).count();
  }
  if (seconds <= 0) return {{"id", id}, {"error", "the flow took no measurable time"}};
  return {{"id", id}, {"gbit", bytes * 8 / seconds / 1e9}, {"seconds", total}, {"messages", arrivals.size()}};
}

}  // namespace

void send_json(transport::Connection& connection, const nlohmann::json& message, std::chrono::milliseconds timeout) {
  const std::string text = message.dump();
  auto request = connection.post_send(std::as_bytes(std::span(text.data(), text.size())));
  Status s = wait_for(*request, timeout);
  if (!s.ok()) {
    if (!request->test()) {
      connection.close();
      request->wait(timeout);
    }
    throw Error(s.code == Errc::ok ? Errc::connection : s.code, "sending to " + connection.peer() + ": " + s.message);
  }
}

struct ProbeNode::Outgoing {
  std::unique_ptr<transport::Connection> connection;
  std::vector<std::byte> reply = std::vector<std::byte>(kSmallMessageBytes);
};

ProbeNode::ProbeNode(transport::Transport& transport, LinkOptions options, ControlHandler on_control)
    : transport_(transport), options_(std::move(options)), on_control_(std::move(on_control)) {
  payload_.resize(kFlowMessageBytes);
  std::mt19937_64 random(static_cast<uint64_t>(options_.rank) + 1);
  for (size_t i = 0; i + 8 <= payload_.size(); i += 8) {
    const uint64_t v = random();
    std::memcpy(payload_.data() + i, &v, 8);
  }
  listener_ = transport_.listen(transport::Url::parse(options_.urls.at(static_cast<size_t>(options_.rank))));
  acceptor_ = std::thread([this] { accept_loop(); });
}

ProbeNode::~ProbeNode() { stop(); }

void ProbeNode::stop() {
  if (stopping_.exchange(true)) return;
  listener_->close();
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> threads;
  std::map<int, std::shared_ptr<Outgoing>> outgoing;
  {
    std::lock_guard lock(mutex_);
    for (auto* c : served_) c->close();
    threads.swap(threads_);
    outgoing.swap(outgoing_);
  }
  for (auto& [_, o] : outgoing) o->connection->close();
  for (auto& t : threads) t.join();
}

void ProbeNode::accept_loop() {
  auto log = logger("probe");
  while (!stopping_) {
    std::unique_ptr<transport::Connection> connection;
    try {
      connection = listener_->accept(200ms);
    } catch (const Error& e) {
      if (!stopping_) log->warn("rank {}: accepting: {}", options_.rank, e.what());
      return;
    }
    if (!connection) continue;
    std::vector<std::byte> buffer(kSmallMessageBytes);
    auto request = connection->post_recv(buffer);
    Status s = wait_for(*request, options_.connect_timeout, &stopping_);
    if (!s.ok()) {
      connection->close();
      request->wait(options_.connect_timeout);
      log->warn("rank {}: a connection from {} sent no hello: {}", options_.rank, connection->peer(), s.message);
      continue;
    }
    const auto hello = parse(std::span(buffer.data(), request->bytes()));
    const std::string kind = hello.is_object() ? hello.value("kind", "") : "";
    if (kind == "control" && on_control_) {
      on_control_(hello.value("rank", -1), std::move(connection));
    } else if (kind == "data") {
      const int from = hello.value("from", -1);
      std::lock_guard lock(mutex_);
      served_.push_back(connection.get());
      threads_.emplace_back([this, c = std::move(connection), from]() mutable { serve(std::move(c), from); });
    } else {
      log->warn("rank {}: dropping a connection from {} with an unexpected hello", options_.rank, connection->peer());
    }
  }
}

void ProbeNode::serve(std::unique_ptr<transport::Connection> connection, int from) {
  auto log = logger("probe");
  struct Slot {
    std::vector<std::byte> buffer = std::vector<std::byte>(kFlowMessageBytes);
    std::shared_ptr<transport::Request> request;
  };
  std::vector<Slot> ring(kFlowWindow);
  for (auto& slot : ring) slot.request = connection->post_recv(slot.buffer);
  bool in_flow = false;
  uint64_t flow_id = 0;
  Clock::time_point flow_start;
  std::vector<Clock::time_point> arrivals;
  for (size_t next = 0; !stopping_; next = (next + 1) % ring.size()) {
    Slot& slot = ring[next];
    Status s;
    while ((s = slot.request->wait(200ms)).code == Errc::timeout && !slot.request->test() && !stopping_) {
    }
    if (stopping_ || !s.ok()) {
      if (!stopping_) log->debug("rank {}: data connection from rank {} ended: {}", options_.rank, from, s.message);
      break;
    }
    const auto now = Clock::now();
    const size_t bytes = slot.request->bytes();
    if (bytes == kFlowMessageBytes) {
      if (in_flow) arrivals.push_back(now);
    } else {
      const auto message = parse(std::span(slot.buffer.data(), bytes));
      const std::string op = message.is_object() ? message.value("op", "") : "";
      try {
        if (op == "flow") {
          in_flow = true;
          flow_id = message.value("id", uint64_t{0});
          flow_start = now;
          arrivals.clear();
        } else if (op == "end") {
          in_flow = false;
          send_json(*connection, flow_result(flow_id, flow_start, arrivals, message.value("messages", uint64_t{0})),
                    options_.peer_timeout);
        } else if (op == "ping") {
          std::vector<std::byte> echo(slot.buffer.begin(), slot.buffer.begin() + static_cast<std::ptrdiff_t>(bytes));
          auto sent = connection->post_send(echo);
          if (!wait_for(*sent, options_.peer_timeout).ok()) break;
        }
      } catch (const Error& e) {
        log->debug("rank {}: answering rank {}: {}", options_.rank, from, e.what());
        break;
      }
    }
    slot.request = connection->post_recv(slot.buffer);
  }
  connection->close();
  for (auto& slot : ring) slot.request->wait(options_.peer_timeout);  // buffers outlive their requests
  std::lock_guard lock(mutex_);
  served_.erase(std::remove(served_.begin(), served_.end(), connection.get()), served_.end());
}

std::shared_ptr<ProbeNode::Outgoing> ProbeNode::outgoing(int to) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = outgoing_.find(to); it != outgoing_.end()) return it->second;
  }
  auto out = std::make_shared<Outgoing>();
  out->connection =
      transport_.connect(transport::Url::parse(options_.urls.at(static_cast<size_t>(to))), options_.connect_timeout);
  send_json(*out->connection, {{"kind", "data"}, {"from", options_.rank}}, options_.connect_timeout);
  std::lock_guard lock(mutex_);
  if (stopping_) throw Error(Errc::cancelled, "the probe is stopping");
  outgoing_[to] = out;
  return out;
}

void ProbeNode::drop(int to) {
  std::shared_ptr<Outgoing> out;
  {
    std::lock_guard lock(mutex_);
    auto it = outgoing_.find(to);
    if (it == outgoing_.end()) return;
    out = it->second;
    outgoing_.erase(it);
  }
  out->connection->close();
}

FlowResult ProbeNode::run_flow(int to, std::chrono::milliseconds flow_time) {
  FlowResult result;
  result.to = to;
  try {
    auto out = outgoing(to);
    auto& connection = *out->connection;
    auto reply = connection.post_recv(out->reply);
    const uint64_t id = next_id_++;
    send_json(connection, {{"op", "flow"}, {"id", id}}, options_.peer_timeout);
    std::vector<std::shared_ptr<transport::Request>> window;
    uint64_t sent = 0;
    const auto start = Clock::now();
    auto keep_sending = [&] {
      const auto elapsed = Clock::now() - start;
      return elapsed < flow_time || (sent < kMinFlowMessages && elapsed < 4 * flow_time);
    };
    Status failure;
    while (failure.ok() && (keep_sending() || !window.empty())) {
      if (keep_sending() && window.size() < static_cast<size_t>(kFlowWindow)) {
        window.push_back(connection.post_send(payload_));
        ++sent;
        continue;
      }
      failure = wait_for(*window.front(), options_.peer_timeout);
      window.erase(window.begin());
    }
    if (!failure.ok()) {
      connection.close();
      for (auto& r : window) r->wait(options_.peer_timeout);
      reply->wait(options_.peer_timeout);
      throw Error(failure.code, "streaming: " + failure.message);
    }
    send_json(connection, {{"op", "end"}, {"id", id}, {"messages", sent}}, options_.peer_timeout);
    // The receiver answers once the last message arrived: allow the socket buffers to drain.
    const Status s = wait_for(*reply, options_.peer_timeout + 30s);
    if (!s.ok()) {
      connection.close();
      reply->wait(options_.peer_timeout);
      throw Error(s.code, "waiting for the receiver's figure: " + s.message);
    }
    const auto answer = parse(std::span(out->reply.data(), reply->bytes()));
    if (!answer.is_object() || answer.value("id", uint64_t{0}) != id)
      throw Error(Errc::connection, "the receiver's answer is not this flow's");
    if (answer.contains("error")) throw Error(Errc::connection, "receiver: " + answer["error"].get<std::string>());
    result.gbit = answer.value("gbit", 0.0);
    result.seconds = answer.value("seconds", 0.0);
    result.messages = answer.value("messages", uint64_t{0});
  } catch (const Error& e) {
    result.gbit.reset();
    result.error = e.what();
    drop(to);
  }
  return result;
}

std::vector<FlowResult> ProbeNode::run_flows(const std::vector<int>& to, std::chrono::milliseconds flow_time) {
  if (to.size() == 1) return {run_flow(to.front(), flow_time)};
  std::vector<std::future<FlowResult>> flows;
  flows.reserve(to.size());
  for (int r : to)
    flows.push_back(std::async(std::launch::async, [this, r, flow_time] { return run_flow(r, flow_time); }));
  std::vector<FlowResult> results;
  results.reserve(flows.size());
  for (auto& f : flows) results.push_back(f.get());
  return results;
}

PingResult ProbeNode::run_ping(int to, int reps) {
  PingResult result;
  try {
    auto out = outgoing(to);
    auto& connection = *out->connection;
    std::string ping = nlohmann::json{{"op", "ping"}}.dump();
    ping.resize(kPingBytes, ' ');
    std::vector<double> rtts;
    for (int k = 0; k < reps + kPingWarmups; ++k) {
      auto reply = connection.post_recv(out->reply);
      const auto start = Clock::now();
      auto sent = connection.post_send(std::as_bytes(std::span(ping.data(), ping.size())));
      Status s = wait_for(*reply, options_.peer_timeout);
      const auto end = Clock::now();
      if (s.ok()) s = wait_for(*sent, options_.peer_timeout);
      if (!s.ok()) {
        connection.close();
        reply->wait(options_.peer_timeout);
        sent->wait(options_.peer_timeout);
        throw Error(s.code, "ping: " + s.message);
      }
      if (k >= kPingWarmups) rtts.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    }
    result.median_us = median(rtts);
  } catch (const Error& e) {
    result.error = e.what();
    drop(to);
  }
  return result;
}

}  // namespace deltacast::tools
