#pragma once
// The refit cost model: how long one refit of a BF16 model takes, from a handful of measured
// constants and the network figures `deltacast probe` finds. One function, `predict`, so that
// later work can fit the constants to measured refits (bench/RESULTS.md) without touching callers.
//
//   seconds = diff + transfer + fill + apply + round_trips
//     diff        = model_bytes / (diff_bytes_per_second_per_thread x diff_threads)
//     transfer    = payload_bytes x bottleneck_seconds_per_byte
//                   (payload_bytes = params x change_rate x bytes_per_change)
//     fill        = tree_depth x chunk_bytes / inner_bytes_per_second   (pipeline fill)
//     apply       = model_bytes / apply_bytes_per_second
//     round_trips = round_trips x rtt_seconds                           (join/commit handshakes)
// where model_bytes = params x bytes_per_element. Pure arithmetic; thread-safe.
#include <cstdint>

#include <nlohmann/json.hpp>

namespace deltacast::tools {

// The constants. Defaults and where they come from:
struct CostModel {
  // Producer diff (encode) throughput per thread, bytes of checkpoint per second: bench/RESULTS.md,
  // "codec: encode", 2.64-2.80 GB/s on one thread at ~3% changed (session 4).
  double diff_bytes_per_second_per_thread = 2.7e9;
  // Receiver apply throughput, checkpoint-equivalent bytes per second: bench/RESULTS.md, "codec:
  // apply", 5.02-5.78 GB/s with 2 threads at ~3% (median 5.31), rounded down.
  double apply_bytes_per_second = 5e9;
  // Producer <-> member round trips on a refit's critical path (announce, acks, commit): the
  // estimate of issue 14, not fitted yet.
  double round_trips = 2.3;
  // BF16: 2 bytes per element.
  double bytes_per_element = 2.0;

  nlohmann::json to_json() const;
};

// What one prediction depends on (the caller fills these from the probe's figures).
struct CostInputs {
  double params = 1e9;                     // elements of the model
  double change_rate = 0.01;               // fraction of elements changed by one step
  double bytes_per_change = 0.80;          // encoded payload bytes per changed element
                                           // (bench/RESULTS.md: 0.85 B/change at ~3%)
  int diff_threads = 8;                    // producer encode threads
  double bottleneck_seconds_per_byte = 0;  // transfer time per payload byte through the tree
  int tree_depth = 1;                      // member hops on the longest path, producer hop included
  double chunk_bytes = 4 << 20;            // pipelining unit
  double inner_bytes_per_second = 1;       // typical link inside a cluster
  double rtt_seconds = 0;                  // producer <-> member round trip
};

struct CostPrediction {
  double seconds = 0;
  double diff = 0, transfer = 0, fill = 0, apply = 0, round_trips = 0;  // the terms, in seconds
  double payload_bytes = 0;

  nlohmann::json terms_json() const;
};

// The model above. Requires diff_threads >= 1 and positive throughputs (a non-positive
// inner_bytes_per_second makes fill 0). Never throws.
CostPrediction predict(const CostModel& model, const CostInputs& in) noexcept;

}  // namespace deltacast::tools
