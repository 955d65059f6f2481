#pragma once
// The producer's state file, <output.dir>/producer-state.json (docs/config.md): what
// `deltacast run --resume` needs to continue the version chain after a producer restart.
#include <cstdint>
#include <map>
#include <string>

#include "config/config.h"

namespace deltacast::tools {

struct ProducerState {
  uint64_t version = 0;       // last committed version
  uint64_t digest = 0;        // its combined StateDigest
  uint64_t trainer_step = 0;  // refits behind it (0: the bootstrap)
  uint64_t attempt = 0;       // the producer's last attempt id
  std::string topology;
  std::string trainer_kind = "synth";    // trainer.kind
  uint64_t params = 0;                   // synth: trainer.params
  uint64_t seed = 0;                     // synth: trainer.seed
  double lr = 0;                         // synth: trainer.lr
  std::string dir;                       // watch: trainer.dir
  std::string checkpoint;                // watch: the checkpoint (name in dir) of `version`
  std::map<uint64_t, uint64_t> history;  // the committed versions' digests the producer remembers
  double full_seconds = 0;               // the bootstrap's time: the reference of the speedup column
  // BYE went out at `version`: the receivers were told to leave (the job finished, or was stopped,
  // or failed). A resume of such a state has nobody to send to: it says so and does nothing.
  bool ended = false;
  // The committed version before `version` (version 0: none): what a producer group's coordinator
  // steps back to when it was lost after deciding `version`, before any rank or receiver heard so
  // (tree::ProducerResume::previous).
  struct Previous {
    uint64_t version = 0;
    uint64_t digest = 0;
    uint64_t trainer_step = 0;
    std::string checkpoint;  // watch
  };
  Previous previous;

  // This state as it was when `previous` was the committed version (its own previous unknown).
  ProducerState at_previous() const;
  // Makes the committed version the previous one (when `version` is another), before a newer one
  // is recorded.
  void push_previous(uint64_t next_version);
};

// <output.dir>/producer-state.json; a producer group's rank g >= 1: producer-state-rank<g>.json.
std::string state_path(const config::Config& c, int producer_rank = 0);
// Writes the state atomically (temporary file, fsync, rename). Throws Error(io).
void write_state(const std::string& path, const ProducerState& s);
// Reads and checks the state file. Throws Error(not_found) when it is missing and
// Error(corrupt_frame) naming the problem when it does not parse.
ProducerState read_state(const std::string& path);
// A state written under another trainer or tree cannot be continued with this config:
// Error(config) naming each difference.
void check_state_against_config(const ProducerState& s, const config::Config& c, const std::string& path);

}  // namespace deltacast::tools
