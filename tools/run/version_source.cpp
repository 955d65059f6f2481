#include "tools/run/version_source.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "codec/digest.h"
#include "sim/model_shape.h"
#include "sim/trainer_simulator.h"
#include "tools/checkpoint/manifest_compare.h"
#include "tools/run/checkpoint_output.h"
#include "tools/run/checkpoint_watch.h"
#include "tree/group_parts.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

unsigned threads() { return std::max(1u, std::thread::hardware_concurrency()); }

// The resumed source's bits must be the state's committed version.
void check_resumed(const codec::ConstWeights& weights, const ProducerState& s, const std::string& what) {
  const uint64_t digest = codec::StateDigest::full_scan(weights, threads()).combined();
  if (digest != s.digest)
    throw Error(Errc::verify_failed, "--resume: " + what + " gives digest " + hex64(digest) +
                                         ", but the state says version " + std::to_string(s.version) + " has " +
                                         hex64(s.digest));
}

// Group rank `rank`'s part of the synthetic model, as simulator element ranges: the partition the
// producers compute (tree::Producer: group_parts, else balanced). Empty for one producer.
std::vector<sim::SimRange> synth_part(const config::Config& c, uint32_t rank) {
  if (c.producers <= 1) return {};
  const codec::Manifest manifest(sim::model_tensors(sim::model_shape_for(c.trainer.params)));
  // shards: the synthetic trainer writes no shard files (shard_parts says so, as for any
  // checkpoint without them).
  const codec::Partition partition =
      c.group_parts == "balanced" ? codec::Partition::balanced(manifest, c.producers)
      : c.group_parts == "shards"
          ? codec::Partition::from_parts(manifest, tree::shard_parts({}, manifest, c.producers))
          : codec::Partition::from_parts(manifest, tree::parse_group_parts(c.group_parts, manifest, c.producers));
  std::vector<sim::SimRange> part;
  for (const codec::PartRange& r : partition.part(rank)) {
    const uint64_t per = codec::dtype_units_per_element(manifest.at(r.tensor).dtype);  // units to elements
    part.push_back({r.tensor, r.begin / per, r.end / per});
  }
  return part;
}

class SynthSource final : public VersionSource {
 public:
  SynthSource(const config::Config& c, uint32_t rank, const std::optional<ProducerState>& resume)
      : trainer_(sim_config(c, rank)) {
    if (!resume) return;
    std::printf("producer: re-simulating the trainer to step %llu\n",
                static_cast<unsigned long long>(resume->trainer_step));
    std::fflush(stdout);
    while (trainer_.step_index() < resume->trainer_step) trainer_.step();
    // The simulator's steps depend only on (seed, step, tensor, element), not on its thread
    // count (sim/trainer_simulator.h), so any machine re-simulates the same bits. A part is
    // checked by the group at GROUP_HELLO (the ranks' parts add up to the committed version).
    if (whole())
      check_resumed(trainer_.bf16_weights(), *resume,
                    "the trainer did not re-simulate to the same bits: step " + std::to_string(resume->trainer_step));
  }
  bool whole() const override { return !part_; }
  uint64_t trainer_bytes() const override { return 14 * (part_ ? elements_ : trainer_.manifest().total_elements()); }
  const codec::Manifest& manifest() const override { return trainer_.manifest(); }
  codec::ConstWeights weights() const override { return trainer_.bf16_weights(); }
  bool next() override {
    trainer_.step();
    return true;
  }
  void describe(nlohmann::json&, std::chrono::steady_clock::time_point) const override {}
  void save(ProducerState& s) const override {
    s.trainer_kind = "synth";
    s.params = params_;
    s.seed = seed_;
    s.lr = lr_;
  }
  std::string describe_bootstrap() const override {
    return "a synthetic model of " + std::to_string(trainer_.manifest().total_elements()) + " parameters";
  }

 private:
  sim::SimConfig sim_config(const config::Config& c, uint32_t rank) {
    params_ = c.trainer.params;
    seed_ = c.trainer.seed;
    lr_ = c.trainer.lr;
    sim::SimConfig s;
    s.params = c.trainer.params;
    s.lr = static_cast<float>(c.trainer.lr);
    s.seed = c.trainer.seed;
    s.threads = threads();
    s.part = synth_part(c, rank);
    part_ = c.producers > 1;
    if (part_) {
      for (const auto& r : s.part) elements_ += r.end - r.begin;
      std::printf("producer rank %u: building its part of a synthetic model of %llu parameters (%llu of them)\n", rank,
                  static_cast<unsigned long long>(s.params), static_cast<unsigned long long>(elements_));
    } else {
      std::printf("producer: building a synthetic model of %llu parameters\n",
                  static_cast<unsigned long long>(s.params));
    }
    std::fflush(stdout);
    return s;
  }
  bool part_ = false;      // a group rank's part only
  uint64_t elements_ = 0;  // a part's parameters
  uint64_t params_ = 0, seed_ = 0;
  double lr_ = 0;
  sim::TrainerSimulator trainer_;
};

class WatchSource final : public VersionSource {
 public:
  WatchSource(const config::Config& c, std::unique_ptr<CheckpointWatch> watch, CheckpointWatch::Found first)
      : dir_(c.trainer.dir),
        read_(c.trainer.read == "pread"),
        watch_(std::move(watch)),
        current_(std::move(first)),
        manifest_(current_.checkpoint.manifest()) {}

  const codec::Manifest& manifest() const override { return manifest_; }
  codec::ConstWeights weights() const override {
    codec::ConstWeights w = current_.checkpoint.weights();
    w.manifest = &manifest_;  // the same tensors (checked): one manifest object for every version
    return w;
  }
  const codec::WeightsReader* reader() const override { return read_ ? &current_.checkpoint.reader() : nullptr; }
  bool next() override {
    auto found = watch_->next_after(current_.name);
    if (!found) return false;
    if (auto why = manifest_difference(manifest_, found->checkpoint.manifest()))
      throw Error(Errc::invalid_argument, "trainer.dir " + dir_ + ": checkpoint " + found->name +
                                              " does not hold the model the receivers hold: " + *why);
    current_ = std::move(*found);
    return true;
  }
  void describe(nlohmann::json& step, std::chrono::steady_clock::time_point committed) const override {
    step["checkpoint"] = current_.name;
    step["appeared_to_commit_seconds"] = std::chrono::duration<double>(committed - current_.appeared).count();
  }
  void save(ProducerState& s) const override {
    s.trainer_kind = "watch";
    s.dir = dir_;
    s.checkpoint = current_.name;
  }
  tree::CheckpointLayout layout() const override { return welcome_layout(current_.checkpoint, manifest_); }
  std::string describe_bootstrap() const override {
    return "checkpoint " + current_.name + " of " + dir_ + " (" + std::to_string(manifest_.size()) + " tensors, " +
           std::to_string(manifest_.total_bytes()) + " bytes)";
  }

 private:
  std::string dir_;
  bool read_;  // trainer.read pread
  std::unique_ptr<CheckpointWatch> watch_;
  CheckpointWatch::Found current_;
  codec::Manifest manifest_;
};

}  // namespace

std::unique_ptr<VersionSource> make_version_source(const config::Config& c, uint32_t rank,
                                                   const std::optional<ProducerState>& resume,
                                                   const std::atomic<bool>& stop) {
  if (c.trainer.kind == "synth") return std::make_unique<SynthSource>(c, rank, resume);
  auto watch = std::make_unique<CheckpointWatch>(c.trainer.dir, stop);
  std::optional<CheckpointWatch::Found> first;
  if (resume) {
    if (resume->checkpoint.empty()) throw Error(Errc::config, "--resume: the state names no checkpoint of trainer.dir");
    first = watch->open(resume->checkpoint);
    check_resumed(first->checkpoint.weights(), *resume,
                  "checkpoint " + resume->checkpoint + " of " + c.trainer.dir + " is not the committed version:");
  } else {
    std::printf("producer: waiting for a complete checkpoint in %s\n", c.trainer.dir.c_str());
    std::fflush(stdout);
    first = watch->latest();
    if (!first) return nullptr;
  }
  return std::make_unique<WatchSource>(c, std::move(watch), std::move(*first));
}

}  // namespace deltacast::tools
