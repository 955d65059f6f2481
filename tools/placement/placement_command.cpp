// `deltacast placement`: a receiver's placement (docs/placement.md) as a file.
//   placement tp    --rank R --size T (--checkpoint PATH | --params N) [--vocab-pad 64] [-o FILE]
//       writes the placement of a vLLM-style tensor-parallel worker (codec::llama_tp_placement:
//       q/k/v and gate/up fused and split by rows, o_proj and down_proj by columns, the vocabulary
//       padded and split by rows, the rest whole) as YAML, to FILE or standard output;
//   placement check FILE (--checkpoint PATH | --params N) [--extract OUT.safetensors]
//       validates FILE against the model (every error of Placement::compile, naming the buffer and
//       part), prints each buffer (dtype, shape, bytes, parts) and what share of the model the
//       receiver holds; --extract writes the receiver's buffers, cut from the checkpoint, as a
//       safetensors file (padding zero): the shard a TP worker loads.
// The model is a checkpoint (a .safetensors file or a sharded directory) or the synthetic model of
// N parameters that `deltacast demo`/`run` simulate.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "codec/placement.h"
#include "codec/tp_placement.h"
#include "config/placement_file.h"
#include "sim/model_shape.h"
#include "tools/cli.h"
#include "util/error.h"

namespace deltacast::tools::placement_command {  // its own namespace: unity builds batch the commands together
namespace {

struct ModelOptions {
  std::string checkpoint;
  std::string params;
};

void add_model_options(CLI::App* cmd, ModelOptions& o) {
  auto* c = cmd->add_option("--checkpoint", o.checkpoint, "the model: a .safetensors file or a sharded directory");
  auto* p = cmd->add_option("--params", o.params, "the model: the synthetic one of this many parameters (100M, 1.5B)");
  c->excludes(p);
}

// The model's manifest, and the checkpoint when one was named.
struct Model {
  std::optional<checkpoint::Checkpoint> checkpoint;
  std::optional<codec::Manifest> synthetic;
  const codec::Manifest& manifest() const { return checkpoint ? checkpoint->manifest() : *synthetic; }
};

Model open_model(const ModelOptions& o) {
  Model m;
  if (!o.checkpoint.empty())
    m.checkpoint.emplace(checkpoint::Checkpoint::open(o.checkpoint));
  else if (!o.params.empty())
    m.synthetic.emplace(sim::model_tensors(sim::model_shape_for(sim::parse_param_count(o.params))));
  else
    throw Error(Errc::invalid_argument, "placement: name the model with --checkpoint PATH or --params N");
  return m;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct TpOptions {
  ModelOptions model;
  uint32_t rank = 0;
  uint32_t size = 0;
  uint64_t vocab_pad = 64;
  std::string out;
};

void run_tp(const TpOptions& o) {
  const Model model = open_model(o.model);
  const auto buffers = codec::llama_tp_placement(model.manifest(), o.rank, o.size, o.vocab_pad);
  codec::Placement::compile(model.manifest(), buffers);  // what it wrote is valid
  const std::string text = "# deltacast placement: TP rank " + std::to_string(o.rank) + " of " +
                           std::to_string(o.size) + " (vocabulary padded to " + std::to_string(o.vocab_pad) + ")\n" +
                           config::placement_yaml(buffers);
  if (o.out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  checkpoint::write_file_atomically(o.out, std::as_bytes(std::span(text.data(), text.size())));
}

struct CheckOptions {
  ModelOptions model;
  std::string file;
  std::string extract;
};

void run_check(const CheckOptions& o) {
  const Model model = open_model(o.model);
  const codec::Manifest& m = model.manifest();
  const codec::Placement p = codec::Placement::compile(m, config::load_placement_file(o.file));
  uint64_t held = 0;
  for (uint32_t b = 0; b < p.buffers().size(); ++b) {
    const auto& spec = p.buffers()[b];
    const uint64_t bytes = p.buffer_units(b) * codec::dtype_unit_size(p.dtype(b));
    std::printf("%s: %s %s, %llu bytes, %zu part%s%s\n", spec.name.c_str(),
                std::string(codec::dtype_name(p.dtype(b))).c_str(), shape_text(p.shape(b)).c_str(),
                static_cast<unsigned long long>(bytes), spec.parts.size(), spec.parts.size() == 1 ? "" : "s",
                spec.stack ? ", stacked" : "");
    held += bytes;
  }
  uint64_t needed = 0;
  for (uint32_t t = 0; t < m.size(); ++t) needed += p.needs(t);
  std::printf("OK: %zu buffers, %llu bytes (%.4f of the model's %llu), parts of %llu of %zu tensors\n",
              p.buffers().size(), static_cast<unsigned long long>(held),
              m.total_bytes() ? double(held) / double(m.total_bytes()) : 0.0,
              static_cast<unsigned long long>(m.total_bytes()), static_cast<unsigned long long>(needed), m.size());
  if (o.extract.empty()) return;
  if (!model.checkpoint)
    throw Error(Errc::invalid_argument, "placement check: --extract needs --checkpoint (the bytes to cut)");
  std::vector<codec::TensorInfo> infos;
  std::vector<std::vector<std::byte>> bytes;
  infos.reserve(p.buffers().size());
  bytes.reserve(p.buffers().size());
  for (uint32_t b = 0; b < p.buffers().size(); ++b) {
    infos.push_back({p.buffers()[b].name, p.dtype(b), p.shape(b)});
    bytes.emplace_back(p.buffer_units(b) * codec::dtype_unit_size(p.dtype(b)));  // padding: zero
  }
  const std::vector<std::span<std::byte>> spans(bytes.begin(), bytes.end());
  codec::gather_placed(p, model.checkpoint->weights(), spans);
  const codec::Manifest shard(infos);
  codec::ConstWeights out{&shard, {}};
  for (uint32_t b = 0; b < p.buffers().size(); ++b) out.tensors.emplace_back(bytes[*shard.find(p.buffers()[b].name)]);
  checkpoint::write_safetensors(o.extract, out);
  std::printf("wrote %s\n", o.extract.c_str());
}

void setup(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("placement", "a receiver's placement: the slices of the model its buffers hold");
  cmd->require_subcommand(1);

  auto tp = std::make_shared<TpOptions>();
  auto* t = cmd->add_subcommand("tp", "write the placement of a vLLM-style tensor-parallel worker (YAML)");
  add_model_options(t, tp->model);
  t->add_option("--rank", tp->rank, "the worker's TP rank")->required();
  t->add_option("--size", tp->size, "the TP size")->required()->check(CLI::PositiveNumber);
  t->add_option("--vocab-pad", tp->vocab_pad, "the vocabulary is padded to a multiple of this, then split evenly")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  t->add_option("-o,--out", tp->out, "the file to write (default: standard output)");
  t->callback([tp] { run_tp(*tp); });

  auto check = std::make_shared<CheckOptions>();
  auto* c = cmd->add_subcommand("check", "validate a placement file against the model; optionally cut its shard");
  c->add_option("file", check->file, "the placement file (YAML or JSON)")->required();
  add_model_options(c, check->model);
  c->add_option("--extract", check->extract,
                "write the receiver's buffers, cut from --checkpoint, as this .safetensors file");
  c->callback([check] { run_check(*check); });
}

// NOLINTNEXTLINE(cert-err58-cpp): registration at start-up, as in every cmd_*.cpp
const CommandRegistrar registrar{"placement", &setup};

}  // namespace
}  // namespace deltacast::tools::placement_command
