#pragma once
// `deltacast run --fault ACTION@VERSION[:N]`, a testing aid (the tests and `deltacast demo
// --kill/--freeze`): a receiver kills (SIGKILL) or freezes (SIGSTOP) itself after handling N data
// messages of VERSION, or (stall) the relay thread that handled the N-th stops draining its
// parent's link for good while the process and its heartbeats go on (a stalled child); the producer does so after
// sending N data messages of VERSION, or, with ACTION@VERSION:commit, once VERSION is decided and its state written,
// right before its COMMIT.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tree/receiver.h"

namespace deltacast::tools {

// A parsed --fault: after `after` data messages of `version`, raise `signal` at this process.
struct Fault {
  int signal = 0;  // SIGKILL (kill) or SIGSTOP (stop); 0 for stall
  std::string action;
  uint64_t version = 0;
  uint64_t after = 1;
  bool at_commit = false;  // producer, ACTION@VERSION:commit: once VERSION is decided and its state
                           // written, before its COMMIT goes out
};

// "kill@3", "stop@2:5", "stall@3:4", "kill@2:commit". Throws Error(invalid_argument) naming what is wrong.
Fault parse_fault(const std::string& spec);

// Installs the fault as the receiver's on_data hook (called on the relay threads, one per tree).
// The hook counts the messages of f.version itself rather than trusting the receiver's count, so
// the fault fires once, at the N-th message of that version, however the receiver counts.
void install_fault(tree::ReceiverOptions& options, const Fault& f, int rank);

// The producer's fault (the same spec, not :commit): it fires after the N-th data message of
// f.version the producer sent (the messages posted to the roots, re-sends not counted). `sending`
// is the version the host thread is sending. For ProducerOptions::on_progress.
std::function<void(uint32_t, uint32_t)> producer_fault_hook(const Fault& f,
                                                            const std::shared_ptr<std::atomic<uint64_t>>& sending);

}  // namespace deltacast::tools
