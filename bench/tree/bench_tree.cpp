// dc_bench_tree: end-to-end relay-tree benchmarks. The producer runs in this process; every
// receiver is a separate process (this executable, `receiver` mode), on 127.0.0.1 or, with
// --netns, each inside its own namespace of scripts/netns.sh (receiver i in PREFIXi at
// 10.200.0.(i+1); this process must then itself run in PREFIX0, address 10.200.0.1).
//
//   dc_bench_tree broadcast --receivers 8 --bytes 256MiB   S random bytes to every receiver
//   dc_bench_tree refit --receivers 4 --params 200M --lr 2e-6 --steps 3
//                                           full checkpoint (bootstrap), then delta refits
//
// broadcast: a manifest of BF16 tensors of --stage bytes each holding random bits (so nothing
// can shrink them and the wire carries S bytes). --mode raw (default) times Producer::bootstrap:
// the checkpoint as raw messages, from the first byte sent to every receiver having verified
// (full-scan digest) and committed, the same span MPI_Bcast is timed over. --mode delta sends
// the same bytes as delta versions from zero (one per tensor), pre-encoded before the clock
// starts, so the time is the delta path's transport + apply. refit: the trainer simulator's
// weights; full_seconds is the bootstrap, refit_seconds each step's Producer::refit.
// Every run ends with an independent bit check: each receiver hashes its final weights
// (XXH3-128 over all tensors) and the producer compares with its own. One JSON line per run is
// appended to --json.
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "util/process.h"
#include "codec/digest.h"
#include "codec/encoder.h"
#include "codec/manifest.h"
#include "config/config.h"
#include "sim/trainer_simulator.h"
#include "transport/transport.h"
#include "tree/producer.h"
#include "tree/receiver.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct CommonOptions {
  unsigned receivers = 8;
  std::string topology = "binary";
  std::string transport = "tcp";
  bool netns = false;
  std::string chunk = "4MiB";
  std::string stage = "32MiB";
  unsigned threads = 2;
  double link_gbit = 0;  // bottleneck bandwidth for the lower bound; 0 = none
  std::string json_path;
  std::string label;
  std::string log_level = "warn";
};

struct BroadcastOptions {
  std::string bytes = "256MiB";
  std::string mode = "raw";  // raw: Producer::bootstrap; delta: pre-encoded delta versions
  uint64_t seed = 1;
};

struct RefitBenchOptions {
  std::string params = "200M";
  double lr = 2e-6;
  unsigned steps = 3;
  uint64_t seed = 0;
};

struct ReceiverModeOptions {
  uint32_t rank = 1;
  std::string producer_url;
  std::string listen_url;
  std::string cluster = "rollout";
  std::string summary_path;
  std::string transport = "tcp";
};

std::string netns_prefix() {
  const char* p = std::getenv("DELTACAST_NETNS_PREFIX");
  return p && *p ? p : "dc";
}

std::string host_of(const CommonOptions& o, unsigned index) {  // 0 = producer
  return o.netns ? "10.200.0." + std::to_string(index + 1) : "127.0.0.1";
}

transport::TransportOptions transport_options() {
  transport::TransportOptions options;
  options.secret = transport::load_secret();  // DELTACAST_SECRET, set by the producer
  options.connect_timeout = std::chrono::seconds(30);
  // Shaped links and 2 shared cores delay heartbeats; the benchmark must not mistake that for death.
  options.peer_timeout = std::chrono::seconds(120);
  return options;
}

std::string hex128(XXH128_hash_t h) {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return text;
}

// XXH3-128 over every tensor's bytes in manifest order: the end-to-end bit check.
std::string weights_hash(const codec::ConstWeights& weights) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  XXH3_128bits_reset(state.get());
  for (const auto& t : weights.tensors) XXH3_128bits_update(state.get(), t.data(), t.size());
  return hex128(XXH3_128bits_digest(state.get()));
}

void set_log_level(const std::string& level) {
  for (const char* subsystem : {"tree", "transport", "codec", "bench"})
    logger(subsystem)->set_level(spdlog::level::from_str(level));
}

// ---- receiver mode --------------------------------------------------------------------------

int run_receiver(const ReceiverModeOptions& o) {
  auto transport = transport::make_transport(o.transport, transport_options());
  tree::ReceiverOptions options;
  options.rank = o.rank;
  options.producer_url = o.producer_url;
  options.listen_url = o.listen_url;
  options.cluster = o.cluster;
  options.idle_timeout = std::chrono::minutes(30);
  tree::Receiver receiver(*transport, options);
  const codec::Manifest& manifest = receiver.join();
  std::vector<std::vector<std::byte>> buffers;  // version 0: all zeros
  codec::MutableWeights weights{&manifest, {}};
  for (const auto& t : manifest.tensors()) buffers.emplace_back(t.nbytes());
  for (auto& b : buffers) weights.tensors.emplace_back(b.data(), b.size());
  receiver.attach(weights, 0);
  tree::RunSummary summary = receiver.run();
  nlohmann::json out = {{"rank", o.rank},
                        {"version", summary.version},
                        {"hash", weights_hash(weights.as_const())},
                        {"versions_committed", summary.stats.versions_committed},
                        {"versions_aborted", summary.stats.versions_aborted},
                        {"frames_forwarded", summary.stats.frames_forwarded}};
  std::ofstream(o.summary_path) << out.dump() << "\n";
  return summary.stats.versions_aborted == 0 ? 0 : 1;
}

// ---- the receiver fleet ---------------------------------------------------------------------

// N receiver processes; the destructor kills any still running (error paths).
class ReceiverFleet {
 public:
  ReceiverFleet(const CommonOptions& o, const std::string& producer_url, const fs::path& dir)
      : dir_(dir) {
    const std::string self = self_executable();
    for (unsigned r = 1; r <= o.receivers; ++r) {
      std::vector<std::string> argv;
      if (o.netns) argv = {"ip", "netns", "exec", netns_prefix() + std::to_string(r)};
      for (std::string a : {self, std::string("receiver"), "--rank=" + std::to_string(r),
                            "--producer=" + producer_url,
                            "--listen=" + o.transport + "://" + host_of(o, r) + ":0",
                            "--transport=" + o.transport, "--summary=" + summary(r).string(),
                            "--log-level=" + o.log_level})
        argv.push_back(a);
      pids_.push_back(spawn_process(argv, log(r)));
    }
  }
  ~ReceiverFleet() { kill_processes(pids_); }

  // Waits for every receiver; returns their final weight hashes (rank order). Throws
  // Error(verify_failed) naming the receivers that failed, with the end of their logs.
  std::vector<std::string> wait_all() {
    std::string failures;
    std::vector<std::string> hashes;
    for (size_t i = 0; i < pids_.size(); ++i) {
      int rc = wait_process(pids_[i]);
      pids_[i] = -1;
      const unsigned rank = static_cast<unsigned>(i + 1);
      if (rc != 0) {
        failures += "  receiver " + std::to_string(rank) + " exited " + std::to_string(rc) + ":\n" +
                    tail_of_file(log(rank), 5);
        continue;
      }
      std::ifstream in(summary(rank));
      hashes.push_back(nlohmann::json::parse(in).at("hash").get<std::string>());
    }
    if (!failures.empty()) throw Error(Errc::verify_failed, "receivers failed:\n" + failures);
    return hashes;
  }

 private:
  fs::path summary(unsigned r) const { return dir_ / ("receiver-" + std::to_string(r) + ".json"); }
  fs::path log(unsigned r) const { return dir_ / ("receiver-" + std::to_string(r) + ".log"); }

  fs::path dir_;
  std::vector<pid_t> pids_;
};

fs::path make_work_dir() {
  std::string pattern = (fs::temp_directory_path() / "dc-bench-tree-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw Error(Errc::io, "cannot create a temporary directory");
  return pattern;
}

void set_random_secret() { ::setenv("DELTACAST_SECRET", transport::random_secret().c_str(), 1); }

tree::ProducerOptions producer_options(const CommonOptions& o) {
  tree::ProducerOptions options;
  options.listen_url = o.transport + "://" + host_of(o, 0) + ":0";
  options.receivers = o.receivers;
  options.topology = tree::parse_topology_kind(o.topology);
  options.encode.chunk_bytes = config::parse_size(o.chunk);
  options.encode.threads = o.threads;
  return options;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

unsigned count_matching(const std::vector<std::string>& hashes, const std::string& want) {
  return static_cast<unsigned>(std::count(hashes.begin(), hashes.end(), want));
}

// The 1-minute load average: this machine is shared, and the numbers mean little without it.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return load;
}

void emit(const CommonOptions& o, nlohmann::json result) {
  result["loadavg_1min"] = load_average();
  result["label"] = o.label;
  result["topology"] = o.topology;
  result["transport"] = o.transport;
  result["receivers"] = o.receivers;
  result["netns"] = o.netns;
  std::printf("%s\n", result.dump().c_str());
  std::fflush(stdout);
  if (!o.json_path.empty()) std::ofstream(o.json_path, std::ios::app) << result.dump() << "\n";
}

double lower_bound(const CommonOptions& o, uint64_t bytes) {
  return o.link_gbit > 0 ? static_cast<double>(bytes) * 8 / (o.link_gbit * 1e9) : 0.0;
}

// ---- broadcast ------------------------------------------------------------------------------

// Random bits (splitmix64) for tensor t: incompressible, reproducible from the seed.
void fill_random(std::vector<std::byte>& bytes, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    std::memcpy(bytes.data() + i, &z, 8);
  }
}

struct EncodedStage {
  std::vector<std::vector<std::byte>> frames;
  uint64_t digest = 0;
};

// Stage k (version k+1) turns tensor k from zeros into its random bits; tensors < k are already
// real, tensors > k still zero. Encoded here, before the clock starts.
std::vector<EncodedStage> encode_stages(const codec::Manifest& manifest,
                                        const std::vector<std::vector<std::byte>>& full,
                                        const tree::ProducerOptions& po) {
  size_t largest = 0;
  for (const auto& t : full) largest = std::max(largest, t.size());
  const std::vector<std::byte> zeros(largest);
  std::vector<uint64_t> zero_digest, full_digest;
  for (uint32_t t = 0; t < manifest.size(); ++t) {
    zero_digest.push_back(codec::tensor_digest(t, codec::DType::bf16, {zeros.data(), full[t].size()}));
    full_digest.push_back(codec::tensor_digest(t, codec::DType::bf16, full[t]));
  }
  codec::EncodeOptions options = po.encode;
  options.xor_safe_mode = codec::ValueMode::xor_bits;  // against zero, XOR is the value itself
  std::vector<EncodedStage> stages;
  for (uint32_t k = 0; k < manifest.size(); ++k) {
    codec::ConstWeights base{&manifest, {}}, next{&manifest, {}};
    std::vector<uint64_t> base_digest;
    for (uint32_t t = 0; t < manifest.size(); ++t) {
      std::span<const std::byte> real(full[t]), zero(zeros.data(), full[t].size());
      base.tensors.push_back(t < k ? real : zero);
      next.tensors.push_back(t <= k ? real : zero);
      base_digest.push_back(t < k ? full_digest[t] : zero_digest[t]);
    }
    auto delta = codec::encode_delta(base, next, codec::StateDigest(base_digest), {k, k + 1}, options);
    stages.push_back({std::move(delta.frames), delta.new_digest.combined()});
  }
  return stages;
}

void run_broadcast(const CommonOptions& o, const BroadcastOptions& b) {
  const uint64_t total = config::parse_size(b.bytes);
  const uint64_t stage = config::parse_size(o.stage);
  if (total < 2 || stage < 2 || total % 2 || stage % 2)
    throw Error(Errc::invalid_argument, "--bytes and --stage must be even, non-zero byte counts");
  std::vector<codec::TensorInfo> tensors;
  std::vector<std::vector<std::byte>> full;
  for (uint64_t offset = 0; offset < total; offset += stage) {
    const uint64_t size = std::min(stage, total - offset);
    char name[32];
    std::snprintf(name, sizeof name, "payload.%04zu", tensors.size());
    tensors.push_back({name, codec::DType::bf16, {size / 2}});
    full.emplace_back(size);
    fill_random(full.back(), b.seed * 1000003 + tensors.size());
  }
  const codec::Manifest manifest(std::move(tensors));
  codec::ConstWeights full_view{&manifest, {}};
  for (const auto& t : full) full_view.tensors.emplace_back(t);

  tree::ProducerOptions po = producer_options(o);
  std::vector<EncodedStage> stages;
  if (b.mode != "raw" && b.mode != "delta")
    throw Error(Errc::invalid_argument, "--mode must be raw or delta, got '" + b.mode + "'");
  if (b.mode == "delta") stages = encode_stages(manifest, full, po);

  set_random_secret();
  const fs::path dir = make_work_dir();
  auto transport = transport::make_transport(o.transport, transport_options());
  tree::Producer producer(*transport, manifest, po);
  ReceiverFleet fleet(o, producer.url(), dir);
  producer.start();

  // seconds: first byte to every receiver active (RefitReport::refit_seconds, summed over the
  // versions); call_seconds adds the producer's own bookkeeping afterwards (its baseline copy
  // and, after a raw bootstrap, its StateDigest scan).
  auto start = Clock::now();
  uint64_t frames_bytes = 0;
  unsigned verified = o.receivers;
  bool committed = true;
  double seconds = 0;
  if (b.mode == "raw") {
    tree::RefitReport r = producer.bootstrap(full_view);
    frames_bytes = r.frames_bytes;
    verified = r.verified_receivers;
    committed = r.committed;
    seconds = r.refit_seconds;
  } else {
    for (size_t k = 0; k < stages.size() && committed; ++k) {
      tree::RefitReport r = producer.publish(stages[k].frames, k + 1, stages[k].digest);
      frames_bytes += r.frames_bytes;
      verified = std::min(verified, r.verified_receivers);
      committed = r.committed;
      seconds += r.refit_seconds;
    }
  }
  const double call_seconds = seconds_since(start);
  producer.finish();
  const auto hashes = fleet.wait_all();
  const unsigned bit_exact = count_matching(hashes, weights_hash(full_view));
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  const double bound = lower_bound(o, total);
  emit(o, {{"bench", "broadcast"},
           {"bytes", total},
           {"frames_bytes", frames_bytes},
           {"stage_bytes", stage},
           {"mode", b.mode},
           {"seconds", seconds},
           {"call_seconds", call_seconds},
           {"gbit_per_s", static_cast<double>(total) * 8 / seconds / 1e9},
           {"lower_bound_seconds", bound},
           {"over_lower_bound", bound > 0 ? seconds / bound : 0.0},
           {"committed", committed},
           {"verified_receivers", verified},
           {"bit_exact_receivers", bit_exact}});
  if (!committed || bit_exact != o.receivers)
    throw Error(Errc::verify_failed, std::to_string(o.receivers - bit_exact) +
                                         " receivers are not bit-exact with the producer");
}

// ---- refit ----------------------------------------------------------------------------------

void run_refit(const CommonOptions& o, const RefitBenchOptions& r) {
  sim::SimConfig sc;
  sc.params = sim::parse_param_count(r.params);
  sc.lr = static_cast<float>(r.lr);
  sc.seed = r.seed;
  sc.threads = o.threads;
  sim::TrainerSimulator trainer(sc);

  set_random_secret();
  const fs::path dir = make_work_dir();
  auto transport = transport::make_transport(o.transport, transport_options());
  tree::Producer producer(*transport, trainer.manifest(), producer_options(o));
  ReceiverFleet fleet(o, producer.url(), dir);
  producer.start();

  tree::RefitReport full = producer.bootstrap(trainer.bf16_weights());
  bool ok = full.committed && full.verified_receivers == o.receivers;
  nlohmann::json steps = nlohmann::json::array();
  for (unsigned step = 1; ok && step <= r.steps; ++step) {
    trainer.step();
    tree::RefitReport s = producer.refit(trainer.bf16_weights());
    ok = s.committed && s.verified_receivers == o.receivers;
    const double bound = lower_bound(o, s.frames_bytes);
    steps.push_back({{"step", step},
                     {"changed_fraction", static_cast<double>(s.changes) / static_cast<double>(s.elements)},
                     {"payload_bytes", s.frames_bytes},
                     {"bytes_per_change", static_cast<double>(s.frames_bytes) / static_cast<double>(std::max<uint64_t>(1, s.changes))},
                     {"encode_seconds", s.encode_seconds},
                     {"refit_seconds", s.refit_seconds},
                     {"speedup", full.refit_seconds / s.refit_seconds},
                     {"lower_bound_seconds", bound},
                     {"over_lower_bound", bound > 0 ? s.refit_seconds / bound : 0.0},
                     {"verified_receivers", s.verified_receivers}});
  }
  producer.finish();
  const auto hashes = fleet.wait_all();
  const unsigned bit_exact = count_matching(hashes, weights_hash(trainer.bf16_weights()));
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  const double full_bound = lower_bound(o, full.checkpoint_bytes);
  emit(o, {{"bench", "refit"},
           {"params", trainer.manifest().total_elements()},
           {"lr", r.lr},
           {"checkpoint_bytes", full.checkpoint_bytes},
           {"full_frames_bytes", full.frames_bytes},
           {"full_seconds", full.refit_seconds},
           {"full_lower_bound_seconds", full_bound},
           {"full_over_lower_bound", full_bound > 0 ? full.refit_seconds / full_bound : 0.0},
           {"steps", steps},
           {"committed", ok},
           {"bit_exact_receivers", bit_exact}});
  if (!ok || bit_exact != o.receivers)
    throw Error(Errc::verify_failed, std::to_string(o.receivers - bit_exact) +
                                         " receivers are not bit-exact with the producer");
}

void add_common(CLI::App* cmd, CommonOptions& o) {
  cmd->add_option("--receivers", o.receivers, "Receiver processes")->capture_default_str();
  cmd->add_option("--topology", o.topology, "binary | double_binary | chain")->capture_default_str();
  cmd->add_option("--transport", o.transport, "Transport backend (tcp, ofi+tcp, ucx)")->capture_default_str();
  cmd->add_flag("--netns", o.netns, "Receiver i runs in namespace PREFIXi of scripts/netns.sh");
  cmd->add_option("--chunk", o.chunk, "Checkpoint bytes per chunk frame")->capture_default_str();
  cmd->add_option("--stage", o.stage, "broadcast: bytes per tensor (and per delta version)")->capture_default_str();
  cmd->add_option("--threads", o.threads, "Encoder / simulator threads")->capture_default_str();
  cmd->add_option("--link-gbit", o.link_gbit, "Bottleneck Gbit/s for the lower bound (0: none)");
  cmd->add_option("--json", o.json_path, "Append one JSON line per run to this file");
  cmd->add_option("--label", o.label, "Free text copied into the JSON line");
  cmd->add_option("--log-level", o.log_level, "spdlog level")->capture_default_str();
}

}  // namespace
}  // namespace deltacast::bench

int main(int argc, char** argv) {
  using namespace deltacast::bench;
  CLI::App app{"Relay-tree benchmarks: broadcast of S bytes, full checkpoint vs delta refit"};
  app.require_subcommand(1);
  CommonOptions common;
  BroadcastOptions broadcast;
  RefitBenchOptions refit;
  ReceiverModeOptions receiver;
  auto* bc = app.add_subcommand("broadcast", "Broadcast S random bytes to every receiver");
  add_common(bc, common);
  bc->add_option("--bytes", broadcast.bytes, "Payload size")->capture_default_str();
  bc->add_option("--mode", broadcast.mode, "raw (Producer::bootstrap) | delta (pre-encoded delta versions)")
      ->capture_default_str();
  bc->add_option("--seed", broadcast.seed, "Payload seed");
  auto* rf = app.add_subcommand("refit", "Full checkpoint, then delta refits of simulated steps");
  add_common(rf, common);
  rf->add_option("--params", refit.params, "Simulated parameters")->capture_default_str();
  rf->add_option("--lr", refit.lr, "Simulator learning rate")->capture_default_str();
  rf->add_option("--steps", refit.steps, "Refit steps")->capture_default_str();
  rf->add_option("--seed", refit.seed, "Simulator seed");
  auto* rc = app.add_subcommand("receiver", "(internal) one receiver process");
  rc->add_option("--rank", receiver.rank)->required();
  rc->add_option("--producer", receiver.producer_url)->required();
  rc->add_option("--listen", receiver.listen_url)->required();
  rc->add_option("--summary", receiver.summary_path)->required();
  rc->add_option("--transport", receiver.transport);
  rc->add_option("--cluster", receiver.cluster);
  rc->add_option("--log-level", common.log_level);
  CLI11_PARSE(app, argc, argv);
  try {
    set_log_level(common.log_level);
    if (rc->parsed()) return run_receiver(receiver);
    if (bc->parsed()) run_broadcast(common, broadcast);
    if (rf->parsed()) run_refit(common, refit);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dc_bench_tree: %s\n", e.what());
    return 1;
  }
}
