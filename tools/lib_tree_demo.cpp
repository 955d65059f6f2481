// The distributed `deltacast demo`: a producer and N receivers as separate local processes (this
// binary re-executed as `deltacast run --rank R --size N+1`) on loopback, refitting a simulated
// trainer's steps through the relay tree. The demo writes the cluster config into a temporary
// directory, lets the producer's progress lines through to stdout, collects each process's JSON
// summary, checks every receiver's SHA-256 against the producer's weights, and prints the table.
#include "tools/lib_tree_demo.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

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
// concurrent demos and tests rarely meet.
int pick_base_port(unsigned count) {
  std::random_device seed;
  std::mt19937 rng(seed());
  for (int attempt = 0; attempt < 200; ++attempt) {
    int base = 20000 + static_cast<int>(rng() % 30000);
    bool all = true;
    for (unsigned i = 0; i < count && all; ++i) all = port_free(base + static_cast<int>(i));
    if (all) return base;
  }
  throw Error(Errc::io, "found no run of free loopback ports for the demo");
}

fs::path make_work_dir() {
  std::string pattern = (fs::temp_directory_path() / "deltacast-demo-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw Error(Errc::io, "cannot create a temporary directory");
  return pattern;
}

std::string random_secret() {
  std::random_device seed;
  std::string hex;
  for (int i = 0; i < 8; ++i) {
    char part[9];
    std::snprintf(part, sizeof part, "%08x", seed());
    hex += part;
  }
  return hex;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw Error(Errc::io, "cannot write " + path.string());
  out << text;
}

std::string write_config(const DemoOptions& o, const fs::path& dir, int base_port) {
  fs::path secret = dir / "secret";
  write_file(secret, random_secret() + "\n");
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
  std::ostringstream yaml;
  yaml << "producer: tcp://127.0.0.1:" << base_port << "\n"
       << "transport: " << o.transport << "\n"
       << "topology: " << o.topology << "\n"
       << "chunk_bytes: 4MiB\n"
       << "members:\n  count: " << o.receivers << "\n  host: 127.0.0.1\n  base_port: "
       << base_port + 1 << "\n  cluster: local\n"
       << "timeouts:\n  connect: 30s\n  heartbeat: 1s\n  peer: 60s\n  refit: 30m\n"
       << "secret_file: " << secret.string() << "\n"
       << "trainer:\n  kind: synth\n  params: " << o.params << "\n  steps: " << o.steps
       << "\n  lr: " << o.lr << "\n  seed: " << o.seed << "\n"
       << "output:\n  dir: " << dir.string() << "\n  metrics_file: " << (dir / "report.json").string()
       << "\n  log_file: \"\"\n"
       << "log_level: warn\n";
  fs::path path = dir / "cluster.yaml";
  write_file(path, yaml.str());
  return path.string();
}


nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::not_found, "missing " + path.string());
  return nlohmann::json::parse(in);
}

}  // namespace

void run_tree_demo(const DemoOptions& o) {
  if (o.receivers == 0) throw Error(Errc::invalid_argument, "the demo needs at least one receiver");
  const std::string self = self_executable();
  const fs::path dir = make_work_dir();
  const int base_port = pick_base_port(o.receivers + 1);
  const std::string config = write_config(o, dir, base_port);
  const std::string size = std::to_string(o.receivers + 1);
  std::printf("demo: 1 producer + %u receivers as local processes, %s tree over %s on 127.0.0.1, "
              "%s params, %u steps (logs in %s)\n",
              o.receivers, o.topology.c_str(), o.transport.c_str(), o.params.c_str(), o.steps,
              dir.c_str());
  std::fflush(stdout);

  std::vector<pid_t> pids;
  for (unsigned r = 1; r <= o.receivers; ++r) {
    std::string rank = std::to_string(r);
    pids.push_back(spawn_process({self, "run", "--config", config, "--rank", rank, "--size", size,
                          "--summary", (dir / ("rank-" + rank + ".json")).string()},
                         dir / ("rank-" + rank + ".out"), dir / ("rank-" + rank + ".log")));
  }
  pids.insert(pids.begin(), spawn_process({self, "run", "--config", config, "--rank", "0", "--size", size},
                                  {}, dir / "rank-0.log"));
  std::vector<int> failed;
  for (size_t r = 0; r < pids.size(); ++r)
    if (wait_process(pids[r]) != 0) failed.push_back(static_cast<int>(r));
  if (!failed.empty()) {
    std::string what;
    for (int r : failed)
      what += "  rank " + std::to_string(r) + " failed; last lines of its log:\n" +
              tail_of_file(dir / ("rank-" + std::to_string(r) + ".log"), 5);
    std::fprintf(stderr, "%s", what.c_str());
    throw Error(Errc::verify_failed, std::to_string(failed.size()) + " of " +
                                         std::to_string(pids.size()) + " processes failed (logs in " +
                                         dir.string() + ")");
  }

  // Independent end-to-end check: every receiver's SHA-256 equals the producer's final weights.
  nlohmann::json report = read_json(dir / "report.json");
  const std::string want = report.at("sha256");
  unsigned bit_exact = 0;
  for (unsigned r = 1; r <= o.receivers; ++r) {
    auto summary = read_json(dir / ("rank-" + std::to_string(r) + ".json"));
    if (summary.at("sha256") == want && summary.at("version") == report.at("version")) ++bit_exact;
    else std::fprintf(stderr, "demo: receiver %u differs from the producer\n", r);
  }
  std::printf("\n%-5s %-8s %9s %12s %10s %10s %8s %9s\n", "step", "version", "changed", "payload",
              "refit s", "full s", "speedup", "verified");
  for (const auto& s : report.at("steps")) {
    std::printf("%-5d %-8llu %8.3f%% %10.2f MB %10.3f %10.3f %7.1fx %5u/%u\n", s.at("step").get<int>(),
                s.at("version").get<unsigned long long>(), 100 * s.at("changed_fraction").get<double>(),
                s.at("payload_bytes").get<double>() / 1e6, s.at("refit_seconds").get<double>(),
                s.at("full_seconds").get<double>(), s.at("speedup").get<double>(),
                s.at("verified_receivers").get<unsigned>(), s.at("receivers").get<unsigned>());
  }
  std::printf("full checkpoint %.1f MB, sent as %.1f MB of frames in %.3f s; %u/%u receivers "
              "bit-exact (SHA-256 %s...)\n",
              report.at("checkpoint_bytes").get<double>() / 1e6,
              report.at("full").at("payload_bytes").get<double>() / 1e6,
              report.at("full").at("seconds").get<double>(), bit_exact, o.receivers,
              want.substr(0, 16).c_str());
  double payload = 0;
  for (const auto& s : report.at("steps")) payload += s.at("payload_bytes").get<double>();
  if (!report.at("steps").empty()) {
    const double share = payload / report.at("steps").size() / report.at("checkpoint_bytes").get<double>();
    std::printf("deltas carried %.2f%% of the checkpoint's bytes (%.0fx fewer than a full send); on "
                "loopback the wire is free, so refit time here is the CPU of %u receivers and the "
                "producer on %u cores\n",
                100 * share, 1 / share, o.receivers, std::max(1u, std::thread::hardware_concurrency()));
  }
  if (!o.json_path.empty()) {
    report["bit_exact_receivers"] = bit_exact;
    std::ofstream out(o.json_path);
    if (!out) throw Error(Errc::io, "cannot write " + o.json_path);
    out << report.dump(2) << "\n";
  }
  if (bit_exact != o.receivers)
    throw Error(Errc::verify_failed, std::to_string(o.receivers - bit_exact) +
                                         " receivers are not bit-exact with the producer");
}

}  // namespace deltacast::tools
