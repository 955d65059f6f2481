// `deltacast diff`: encodes the delta between two checkpoints (each a .safetensors file or a
// Hugging Face sharded directory, checkpoint/checkpoint.h) into a .dcx file (the chunk frames
// followed by the seal frame, concatenated) and reports its size.
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>
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
#include "util/bytes.h"
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
  bool baseline = false;
  bool two_pass = false;
};

// Seconds to read every byte of both checkpoints once (a sum of 64-bit words, `threads` threads
// over 16 MiB pieces): the memory-bound floor any diff of the two has to pay. Timed on the second
// of two passes, so that neither it nor the diff after it pays the mapping's page faults.
double read_both_seconds(const codec::ConstWeights& a, const codec::ConstWeights& b, unsigned threads) {
  std::vector<std::span<const std::byte>> pieces;
  constexpr size_t kPiece = size_t{16} << 20;
  for (const auto* w : {&a, &b})
    for (const auto& t : w->tensors)
      for (size_t at = 0; at < t.size(); at += kPiece) pieces.push_back(t.subspan(at, std::min(kPiece, t.size() - at)));
  std::atomic<uint64_t> sink{0};
  auto pass = [&] {
    std::atomic<size_t> next{0};
    const auto start = std::chrono::steady_clock::now();
    auto worker = [&] {
      uint64_t sum[4] = {0, 0, 0, 0};  // independent sums: the loop runs at memory speed
      for (size_t k; (k = next.fetch_add(1)) < pieces.size();) {
        const auto p = pieces[k];
        const size_t words = p.size() / 32 * 4;
        for (size_t i = 0; i < words; i += 4)
          for (size_t l = 0; l < 4; ++l) sum[l] += load_le<uint64_t>(p.data() + 8 * (i + l));
        for (size_t i = words * 8; i < p.size(); ++i) sum[0] += std::to_integer<uint64_t>(p[i]);
      }
      sink += sum[0] + sum[1] + sum[2] + sum[3];
    };
    std::vector<std::thread> pool;
    for (unsigned i = 1; i < threads; ++i) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  pass();  // maps every page in (the diff that follows finds them mapped too)
  const double seconds = pass();
  if (sink.load() == 42) std::fprintf(stderr, " ");  // keeps the sums (and the reads) alive
  return seconds;
}


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

  // --baseline: first a plain read of both checkpoints (the memory-bound floor of a diff), timed
  // in the same process, so the report gives the diff as a ratio of it.
  const double read_seconds = o.baseline ? read_both_seconds(base.weights(), next.weights(), o.threads) : 0.0;
  const auto t1 = std::chrono::steady_clock::now();
  // One pass: the base's digest is computed during the scan (codec/encoder.h). --two-pass: a full
  // scan of the base first, as before (for benchmarks; the same bytes).
  const codec::VersionIds ids{o.base_version, o.base_version + 1};
  const auto delta =
      o.two_pass ? codec::encode_delta(base.weights(), next.weights(),
                                       codec::StateDigest::full_scan(base.weights(), o.threads), ids, options)
                 : codec::encode_delta(base.weights(), next.weights(), ids, options);
  const auto t2 = std::chrono::steady_clock::now();
  const auto& base_digest = delta.base_digest;

  std::vector<std::byte> file;
  file.reserve(delta.stats.frame_bytes);
  for (const auto& f : delta.frames) file.insert(file.end(), f.begin(), f.end());
  write_file_atomic(o.out, file);

  const auto& s = delta.stats;
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
    j["encode_seconds"] = encode_seconds;  // the whole diff: scan, base digest, coding
    if (o.baseline) {
      j["read_seconds"] = read_seconds;
      j["diff_over_read"] = read_seconds > 0 ? encode_seconds / read_seconds : 0.0;
    }
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
  std::printf("  time           %.3f s (%.2f GB/s)", encode_seconds,
              encode_seconds > 0 ? double(s.checkpoint_bytes) / encode_seconds / 1e9 : 0.0);
  if (o.baseline)
    std::printf(", %.2fx a plain read of both (%.3f s)", read_seconds > 0 ? encode_seconds / read_seconds : 0.0,
                read_seconds);
  std::printf("\n");
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
  cmd->add_flag("--baseline", o->baseline,
                "first time a plain read of both checkpoints and report the diff as a multiple of it");
  cmd->add_flag("--two-pass", o->two_pass, "BENCHMARK: digest the base in its own pass first (the old way)")
      ->group("Benchmarking");
  cmd->callback([o] { run_diff(*o); });
}

const CommandRegistrar registrar{"diff", &setup};

}  // namespace
}  // namespace deltacast::tools
