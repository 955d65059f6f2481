// `deltacast diff`: encodes the delta between two checkpoints (each a .safetensors file or a
// Hugging Face sharded directory, checkpoint/checkpoint.h) into a .dcx file (the chunk frames
// followed by the seal frame, concatenated) and reports its size. With --baseline it also times,
// in rounds interleaved with the diff, plain reads of both checkpoints (fresh mappings, mapped
// pages, pread) and reports the diff as a multiple of each (bench/codec/diff_speed.sh).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "codec/encoder.h"
#include "tools/bench/tree_math.h"
#include "tools/checkpoint/files.h"
#include "tools/checkpoint/manifest_compare.h"
#include "tools/cli.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::tools::diff_command {  // its own namespace: unity builds batch the commands together
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
  std::string read = "pread";  // how the diff reads the checkpoints: "pread" or "map"
  unsigned rounds = 3;
};

// Adds the 64-bit words of [p, p + n) into four independent sums (so the loop runs at memory
// speed) and the bytes after the last whole 32 into sum[0].
void sum_words(const std::byte* p, size_t n, uint64_t (&sum)[4]) {
  const size_t words = n / 32 * 4;
  for (size_t i = 0; i < words; i += 4)
    for (size_t l = 0; l < 4; ++l) sum[l] += load_le<uint64_t>(p + 8 * (i + l));
  for (size_t i = words * 8; i < n; ++i) sum[0] += std::to_integer<uint64_t>(p[i]);
}

// Runs worker(sum) on `threads` threads (this one included), each with its own zeroed sums, and
// returns the seconds until every one ended. The sums are kept, so the reads cannot be elided.
template <class Worker>
double timed_read(unsigned threads, Worker&& worker) {
  std::atomic<uint64_t> sink{0};
  auto run = [&] {
    uint64_t sum[4] = {0, 0, 0, 0};
    worker(sum);
    sink += sum[0] + sum[1] + sum[2] + sum[3];
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (sink.load() == 42) std::fprintf(stderr, " ");
  return seconds;
}

// Seconds to read every byte of both checkpoints once (a sum of 64-bit words, `threads` threads
// over 16 MiB pieces): the memory-bound floor of any diff of the two.
double read_pass_seconds(const codec::ConstWeights& a, const codec::ConstWeights& b, unsigned threads) {
  std::vector<std::span<const std::byte>> pieces;
  constexpr size_t kPiece = size_t{16} << 20;
  for (const auto* w : {&a, &b})
    for (const auto& t : w->tensors)
      for (size_t at = 0; at < t.size(); at += kPiece) pieces.push_back(t.subspan(at, std::min(kPiece, t.size() - at)));
  std::atomic<size_t> next{0};
  return timed_read(threads, [&](uint64_t(&sum)[4]) {
    for (size_t k; (k = next.fetch_add(1)) < pieces.size();) sum_words(pieces[k].data(), pieces[k].size(), sum);
  });
}

// Seconds to read every file of both checkpoints once with pread (1 MiB pieces into one buffer
// per thread, summed as above): a read that maps nothing, so it pays a copy instead of the first
// touch of mapped pages. `files` are the checkpoints' files (headers included). Throws Error(io).
double pread_pass_seconds(const std::vector<std::filesystem::path>& files, unsigned threads) {
  constexpr size_t kPiece = size_t{1} << 20;
  std::vector<int> fds;
  struct Piece {
    int fd;
    off_t at;
  };
  std::vector<Piece> pieces;
  auto close_all = [&] {
    for (int fd : fds) ::close(fd);
  };
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      close_all();
      throw Error(Errc::io, "cannot open " + f.string() + ": " + std::strerror(errno));
    }
    fds.push_back(fd);
    const off_t size = ::lseek(fd, 0, SEEK_END);
    for (off_t at = 0; at < size; at += static_cast<off_t>(kPiece)) pieces.push_back({fd, at});
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const double seconds = timed_read(threads, [&](uint64_t(&sum)[4]) {
    std::vector<std::byte> buf(kPiece);
    for (size_t k; (k = next.fetch_add(1)) < pieces.size();) {
      const ssize_t got = ::pread(pieces[k].fd, buf.data(), kPiece, pieces[k].at);
      if (got < 0) failed = true;
      sum_words(buf.data(), got > 0 ? static_cast<size_t>(got) : 0, sum);
    }
  });
  close_all();
  if (failed) throw Error(Errc::io, "diff --baseline: a pread of the checkpoints failed");
  return seconds;
}

// The files a checkpoint at `path` is stored in: `path` itself, or every shard of a directory.
std::vector<std::filesystem::path> files_of(const checkpoint::Checkpoint& c, const std::filesystem::path& path) {
  if (!std::filesystem::is_directory(path)) return {path};
  std::set<std::filesystem::path> files;
  for (uint32_t i = 0; i < c.manifest().size(); ++i) files.insert(path / c.file_of(i));
  return {files.begin(), files.end()};
}

// The files of both checkpoints, base first (what the pread baseline reads).
std::vector<std::filesystem::path> files_of_both(const checkpoint::Checkpoint& base, const checkpoint::Checkpoint& next,
                                                 const DiffOptions& o) {
  auto files = files_of(base, o.base);
  for (auto& f : files_of(next, o.next)) files.push_back(std::move(f));
  return files;
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

// One diff of the two checkpoints, timed (scan, base digest and coding; not the file write).
struct TimedDelta {
  codec::EncodedDelta delta;
  double seconds = 0;
};
TimedDelta diff_once(const checkpoint::Checkpoint& base, const checkpoint::Checkpoint& next, const DiffOptions& o,
                     const codec::EncodeOptions& options) {
  const auto t1 = std::chrono::steady_clock::now();
  // One pass: the base's digest is computed during the scan (codec/encoder.h), over pieces read
  // with pread (--read map: through the mappings). --two-pass: a full scan of the base first, as
  // before (for benchmarks). The same bytes every way.
  const codec::VersionIds ids{o.base_version, o.base_version + 1};
  TimedDelta out;
  if (o.two_pass) {
    out.delta = codec::encode_delta(base.weights(), next.weights(),
                                    codec::StateDigest::full_scan(base.weights(), o.threads), ids, options);
  } else if (o.read == "map") {
    out.delta = codec::encode_delta(base.weights(), next.weights(), ids, options);
  } else {
    out.delta = codec::encode_delta(base.reader(), next.reader(), ids, options);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return out;
}

// --baseline, one round: a plain read of both checkpoints and the diff, each first on a fresh
// mapping of the files (as a process that maps them and reads them once: the first touch of every
// page is paid, here as by any user's diff) and then again on the same, now mapped, pages; and a
// read of the files with pread (no mapping). The diff opens the checkpoints as the read does, then
// reads them its own way (--read): the default pread diff's second run is simply a second diff.
struct BaselineRound {
  double read_fresh = 0, read_mapped = 0, read_pread = 0, diff_fresh = 0, diff_mapped = 0;
};

// Runs `rounds` interleaved rounds (odd rounds diff first) and returns the first diff. Every diff
// of every round must give the same frames (Error(internal) otherwise: the encoder is
// deterministic whatever the threads' interleaving).
TimedDelta run_baseline(const DiffOptions& o, const codec::EncodeOptions& options, std::vector<BaselineRound>& rounds) {
  std::optional<TimedDelta> first;
  auto check_same = [&](const TimedDelta& d) {
    if (!first) {
      first = d;
    } else if (d.delta.frames != first->delta.frames) {
      throw Error(Errc::internal, "diff --baseline: two diffs of the same checkpoints gave different frames");
    }
  };
  {  // warm-up, untimed: the first mapping in a process pays more (its page-table pages) than later
     // ones at the same addresses, which would flatter whichever of read and diff came first; and
     // the first read(2) of files whose pages a mapping read in (in huge folios) is slow once
     // (docs/performance.md, "deltacast diff against a read"), which would flatter the first round's diff against pread
    const auto base = checkpoint::Checkpoint::open(o.base);
    const auto next = checkpoint::Checkpoint::open(o.next);
    read_pass_seconds(base.weights(), next.weights(), o.threads);
    pread_pass_seconds(files_of_both(base, next, o), o.threads);
  }
  for (unsigned r = 0; r < o.rounds; ++r) {
    BaselineRound b;
    auto read = [&] {
      const auto base = checkpoint::Checkpoint::open(o.base);
      const auto next = checkpoint::Checkpoint::open(o.next);
      b.read_fresh = read_pass_seconds(base.weights(), next.weights(), o.threads);
      b.read_mapped = read_pass_seconds(base.weights(), next.weights(), o.threads);
      b.read_pread = pread_pass_seconds(files_of_both(base, next, o), o.threads);
    };
    auto diff = [&] {
      const auto base = checkpoint::Checkpoint::open(o.base);
      const auto next = checkpoint::Checkpoint::open(o.next);
      const auto fresh = diff_once(base, next, o, options);
      b.diff_fresh = fresh.seconds;
      check_same(fresh);
      const auto mapped = diff_once(base, next, o, options);
      b.diff_mapped = mapped.seconds;
      check_same(mapped);
    };
    if (r % 2 == 0) {
      read();
      diff();
    } else {
      diff();
      read();
    }
    rounds.push_back(b);
  }
  return std::move(*first);
}

// What --baseline reports: over the rounds, each time's spread and each per-round ratio's.
struct BaselineSummary {
  Spread read_fresh, read_mapped, read_pread, diff_fresh, diff_mapped;
  Spread fresh, mapped, pread;  // diff_fresh / read_fresh, diff_mapped / read_mapped, diff_fresh / read_pread
  BaselineSummary() = default;  // no --baseline: all zero
  explicit BaselineSummary(const std::vector<BaselineRound>& rounds)
      : read_fresh(over(rounds, [](const BaselineRound& r) { return r.read_fresh; })),
        read_mapped(over(rounds, [](const BaselineRound& r) { return r.read_mapped; })),
        read_pread(over(rounds, [](const BaselineRound& r) { return r.read_pread; })),
        diff_fresh(over(rounds, [](const BaselineRound& r) { return r.diff_fresh; })),
        diff_mapped(over(rounds, [](const BaselineRound& r) { return r.diff_mapped; })),
        fresh(over(rounds, [](const BaselineRound& r) { return r.diff_fresh / r.read_fresh; })),
        mapped(over(rounds, [](const BaselineRound& r) { return r.diff_mapped / r.read_mapped; })),
        pread(over(rounds, [](const BaselineRound& r) { return r.diff_fresh / r.read_pread; })) {}

 private:
  template <class F>
  static Spread over(const std::vector<BaselineRound>& rounds, F value) {
    std::vector<double> v;
    v.reserve(rounds.size());
    for (const auto& r : rounds) v.push_back(value(r));
    return spread_of(v);
  }
};

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
  const size_t overwritten =
      static_cast<size_t>(std::count(options.overwrite_tensors.begin(), options.overwrite_tensors.end(), true));

  // --baseline: rounds of plain reads of both checkpoints and of the diff, timed in this process,
  // so the report gives the diff as a ratio of each read.
  std::vector<BaselineRound> rounds;
  const TimedDelta timed = o.baseline ? run_baseline(o, options, rounds) : diff_once(base, next, o, options);
  const BaselineSummary summary = o.baseline ? BaselineSummary(rounds) : BaselineSummary();
  const auto& delta = timed.delta;
  const auto& base_digest = delta.base_digest;

  std::vector<std::byte> file;
  file.reserve(delta.stats.frame_bytes);
  for (const auto& f : delta.frames) file.insert(file.end(), f.begin(), f.end());
  write_file_atomic(o.out, file);

  const auto& s = delta.stats;
  const double encode_seconds = o.baseline ? summary.diff_fresh.median : timed.seconds;
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
    // --baseline: medians over the rounds; the ratios per round, then their median and range.
    if (o.baseline) {
      nlohmann::ordered_json rs = nlohmann::ordered_json::array();
      for (const auto& r : rounds)
        rs.push_back({{"read_fresh", r.read_fresh},
                      {"diff_fresh", r.diff_fresh},
                      {"read_mapped", r.read_mapped},
                      {"diff_mapped", r.diff_mapped},
                      {"read_pread", r.read_pread}});
      j["rounds"] = rs;
      const auto& b = summary;
      j["read_seconds"] = b.read_fresh.median;
      j["diff_over_read"] = b.fresh.median;
      j["diff_over_read_range"] = {b.fresh.min, b.fresh.max};
      j["read_mapped_seconds"] = b.read_mapped.median;
      j["diff_mapped_seconds"] = b.diff_mapped.median;
      j["diff_over_read_mapped"] = b.mapped.median;
      j["diff_over_read_mapped_range"] = {b.mapped.min, b.mapped.max};
      j["read_pread_seconds"] = b.read_pread.median;
      j["diff_over_read_pread"] = b.pread.median;
      j["diff_over_read_pread_range"] = {b.pread.min, b.pread.max};
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
  std::printf("  frames         %zu, %zu bytes (%.3f%% of the %llu-byte checkpoint)\n", delta.frames.size(),
              file.size(), percent, static_cast<unsigned long long>(s.checkpoint_bytes));
  std::printf("  per change     %.3f bytes (locations %llu, values %llu)\n", bytes_per_change,
              static_cast<unsigned long long>(s.location_bytes), static_cast<unsigned long long>(s.value_bytes));
  std::printf("  overwrite      %zu tensors\n", overwritten);
  std::printf("  time           %.3f s (%.2f GB/s)", encode_seconds,
              encode_seconds > 0 ? double(s.checkpoint_bytes) / encode_seconds / 1e9 : 0.0);
  std::printf("\n");
  if (o.baseline) {
    const auto& b = summary;
    std::printf(
        "  vs a read      %.2fx a plain read of both, fresh mappings (%.2f-%.2fx over %zu rounds; read %.3f-%.3f s)\n",
        b.fresh.median, b.fresh.min, b.fresh.max, rounds.size(), b.read_fresh.min, b.read_fresh.max);
    std::printf(
        "                 %.2fx with the pages already mapped (%.2f-%.2fx; read %.3f-%.3f s, diff %.3f-%.3f s)\n",
        b.mapped.median, b.mapped.min, b.mapped.max, b.read_mapped.min, b.read_mapped.max, b.diff_mapped.min,
        b.diff_mapped.max);
    std::printf("                 %.2fx a read of the files with pread (%.2f-%.2fx; read %.3f-%.3f s)\n",
                b.pread.median, b.pread.min, b.pread.max, b.read_pread.min, b.read_pread.max);
  }
}

void setup(CLI::App& parent) {
  auto o = std::make_shared<DiffOptions>();
  auto* cmd = parent.add_subcommand(
      "diff", "encode the delta between two checkpoints (.safetensors files or sharded directories) into a .dcx file");
  cmd->add_option("--base", o->base, "checkpoint the receivers hold (a file or a sharded directory)")->required();
  cmd->add_option("--new", o->next, "checkpoint to move them to (any layout of the same tensors)")->required();
  cmd->add_option("--out", o->out, "output .dcx file")->required();
  cmd->add_option("--overwrite", o->overwrite_regex,
                  "regex (std::regex search) on tensor names not XOR-safe: sent as overwrite");
  cmd->add_flag("--json", o->json, "print one JSON object instead of the summary");
  cmd->add_option("--base-version", o->base_version, "version number of the base")->capture_default_str();
  cmd->add_option("--threads", o->threads, "encoder threads")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--chunk-bytes", o->chunk_bytes, "checkpoint bytes per chunk frame")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto* baseline = cmd->add_flag("--baseline", o->baseline,
                                 "also time a plain read of both checkpoints, in rounds interleaved with the diff, "
                                 "and report the diff as a multiple of it");
  cmd->add_option("--rounds", o->rounds, "with --baseline: interleaved rounds (read and diff, each on a fresh mapping)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->needs(baseline);
  cmd->add_option("--read", o->read,
                  "how the diff reads the checkpoints: pread (pieces that stay in the cache) or map (through the "
                  "mappings, as before)")
      ->capture_default_str()
      ->check(CLI::IsMember({"pread", "map"}))
      ->group("Benchmarking");
  cmd->add_flag("--two-pass", o->two_pass,
                "BENCHMARK: digest the base in its own pass first, through the mappings (the old way)")
      ->group("Benchmarking");
  cmd->callback([o] { run_diff(*o); });
}

const CommandRegistrar registrar{"diff", &setup};

}  // namespace
}  // namespace deltacast::tools::diff_command
