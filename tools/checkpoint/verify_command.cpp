// `deltacast verify`: bitwise comparison of two checkpoints, tensor by tensor (names, dtypes,
// shapes, bytes), whatever their layouts (a .safetensors file or a sharded directory each: tensors
// are compared, not files). Exit status 0 only when they are identical; 1 on any difference.
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "tools/cli.h"
#include "util/error.h"

namespace deltacast::tools::verify_command {  // its own namespace: unity builds batch the commands together
namespace {

// Elements whose bytes differ (element size from the dtype), and the first of them.
std::pair<uint64_t, uint64_t> differing_elements(std::span<const std::byte> a, std::span<const std::byte> b,
                                                 size_t element_size) {
  uint64_t count = 0, first = 0;
  for (size_t i = 0; i < a.size(); i += element_size)
    if (std::memcmp(a.data() + i, b.data() + i, element_size) != 0 && count++ == 0) first = i / element_size;
  return {count, first};
}

void run_verify(const std::string& path_a, const std::string& path_b) {
  const auto a = checkpoint::Checkpoint::open(path_a);
  const auto b = checkpoint::Checkpoint::open(path_b);
  const auto wa = a.weights();
  const auto wb = b.weights();
  uint64_t differences = 0;
  for (uint32_t i = 0; i < a.manifest().size(); ++i) {
    const auto& ta = a.manifest().at(i);
    const auto j = b.manifest().find(ta.name);
    if (!j) {
      std::printf("%s: only in %s\n", ta.name.c_str(), path_a.c_str());
      ++differences;
      continue;
    }
    const auto& tb = b.manifest().at(*j);
    if (ta.dtype != tb.dtype || ta.shape != tb.shape) {
      std::printf("%s: dtype/shape differ (%s vs %s, %zu vs %zu dims)\n", ta.name.c_str(),
                  std::string(codec::dtype_name(ta.dtype)).c_str(), std::string(codec::dtype_name(tb.dtype)).c_str(),
                  ta.shape.size(), tb.shape.size());
      ++differences;
      continue;
    }
    if (wa.tensors[i].empty() || std::memcmp(wa.tensors[i].data(), wb.tensors[*j].data(), wa.tensors[i].size()) == 0)
      continue;
    const auto [n, first] = differing_elements(wa.tensors[i], wb.tensors[*j], codec::dtype_size(ta.dtype));
    std::printf("%s: %llu of %llu elements differ (first at element %llu; %s vs %s)\n", ta.name.c_str(),
                static_cast<unsigned long long>(n), static_cast<unsigned long long>(ta.numel()),
                static_cast<unsigned long long>(first), a.file_of(i).c_str(), b.file_of(*j).c_str());
    ++differences;
  }
  for (const auto& tb : b.manifest().tensors()) {
    if (!a.manifest().find(tb.name)) {
      std::printf("%s: only in %s\n", tb.name.c_str(), path_b.c_str());
      ++differences;
    }
  }
  if (differences != 0) {
    std::printf("DIFFERENT: %llu tensors differ\n", static_cast<unsigned long long>(differences));
    throw CLI::RuntimeError(1);
  }
  std::printf("IDENTICAL: %zu tensors, %llu bytes compared bitwise\n", a.manifest().size(),
              static_cast<unsigned long long>(a.manifest().total_bytes()));
}

void setup(CLI::App& parent) {
  auto a = std::make_shared<std::string>();
  auto b = std::make_shared<std::string>();
  auto* cmd =
      parent.add_subcommand("verify", "compare two checkpoints tensor by tensor, bitwise (exit 1 on any difference)");
  cmd->add_option("first", *a, "checkpoint: a .safetensors file or a sharded directory")->required();
  cmd->add_option("second", *b, "checkpoint: a .safetensors file or a sharded directory")->required();
  cmd->callback([a, b] { run_verify(*a, *b); });
}

const CommandRegistrar registrar{"verify", &setup};

}  // namespace
}  // namespace deltacast::tools::verify_command
