// Codec benchmark: bytes per changed element and encode/apply throughput on simulator data, with
// baselines measured in the same run (memcpy, XOR+zstd-1, zstd --patch-from, bsdiff).
// Usage: dc_bench_codec [--params 200M] [--lr 2e-6] [--lr-high 6e-6] [--threads 2] [--json FILE]
//        [--tools-slice-mib 32] [--no-tools]
//        dc_bench_codec --profile encode|encode-one-pass|apply|digest|read [--reps 20] [--threads 1] [--params 50M]
//        [--lr 1.3e-6]
// Prints a markdown table; --json writes the figures. --profile only repeats one phase on one
// step (lr of --lr) and prints each repetition's time: a loop to run under perf or callgrind. It
// first prints a fingerprint of the encoded frames (identical output => identical fingerprint).
// Phases on one thread: encode (the base digest given), encode-one-pass (the base digest computed
// in the encode, as `deltacast diff` does), digest (the base's alone), read (a plain read of both
// steps, the memory-bound floor); their times split a diff into its parts.
#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zstd.h>

#include "codec/applier.h"
#include "codec/encoder.h"
#include "codec/owned_weights.h"
#include "sim/model_shape.h"
#include "sim/trainer_simulator.h"
#include "util/bytes.h"
#include "util/worker_threads.h"

using namespace deltacast;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time of the calling thread: on a shared, loaded machine it estimates the uncontended speed.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using Owned = codec::OwnedWeights;
constexpr int kReps = 5;  // timed repetitions per figure; the best is reported (shared, noisy machine)

double memcpy_gbps(const Owned& src) {
  std::vector<std::vector<std::byte>> dst;
  for (auto t : src.view().tensors) dst.emplace_back(t.size());
  double best = 1e9;
  for (int rep = 0; rep < kReps; ++rep) {
    const auto t0 = Clock::now();
    const auto v = src.view();
    for (size_t i = 0; i < dst.size(); ++i) std::memcpy(dst[i].data(), v.tensors[i].data(), dst[i].size());
    best = std::min(best, seconds_since(t0));
  }
  uint64_t total = 0;
  for (auto t : src.view().tensors) total += t.size();
  return static_cast<double>(total) / best / 1e9;
}

uint64_t xor_zstd1_bytes(const Owned& a, const Owned& b) {
  uint64_t total = 0;
  std::vector<std::byte> x, z;
  const auto va = a.view(), vb = b.view();
  for (size_t t = 0; t < va.tensors.size(); ++t) {
    x.resize(va.tensors[t].size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = va.tensors[t][i] ^ vb.tensors[t][i];
    z.resize(ZSTD_compressBound(x.size()));
    total += ZSTD_compress(z.data(), z.size(), x.data(), x.size(), 1);
  }
  return total;
}

void write_slice(const Owned& w, uint64_t bytes, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  uint64_t left = bytes;
  // Take the largest tensors' prefixes (they dominate a checkpoint).
  for (const auto b : w.view().tensors) {
    if (left == 0) break;
    if (b.size() < (1u << 20)) continue;
    const uint64_t n = std::min<uint64_t>(left, b.size());
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(n));
    left -= n;
  }
}

uint64_t file_size(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return in ? static_cast<uint64_t>(in.tellg()) : 0;
}

struct Row {
  std::string label;
  double lr = 0, changed_fraction = 0;
  uint64_t checkpoint_bytes = 0, changes = 0, frame_bytes = 0, frame_bytes_noclass = 0, frame_bytes_xor = 0;
  uint64_t xor_zstd_bytes = 0;
  double encode_gbps_1t = 0, encode_gbps_2t = 0, apply_gbps = 0, apply_gbps_2t = 0, memcpy_gbps = 0;
  double encode_cpu_gbps = 0, apply_cpu_gbps = 0;
  double tools_slice_bytes = 0, tools_slice_changes = 0, patch_from_bytes = 0, patch_from_s = 0, bsdiff_bytes = 0,
         bsdiff_s = 0, ours_slice_bytes = 0;
};

// Applies every frame on `threads` long-lived threads (this one included), each taking the next
// frame not yet taken (frames differ in size: a fixed frame-to-thread split leaves one thread idle
// early), as a receiver's apply workers would: their per-thread decode scratch stays warm.
class ApplyPool {
 public:
  explicit ApplyPool(unsigned threads) : workers_(threads > 0 ? threads - 1 : 0) {}
  void run(codec::DeltaApplier& applier, const std::vector<std::vector<std::byte>>& frames) {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < frames.size();) applier.apply(frames[i]);
    };
    workers_.start(work);
    work();
    workers_.wait();
  }

 private:
  WorkerThreads workers_;
};

double best_encode(const Owned& a, const Owned& b, const codec::StateDigest& d, unsigned threads, codec::EncodedDelta* keep,
                   const codec::EncodeOptions& base_opts, double* best_cpu = nullptr) {
  codec::EncodeOptions o = base_opts;
  o.threads = threads;
  double best = 1e9;
  for (int rep = 0; rep < kReps; ++rep) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    auto e = codec::encode_delta(a.view(), b.view(), d, {0, 1}, o);
    best = std::min(best, seconds_since(t0));
    if (best_cpu) *best_cpu = std::min(*best_cpu, thread_cpu_seconds() - c0);
    if (keep) *keep = std::move(e);
  }
  return best;
}

Row measure(const std::string& label, double lr, const Owned& a, const Owned& b, bool tools, uint64_t slice_mib) {
  Row r;
  r.label = label;
  r.lr = lr;
  const auto da = codec::StateDigest::full_scan(a.view(), 2);
  codec::EncodedDelta delta;
  codec::EncodeOptions opts;
  double cpu1 = 1e9;
  const double t1 = best_encode(a, b, da, 1, &delta, opts, &cpu1);
  const double t2 = best_encode(a, b, da, 2, nullptr, opts);
  r.checkpoint_bytes = delta.stats.checkpoint_bytes;
  r.changes = delta.stats.changes;
  r.changed_fraction = static_cast<double>(delta.stats.changes) / static_cast<double>(delta.stats.elements);
  r.frame_bytes = delta.stats.frame_bytes;
  r.encode_gbps_1t = static_cast<double>(r.checkpoint_bytes) / t1 / 1e9;
  r.encode_gbps_2t = static_cast<double>(r.checkpoint_bytes) / t2 / 1e9;
  r.encode_cpu_gbps = static_cast<double>(r.checkpoint_bytes) / cpu1 / 1e9;
  {
    codec::EncodeOptions o;
    o.allow_classed = false;
    r.frame_bytes_noclass = codec::encode_delta(a.view(), b.view(), da, {0, 1}, o).stats.frame_bytes;
    o.xor_safe_mode = codec::ValueMode::xor_bits;
    r.frame_bytes_xor = codec::encode_delta(a.view(), b.view(), da, {0, 1}, o).stats.frame_bytes;
  }
  // Apply: parse + decode + write + digest update + verify, on a fresh copy each time, by 1 and by
  // 2 threads (DeltaApplier::apply is concurrent across chunks). The undo log is reserved first,
  // as a receiver does while idle (DeltaApplier::reserve).
  for (unsigned threads : {1u, 2u}) {
    ApplyPool pool(threads);
    double best_apply = 1e9, best_apply_cpu = 1e9;
    for (int rep = 0; rep < kReps; ++rep) {
      Owned target(a.view());
      codec::DeltaApplier applier(a.manifest(), target.mutable_view(), 0, da);
      applier.reserve(delta.stats.changes);
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_seconds();
      pool.run(applier, delta.frames);
      applier.verify();
      applier.commit();
      best_apply = std::min(best_apply, seconds_since(t0));
      best_apply_cpu = std::min(best_apply_cpu, thread_cpu_seconds() - c0);
      if (rep == 0 && !codec::bitwise_equal(target.view(), b.view())) {
        std::fprintf(stderr, "BIT MISMATCH after apply (%u threads)\n", threads);
        std::exit(2);
      }
    }
    const double gbps = static_cast<double>(r.checkpoint_bytes) / best_apply / 1e9;
    if (threads == 1) {
      r.apply_gbps = gbps;
      r.apply_cpu_gbps = static_cast<double>(r.checkpoint_bytes) / best_apply_cpu / 1e9;
    } else {
      r.apply_gbps_2t = gbps;
    }
  }
  r.memcpy_gbps = memcpy_gbps(a);
  r.xor_zstd_bytes = xor_zstd1_bytes(a, b);
  if (tools) {
    const std::string dir = "/tmp/dc_bench_codec";
    std::system(("mkdir -p " + dir).c_str());
    const uint64_t slice = slice_mib << 20;
    write_slice(a, slice, dir + "/old.bin");
    write_slice(b, slice, dir + "/new.bin");
    // Our codec on exactly the same bytes: a one-tensor manifest over the slice.
    std::ifstream fo(dir + "/old.bin", std::ios::binary), fn(dir + "/new.bin", std::ios::binary);
    std::vector<char> so((std::istreambuf_iterator<char>(fo)), {}), sn((std::istreambuf_iterator<char>(fn)), {});
    codec::Manifest sm({{"slice", codec::DType::bf16, {so.size() / 2}}});
    codec::ConstWeights wo{&sm, {std::span<const std::byte>(reinterpret_cast<const std::byte*>(so.data()), so.size())}};
    codec::ConstWeights wn{&sm, {std::span<const std::byte>(reinterpret_cast<const std::byte*>(sn.data()), sn.size())}};
    auto sd = codec::encode_delta(wo, wn, codec::StateDigest::full_scan(wo), {0, 1}, {});
    r.tools_slice_bytes = static_cast<double>(so.size());
    r.tools_slice_changes = static_cast<double>(sd.stats.changes);
    r.ours_slice_bytes = static_cast<double>(sd.stats.frame_bytes);
    auto t0 = Clock::now();
    const std::string pf = "zstd -q -f -1 --patch-from=" + dir + "/old.bin " + dir + "/new.bin -o " + dir + "/patch.zst";
    if (std::system(pf.c_str()) == 0) {
      r.patch_from_s = seconds_since(t0);
      r.patch_from_bytes = static_cast<double>(file_size(dir + "/patch.zst"));
    }
    t0 = Clock::now();
    const std::string bs = "bsdiff " + dir + "/old.bin " + dir + "/new.bin " + dir + "/patch.bsdiff";
    if (std::system(bs.c_str()) == 0) {
      r.bsdiff_s = seconds_since(t0);
      r.bsdiff_bytes = static_cast<double>(file_size(dir + "/patch.bsdiff"));
    }
  }
  return r;
}

// Fingerprint of a delta's bytes: every frame ends with the XXH3-64 of all its other bytes, so
// mixing the trailers (FNV-1a over them, in frame order) identifies the whole encoding. For
// checking that a codec change keeps the output bit-identical.
uint64_t frames_hash(const std::vector<std::vector<std::byte>>& frames) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (const auto& f : frames)
    for (size_t i = f.size() >= 8 ? f.size() - 8 : 0; i < f.size(); ++i)
      h = (h ^ static_cast<uint8_t>(f[i])) * 0x100000001B3ULL;
  return h;
}

// --profile: repeats one phase on one step.
int profile(const std::string& phase, int reps, unsigned profile_threads, const Owned& a, const Owned& b) {
  const auto da = codec::StateDigest::full_scan(a.view(), 2);
  codec::EncodeOptions opts;
  opts.threads = 1;
  auto delta = codec::encode_delta(a.view(), b.view(), da, {0, 1}, opts);
  std::printf("frames: %zu, %llu bytes, hash %016llx\n", delta.frames.size(),
              static_cast<unsigned long long>(delta.stats.frame_bytes),
              static_cast<unsigned long long>(frames_hash(delta.frames)));
  Owned target(a.view());
  ApplyPool pool(profile_threads);
  for (int rep = 0; rep < reps; ++rep) {
    double s = 0;
    const double c0 = thread_cpu_seconds();
    if (phase == "read") {
      const auto t0 = Clock::now();
      uint64_t sum[4] = {0, 0, 0, 0};  // independent sums: the loop runs at memory speed
      for (const Owned* w : {&a, &b})
        for (const auto& t : w->view().tensors) {
          const size_t words = t.size() / 32 * 4;
          for (size_t i = 0; i < words; i += 4)
            for (size_t l = 0; l < 4; ++l) sum[l] += load_le<uint64_t>(t.data() + 8 * (i + l));
        }
      s = seconds_since(t0);
      if (sum[0] + sum[1] + sum[2] + sum[3] == 42) std::printf("!");
    } else if (phase == "encode-one-pass") {
      const auto t0 = Clock::now();
      delta = codec::encode_delta(a.view(), b.view(), {0, 1}, opts);
      s = seconds_since(t0);
    } else if (phase == "digest") {
      const auto t0 = Clock::now();
      const auto d = codec::StateDigest::full_scan(a.view(), 1);
      s = seconds_since(t0);
      if (d.combined() == 42) std::printf("!");
    } else if (phase == "encode") {
      const auto t0 = Clock::now();
      delta = codec::encode_delta(a.view(), b.view(), da, {0, 1}, opts);
      s = seconds_since(t0);
    } else {
      codec::DeltaApplier applier(a.manifest(), target.mutable_view(), 0, da);
      applier.reserve(delta.stats.changes);
      const auto t0 = Clock::now();
      pool.run(applier, delta.frames);
      applier.verify();
      s = seconds_since(t0);
      applier.rollback();
    }
    const double cpu = thread_cpu_seconds() - c0;
    std::printf("%s rep %d: %.4f s, %.2f GB/s; %.2f GB/s per CPU-s\n", phase.c_str(), rep, s,
                static_cast<double>(delta.stats.checkpoint_bytes) / s / 1e9,
                static_cast<double>(delta.stats.checkpoint_bytes) / cpu / 1e9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string params = "200M", json_path;
  double lr_low = 2e-6, lr_high = 6e-6;
  bool tools = true;
  uint64_t slice_mib = 32;
  std::string profile_phase;
  int profile_reps = 20;
  unsigned profile_threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--params") params = next();
    else if (a == "--lr") lr_low = std::stod(next());
    else if (a == "--lr-high") lr_high = std::stod(next());
    else if (a == "--json") json_path = next();
    else if (a == "--no-tools") tools = false;
    else if (a == "--tools-slice-mib") slice_mib = std::stoull(next());
    else if (a == "--profile") profile_phase = next();
    else if (a == "--reps") profile_reps = std::stoi(next());
    else if (a == "--threads") profile_threads = static_cast<unsigned>(std::stoul(next()));
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::vector<Row> rows;
  for (double lr : {lr_low, lr_high}) {
    sim::SimConfig cfg;
    cfg.params = sim::parse_param_count(params);
    cfg.lr = static_cast<float>(lr);
    cfg.seed = 1;
    sim::TrainerSimulator trainer(cfg);
    trainer.step();  // a few steps in: the first step of a warm optimizer is representative too
    Owned a(trainer.bf16_weights());
    trainer.step();
    Owned b(trainer.bf16_weights());
    if (!profile_phase.empty()) return profile(profile_phase, profile_reps, profile_threads, a, b);
    rows.push_back(measure("lr=" + std::to_string(lr), lr, a, b, tools, slice_mib));
    std::fprintf(stderr, "measured lr %g: %.3f%% changed\n", lr, rows.back().changed_fraction * 100);
  }
  std::printf("| lr | changed %% | B/change deltacast | B/change no classes | B/change XOR mode | B/change XOR+zstd-1 | "
              "%% of checkpoint | encode GB/s 1T | encode GB/s 2T | apply GB/s 1T | apply GB/s 2T | memcpy GB/s | encode GB/s per CPU-s | apply GB/s per CPU-s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows) {
    const double ch = static_cast<double>(r.changes);
    std::printf("| %.1e | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", r.lr,
                r.changed_fraction * 100, r.frame_bytes / ch, r.frame_bytes_noclass / ch, r.frame_bytes_xor / ch,
                r.xor_zstd_bytes / ch, 100.0 * static_cast<double>(r.frame_bytes) / static_cast<double>(r.checkpoint_bytes),
                r.encode_gbps_1t, r.encode_gbps_2t, r.apply_gbps, r.apply_gbps_2t, r.memcpy_gbps, r.encode_cpu_gbps,
                r.apply_cpu_gbps);
    j.push_back({{"lr", r.lr},
                 {"changed_fraction", r.changed_fraction},
                 {"checkpoint_bytes", r.checkpoint_bytes},
                 {"changes", r.changes},
                 {"bytes_per_change", r.frame_bytes / ch},
                 {"bytes_per_change_no_classes", r.frame_bytes_noclass / ch},
                 {"bytes_per_change_xor_mode", r.frame_bytes_xor / ch},
                 {"bytes_per_change_xor_zstd1", r.xor_zstd_bytes / ch},
                 {"encode_gbps_1_thread", r.encode_gbps_1t},
                 {"encode_gbps_2_threads", r.encode_gbps_2t},
                 {"apply_gbps", r.apply_gbps},
                 {"apply_gbps_2_threads", r.apply_gbps_2t},
                 {"encode_gbps_1_thread_cpu_time", r.encode_cpu_gbps},
                 {"apply_gbps_cpu_time", r.apply_cpu_gbps},
                 {"memcpy_gbps", r.memcpy_gbps},
                 {"slice_bytes", r.tools_slice_bytes},
                 {"slice_changes", r.tools_slice_changes},
                 {"slice_bytes_per_change_deltacast", r.ours_slice_bytes / r.tools_slice_changes},
                 {"slice_bytes_per_change_zstd1_patch_from", r.patch_from_bytes / r.tools_slice_changes},
                 {"slice_patch_from_seconds", r.patch_from_s},
                 {"slice_bytes_per_change_bsdiff", r.bsdiff_bytes / r.tools_slice_changes},
                 {"slice_bsdiff_seconds", r.bsdiff_s}});
  }
  if (tools) {
    std::printf("\nSame %llu MiB slice of the largest tensors, bytes per changed element:\n\n",
                static_cast<unsigned long long>(slice_mib));
    std::printf("| lr | deltacast | zstd -1 --patch-from (s) | bsdiff (s) |\n|---|---|---|---|\n");
    for (const auto& r : rows)
      std::printf("| %.1e | %.3f | %.3f (%.2f s) | %.3f (%.2f s) |\n", r.lr, r.ours_slice_bytes / r.tools_slice_changes,
                  r.patch_from_bytes / r.tools_slice_changes, r.patch_from_s, r.bsdiff_bytes / r.tools_slice_changes,
                  r.bsdiff_s);
  }
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  return 0;
}
