// The distributed `deltacast demo`: a producer and N receivers as separate local processes (this
// binary re-executed as `deltacast run --rank R --size N+1`) on loopback, refitting a simulated
// trainer's steps through the relay tree over the chosen transport. The demo writes the cluster
// config into a temporary directory, lets the producer's progress lines through to stdout,
// collects each process's JSON summary, checks every receiver's SHA-256 against the producer's
// weights, and prints the table. With --kill/--freeze some receivers fail on purpose (`deltacast
// run --fault`): the demo expects their end, names the failures and repairs the producer reported
// per step, and checks the survivors only.
#include "tools/demo/tree_demo.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "tools/demo/store_demo.h"
#include "transport/transport.h"
#include "util/error.h"
#include "util/process.h"

namespace deltacast::tools {
namespace {

namespace fs = std::filesystem;

// True when 127.0.0.1:port can be bound right now.
bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// A run of `count` consecutive free loopback ports (producer + receivers), chosen at random so
// concurrent demos and tests rarely meet, and outside the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range): there any outgoing connection may take a port between
// the check and a receiver's bind, or while a killed process is down before it binds again.
int pick_base_port(unsigned count) {
  int low = 32768, high = 60999;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) {
    int l = 0, h = 0;
    if (range >> l >> h && l > 0 && h >= l) low = l, high = h;
  }
  const int n = static_cast<int>(count);
  std::vector<std::pair<int, int>> spans;  // [first, last] base ports
  if (low - n > 20000) spans.emplace_back(20000, low - n);
  if (65535 - n > high) spans.emplace_back(high + 1, 65535 - n);
  if (spans.empty()) throw Error(Errc::io, "the ephemeral port range leaves no room for the demo's ports");
  std::random_device seed;
  std::mt19937 rng(seed());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto& [first, last] = spans[rng() % spans.size()];
    int base = first + static_cast<int>(rng() % static_cast<unsigned>(last - first + 1));
    // Never 29400-29699: the fixed ports of the examples and the launcher tests (29500..29508).
    if (base + n > 29400 && base <= 29699) continue;
    bool all = true;
    for (int i = 0; i < n && all; ++i) all = port_free(base + i);
    if (all) return base;
  }
  throw Error(Errc::io, "found no run of free loopback ports for the demo");
}

fs::path make_work_dir() {
  std::string pattern = (fs::temp_directory_path() / "deltacast-demo-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw Error(Errc::io, "cannot create a temporary directory");
  return pattern;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw Error(Errc::io, "cannot write " + path.string());
  out << text;
}

// A receiver that fails on purpose (--kill / --freeze).
struct Victim {
  unsigned rank = 0;
  unsigned step = 0;   // 0: the full checkpoint
  uint64_t after = 1;  // data messages of the version handled before the fault
  std::string action;  // "kill" | "stop" (the `deltacast run --fault` action)
  std::string flag;    // "--kill" | "--freeze", for messages
  std::string verb;    // "killed" | "frozen"
  uint64_t version() const { return step + 1ull; }
  std::string fault() const { return action + "@" + std::to_string(version()) + ":" + std::to_string(after); }
};

unsigned parse_number(const std::string& text, const std::string& flag, const std::string& spec, const char* what) {
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw Error(Errc::invalid_argument,
                flag + " " + spec + ": " + what + " must be a whole number, got '" + text + "'");
  return value;
}

// "3@2" or "3@2:5" for --kill / --freeze. Throws Error(invalid_argument).
Victim parse_victim(const std::string& spec, const std::string& flag, const DemoOptions& o) {
  Victim v;
  v.flag = flag;
  v.action = flag == "--kill" ? "kill" : "stop";
  v.verb = flag == "--kill" ? "killed" : "frozen";
  const size_t at = spec.find('@');
  if (at == std::string::npos)
    throw Error(Errc::invalid_argument, flag + " " + spec + ": expected RANK@STEP[:N], e.g. 3@2");
  v.rank = parse_number(spec.substr(0, at), flag, spec, "RANK");
  const std::string rest = spec.substr(at + 1);
  const size_t colon = rest.find(':');
  v.step = parse_number(rest.substr(0, colon), flag, spec, "STEP");
  if (colon != std::string::npos) v.after = parse_number(rest.substr(colon + 1), flag, spec, "N");
  if (v.rank < 1 || v.rank > o.receivers)
    throw Error(Errc::invalid_argument, flag + " " + spec + ": RANK must be a receiver, 1.." +
                                            std::to_string(o.receivers) + " (rank 0 is the producer)");
  if (v.step > o.steps)
    throw Error(Errc::invalid_argument, flag + " " + spec + ": STEP must be 0 (the full checkpoint) .. " +
                                            std::to_string(o.steps) + " (--steps)");
  if (v.after < 1) throw Error(Errc::invalid_argument, flag + " " + spec + ": N must be at least 1");
  return v;
}

// Victims by rank; a rank named twice is an error (it can only fail once).
std::map<unsigned, Victim> parse_victims(const DemoOptions& o) {
  std::map<unsigned, Victim> victims;
  auto add = [&](const std::vector<std::string>& specs, const std::string& flag) {
    for (const auto& spec : specs) {
      Victim v = parse_victim(spec, flag, o);
      if (!victims.emplace(v.rank, v).second)
        throw Error(Errc::invalid_argument,
                    "rank " + std::to_string(v.rank) + " is named by more than one --kill/--freeze");
    }
  };
  add(o.kill, "--kill");
  add(o.freeze, "--freeze");
  if (victims.size() >= o.receivers)
    throw Error(Errc::invalid_argument, "--kill/--freeze must leave at least one receiver alive");
  return victims;
}

bool any_frozen(const std::map<unsigned, Victim>& victims) {
  return std::any_of(victims.begin(), victims.end(), [](const auto& v) { return v.second.action == "stop"; });
}

// `store_yaml`: the store demo's members and store sections (store_demo_yaml), replacing the
// local members shorthand; its trees run over tcp.
std::string write_config(const DemoOptions& o, const fs::path& dir, int base_port, bool freezing,
                         const std::string& store_yaml = {}) {
  fs::path secret = dir / "secret";
  write_file(secret, transport::random_secret() + "\n");
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
  // A frozen member is found by silence: a short peer timeout keeps the demo short. Otherwise a
  // generous one (a failed process closes its links, which is noticed at once).
  const char* liveness = freezing ? "  heartbeat: 1s\n  peer: 10s\n" : "  heartbeat: 1s\n  peer: 60s\n";
  std::ostringstream yaml;
  // The producer's URL and the members' (from `transport` + host/port) name the same transport:
  // every backend here (tcp, ofi+tcp, ofi+shm, ucx) listens on a host:port (ofi and ucx through
  // their TCP side channel).
  // Producer rank g listens on base_port + g; the members from base_port + producers.
  const std::string scheme = store_yaml.empty() ? o.transport : "tcp";
  yaml << "producer: " << scheme << "://127.0.0.1:" << base_port << "\n"
       << "producers: " << o.producers << "\n"
       << "transport: " << scheme << "\n"
       << "topology: " << o.topology << "\n"
       << "chunk_bytes: 4MiB\n";
  if (store_yaml.empty())
    yaml << "members:\n  count: " << o.receivers
         << "\n  host: 127.0.0.1\n  base_port: " << base_port + static_cast<int>(o.producers) << "\n  cluster: local\n";
  else
    yaml << store_yaml;
  yaml
      // join: receivers start first and wait for the producer to build its model (large with
      // the default 500M parameters on a small machine).
      << "timeouts:\n  connect: 30s\n"
      << liveness << "  refit: 30m\n  join: 10m\n  producer_loss: 30s\n"
      << "secret_file: " << secret.string() << "\n"
      << "egress:\n  producer: " << o.uplink << "\n"
      << "trainer:\n  kind: synth\n  params: " << o.params << "\n  steps: " << o.steps << "\n  lr: " << o.lr
      << "\n  seed: " << o.seed << "\n"
      << "output:\n  dir: " << dir.string() << "\n  metrics_file: " << (dir / "report.json").string()
      << "\n  log_file: \"\"\n"
      << "log_level: warn\n";
  fs::path path = dir / "cluster.yaml";
  write_file(path, yaml.str());
  return path.string();
}

// The processes run on 127.0.0.1: keep libfabric and UCX on the loopback interface (this machine
// may also have an eth0 they would pick), as tests/transport/pin_loopback.cpp does for the tests.
// Values already set in the environment win. The children inherit the environment.
void pin_loopback_for_children() {
  ::setenv("UCX_TLS", "tcp,self", 0);
  ::setenv("UCX_NET_DEVICES", "lo", 0);
  ::setenv("FI_TCP_IFACE", "lo", 0);
  ::setenv("FI_SOCKETS_IFACE", "lo", 0);
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::not_found, "missing " + path.string());
  return nlohmann::json::parse(in);
}

// The demo's child processes, rank r at index r. Whatever is not reaped when it goes out of scope
// (an error path, a frozen victim) is SIGKILLed and reaped: the demo leaves nothing behind.
class Fleet {
 public:
  explicit Fleet(size_t size) : pids_(size, -1), exit_codes_(size) {}
  ~Fleet() { kill_all(); }
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  void started(size_t rank, pid_t pid) { pids_[rank] = pid; }
  // Waits until `deadline` for rank's exit; its exit code, or nullopt when it still runs.
  std::optional<int> wait(size_t rank, std::chrono::steady_clock::time_point deadline) {
    if (exit_codes_[rank] || pids_[rank] < 0) return exit_codes_[rank];
    const auto left =
        std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration::zero());
    exit_codes_[rank] = wait_process_for(pids_[rank], std::chrono::duration_cast<std::chrono::milliseconds>(left));
    return exit_codes_[rank];
  }
  // SIGKILLs rank if it still runs and reaps it.
  void kill(size_t rank) {
    if (pids_[rank] < 0 || exit_codes_[rank]) return;
    kill_processes({pids_[rank]});
    exit_codes_[rank] = 128 + 9;
  }
  void kill_all() noexcept {
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (pids_[r] >= 0 && !exit_codes_[r]) {
        kill_processes({pids_[r]});
        exit_codes_[r] = 128 + 9;
      }
    }
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<std::optional<int>> exit_codes_;
};

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", s);
  return text;
}

// "rank 3 killed (link_closed), detected in 0.00 s" for each failed member of one version.
std::string failures_text(const nlohmann::json& entry, const std::map<unsigned, Victim>& victims) {
  std::string text;
  for (const auto& m : entry.at("failed_members")) {
    const unsigned rank = m.at("rank").get<unsigned>();
    auto v = victims.find(rank);
    if (!text.empty()) text += ", ";
    text += "rank " + std::to_string(rank) + " " + (v != victims.end() ? v->second.verb : std::string("failed")) +
            " (" + m.at("cause").get<std::string>() + "), detected in " +
            seconds_text(m.at("detection_seconds").get<double>());
  }
  return text;
}

// One line per version that lost members: who, how it was found, and the repair.
void print_failures(const nlohmann::json& report, const std::map<unsigned, Victim>& victims) {
  auto line = [&](const std::string& name, const nlohmann::json& entry, const std::string& verified) {
    if (!entry.contains("failed_members") || entry.at("failed_members").empty()) return;
    std::printf("%s: %s; repaired in %s (epoch %llu), %u chunks re-sent; %s, verified by %s\n", name.c_str(),
                failures_text(entry, victims).c_str(), seconds_text(entry.value("repair_seconds", 0.0)).c_str(),
                static_cast<unsigned long long>(entry.value("epoch", uint64_t{0})), entry.value("resent_chunks", 0u),
                entry.value("committed", false) ? "committed" : "NOT committed", verified.c_str());
  };
  const auto& full = report.at("full");
  auto verified = [](const nlohmann::json& entry) {
    return std::to_string(entry.value("verified_receivers", 0u)) + "/" + std::to_string(entry.value("receivers", 0u));
  };
  line("full checkpoint (version 1)", full, verified(full));
  for (const auto& s : report.at("steps")) {
    line("step " + std::to_string(s.at("step").get<int>()) + " (version " +
             std::to_string(s.at("version").get<unsigned long long>()) + ")",
         s, verified(s));
  }
  // A victim nobody reported: its fault never fired (e.g. its version sent it nothing) or it went
  // unnoticed.
  for (const auto& [victim_rank, v] : victims) {
    const unsigned rank = victim_rank;  // a copy: lambdas may not capture structured bindings (clang 14)
    bool reported = false;
    auto names = [&](const nlohmann::json& entry) {
      for (const auto& m : entry.value("failed_members", nlohmann::json::array()))
        if (m.at("rank").get<unsigned>() == rank) reported = true;
    };
    names(full);
    for (const auto& s : report.at("steps")) names(s);
    if (!reported)
      std::printf("note: rank %u was to be %s at step %u (%s %u@%u), but the producer reported no failure of it\n",
                  rank, v.verb.c_str(), v.step, v.flag.c_str(), rank, v.step);
  }
}

// "100 Mbit/s" for a rate in bytes per second.
std::string rate_text(uint64_t bytes_per_second) {
  const double bits = 8.0 * static_cast<double>(bytes_per_second);
  char text[32];
  if (bits >= 1e9)
    std::snprintf(text, sizeof text, "%g Gbit/s", bits / 1e9);
  else if (bits >= 1e6)
    std::snprintf(text, sizeof text, "%g Mbit/s", bits / 1e6);
  else
    std::snprintf(text, sizeof text, "%g kbit/s", bits / 1e3);
  return text;
}

// The wire floor of `bytes` through `links` producer uplinks at once (each chunk is sent once, by
// the rank whose part holds it): bytes / (links x uplink); "-" when the uplink is not capped.
std::string floor_text(double bytes, uint64_t uplink, unsigned links) {
  if (uplink == 0) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", bytes / (static_cast<double>(links) * static_cast<double>(uplink)));
  return text;
}

// --transport: a relay-tree backend this binary has, or s3. Throws Error(invalid_argument) naming
// the choices for an unknown name, Error(unsupported) for a known backend that was not built.
void check_demo_transport(const std::string& name) {
  if (name == "s3") return;
  const std::string choices = " (choose tcp, ofi+tcp, ofi+shm, ucx or s3)";
  try {
    const transport::Url url = transport::Url::parse(name + "://127.0.0.1:1");
    if (url.scheme == "loop") throw Error(Errc::invalid_argument, "loop works inside one process only");
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, "--transport " + name + ": not a transport: " + e.what() + choices);
  }
  if (!transport::backend_built(name))
    throw Error(Errc::unsupported, "--transport " + name + ": this deltacast was built without it" + choices);
}

}  // namespace

void run_tree_demo(const DemoOptions& o) {
  if (o.receivers == 0) throw Error(Errc::invalid_argument, "the demo needs at least one receiver");
  check_demo_transport(o.transport);
  const bool store = o.transport == "s3";
  if (store && o.producers > 1)
    throw Error(Errc::invalid_argument, "--transport s3 --producers " + std::to_string(o.producers) +
                                            ": a producer group cannot publish to a store yet");
  const uint64_t uplink = config::parse_rate(o.uplink);
  const auto victims = parse_victims(o);
  const auto timeout = config::parse_duration(o.timeout);
  const std::string self = self_executable();
  const fs::path dir = make_work_dir();
  const unsigned m = std::max(1u, o.producers);
  const int base_port = pick_base_port(static_cast<int>(o.receivers + m));
  // --transport s3: a store started here (stopped when the demo ends), two store clusters behind it.
  std::optional<DemoStore> store_server;
  if (store) store_server.emplace(dir / "s3");
  const std::string config =
      write_config(o, dir, base_port, any_frozen(victims),
                   store ? store_demo_yaml(*store_server, o.receivers, base_port, "demo-" + std::to_string(::getpid()))
                         : std::string());
  const std::string size = std::to_string(o.receivers + m);
  pin_loopback_for_children();
  std::printf(
      "demo: %s + %u receivers as local processes, %s tree over %s on 127.0.0.1, "
      "%s params, %u steps (logs in %s)\n",
      m == 1 ? "1 producer" : (std::to_string(m) + " producer ranks").c_str(), o.receivers, o.topology.c_str(),
      o.transport.c_str(), o.params.c_str(), o.steps, dir.c_str());
  if (store)
    std::printf(
        "demo: the rollout side cannot reach the producer: every version goes through the S3 store at %s "
        "(%s), into 2 clusters (east, west) whose gateway (their lowest rank) downloads it once and roots "
        "the cluster's relay tree%s\n",
        store_server->endpoint().c_str(),
        store_server->started_here() ? "Ceph RGW started for the demo" : "$DELTACAST_S3_ENV",
        uplink > 0 ? "; --uplink does not pace the store's traffic, so no floor is printed" : "");
  else if (uplink > 0)
    std::printf(
        "demo: %s uplink is capped at %s (egress.producer), as a link between the trainer's "
        "cluster and the rollout cluster; the receivers relay among themselves at loopback speed\n",
        m == 1 ? "the producer's" : "each producer rank's", rate_text(uplink).c_str());
  for (const auto& [rank, v] : victims)
    std::printf("demo: rank %u will be %s at step %u (version %llu, data message %llu)\n", rank, v.verb.c_str(), v.step,
                static_cast<unsigned long long>(v.version()), static_cast<unsigned long long>(v.after));
  std::fflush(stdout);

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Job ranks: producers 0..m-1, then receiver r (1..receivers) at m + r - 1. Files and the fleet
  // are indexed by the job rank.
  Fleet fleet(o.receivers + m);
  for (unsigned r = 1; r <= o.receivers; ++r) {
    std::string rank = std::to_string(m + r - 1);
    std::vector<std::string> argv = {
        self, "run",    "--config", config,      "--rank",
        rank, "--size", size,       "--summary", (dir / ("receiver-" + std::to_string(r) + ".json")).string()};
    if (auto v = victims.find(r); v != victims.end()) {
      argv.push_back("--fault");
      argv.push_back(v->second.fault());
    }
    fleet.started(m + r - 1, spawn_process(argv, dir / ("rank-" + rank + ".out"), dir / ("rank-" + rank + ".log")));
  }
  for (unsigned g = m; g-- > 0;) {
    const std::string rank = std::to_string(g);
    // Rank 0's lines are the demo's; a part rank's go to its own file.
    const fs::path out = g == 0 ? fs::path{} : dir / ("rank-" + rank + ".out");
    fleet.started(g, spawn_process({self, "run", "--config", config, "--rank", rank, "--size", size}, out,
                                   dir / ("rank-" + rank + ".log")));
  }

  // The producer first: its end decides how long the receivers may take to follow (BYE, or their
  // producer_loss wait when it failed).
  struct Failure {
    unsigned rank;
    std::string what;
  };
  std::vector<Failure> failed;
  const auto producer_exit = fleet.wait(0, deadline);
  if (!producer_exit) {
    fleet.kill_all();
    throw Error(Errc::timeout, "the demo did not finish within " + o.timeout + "; every process was killed (logs in " +
                                   dir.string() + ")");
  }
  if (*producer_exit != 0) failed.push_back({0, "rank 0 (the producer) exited with " + std::to_string(*producer_exit)});
  const auto receivers_deadline =
      *producer_exit == 0 ? deadline : std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  for (unsigned j = 1; j < o.receivers + m; ++j) {
    const bool producer = j < m;
    const unsigned r = j + 1 - m;                 // a receiver's rank
    if (!producer && victims.count(r)) continue;  // expected to fail; reaped (or killed, if frozen) below
    const std::string name = producer ? "producer rank " + std::to_string(j)
                                      : "rank " + std::to_string(j) + " (receiver " + std::to_string(r) + ")";
    const auto code = fleet.wait(j, receivers_deadline);
    if (!code) {
      fleet.kill(j);
      failed.push_back({j, name + " was still running after the producer ended; killed"});
    } else if (*code != 0) {
      failed.push_back({j, name + " exited with " + std::to_string(*code)});
    }
  }
  for (const auto& [rank, v] : victims) fleet.kill(m + rank - 1);  // a frozen victim waits for this
  if (!failed.empty()) {
    std::string what;
    for (const auto& f : failed)
      what += "  " + f.what + "; last lines of its log:\n" +
              tail_of_file(dir / ("rank-" + std::to_string(f.rank) + ".log"), 5);
    std::fprintf(stderr, "%s", what.c_str());
    throw Error(Errc::verify_failed, std::to_string(failed.size()) + " of " +
                                         std::to_string(o.receivers + m - victims.size()) +
                                         " processes expected to finish failed (logs in " + dir.string() + ")");
  }

  // Independent end-to-end check: every surviving receiver's SHA-256 equals the producer's final
  // weights. A producer group's ranks each hold their part only (no process holds every bit): then
  // every receiver's digest, taken again from its bits, must be the sum of the ranks' part digests
  // (each taken from that rank's own memory), and every receiver's SHA-256 the same.
  nlohmann::json report = read_json(dir / "report.json");
  const bool whole = report.contains("sha256");
  std::string want = whole ? report.at("sha256").get<std::string>() : "";
  const unsigned survivors = o.receivers - static_cast<unsigned>(victims.size());
  unsigned bit_exact = 0;
  std::vector<nlohmann::json> summaries;  // the survivors'
  for (unsigned r = 1; r <= o.receivers; ++r) {
    if (victims.count(r)) continue;
    auto summary = read_json(dir / ("receiver-" + std::to_string(r) + ".json"));
    summaries.push_back(summary);
    if (want.empty()) want = summary.at("sha256");
    const bool same = whole ? summary.at("sha256") == want
                            : summary.at("sha256") == want && summary.at("digest") == report.at("digest");
    if (same && summary.at("version") == report.at("version"))
      ++bit_exact;
    else
      std::fprintf(stderr, "demo: receiver %u differs from the producer%s\n", r, whole ? "" : " ranks or the others");
  }
  // A store run: times from the receivers' clocks (when the last one had each version).
  const uint64_t floor_rate = store ? 0 : uplink;
  if (store) {
    complete_store_report(report, summaries);
    report["transport"] = o.transport;
  }
  // Each time beside its wire floor: the payload over the producer ranks' capped uplinks (m at once).
  const double full_floor_bytes = report.at("full").at("payload_bytes").get<double>();
  std::printf("\n%-5s %-8s %9s %12s %9s %9s %9s %9s %8s %9s\n", "step", "version", "changed", "payload", "refit s",
              "floor s", "full s", "floor s", "speedup", "verified");
  for (const auto& s : report.at("steps")) {
    std::printf("%-5d %-8llu %8.3f%% %9.2f MB %9.3f %9s %9.3f %9s %7.1fx %5u/%u\n", s.at("step").get<int>(),
                s.at("version").get<unsigned long long>(), 100 * s.at("changed_fraction").get<double>(),
                s.at("payload_bytes").get<double>() / 1e6, s.at("refit_seconds").get<double>(),
                floor_text(s.at("payload_bytes").get<double>(), floor_rate, m).c_str(),
                s.at("full_seconds").get<double>(), floor_text(full_floor_bytes, floor_rate, m).c_str(),
                s.at("speedup").get<double>(), s.at("verified_receivers").get<unsigned>(),
                s.at("receivers").get<unsigned>());
  }
  print_failures(report, victims);
  std::string not_counted;
  for (const auto& [rank, v] : victims)
    not_counted += (not_counted.empty() ? "" : ", ") + std::string("rank ") + std::to_string(rank) + " " + v.verb;
  if (!not_counted.empty()) not_counted = " (survivors; not counted: " + not_counted + ")";
  std::printf(
      "full checkpoint %.1f MB, sent as %.1f MB of frames in %.3f s; %u/%u receivers "
      "bit-exact%s (SHA-256 %s...%s)\n",
      report.at("checkpoint_bytes").get<double>() / 1e6, report.at("full").at("payload_bytes").get<double>() / 1e6,
      report.at("full").at("seconds").get<double>(), bit_exact, survivors, not_counted.c_str(),
      want.substr(0, 16).c_str(),
      whole ? "" : (", digest " + report.at("digest").get<std::string>() + " = the sum of the ranks' parts").c_str());
  double payload = 0;
  for (const auto& s : report.at("steps")) payload += s.at("payload_bytes").get<double>();
  if (!report.at("steps").empty()) {
    const double share = payload / report.at("steps").size() / report.at("checkpoint_bytes").get<double>();
    std::printf("deltas carried %.2f%% of the checkpoint's bytes (%.0fx fewer than a full send)", 100 * share,
                1 / share);
    if (store)
      std::printf("; refit s = from the producer's start of a version to the last receiver holding it\n");
    else if (uplink > 0)
      std::printf("; floor s = payload / %s%s uplink, the least time any transport needs\n",
                  m == 1 ? "the " : (std::to_string(m) + " x the ").c_str(), rate_text(uplink).c_str());
    else
      std::printf(
          "; uplink not capped: on loopback the wire is free, so refit time here is the CPU of %u "
          "receivers and the producer on %u cores\n",
          o.receivers, std::max(1u, std::thread::hardware_concurrency()));
  }
  if (store) {
    // What left the store: the gateways' downloads, against what was published (version 1 whole
    // and every delta) times the clusters.
    double downloaded = 0, gateways = 0;
    for (const auto& s : summaries)
      if (s.value("gateway", false)) downloaded += s.at("store").at("bytes_received").get<double>(), ++gateways;
    const double published = report.at("checkpoint_bytes").get<double>() + payload;
    std::printf(
        "store: %.0f gateways downloaded %.2f MB for %.2f MB published: %.3fx the published bytes x "
        "clusters; the other %zu receivers took it from their gateway's tree\n",
        gateways, downloaded / 1e6, published / 1e6, downloaded / std::max(1.0, published * gateways),
        summaries.size() - static_cast<size_t>(gateways));
    report["store_downloaded_bytes"] = downloaded;
    report["store_published_bytes"] = published;
  }
  if (!o.json_path.empty()) {
    report["uplink_bytes_per_second"] = uplink;
    report["producer_ranks"] = m;
    report["bit_exact_receivers"] = bit_exact;
    report["surviving_receivers"] = survivors;
    report["receivers_sha256"] = want;  // the bits every bit-exact receiver holds
    nlohmann::json injected = nlohmann::json::array();
    for (const auto& [rank, v] : victims)
      injected.push_back({{"rank", rank}, {"action", v.verb}, {"step", v.step}, {"version", v.version()}});
    report["injected_failures"] = injected;
    std::ofstream out(o.json_path);
    if (!out) throw Error(Errc::io, "cannot write " + o.json_path);
    out << report.dump(2) << "\n";
  }
  if (bit_exact != survivors)
    throw Error(Errc::verify_failed,
                std::to_string(survivors - bit_exact) + " receivers are not bit-exact with the producer");
}

}  // namespace deltacast::tools
