// `deltacast synth`: writes the checkpoints of a SIMULATED training run (sim/trainer_simulator.h):
// DIR/step-0000.safetensors (initial weights) ... DIR/step-NNNN.safetensors, or with --shards K
// each step as a Hugging Face sharded directory DIR/step-NNNN/ (K shards and the index).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "checkpoint/checkpoint.h"
#include "sim/trainer_simulator.h"
#include "tools/cli.h"
#include "util/error.h"

namespace deltacast::tools::synth_command {  // its own namespace: unity builds batch the commands together
namespace {

struct SynthOptions {
  std::string out_dir;
  std::string params = "200M";
  unsigned steps = 3;
  double lr = 2e-6;
  uint64_t seed = 0;
  unsigned threads = 2;
  unsigned shards = 0;  // 0: single files
};

std::filesystem::path step_path(const std::filesystem::path& dir, uint64_t step, bool sharded) {
  char name[64];
  std::snprintf(name, sizeof name, "step-%04llu%s", static_cast<unsigned long long>(step),
                sharded ? "" : ".safetensors");
  return dir / name;
}

void run_synth(const SynthOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) throw Error(Errc::io, "cannot create directory " + o.out_dir + ": " + ec.message());
  sim::SimConfig config;
  config.params = sim::parse_param_count(o.params);
  config.lr = static_cast<float>(o.lr);
  config.seed = o.seed;
  config.threads = o.threads;
  const auto t0 = std::chrono::steady_clock::now();
  sim::TrainerSimulator trainer(config);
  const auto& shape = trainer.shape();
  std::printf("simulated model: %llu parameters (hidden %llu, layers %llu, vocab %llu), lr %g, seed %llu\n",
              static_cast<unsigned long long>(trainer.manifest().total_elements()),
              static_cast<unsigned long long>(shape.hidden), static_cast<unsigned long long>(shape.layers),
              static_cast<unsigned long long>(shape.vocab), o.lr, static_cast<unsigned long long>(o.seed));
  const checkpoint::Metadata base_meta{{"format", "pt"},
                                       {"producer", "deltacast synth (simulated trainer)"},
                                       {"seed", std::to_string(o.seed)},
                                       {"lr", std::to_string(o.lr)}};
  for (uint64_t step = 0;; ++step) {
    auto meta = base_meta;
    meta["step"] = std::to_string(step);
    const auto path = step_path(o.out_dir, step, o.shards > 0);
    const auto weights = trainer.bf16_weights();
    if (o.shards == 0) {
      checkpoint::write_safetensors(path, weights, meta);
    } else {
      auto layout = checkpoint::even_layout(*weights.manifest, o.shards);
      for (auto& shard : layout.shards) shard.metadata = meta;
      checkpoint::write_checkpoint(path, weights, layout);
    }
    std::printf("wrote %s\n", path.c_str());
    if (step == o.steps) break;
    trainer.step();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("done in %.1f s\n", seconds);
}

void setup(CLI::App& parent) {
  auto opts = std::make_shared<SynthOptions>();
  auto* cmd = parent.add_subcommand("synth", "write checkpoints of a SIMULATED trainer (FP32 Adam -> BF16)");
  cmd->add_option("--out", opts->out_dir, "output directory")->required();
  cmd->add_option("--params", opts->params, "parameter count, e.g. 200M, 1.5B")->capture_default_str();
  cmd->add_option("--steps", opts->steps, "optimizer steps after the initial checkpoint")->capture_default_str();
  cmd->add_option("--lr", opts->lr, "Adam learning rate")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "random seed")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "worker threads")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--shards", opts->shards, "write each step as a sharded directory of this many shards (0: one file)")
      ->capture_default_str();
  cmd->callback([opts] { run_synth(*opts); });
}

const CommandRegistrar registrar{"synth", &setup};

}  // namespace
}  // namespace deltacast::tools::synth_command
