#pragma once
// What both roles of `deltacast run` share (tools/run/run_command.cpp): the command's options, the
// end-to-end SHA-256 of the weights, JSON reports, logging set-up, memory readings.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/logger.h>
#include <nlohmann/json.hpp>

#include "codec/manifest.h"
#include "config/config.h"

namespace deltacast::tools {

struct RunOptions {
  std::string config_path;
  std::optional<int> rank;
  std::optional<int> size;
  std::optional<std::string> producer;
  std::vector<std::string> sets;
  std::string report_path;
  std::string summary_path;
  std::string fault;                      // ACTION@VERSION[:N] (testing aid, tools/run/fault.h)
  bool resume = false;                    // producer: continue from <output.dir>/producer-state.json
  double slow_disk_bytes_per_second = 0;  // receiver, testing aid: output.checkpoint_dir writes this slow
  // Receiver: a placement file ("{rank}": the receiver's rank); the receiver holds only its slices.
  std::string placement_path;
};

// SHA-256 over every tensor's bytes in manifest order, as hex: an end-to-end bit-equality check
// independent of the codec's own digests. Throws Error(internal) without OpenSSL's SHA-256.
std::string weights_sha256(const codec::ConstWeights& weights);

// Writes `value` (indented) to `path`, creating its folder. Throws Error(io).
void write_json(const std::string& path, const nlohmann::json& value);

// The process's anonymous resident memory (RssAnon): what it allocated, not file pages it maps.
uint64_t rss_anon_bytes();

// The process's peak resident memory so far (VmHWM: anonymous and file pages, the kernel's own
// high-water mark, so no peak between two samples is missed).
uint64_t peak_rss_bytes();

// Sets the level of every subsystem's logger ("info", "debug", ...).
void set_log_level(const std::string& level);

// output.log_file: this process's logs also go to FILE with the rank inserted before the
// extension (run.log -> run.rank3.log), appended, so one file per rank survives restarts. Returns
// a logger writing only to that file (for the final error, which main() prints to stderr), or
// nullptr when no log file is configured. Throws Error(io) when the file cannot be opened. Call
// before any transport or tree thread exists.
std::shared_ptr<spdlog::logger> open_log_file(const config::Config& c, int rank);

// Wall-clock seconds since the epoch: when a version became active (compared across processes of
// one machine or of NTP-synchronised hosts by the benches).
inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace deltacast::tools
