#pragma once
// Options of `deltacast demo` and the entry point of its distributed (relay tree) mode.
// The offline mode lives in tools/demo/offline_demo.h.
#include <cstdint>
#include <string>
#include <vector>

namespace deltacast::tools {

struct DemoOptions {
  bool offline = false;    // in-process: simulator -> encoder -> applier, no transport
  unsigned receivers = 8;  // receivers in the relay tree (distributed mode)
  // Producer ranks (a producer group, docs/producer-group.md): each sends its part of every version
  // through its own uplink (`uplink` each). 1: one producer.
  unsigned producers = 1;
  unsigned steps = 5;           // optimizer steps to refit
  std::string params = "100M";  // simulated model size (sim::parse_param_count)
  // The producer's egress cap (config egress.producer, a rate: "100Mbit/s"; "0" or "unlimited":
  // none): a cross-cluster uplink on one machine, where loopback's wire would otherwise be free.
  std::string uplink = "100Mbit/s";
  std::string topology = "binary";  // relay tree shape (distributed mode)
  double lr = 2e-6;                 // simulator learning rate
  std::string transport = "tcp";    // transport backend (distributed mode)
  std::string json_path;            // when set, write {"steps":[{...}, ...]} here
  uint64_t seed = 0;                // simulator seed
  unsigned threads = 2;             // encoder / applier threads
  // Failure injection (distributed mode), each "RANK@STEP[:N]": receiver RANK (1..receivers)
  // kills (SIGKILL) / freezes (SIGSTOP) itself after N (default 1) data messages of the version
  // STEP creates (STEP 0 = the full checkpoint, version 1; step s = version s+1). The demo then
  // expects that rank to fail, checks only the others, and SIGKILLs frozen ones at the end.
  std::vector<std::string> kill;
  std::vector<std::string> freeze;
  std::string timeout = "30m";  // every process is killed and the demo fails after this long
};

// Runs the demo over a relay tree of options.receivers receivers. Throws Error on failure
// (Error(verify_failed) when a process other than a --kill/--freeze victim failed or a surviving
// receiver does not end bit-exact, Error(timeout) after options.timeout). Leaves no child process
// behind, also when it throws.
void run_tree_demo(const DemoOptions& options);

}  // namespace deltacast::tools
