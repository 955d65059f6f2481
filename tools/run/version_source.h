#pragma once
// Where `deltacast run`'s producer gets its versions (config trainer.kind, docs/config.md):
//   synth  the synthetic trainer (sim/trainer_simulator.h): one optimizer step per version;
//   watch  a real trainer's checkpoints in trainer.dir (tools/run/checkpoint_watch.h): one
//          checkpoint per version, read with pread (trainer.read; the bootstrap through its
//          file mappings).
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "codec/manifest.h"
#include "config/config.h"
#include "tools/run/producer_state.h"
#include "tree/protocol.h"

namespace deltacast::tools {

class VersionSource {
 public:
  virtual ~VersionSource() = default;
  // The manifest every version has (the bootstrap's).
  virtual const codec::Manifest& manifest() const = 0;
  // The current version's bits (valid until next()).
  virtual codec::ConstWeights weights() const = 0;
  // The same bits read on demand (valid until next()), when the source reads them so (watch with
  // trainer.read pread: Producer::refit reads them in cache-sized pieces); else null.
  virtual const codec::WeightsReader* reader() const { return nullptr; }
  // Moves to the next version: false when none comes (watch: a stop was requested while waiting).
  // Throws Error when the next one cannot be used (watch: its tensors differ from the manifest).
  virtual bool next() = 0;
  // Adds what the report says of the current version to its step entry, committed at `committed`.
  virtual void describe(nlohmann::json& step, std::chrono::steady_clock::time_point committed) const = 0;
  // Records the current version's position (synth: nothing beyond the step; watch: its name).
  virtual void save(ProducerState& state) const = 0;
  // How the current version's checkpoint lies on disk: for WELCOME (the first or resumed version),
  // then with each refit (RefitOptions::layout). Synth: none.
  virtual tree::CheckpointLayout layout() const { return {}; }
  // One line for the producer's log: what version 1 is.
  virtual std::string describe_bootstrap() const = 0;
  // True when weights() holds every tensor (false: a group rank's synthetic trainer holds its part
  // only, and the spans of the tensors outside it are empty).
  virtual bool whole() const { return true; }
  // The trainer's own memory in this process (synth: the simulator's 14 bytes per parameter it
  // holds; watch: 0, the checkpoints are file pages), so a report can tell it from deltacast's.
  virtual uint64_t trainer_bytes() const { return 0; }
};

// Builds the source of producer rank `rank` for `c`, positioned at its first version: synth at
// step 0 (or, resuming, at the state's step, re-simulated and checked against the state's digest);
// watch at the latest complete checkpoint (waiting for one; nullptr when `stop` came first) or,
// resuming, at the state's checkpoint, checked likewise. A group's synth rank (c.producers > 1)
// simulates only its part (the partition the group uses: group_parts, or balanced), as a trainer
// rank holds only its shard; resumed, its part is checked by the group (the parts must add up to
// the committed version's digest at GROUP_HELLO), not here. Throws Error(verify_failed) when a
// resumed source's bits are not the state's, Error(config) when synth is given group_parts shards.
std::unique_ptr<VersionSource> make_version_source(const config::Config& c, uint32_t rank,
                                                   const std::optional<ProducerState>& resume,
                                                   const std::atomic<bool>& stop);

}  // namespace deltacast::tools
