#pragma once
// The refit cost model of docs/performance.md, in the form it projects a deployment (producer and
// receivers on hosts of their own): how long one refit of a BF16 model takes, from constants fitted
// on measured refits and the network figures `deltacast probe` finds.
//
//   seconds = max(diff, transfer, apply) + fill + commit        (the three stages are pipelined)
//     diff     = (E x t_scan + C x t_change) / (M x diff_threads)   producer: scan, encode the changes
//     transfer = payload_bytes x max(producer uplink s/B / M, worst member s/B)   payload = C x bytes_per_change
//     apply    = (C x (t_apply_c + t_apply_rc) + E x t_scan_rc) / apply_threads   one receiver
//     fill     = depth x (t_hop + chunk payload / inner bytes per second)       pipeline fill
//     commit   = c0 + k x rtt      k: round trips per version, fitted per commit mode
// with E = params x 2 (checkpoint bytes), C = params x change_rate (changed elements) and M producer
// ranks (a producer group, docs/producer-group.md: each rank diffs its part on its own host and
// sends it on its own uplink, so the producer's share of the transfer and its diff divide by M;
// what a member relays does not: every receiver still takes in, and relays, the whole payload).
// `serial_seconds` adds the three stages instead of taking the max: the bound if nothing overlapped.
//
// The constants are data installed with the CLI (share/deltacast/cost_model_fit.json, from
// tools/probe/cost_model_fit.json, which bench/model/cost_model.py fit writes), read when a probe
// predicts: this model and bench/model/project_lib.py's `project_one` are the same arithmetic on
// the same numbers. Pure arithmetic besides load(); thread-safe.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace deltacast::tools {

// The fitted constants (thread-seconds of a core to itself; see docs/performance.md).
struct CostModel {
  double t_scan_s_per_byte = 0;     // producer: per checkpoint byte scanned
  double t_change_s = 0;            // producer: per changed element encoded
  double t_apply_c_s = 0;           // receiver: per changed element (fixed part)
  double t_apply_rc_s = 0;          // receiver: per changed element, per receiver
  double t_scan_rc_s_per_byte = 0;  // receiver: per checkpoint byte
  double t_hop_s = 0;               // pipeline fill per tree level
  double c0_s = 0;                  // per-version constant of the commit
  double k_rtt_producer = 0;        // round trips per version, the producer commits
  double k_rtt_delegated = 0;       // round trips per version, a member of the receivers' cluster commits
  double bytes_per_change_1 = 0, bytes_per_change_3 = 0, bytes_per_change_5 = 0;  // measured, at ~1/3/5%
  double bytes_per_element = 2.0;                                                 // BF16

  // The constants of a fit file (bench/model/cost_model.py fit's output: "constants" and
  // "bytes_per_change"). Throws Error(io) when it cannot be read, Error(config) naming the first
  // missing or malformed key.
  static CostModel load(const std::filesystem::path& fit_file);
  // The fit installed with this deltacast: $DELTACAST_COST_MODEL when set, else
  // <the executable's folder>/../share/deltacast/cost_model_fit.json (the install prefix, and the
  // build tree, where the build copies it). Throws as load(), naming where it looked.
  static CostModel installed();
  // The file load() read ("" for a model built in code).
  std::string source;
  // Measured payload bytes per changed element at the nearest of 1%, 3%, 5%.
  double bytes_per_change_at(double change_rate) const noexcept;
  nlohmann::json to_json() const;
};

// What one prediction depends on (the caller fills these from the probe's figures).
struct CostInputs {
  double params = 1e9;                     // elements of the model
  double change_rate = 0.01;               // fraction of elements changed by one step
  double bytes_per_change = 0;             // encoded payload bytes per change; 0: the measured one
  int diff_threads = 8;                    // encode threads of one producer rank
  int producer_ranks = 1;                  // M: producer ranks, each with an uplink like the producer's
  int apply_threads = 8;                   // threads applying one receiver's changes
  double bottleneck_seconds_per_byte = 0;  // transfer time per payload byte through the tree (all links)
  double producer_seconds_per_byte = 0;    // the producer's own share of it (0: not known apart)
  double member_seconds_per_byte = 0;      // the slowest member's (relaying) share
  int tree_depth = 1;                      // member hops on the longest path, producer hop included
  double chunk_bytes = 4 << 20;            // checkpoint bytes per chunk (the pipelining unit)
  double inner_bytes_per_second = 0;       // typical link inside a cluster (<= 0: no transfer part in fill)
  double rtt_seconds = 0;                  // producer <-> member round trip
  bool delegated_commit = false;           // commit decided next to the receivers (docs/protocol.md)
};

struct CostPrediction {
  double seconds = 0, serial_seconds = 0;
  double diff = 0, transfer = 0, fill = 0, apply = 0, commit = 0;  // the terms, in seconds
  double payload_bytes = 0, bytes_per_change = 0, commit_round_trips = 0;

  nlohmann::json terms_json() const;
};

// The model above. Thread counts below 1 count as 1. Never throws.
CostPrediction predict(const CostModel& model, const CostInputs& in) noexcept;

}  // namespace deltacast::tools
