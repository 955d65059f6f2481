#pragma once
// Options of `deltacast demo` and the entry point of its distributed (relay tree) mode.
// The offline mode lives in tools/lib_offline_demo.h.
#include <cstdint>
#include <string>

namespace deltacast::tools {

struct DemoOptions {
  bool offline = false;          // in-process: simulator -> encoder -> applier, no transport
  unsigned receivers = 8;        // receivers in the relay tree (distributed mode)
  unsigned steps = 5;            // optimizer steps to refit
  std::string params = "500M";   // simulated model size (sim::parse_param_count)
  std::string topology = "binary";  // relay tree shape (distributed mode)
  double lr = 2e-6;              // simulator learning rate
  std::string transport = "tcp"; // transport backend (distributed mode)
  std::string json_path;         // when set, write {"steps":[{...}, ...]} here
  uint64_t seed = 0;             // simulator seed
  unsigned threads = 2;          // encoder / applier threads
};

// Runs the demo over a relay tree of options.receivers receivers. Throws Error on failure
// (Error(verify_failed) when a receiver does not end bit-exact).
void run_tree_demo(const DemoOptions& options);

}  // namespace deltacast::tools
