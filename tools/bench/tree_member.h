#pragma once
// The processes of `deltacast bench tree` (docs/benchmarks.md) apart from what they measure: the
// roll call that names ranks that never started, and a receiver's loop over the sweep's sessions.
//
// A sweep is a sequence of sessions, one per measurement: rank 0 builds a tree::Producer on the
// rendezvous URL for a manifest (the payload's size, or the model), starts it, sends a bootstrap
// (and refits), and finishes it with BYE. With a producer group (`producers: M`, refit mode), the
// part ranks 1..M-1 run the same sequence of sessions (they derive it from the same flags) and
// start a part rank's Producer for each; rank 0's is the coordinator. Every receiver builds a
// tree::Receiver on its member URL for each session, learns the session's manifest at WELCOME,
// attaches zeroed buffers (version 0) and runs until BYE. The last session's manifest is one
// tensor named kEndTensor: it tells the receivers that the sweep is over, so they need no plan of
// their own (rank 0 alone decides which sizes fit in memory). Every wait is bounded by the
// config's timeouts.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "codec/manifest.h"
#include "transport/transport.h"
#include "tree/producer.h"
#include "tree/receiver.h"

namespace deltacast::tools {

// The tensor of the session that ends the sweep.
inline constexpr const char* kEndTensor = "deltacast.bench.end";

// Rank 0: listens on `url` and waits up to `patience` for a roll call from each of ranks
// 1..members, then tells every one to go on and closes the listener (the first session's producer
// listens on the same URL next). Throws Error(timeout) naming the ranks that did not report ("they
// never started, or cannot reach rank 0 at URL"); the ranks that did then see their connection
// close and stop. `connect_timeout` bounds each exchange with one member.
void roll_call_coordinator(transport::Transport& transport, const std::string& url, int members,
                           std::chrono::milliseconds patience, std::chrono::milliseconds connect_timeout);

// A member (rank >= 1): reaches rank 0 at `url` (retrying for `patience`, as a receiver's join
// does), reports its rank and waits for rank 0's word, at most 2 x patience + 30 s. Throws
// Error(connection | timeout) saying rank 0 could not be reached or gave up.
void roll_call_member(transport::Transport& transport, const std::string& url, int rank,
                      std::chrono::milliseconds patience, std::chrono::milliseconds connect_timeout);

struct MemberSessionOptions {
  tree::ReceiverOptions receiver;         // rank, producer_url, listen_url, cluster and timeouts
  std::chrono::milliseconds patience{0};  // how long to wait for each next session (timeouts.join)
  // TESTING AID (`--fault kill@S[:N]`): SIGKILL this process at its N-th data message of session
  // S (sessions count from 1 in rank 0's order, warm-ups included). 0: none.
  uint64_t fault_session = 0;
  uint64_t fault_after = 1;
};

// A receiver's part of the sweep: session after session until the end session's BYE. Buffers are
// kept while the manifest stays the same (zeroed again between sessions) and their all-zero
// digest computed once per manifest, so a session's setup costs a memset. Throws when a session
// does not come within `patience` ("rank 0 stopped"), when joining or running one fails, and when
// a session aborted a version on this member.
void serve_sessions(transport::Transport& transport, const MemberSessionOptions& options);

// A producer group's part rank (1..M-1, config `producers: M`) in session `session`: a
// tree::Producer for `manifest` with `options` (options.group names the rank and the
// coordinator), started: it said GROUP_HELLO to rank 0's producer of this session and got its
// WELCOME. As a receiver's join, a start that fails on the previous session's producer closing
// (or this rank's own port not yet free) is tried again, until `patience` is spent (then Error
// naming the session: "rank 0 stopped the sweep"). The caller runs the session's versions on it and finish()es it.
std::unique_ptr<tree::Producer> start_part_session(transport::Transport& transport, const codec::Manifest& manifest,
                                                   const tree::ProducerOptions& options,
                                                   std::chrono::milliseconds patience, uint64_t session);

}  // namespace deltacast::tools
