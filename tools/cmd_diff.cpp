// `deltacast diff`: encodes the delta between two checkpoints (each a .safetensors file or a
// Hugging Face sharded directory, checkpoint/checkpoint.h) into a .dcx file (the chunk frames
// followed by the seal frame, concatenated) and reports its size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "codec/encoder.h"
#include "tools/cli.h"
#include "tools/lib_files.h"
#include "tools/lib_manifest_compare.h"
#include "util/error.h"

namespace deltacast::tools {
namespace {

struct DiffOptions {
  std::string base;
  std::string next;
  std::string out;
  std::string overwrite_regex;
  bool json = false;
  uint64_t base_version = 0;
  unsigned threads = 2;
  uint64_t chunk_bytes = uint64_t{16} << 20;
};


std::vector<bool> overwrite_mask(const codec::Manifest& manifest, const std::string& pattern) {
  if (pattern.empty()) return {};
  std::regex re;
  try {
    re = std::regex(pattern);
  } catch (const std::regex_error& e) {
    throw Error(Errc::invalid_argument, "bad --overwrite regex '" + pattern + "': " + e.what());
  }
  std::vector<bool> mask;
  for (const auto& t : manifest.tensors()) mask.push_back(std::regex_search(t.name, re));
  return mask;
}

void run_diff(const DiffOptions& o) {
  const auto base = checkpoint::Checkpoint::open(o.base);
  const auto next = checkpoint::Checkpoint::open(o.next);
  if (auto why = manifest_difference(base.manifest(), next.manifest())) {
    throw Error(Errc::invalid_argument, "cannot diff " + o.base + " and " + o.next + ": different tensors: " + *why);
  }
  codec::EncodeOptions options;
  options.chunk_bytes = o.chunk_bytes;
  options.threads = o.threads;
  options.overwrite_tensors = overwrite_mask(base.manifest(), o.overwrite_regex);
  const size_t overwritten = static_cast<size_t>(std::count(options.overwrite_tensors.begin(), options.overwrite_tensors.end(), true));

  const auto t0 = std::chrono::steady_clock::now();
  const auto base_digest = codec::StateDigest::full_scan(base.weights(), o.threads);
  const auto t1 = std::chrono::steady_clock::now();
  const auto delta = codec::encode_delta(base.weights(), next.weights(), base_digest,
                                         codec::VersionIds{o.base_version, o.base_version + 1}, options);
  const auto t2 = std::chrono::steady_clock::now();

  std::vector<std::byte> file;
  file.reserve(delta.stats.frame_bytes);
  for (const auto& f : delta.frames) file.insert(file.end(), f.begin(), f.end());
  write_file_atomic(o.out, file);

  const auto& s = delta.stats;
  const double scan_seconds = std::chrono::duration<double>(t1 - t0).count();
  const double encode_seconds = std::chrono::duration<double>(t2 - t1).count();
  const double changed_fraction = s.elements ? double(s.changes) / double(s.elements) : 0.0;
  const double bytes_per_change = s.changes ? double(file.size()) / double(s.changes) : 0.0;
  const double percent = s.checkpoint_bytes ? 100.0 * double(file.size()) / double(s.checkpoint_bytes) : 0.0;
  if (o.json) {
    nlohmann::ordered_json j;
    j["base"] = o.base;
    j["new"] = o.next;
    j["out"] = o.out;
    j["base_version"] = o.base_version;
    j["new_version"] = o.base_version + 1;
    j["tensors"] = base.manifest().size();
    j["overwrite_tensors"] = overwritten;
    j["elements"] = s.elements;
    j["checkpoint_bytes"] = s.checkpoint_bytes;
    j["changes"] = s.changes;
    j["changed_fraction"] = changed_fraction;
    j["frames"] = delta.frames.size();
    j["frame_bytes"] = file.size();
    j["location_bytes"] = s.location_bytes;
    j["value_bytes"] = s.value_bytes;
    j["bytes_per_change"] = bytes_per_change;
    j["percent_of_checkpoint"] = percent;
    nlohmann::ordered_json codings;
    for (int c = 0; c < codec::kLocationCodingCount; ++c)
      codings[codec::location_coding_name(static_cast<codec::LocationCoding>(c))] = s.segments_by_coding[c];
    j["segments_by_coding"] = codings;
    j["base_digest"] = base_digest.combined();
    j["new_digest"] = delta.new_digest.combined();
    j["scan_seconds"] = scan_seconds;
    j["encode_seconds"] = encode_seconds;
    j["encode_gbps"] = encode_seconds > 0 ? double(s.checkpoint_bytes) / encode_seconds / 1e9 : 0.0;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("delta %s -> %s (version %llu -> %llu) written to %s\n", o.base.c_str(), o.next.c_str(),
              static_cast<unsigned long long>(o.base_version), static_cast<unsigned long long>(o.base_version + 1),
              o.out.c_str());
  std::printf("  changes        %llu of %llu elements (%.3f%%)\n", static_cast<unsigned long long>(s.changes),
              static_cast<unsigned long long>(s.elements), 100.0 * changed_fraction);
  std::printf("  frames         %zu, %zu bytes (%.3f%% of the %llu-byte checkpoint)\n", delta.frames.size(), file.size(),
              percent, static_cast<unsigned long long>(s.checkpoint_bytes));
  std::printf("  per change     %.3f bytes (locations %llu, values %llu)\n", bytes_per_change,
              static_cast<unsigned long long>(s.location_bytes), static_cast<unsigned long long>(s.value_bytes));
  std::printf("  overwrite      %zu tensors\n", overwritten);
  std::printf("  time           %.3f s digest scan, %.3f s encode (%.2f GB/s)\n", scan_seconds, encode_seconds,
              encode_seconds > 0 ? double(s.checkpoint_bytes) / encode_seconds / 1e9 : 0.0);
}

void setup(CLI::App& parent) {
  auto o = std::make_shared<DiffOptions>();
  auto* cmd = parent.add_subcommand(
      "diff", "encode the delta between two checkpoints (.safetensors files or sharded directories) into a .dcx file");
  cmd->add_option("--base", o->base, "checkpoint the receivers hold (a file or a sharded directory)")->required();
  cmd->add_option("--new", o->next, "checkpoint to move them to (any layout of the same tensors)")->required();
  cmd->add_option("--out", o->out, "output .dcx file")->required();
  cmd->add_option("--overwrite", o->overwrite_regex, "regex (std::regex search) on tensor names not XOR-safe: sent as overwrite");
  cmd->add_flag("--json", o->json, "print one JSON object instead of the summary");
  cmd->add_option("--base-version", o->base_version, "version number of the base")->capture_default_str();
  cmd->add_option("--threads", o->threads, "encoder threads")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--chunk-bytes", o->chunk_bytes, "checkpoint bytes per chunk frame")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->callback([o] { run_diff(*o); });
}

const CommandRegistrar registrar{"diff", &setup};

}  // namespace
}  // namespace deltacast::tools
