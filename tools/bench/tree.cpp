// `deltacast bench tree` (docs/benchmarks.md). The measuring side (rank 0) is here: the plan
// (sizes under the memory cap), the sweeps, the checks on every report, the table, --json and
// --svg. The receivers' side and the session protocol are in tools/bench/tree_member.h, the
// arithmetic in tools/bench/tree_math.h, the plot in tools/bench/tree_svg.h.
//
// What a time is: RefitReport::refit_seconds of the version, from the producer's first byte (or
// first encode, for a refit) to every receiver having verified the version and made it active;
// connection set-up, buffer allocation and the producer's baseline copy are outside it. Each
// timed version runs in a session of its own (a fresh Producer and fresh Receivers on the same
// URLs), because a bootstrap needs receivers at version 0.
#include "tools/bench/tree.h"

#include <malloc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "codec/manifest.h"
#include "config/config.h"
#include "sim/bf16.h"
#include "sim/model_shape.h"
#include "tools/bench/tree_math.h"
#include "tools/bench/tree_member.h"
#include "tools/bench/tree_svg.h"
#include "transport/transport.h"
#include "tree/config_options.h"
#include "tree/launch_env.h"
#include "tree/producer.h"
#include "tree/secure_start.h"
#include "util/error.h"
#include "util/json.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

struct TreeBenchOptions {
  std::string config_path;
  std::optional<int> rank;
  std::optional<int> size;
  std::optional<std::string> producer;
  std::vector<std::string> sets;
  std::string mode = "broadcast";
  std::string min_size = "1MiB";
  std::string max_size = "4GiB";
  std::vector<std::string> topologies{"binary", "double_binary", "chain"};
  int iters = 5;
  int warmup = 1;
  std::string params = "100M";
  std::vector<double> change_rates{0.01, 0.03, 0.05};
  uint64_t seed = 1;
  std::string probe_path;
  double link_gbit = 0;
  std::string json_path;
  std::string svg_path;
  std::string log_level = "warn";
  std::string fault;  // receivers, testing aid: kill@SESSION[:N]
};

// Bytes per tensor of the broadcast payload: the manifest looks like a model's (many tensors),
// not one blob.
constexpr uint64_t kPayloadTensorBytes = uint64_t{32} << 20;

std::string fixed(double v, int digits) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

nlohmann::json optional_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); }

void write_text(const std::string& path, const std::string& text) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  if (!out || !(out << text)) throw Error(Errc::io, "cannot write " + path);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::io, "cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// ---- the job: what every rank knows ----------------------------------------------------------

struct Job {
  TreeBenchOptions o;
  config::Config c;
  tree::LaunchEnv env;
  std::vector<config::MemberConfig> members;
  std::unique_ptr<transport::Transport> transport;
  uint64_t sessions = 0;  // sessions run so far (rank 0)
};

// A receiver's testing aid: kill@SESSION[:N].
std::pair<uint64_t, uint64_t> parse_session_fault(const std::string& spec) {
  auto number = [&](std::string_view text) {
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v == 0)
      throw Error(Errc::invalid_argument, "--fault " + spec + ": expected kill@SESSION[:N] with positive integers");
    return v;
  };
  if (spec.rfind("kill@", 0) != 0)
    throw Error(Errc::invalid_argument, "--fault " + spec + ": expected kill@SESSION[:N]");
  const std::string rest = spec.substr(5);
  const size_t colon = rest.find(':');
  return {number(std::string_view(rest).substr(0, colon)),
          colon == std::string::npos ? 1 : number(std::string_view(rest).substr(colon + 1))};
}

void run_member(Job& job) {
  const auto& me = job.members.at(static_cast<size_t>(job.env.member_rank()));
  roll_call_member(*job.transport, job.env.require_rendezvous(), job.env.rank, job.c.timeouts.join,
                   job.c.timeouts.connect);
  MemberSessionOptions options;
  options.receiver = tree::receiver_options_from(job.c);
  options.receiver.rank = static_cast<uint32_t>(job.env.receiver_rank());
  options.receiver.producer_url = job.env.require_rendezvous();
  options.receiver.listen_url = me.url;
  options.receiver.cluster = me.cluster;
  options.patience = job.c.timeouts.join;
  if (!job.o.fault.empty()) std::tie(options.fault_session, options.fault_after) = parse_session_fault(job.o.fault);
  serve_sessions(*job.transport, options);
}

// ---- rank 0: sessions -------------------------------------------------------------------------

// The options of a session's producer; with a producer group, rank `rank`'s (rank 0: the
// coordinator, on the rendezvous URL): its listen URL and group options as `run` gives them
// (config::producer_rank_urls).
tree::ProducerOptions session_options(const Job& job, uint32_t rank) {
  tree::ProducerOptions options = tree::producer_options_from(job.c);
  options.listen_url = job.env.require_rendezvous();
  options.encode.threads = std::max(1u, std::thread::hardware_concurrency());
  if (job.c.producers > 1) {
    config::Config at = job.c;
    at.producer = job.env.require_rendezvous();
    options.listen_url = config::producer_rank_urls(at).at(rank);
    options.group = {rank, static_cast<uint32_t>(job.c.producers), job.env.require_rendezvous(), {}};
  }
  return options;
}

// One session: a Producer for `manifest` on the rendezvous URL, started (every receiver, and a
// group's part ranks, joined within timeouts.join), `body` run, then BYE. `what` names the
// measurement in errors; `group` false: rank 0 alone, whatever `producers` says.
template <class Body>
void run_session(Job& job, const codec::Manifest& manifest, tree::TopologyKind kind, const std::string& what,
                 Body&& body, bool group = true) {
  ++job.sessions;
  tree::ProducerOptions options = session_options(job, 0);  // rank 0 listens on the rendezvous URL
  if (!group) options.group = {};
  options.receivers = static_cast<uint32_t>(job.members.size());
  options.topology = kind;
  tree::Producer producer(*job.transport, manifest, options);
  try {
    producer.start(job.c.timeouts.join);
  } catch (const Error& e) {
    throw Error(e.code(), what + " (session " + std::to_string(job.sessions) +
                              "): the receivers (and producer ranks) did not all join within timeouts.join: " +
                              e.what() + (job.sessions > 1 ? " (a receiver stopped between sessions?)" : ""));
  }
  body(producer);
  producer.finish();
}

// The end of the sweep: a session whose one tensor tells the receivers to exit.
void end_session(Job& job) {
  const codec::Manifest manifest({{kEndTensor, codec::DType::bf16, {1}}});
  // One producer: a group's part ranks end after their last refit session.
  run_session(
      job, manifest, tree::TopologyKind::binary, "the end of the sweep", [](tree::Producer&) {}, false);
}

std::string failed_text(const std::vector<tree::FailedMember>& failed) {
  std::string text;
  for (const auto& f : failed) text += (text.empty() ? "" : ", ") + std::to_string(f.rank) + " (" + f.cause + ")";
  return text;
}

nlohmann::json failed_json(const std::vector<tree::FailedMember>& failed) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : failed)
    out.push_back({{"rank", f.rank}, {"cause", f.cause}, {"detection_seconds", f.detection_seconds}});
  return out;
}

// Every receiver of the job verified and committed the version: the joint commit's word that each
// holds the producer's bits (digest acks). Throws Error(verify_failed) otherwise.
void check_verified(const tree::RefitReport& r, size_t members, const std::string& what) {
  if (!r.committed)
    throw Error(Errc::verify_failed, what + ": version " + std::to_string(r.version) + " was aborted (" +
                                         r.abort_reason + "): the receivers do not hold the producer's bits");
  if (r.verified_receivers != members)
    throw Error(Errc::verify_failed, what + ": only " + std::to_string(r.verified_receivers) + " of " +
                                         std::to_string(members) + " receivers verified version " +
                                         std::to_string(r.version));
}

// A receiver failed during a measurement: the tree repaired around it, but every later session
// needs all ranks, so the sweep stops.
[[noreturn]] void stop_for_failure(const tree::RefitReport& r, size_t members, const std::string& what) {
  throw Error(Errc::connection, what + ": receiver rank " + failed_text(r.failed_members) +
                                    " failed; the tree repaired around it and " + std::to_string(r.verified_receivers) +
                                    " of " + std::to_string(members) +
                                    " receivers verified the version, but every session needs all ranks: the "
                                    "sweep stops here");
}

// ---- rank 0: output ---------------------------------------------------------------------------

// The JSON document (rewritten after every row, so a stopped sweep leaves its rows), the table on
// stdout and the SVG at the end.
class Report {
 public:
  Report(const Job& job, nlohmann::json header) : job_(job), doc_(std::move(header)) {
    doc_["rows"] = nlohmann::json::array();
    doc_["complete"] = false;
  }
  nlohmann::json& doc() { return doc_; }
  void add_row(nlohmann::json row, const std::string& line) {
    doc_["rows"].push_back(std::move(row));
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    save();
  }
  void finish(const std::optional<std::string>& error) {
    doc_["complete"] = !error;
    doc_["sessions"] = job_.sessions;
    if (error) doc_["error"] = *error;
    save();
    if (!job_.o.svg_path.empty()) write_text(job_.o.svg_path, plot());
    if (!job_.o.json_path.empty() || !job_.o.svg_path.empty()) {
      std::printf("# wrote%s%s%s%s\n", job_.o.json_path.empty() ? "" : " ", job_.o.json_path.c_str(),
                  job_.o.svg_path.empty() ? "" : " ", job_.o.svg_path.c_str());
      std::fflush(stdout);
    }
  }

 private:
  void save() const {
    if (!job_.o.json_path.empty()) write_text(job_.o.json_path, doc_.dump(2) + "\n");
  }
  std::string plot() const {
    const bool refit = job_.o.mode == "refit";
    std::vector<PlotSeries> series;
    for (const auto& name : job_.o.topologies) {
      PlotSeries s{name, {}};
      for (const auto& row : doc_["rows"]) {
        if (row["topology"] != name) continue;
        const auto& y = row[refit ? "refit_s" : "busbw_gbyte_s"];
        if (!y.is_number()) continue;
        s.xy.emplace_back(row[refit ? "change_rate" : "size_bytes"].get<double>(), y.get<double>());
      }
      series.push_back(std::move(s));
    }
    PlotAxes axes;
    const std::string who = std::to_string(job_.members.size()) + " receivers over " + job_.c.transport;
    if (refit) {
      axes.title = "deltacast bench tree --mode refit: refit time, " + doc_["params"].dump() + " params, " + who;
      axes.x_label = "change rate (requested)";
      axes.y_label = "refit seconds (median)";
      axes.x_tick = [](double x) { return fixed(100 * x, x < 0.1 ? 1 : 0) + "%"; };
    } else {
      axes.title = "deltacast bench tree: broadcast busbw, " + who;
      axes.x_label = "size";
      axes.y_label = "busbw GB/s (median)";
      axes.log_x = true;
      axes.x_tick = [](double x) { return size_text(static_cast<uint64_t>(x)); };
    }
    return line_plot_svg(axes, series);
  }

  const Job& job_;
  nlohmann::json doc_;
};

// B per topology: --link-gbit for all, else the probe's slowest tree edge, else none.
std::map<std::string, std::optional<double>> bottlenecks(const Job& job, std::string* source) {
  std::map<std::string, std::optional<double>> out;
  std::optional<nlohmann::json> probe;
  if (job.o.link_gbit > 0) {
    *source = "--link-gbit";
  } else if (!job.o.probe_path.empty()) {
    std::string why;
    probe = util::parse_json_bounded(read_text(job.o.probe_path), &why);
    if (probe->is_discarded())
      throw Error(Errc::invalid_argument, "--probe " + job.o.probe_path + ": not JSON: " + why);
    *source = "probe " + job.o.probe_path + ": slowest edge of each topology's trees";
  } else {
    *source = "none";
  }
  std::vector<std::string> labels;
  labels.reserve(job.members.size());
  for (const auto& m : job.members) labels.push_back(m.cluster);
  for (const auto& name : job.o.topologies) {
    if (job.o.link_gbit > 0)
      out[name] = job.o.link_gbit;
    else if (probe)
      out[name] = probe_bottleneck_gbit(*probe, tree::parse_topology_kind(name), labels);
    else
      out[name] = std::nullopt;
  }
  return out;
}

std::string over_text(const std::optional<double>& v) { return v ? fixed(*v, 2) + "x" : "-"; }

// ---- rank 0: broadcast ------------------------------------------------------------------------

// Random bits (splitmix64): nothing can shrink them, and they are reproducible from the seed.
void fill_random(std::span<std::byte> bytes, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    std::memcpy(bytes.data() + i, &z, 8);
  }
}

struct Payload {
  codec::Manifest manifest;
  codec::ConstWeights weights;
};

// `size` bytes of `bytes` as BF16 tensors of kPayloadTensorBytes (the last one shorter).
std::unique_ptr<Payload> payload_of(std::span<const std::byte> bytes, uint64_t size) {
  std::vector<codec::TensorInfo> tensors;
  tensors.reserve(static_cast<size_t>(size / kPayloadTensorBytes + 1));
  for (uint64_t offset = 0; offset < size; offset += kPayloadTensorBytes) {
    char name[40];
    std::snprintf(name, sizeof name, "bench.payload.%05zu", tensors.size());
    tensors.push_back({name, codec::DType::bf16, {std::min(kPayloadTensorBytes, size - offset) / 2}});
  }
  auto p = std::make_unique<Payload>(Payload{codec::Manifest(std::move(tensors)), {}});
  p->weights.manifest = &p->manifest;
  uint64_t offset = 0;
  for (const auto& t : p->manifest.tensors()) {
    p->weights.tensors.push_back(bytes.subspan(offset, t.nbytes()));
    offset += t.nbytes();
  }
  return p;
}

void broadcast_sweep(Job& job, Report& report, const std::vector<uint64_t>& sizes,
                     const std::map<std::string, std::optional<double>>& bottleneck) {
  const size_t members = job.members.size();
  std::vector<std::byte> bytes(sizes.back());
  fill_random(bytes, job.o.seed);
  std::printf("# %-14s %14s %11s %11s %11s %11s %11s %9s  %s\n", "topology", "size_bytes", "time_s", "time_min_s",
              "time_max_s", "algbw_GB/s", "busbw_GB/s", "over_lb", "failed");
  std::fflush(stdout);
  for (const auto& name : job.o.topologies) {
    const tree::TopologyKind kind = tree::parse_topology_kind(name);
    for (uint64_t size : sizes) {
      const auto payload = payload_of(bytes, size);
      std::vector<double> times;
      std::optional<tree::RefitReport> failure;
      for (int it = 0; it < job.o.warmup + job.o.iters && !failure; ++it) {
        const std::string what = name + " " + size_text(size) + ", " +
                                 (it < job.o.warmup ? "warm-up " + std::to_string(it + 1)
                                                    : "iteration " + std::to_string(it - job.o.warmup + 1));
        tree::RefitReport r;
        run_session(job, payload->manifest, kind, what, [&](tree::Producer& p) { r = p.bootstrap(payload->weights); });
        if (!r.failed_members.empty()) {
          if (r.committed && (it >= job.o.warmup || times.empty())) times.push_back(r.refit_seconds);
          failure = r;
          if (times.empty()) stop_for_failure(r, members, what);
          continue;
        }
        check_verified(r, members, what);
        if (it >= job.o.warmup) times.push_back(r.refit_seconds);
      }
      const Spread t = spread_of(times);
      const double algbw = algbw_gbyte_s(size, t.median);
      const auto over = over_lower_bound(t.median, size, bottleneck.at(name));
      nlohmann::json row = {
          {"topology", name},
          {"size_bytes", size},
          {"time_s", t.median},
          {"time_min_s", t.min},
          {"time_max_s", t.max},
          {"algbw_gbyte_s", algbw},
          {"busbw_gbyte_s", busbw_gbyte_s_broadcast(algbw)},
          {"over_lower_bound", optional_json(over)},
          {"bottleneck_gbit", optional_json(bottleneck.at(name))},
          {"iters", times.size()},
          {"receivers", members},
          {"verified_receivers", failure ? failure->verified_receivers : members},
          {"failed_members", failure ? failed_json(failure->failed_members) : nlohmann::json::array()}};
      char line[256];
      std::snprintf(line, sizeof line, "  %-14s %14llu %11.5f %11.5f %11.5f %11.3f %11.3f %9s  %s", name.c_str(),
                    static_cast<unsigned long long>(size), t.median, t.min, t.max, algbw,
                    busbw_gbyte_s_broadcast(algbw), over_text(over).c_str(),
                    failure ? failed_text(failure->failed_members).c_str() : "-");
      report.add_row(std::move(row), line);
      if (failure) stop_for_failure(*failure, members, name + " " + size_text(size));
    }
  }
}

// ---- rank 0: refit ----------------------------------------------------------------------------

// splitmix64: a small, fast, seedable generator.
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform_open() { return (static_cast<double>(next() >> 11) + 1) * 0x1p-53; }  // (0, 1]
};

// The synthetic model: sim::model_tensors' names and shapes (what `deltacast run`'s synth trainer
// publishes), initialised as the simulator does (normal, std 0.02; RMSNorm weights near 1) and
// held as one flat BF16 array.
struct Model {
  codec::Manifest manifest;
  std::vector<uint16_t> base;     // version 1 (the bootstrap)
  std::vector<uint16_t> working;  // the versions after it
  codec::ConstWeights view(const std::vector<uint16_t>& bits) const {
    codec::ConstWeights w{&manifest, {}};
    w.tensors.reserve(manifest.size());
    const auto bytes = std::as_bytes(std::span(bits));
    uint64_t offset = 0;
    for (const auto& t : manifest.tensors()) {
      w.tensors.push_back(bytes.subspan(offset, t.nbytes()));
      offset += t.nbytes();
    }
    return w;
  }
};

std::unique_ptr<Model> make_model(uint64_t params, uint64_t seed) {
  auto m = std::make_unique<Model>(Model{codec::Manifest(sim::model_tensors(sim::model_shape_for(params))), {}, {}});
  m->base.resize(m->manifest.total_elements());
  SplitMix rng{seed * 0x2545F4914F6CDD1DULL + 7};
  uint64_t at = 0;
  constexpr double kTwoPi = 6.283185307179586;
  for (const auto& t : m->manifest.tensors()) {
    const double centre = sim::is_norm_tensor(t.name) ? 1.0 : 0.0;
    const uint64_t end = at + t.numel();
    for (; at < end; at += 2) {  // Box-Muller: two normals per pair of uniforms
      const double r = 0.02 * std::sqrt(-2 * std::log(rng.uniform_open())), phi = kTwoPi * rng.uniform_open();
      m->base[at] = sim::fp32_to_bf16(static_cast<float>(centre + r * std::cos(phi)));
      if (at + 1 < end) m->base[at + 1] = sim::fp32_to_bf16(static_cast<float>(centre + r * std::sin(phi)));
    }
    at = end;
  }
  m->working.resize(m->base.size());
  return m;
}

// One BF16 ulp up or down (what an optimizer step does to most elements it changes), never to an
// infinity or NaN, never to the same bits.
uint16_t nudge(uint16_t bits, bool up) {
  const uint16_t sign = bits & 0x8000;
  uint16_t magnitude = bits & 0x7FFF;
  if (magnitude == 0)
    magnitude = 1;
  else if (magnitude >= 0x7F7F)
    magnitude -= 1;
  else
    magnitude = up ? magnitude + 1 : magnitude - 1;
  return static_cast<uint16_t>(sign | magnitude);
}

// Changes each element with probability `rate` (geometric gaps between changed elements, so the
// cost is the number of changes). Returns how many changed.
uint64_t mutate(std::vector<uint16_t>& bits, double rate, uint64_t seed) {
  SplitMix rng{seed};
  const double log_keep = rate < 1 ? std::log1p(-rate) : 0;
  auto gap = [&]() -> uint64_t {
    if (rate >= 1) return 0;
    const double g = std::floor(std::log(rng.uniform_open()) / log_keep);
    return g > 1e18 ? uint64_t{1} << 60 : static_cast<uint64_t>(g);
  };
  uint64_t changed = 0;
  for (uint64_t i = gap(); i < bits.size(); i += 1 + gap()) {
    bits[i] = nudge(bits[i], (rng.next() & 1) != 0);
    ++changed;
  }
  return changed;
}

// One refit session's versions on `p` (the coordinator's, or a group's part rank's: every rank
// runs the same sequence from the same flags): version 1, the full checkpoint (raw bytes; a
// group's, every rank its own part's), then
// one refit per --change-rates entry, each a mutation of the last (seeded by the iteration `it`).
// `seen(rate index or nothing for version 1, report)` after each.
template <class Seen>
void session_versions(const Job& job, Model& model, tree::Producer& p, int it, Seen&& seen) {
  seen(std::nullopt, p.bootstrap(model.view(model.base)));
  model.working = model.base;
  for (size_t k = 0; k < job.o.change_rates.size(); ++k) {
    mutate(model.working, job.o.change_rates[k], job.o.seed * 1000003 + static_cast<uint64_t>(it) * 1009 + k);
    seen(k, p.refit(model.view(model.working)));
  }
}

// A producer group's part rank (1..M-1): the coordinator's refit sweep, session by session, its
// part of every version. Every version must commit (the coordinator's checks name the members;
// a part rank only says which version did not).
void run_part_rank(Job& job) {
  roll_call_member(*job.transport, job.env.require_rendezvous(), job.env.rank, job.c.timeouts.join,
                   job.c.timeouts.connect);
  const auto model = make_model(sim::parse_param_count(job.o.params), job.o.seed);
  const tree::ProducerOptions options = session_options(job, static_cast<uint32_t>(job.env.rank));
  uint64_t session = 0;
  for (const auto& name : job.o.topologies) {
    for (int it = 0; it < job.o.warmup + job.o.iters; ++it) {
      auto p = start_part_session(*job.transport, model->manifest, options, job.c.timeouts.join, ++session);
      session_versions(job, *model, *p, it, [&](std::optional<size_t>, const tree::RefitReport& r) {
        if (!r.committed)
          throw Error(Errc::verify_failed, "producer rank " + std::to_string(job.env.rank) + ": " + name + " session " +
                                               std::to_string(session) + ": version " + std::to_string(r.version) +
                                               " aborted: " + r.abort_reason);
      });
      p->finish();
    }
  }
}

void refit_sweep(Job& job, Report& report, const std::map<std::string, std::optional<double>>& bottleneck) {
  const size_t members = job.members.size();
  const auto model = make_model(sim::parse_param_count(job.o.params), job.o.seed);
  const uint64_t checkpoint_bytes = model->manifest.total_bytes();
  report.doc()["params"] = model->manifest.total_elements();
  report.doc()["checkpoint_bytes"] = checkpoint_bytes;
  std::printf("# model: %llu params (%s of BF16 in %zu tensors); each change moves an element by one BF16 ulp\n",
              static_cast<unsigned long long>(model->manifest.total_elements()), size_text(checkpoint_bytes).c_str(),
              model->manifest.size());
  std::printf("# %-14s %11s %9s %14s %9s %9s %9s %11s %11s\n", "topology", "change_rate", "changed", "payload_bytes",
              "full_s", "refit_s", "speedup", "full_over", "refit_over");
  std::fflush(stdout);
  const size_t rates = job.o.change_rates.size();
  for (const auto& name : job.o.topologies) {
    const tree::TopologyKind kind = tree::parse_topology_kind(name);
    std::vector<double> full_times;
    std::vector<std::vector<double>> refit_times(rates), payloads(rates), changed(rates);
    for (int it = 0; it < job.o.warmup + job.o.iters; ++it) {
      const bool timed = it >= job.o.warmup;
      const std::string what =
          name + " refit, " +
          (timed ? "iteration " + std::to_string(it - job.o.warmup + 1) : "warm-up " + std::to_string(it + 1));
      run_session(job, model->manifest, kind, what, [&](tree::Producer& p) {
        session_versions(job, *model, p, it, [&](std::optional<size_t> rate, const tree::RefitReport& r) {
          const std::string step =
              what + (rate ? ", change rate " + fixed(job.o.change_rates[*rate], 4) : std::string(", full checkpoint"));
          if (!r.failed_members.empty()) stop_for_failure(r, members, step);
          check_verified(r, members, step);
          if (!timed) return;
          if (!rate) {
            full_times.push_back(r.refit_seconds);
            return;
          }
          refit_times[*rate].push_back(r.refit_seconds);
          payloads[*rate].push_back(static_cast<double>(r.frames_bytes));
          changed[*rate].push_back(static_cast<double>(r.changes) /
                                   static_cast<double>(std::max<uint64_t>(1, r.elements)));
        });
      });
    }
    const Spread full = spread_of(full_times);
    const auto full_over = over_lower_bound(full.median, checkpoint_bytes, bottleneck.at(name));
    for (size_t k = 0; k < rates; ++k) {
      const Spread refit = spread_of(refit_times[k]);
      const auto payload = static_cast<uint64_t>(spread_of(payloads[k]).median);
      const double fraction = spread_of(changed[k]).median;
      const double speedup = refit.median > 0 ? full.median / refit.median : 0;
      const auto refit_over = over_lower_bound(refit.median, payload, bottleneck.at(name));
      nlohmann::json row = {{"topology", name},
                            {"change_rate", job.o.change_rates[k]},
                            {"changed_fraction", fraction},
                            {"payload_bytes", payload},
                            {"checkpoint_bytes", checkpoint_bytes},
                            {"full_s", full.median},
                            {"full_min_s", full.min},
                            {"full_max_s", full.max},
                            {"refit_s", refit.median},
                            {"refit_min_s", refit.min},
                            {"refit_max_s", refit.max},
                            {"speedup", speedup},
                            {"full_over_lower_bound", optional_json(full_over)},
                            {"refit_over_lower_bound", optional_json(refit_over)},
                            {"bottleneck_gbit", optional_json(bottleneck.at(name))},
                            {"iters", refit_times[k].size()},
                            {"receivers", members},
                            {"verified_receivers", members},
                            {"failed_members", nlohmann::json::array()}};
      char line[256];
      std::snprintf(line, sizeof line, "  %-14s %11.4f %8.3f%% %14llu %9.4f %9.4f %8.1fx %11s %11s", name.c_str(),
                    job.o.change_rates[k], 100 * fraction, static_cast<unsigned long long>(payload), full.median,
                    refit.median, speedup, over_text(full_over).c_str(), over_text(refit_over).c_str());
      report.add_row(std::move(row), line);
    }
  }
}

// ---- rank 0: the plan and the run ---------------------------------------------------------------

struct MemoryPlan {
  uint64_t mem_available = 0;
  LocalProcesses local;
  double factor = 0;
  uint64_t cap = 0;
  nlohmann::json to_json() const {
    return {{"mem_available_bytes", mem_available},
            {"local_processes", local.count},
            {"local_processes_source", local.source},
            {"bytes_factor", factor},
            {"fraction", kMemoryFraction},
            {"size_cap_bytes", cap}};
  }
};

MemoryPlan memory_plan(const Job& job, double factor) {
  MemoryPlan plan;
  const auto available = mem_available_bytes(read_text("/proc/meminfo"));
  if (!available) throw Error(Errc::io, "/proc/meminfo has no MemAvailable line");
  plan.mem_available = *available;
  plan.local = local_process_count(process_env(), job.env.size);
  plan.factor = factor;
  plan.cap = memory_size_cap(plan.mem_available, plan.local.count, factor);
  return plan;
}

void run_coordinator(Job& job) {
  const bool refit = job.o.mode == "refit";
  const MemoryPlan memory = memory_plan(job, refit ? kRefitBytesFactor : kBroadcastBytesFactor);
  std::vector<uint64_t> sizes;
  nlohmann::json skipped = nlohmann::json::array();
  std::vector<std::string> notes;
  std::optional<std::string> plan_error;
  const std::string cap_rule = std::to_string(memory.local.count) + " local processes (" + memory.local.source +
                               ") x " + fixed(memory.factor, 0) + " x size must stay under " +
                               fixed(100 * kMemoryFraction, 0) + "% of MemAvailable (" +
                               size_text(memory.mem_available) + ")";
  if (refit) {
    const uint64_t bytes = 2 * sim::parameter_count(sim::model_shape_for(sim::parse_param_count(job.o.params)));
    if (bytes > memory.cap)
      plan_error = "--params " + job.o.params + " (" + size_text(bytes) + " of BF16) does not fit: " + cap_rule +
                   ", so at most " + size_text(memory.cap);
  } else {
    for (uint64_t s : sweep_sizes(config::parse_size(job.o.min_size), config::parse_size(job.o.max_size))) {
      if (s <= memory.cap) {
        sizes.push_back(s);
        continue;
      }
      skipped.push_back({{"size_bytes", s}, {"reason", "above the memory cap of " + size_text(memory.cap)}});
      notes.push_back("# skipped " + size_text(s) + ": above the memory cap of " + size_text(memory.cap) + " (" +
                      cap_rule + ")");
    }
    if (sizes.empty()) plan_error = "every size is above the memory cap of " + size_text(memory.cap) + ": " + cap_rule;
  }
  std::string bottleneck_source;
  const auto bottleneck = bottlenecks(job, &bottleneck_source);
  nlohmann::json b = nlohmann::json::object();
  for (const auto& [name, v] : bottleneck) b[name] = optional_json(v);

  nlohmann::json header = {{"bench", "tree"},
                           {"mode", job.o.mode},
                           {"transport", job.c.transport},
                           {"ranks", job.env.size},
                           {"producers", job.c.producers},
                           {"receivers", job.members.size()},
                           {"launcher", std::string(tree::launcher_name(job.env.launcher))},
                           {"chunk_bytes", job.c.chunk_bytes},
                           {"iters", job.o.iters},
                           {"warmup", job.o.warmup},
                           {"topologies", job.o.topologies},
                           {"busbw_definition", "nccl-tests broadcast: busbw = algbw = size / time"},
                           {"bottleneck_gbit", b},
                           {"bottleneck_source", bottleneck_source},
                           {"memory", memory.to_json()},
                           {"skipped", skipped}};
  if (refit) header["change_rates"] = job.o.change_rates;
  Report report(job, header);
  std::printf(
      "# deltacast bench tree --mode %s over %s: %d ranks (%s + %zu receivers, launcher %s), chunk %s, "
      "%d iterations after %d warm-up, median [min, max]\n",
      job.o.mode.c_str(), job.c.transport.c_str(), job.env.size,
      job.c.producers == 1 ? "producer" : (std::to_string(job.c.producers) + " producer ranks").c_str(),
      job.members.size(), std::string(tree::launcher_name(job.env.launcher)).c_str(),
      size_text(job.c.chunk_bytes).c_str(), job.o.iters, job.o.warmup);
  std::printf("# memory cap %s per %s: %s\n", size_text(memory.cap).c_str(), refit ? "checkpoint" : "size",
              cap_rule.c_str());
  for (const auto& note : notes) std::printf("%s\n", note.c_str());
  std::printf("# bottleneck B (over_lower_bound = time / (bytes / B)): %s\n", bottleneck_source.c_str());
  for (const auto& [name, v] : bottleneck)
    if (v) std::printf("#   %s: %.3f Gbit/s\n", name.c_str(), *v);
  std::fflush(stdout);

  try {
    roll_call_coordinator(*job.transport, job.env.require_rendezvous(), job.env.size - 1, job.c.timeouts.join,
                          job.c.timeouts.connect);
    if (!plan_error) {
      if (refit)
        refit_sweep(job, report, bottleneck);
      else
        broadcast_sweep(job, report, sizes, bottleneck);
    }
    end_session(job);
    if (plan_error) throw Error(Errc::invalid_argument, *plan_error);
  } catch (const std::exception& e) {
    report.finish(std::string(e.what()));
    throw;
  }
  report.finish(std::nullopt);
}

void check_options(const TreeBenchOptions& o) {
  if (o.mode != "broadcast" && o.mode != "refit")
    throw Error(Errc::invalid_argument, "--mode must be broadcast or refit, got '" + o.mode + "'");
  if (o.iters < 1) throw Error(Errc::invalid_argument, "--iters must be at least 1");
  if (o.warmup < 0) throw Error(Errc::invalid_argument, "--warmup must be at least 0");
  if (o.topologies.empty()) throw Error(Errc::invalid_argument, "--topologies lists no topology");
  for (const auto& t : o.topologies) tree::parse_topology_kind(t);
  if (o.change_rates.empty()) throw Error(Errc::invalid_argument, "--change-rates lists no rate");
  for (double r : o.change_rates)
    if (!(r > 0 && r <= 1)) throw Error(Errc::invalid_argument, "--change-rates: each rate must be in (0, 1]");
  if (o.link_gbit < 0) throw Error(Errc::invalid_argument, "--link-gbit must not be negative");
  sweep_sizes(config::parse_size(o.min_size), config::parse_size(o.max_size));
  sim::parse_param_count(o.params);
  if (!o.fault.empty()) parse_session_fault(o.fault);
}

// Every session builds a fresh Producer or Receiver, whose buffers (a receiver's 64 MiB WELCOME
// buffer, the relays' message buffers, ...) a long-lived process allocates once. glibc serves such
// sizes with fresh mmaps, so each session would fault them in again: over a second per session on
// machines with slow page faults. Served from the heap and kept there, they reuse the pages the
// previous session touched, as a long-lived refit process's would.
void keep_freed_memory() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

void bench_tree(const TreeBenchOptions& o) {
  keep_freed_memory();
  Job job{o, config::load_config(o.config_path), {}, {}, nullptr};
  config::apply_flag_overrides(job.c, o.sets);
  config::validate(job.c);
  for (const char* subsystem : {"bench", "tree", "transport", "codec", "cli"})
    logger(subsystem)->set_level(spdlog::level::from_str(o.log_level));
  if (job.c.transport == "loop" || job.c.transport == "loopback")
    throw Error(Errc::config, "transport '" + job.c.transport + "' only works inside one process");
  check_options(o);
  // Canonical spellings (double-binary -> double_binary): the JSON and the plot key on them.
  for (auto& t : job.o.topologies) t = std::string(tree::topology_kind_name(tree::parse_topology_kind(t)));
  job.env = tree::detect_job_env(process_env(), {o.rank, o.size, o.producer}, job.c, o.config_path);
  job.members = config::member_list(job.c);
  if (job.c.producers > 1 && o.mode != "refit")
    throw Error(Errc::invalid_argument, "--mode " + o.mode +
                                            " sends raw bytes from one producer; a producer group (producers: " +
                                            std::to_string(job.c.producers) + ") runs --mode refit");
  job.transport = transport::make_transport(
      job.c.transport, job.env.is_producer() ? tree::producer_transport_options(job.c)
                                             : tree::member_transport_options(job.c, job.env.member_rank()));
  // As `run`: a process whose addresses other machines reach must authenticate its peers (the
  // roll call opens sockets before any Producer or Receiver does).
  std::vector<std::string> own{job.env.require_rendezvous()};
  if (job.env.is_part_rank()) own.push_back(session_options(job, static_cast<uint32_t>(job.env.rank)).listen_url);
  if (!job.env.is_producer()) own.push_back(job.members.at(static_cast<size_t>(job.env.member_rank())).url);
  tree::require_authenticated(*job.transport, own, job.c.allow_insecure,
                              job.env.is_producer() ? "the producer" : "rank " + std::to_string(job.env.rank));
  if (job.env.is_part_rank())
    run_part_rank(job);
  else if (job.env.is_producer())
    run_coordinator(job);
  else
    run_member(job);
}

}  // namespace

void setup_bench_tree(CLI::App& bench) {
  auto o = std::make_shared<TreeBenchOptions>();
  auto* cmd = bench.add_subcommand(
      "tree", "Relay-tree broadcast sweep or refit benchmark over a job's processes (launched like `run`)");
  cmd->add_option("--config", o->config_path, "Cluster YAML (see docs/config.md)")->required();
  cmd->add_option("--rank", o->rank, "This process's rank (default: from mpirun/srun)");
  cmd->add_option("--size", o->size, "Processes in the job (default: from mpirun/srun)");
  cmd->add_option("--producer", o->producer, "Rendezvous URL (default: DELTACAST_PRODUCER, then the config)");
  cmd->add_option("--set", o->sets, "Override a config key: key=value (repeatable)");
  cmd->add_option("--mode", o->mode, "broadcast (size sweep) | refit (full checkpoint vs delta refits)")
      ->capture_default_str();
  cmd->add_option("--min-size", o->min_size, "Broadcast: smallest payload")->capture_default_str();
  cmd->add_option("--max-size", o->max_size, "Broadcast: largest payload (sizes go x4; capped by memory)")
      ->capture_default_str();
  cmd->add_option("--topologies", o->topologies, "Topologies to measure")->capture_default_str()->delimiter(',');
  cmd->add_option("--iters", o->iters, "Timed iterations per point")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed iterations before them")->capture_default_str();
  cmd->add_option("--params", o->params, "Refit: synthetic model's parameters (BF16)")->capture_default_str();
  cmd->add_option("--change-rates", o->change_rates, "Refit: fractions of elements changed per refit")
      ->capture_default_str()
      ->delimiter(',');
  cmd->add_option("--seed", o->seed, "Payload / model / change seed")->capture_default_str();
  cmd->add_option("--probe", o->probe_path,
                  "A `deltacast probe` JSON: B = the slowest edge of each topology's trees (over_lower_bound)");
  cmd->add_option("--link-gbit", o->link_gbit, "B in Gbit/s for over_lower_bound (wins over --probe)");
  cmd->add_option("--json", o->json_path, "Rank 0: write the results as JSON here");
  cmd->add_option("--svg", o->svg_path, "Rank 0: write the plot here");
  cmd->add_option("--log-level", o->log_level, "spdlog level of every subsystem")->capture_default_str();
  cmd->add_option("--fault", o->fault,
                  "TESTING AID: kill@SESSION[:N]: a receiver SIGKILLs itself at its N-th data message of session "
                  "SESSION (sessions count from 1 in rank 0's order, warm-ups included)")
      ->group("Testing aids");
  cmd->callback([o] { bench_tree(*o); });
}

}  // namespace deltacast::tools
