#pragma once
// Follows the directory a trainer writes its checkpoints into (config trainer.kind watch,
// docs/config.md): each entry that is a sharded directory, a directory holding one .safetensors
// file, or a .safetensors file is a checkpoint; names ending in ".tmp" or starting with "." are
// not. Checkpoints are taken in natural order of names ("step-9" before "step-10"), each only once
// it opens whole (checkpoint::Checkpoint::open validates the index, every shard and every size).
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"

namespace deltacast::tools {

// Natural order: digit runs compare as numbers, everything else bytewise.
bool natural_less(const std::string& a, const std::string& b);

class CheckpointWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Found {
    std::string name;
    checkpoint::Checkpoint checkpoint;
    Clock::time_point appeared;  // when its name was first seen
  };
  // `stop` ends a wait (the call returns nullopt). `poll`: how often the directory is listed.
  CheckpointWatch(std::filesystem::path dir, const std::atomic<bool>& stop,
                  std::chrono::milliseconds poll = std::chrono::milliseconds(100));

  // The latest checkpoint present that opens whole (older ones are ignored); when none does yet,
  // waits for the first one that does. Throws Error(io) when the directory cannot be listed.
  std::optional<Found> latest();
  // The checkpoint after `current` in natural order, once it opens whole (waiting for it: a
  // checkpoint still being written is not skipped). Names sorting before `current` that appear
  // are ignored with a warning, once each. A directory that cannot be listed is waited for too
  // (a warning every 10 s), never an error: the tree keeps the current version meanwhile.
  std::optional<Found> next_after(const std::string& current);
  // Opens checkpoint `name` now (--resume). Throws what Checkpoint::open throws.
  Found open(const std::string& name);

 private:
  std::map<std::string, Clock::time_point, decltype(&natural_less)> list();
  std::optional<Found> try_open(const std::string& name, Clock::time_point appeared, bool quiet);

  const std::filesystem::path dir_;
  const std::atomic<bool>& stop_;
  const std::chrono::milliseconds poll_;
  std::map<std::string, Clock::time_point> first_seen_;
  std::map<std::string, bool> warned_before_;
  Clock::time_point last_incomplete_log_{};
  std::optional<Clock::time_point> unlistable_since_;  // next_after: the directory cannot be listed
  Clock::time_point last_unlistable_log_{};
};

}  // namespace deltacast::tools
