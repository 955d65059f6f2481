#pragma once
// The data plane of `deltacast probe` (docs/probe.md): every process of the job runs one
// ProbeNode. It listens on its own URL and serves the data connections other ranks open to it
// (one thread each): it times the flows they stream and sends each flow's steady-state rate back,
// and it echoes their pings. It opens (and caches) its own data connections to measure flows and
// round trips towards other ranks when the coordinator asks.
//
// Wire rules (every message is a transport message):
//  * The first message on every connection is a hello, a small JSON text:
//    {"kind":"data","from":R} for a data connection, {"kind":"control","rank":R} for a member's
//    control connection to rank 0 (handed to the on_control callback).
//  * On a data connection from S: {"op":"flow","id":K} starts a flow, then messages of exactly
//    kFlowMessageBytes are the flow's payload, then {"op":"end","id":K,"messages":M} ends it; the
//    receiver answers {"id":K,"gbit":G,"seconds":D,"messages":M} or {"id":K,"error":"..."}.
//    A ping is a 64-byte message {"op":"ping"} padded with spaces; the receiver echoes it.
//  * Flow rate: the receiver's arrival times of the payload messages, from the flow header to the
//    last message (duration D); the rate counts the messages after the first one that arrived at
//    or after 25% of D, over the time from that one to the last (TCP slow start excluded).
//
// Every wait is bounded (connect_timeout for connecting, peer_timeout for a peer's answer, plus
// the drain time of a flow); failures come back as error strings in the results, never as hangs.
// Thread-safety: run_flows and run_ping may be called from any thread, but never two operations
// towards the same destination at once (the coordinator measures one figure at a time).
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "transport/transport.h"

namespace deltacast::tools {

inline constexpr size_t kFlowMessageBytes = size_t{1} << 20;  // 1 MiB
inline constexpr int kFlowWindow = 4;                         // sends in flight per flow
inline constexpr size_t kPingBytes = 64;

struct LinkOptions {
  int rank = 0;
  std::vector<std::string> urls;  // [job rank] -> the URL that rank listens on
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds peer_timeout{10000};
};

struct FlowResult {
  int to = 0;
  std::optional<double> gbit;  // 10^9 bit/s, steady state; nullopt on error
  double seconds = 0;          // the flow's duration at the receiver
  uint64_t messages = 0;
  std::string error;
};

struct PingResult {
  std::optional<double> median_us;
  std::string error;
};

// A small JSON message on `connection`; throws Error(connection | timeout) when it is not sent
// within `timeout`.
void send_json(transport::Connection& connection, const nlohmann::json& message, std::chrono::milliseconds timeout);

class ProbeNode {
 public:
  using ControlHandler = std::function<void(int rank, std::unique_ptr<transport::Connection>)>;

  // Listens on options.urls[options.rank] (throws what Transport::listen throws) and starts
  // serving. on_control receives members' control connections (rank 0); without it they are
  // closed. `transport` must outlive the node.
  ProbeNode(transport::Transport& transport, LinkOptions options, ControlHandler on_control = {});
  ~ProbeNode();
  ProbeNode(const ProbeNode&) = delete;
  ProbeNode& operator=(const ProbeNode&) = delete;

  // One flow of `flow_time` to each rank of `to` (distinct), all at once. A flow goes on past
  // flow_time until it sent 8 messages, but not past 4 x flow_time. Results in the order of `to`.
  std::vector<FlowResult> run_flows(const std::vector<int>& to, std::chrono::milliseconds flow_time);
  // `reps` round trips of a 64-byte message to `to` (after 2 not counted), their median.
  PingResult run_ping(int to, int reps);
  // Stops listening, closes every connection and joins the threads. Idempotent.
  void stop();

 private:
  struct Outgoing;
  std::shared_ptr<Outgoing> outgoing(int to);
  void drop(int to);
  FlowResult run_flow(int to, std::chrono::milliseconds flow_time);
  void accept_loop();
  void serve(std::unique_ptr<transport::Connection> connection, int from);

  transport::Transport& transport_;
  LinkOptions options_;
  ControlHandler on_control_;
  std::unique_ptr<transport::Listener> listener_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_id_{1};
  std::vector<std::byte> payload_;
  std::mutex mutex_;  // guards outgoing_, served_, threads_
  std::map<int, std::shared_ptr<Outgoing>> outgoing_;
  std::vector<transport::Connection*> served_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace deltacast::tools
