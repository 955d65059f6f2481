#include "tools/demo/store_demo.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "util/error.h"
#include "util/process.h"

namespace deltacast::tools {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::string> read_env_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::io, "cannot read " + path.string());
  std::map<std::string, std::string> out;
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos || line.empty() || line[0] == '#') continue;
    std::string value = line.substr(eq + 1);
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'')) value = value.substr(1, value.size() - 2);
    out[line.substr(0, eq)] = value;
  }
  for (const char* key : {"S3_ENDPOINT", "S3_BUCKET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"})
    if (!out.count(key)) throw Error(Errc::io, path.string() + " names no " + key);
  return out;
}

// scripts/s3-server.sh: $DELTACAST_S3_SERVER, else the source tree this binary was built in
// (<root>/build*/tools/deltacast -> <root>/scripts/s3-server.sh).
std::string find_server_script() {
  if (const char* set = std::getenv("DELTACAST_S3_SERVER"); set && *set) return set;
  const fs::path exe = self_executable();
  for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path())
    if (fs::exists(dir / "scripts" / "s3-server.sh")) return (dir / "scripts" / "s3-server.sh").string();
  throw Error(Errc::not_found,
              "--transport s3 starts an S3 server with scripts/s3-server.sh, which is not beside " + exe.string() +
                  ": set DELTACAST_S3_SERVER to it, or DELTACAST_S3_ENV to a running server's env file");
}

int run_script(const std::string& script, const std::string& action, const fs::path& dir, const fs::path& log) {
  return wait_process(spawn_process({"bash", script, action, dir.string()}, log));
}

}  // namespace

DemoStore::DemoStore(const fs::path& dir) {
  if (const char* outside = std::getenv("DELTACAST_S3_ENV"); outside && *outside) {
    env_ = read_env_file(outside);
  } else {
    script_ = find_server_script();
    dir_ = dir;
    const fs::path log = dir.parent_path() / "s3-server.log";
    if (run_script(script_, "start", dir_, log) != 0) {
      run_script(script_, "stop", dir_, log);
      throw Error(Errc::io, "the demo's S3 server did not start (" + log.string() + "):\n" + tail_of_file(log, 8) +
                                "  (scripts/install-deps.sh --test installs radosgw)");
    }
    env_ = read_env_file(dir_ / "s3.env");
  }
  ::setenv("AWS_ACCESS_KEY_ID", env_.at("AWS_ACCESS_KEY_ID").c_str(), 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", env_.at("AWS_SECRET_ACCESS_KEY").c_str(), 1);
  ::unsetenv("AWS_SESSION_TOKEN");
}

DemoStore::~DemoStore() {
  if (script_.empty()) return;
  try {
    run_script(script_, "stop", dir_, dir_.parent_path() / "s3-server.log");
  } catch (...) {
  }
}

std::string store_demo_cluster(unsigned r, unsigned n) { return r <= (n + 1) / 2 ? "east" : "west"; }

std::string store_demo_yaml(const DemoStore& store, unsigned receivers, int base_port, const std::string& prefix) {
  std::ostringstream yaml;
  yaml << "producer_cluster: trainer\nmembers:\n";
  for (unsigned r = 1; r <= receivers; ++r)
    yaml << "  - {rank: " << r - 1 << ", host: 127.0.0.1, port: " << base_port + static_cast<int>(r)
         << ", cluster: " << store_demo_cluster(r, receivers) << "}\n";
  yaml << "store:\n  endpoint: " << store.endpoint() << "\n  region: " << store.region()
       << "\n  bucket: " << store.bucket() << "\n  prefix: " << prefix << "\n  poll: 50ms\n  clusters: ["
       << (receivers > 1 ? "east, west" : "east") << "]\n";
  return yaml.str();
}

void complete_store_report(nlohmann::json& report, const std::vector<nlohmann::json>& summaries) {
  // When receiver `s` first held version v or a later one (a member that caught up by a snapshot
  // skips versions); nullopt when it never did.
  auto held_at = [](const nlohmann::json& s, uint64_t v) -> std::optional<double> {
    std::optional<double> first;
    const nlohmann::json at = s.value("committed_at_unix", nlohmann::json::object());
    for (const auto& [key, t] : at.items())
      if (std::stoull(key) >= v && (!first || t.get<double>() < *first)) first = t.get<double>();
    return first;
  };
  // When the last receiver held it.
  auto last_at = [&](uint64_t v) -> std::optional<double> {
    double last = 0;
    for (const auto& s : summaries) {
      const auto t = held_at(s, v);
      if (!t) return std::nullopt;
      last = std::max(last, *t);
    }
    return last;
  };
  auto verified = [&](uint64_t v) {
    unsigned n = 0;
    for (const auto& s : summaries) n += held_at(s, v).has_value();
    return n;
  };
  nlohmann::json steps = nlohmann::json::array();
  double full_seconds = 0;
  for (const auto& s : report.at("steps")) {
    const uint64_t v = s.at("version").get<uint64_t>();
    const auto at = last_at(v);
    const double seconds = at ? *at - s.at("started_at_unix").get<double>() : 0;
    if (v == 1) {
      full_seconds = seconds;
      report["full"] = {{"versions", 1},
                        {"payload_bytes", report.at("checkpoint_bytes")},
                        {"seconds", seconds},
                        {"committed", at.has_value()},
                        {"receivers", summaries.size()},
                        {"verified_receivers", verified(1)}};
      continue;
    }
    nlohmann::json e = s;
    e["refit_seconds"] = seconds;
    e["committed"] = at.has_value();
    e["changed_fraction"] = s.at("changes").get<double>() / std::max(1.0, s.at("elements").get<double>());
    e["receivers"] = summaries.size();
    e["verified_receivers"] = verified(v);
    steps.push_back(std::move(e));
  }
  // What the tree's entries also carry: a store run names no failed member (a receiver that failed
  // fails its own process, which the demo reports) and repairs nothing itself.
  auto no_repair = [](nlohmann::json& e) {
    e["failed_members"] = nlohmann::json::array();
    e["epoch"] = 0;
    e["repair_seconds"] = 0.0;
    e["resent_chunks"] = 0;
  };
  no_repair(report["full"]);
  for (auto& e : steps) {
    no_repair(e);
    e["full_seconds"] = full_seconds;
    e["speedup"] = e["refit_seconds"].get<double>() > 0 ? full_seconds / e["refit_seconds"].get<double>() : 0.0;
  }
  report["steps"] = steps;
}

}  // namespace deltacast::tools
