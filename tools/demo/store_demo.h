#pragma once
// `deltacast demo --transport s3` (docs/object-storage.md): the rollout side cannot reach the
// producer; versions go through an S3-compatible store the demo starts itself (Ceph RGW on
// 127.0.0.1, scripts/s3-server.sh), into two store clusters whose gateways root each cluster's
// relay tree (the hybrid), as `deltacast run` processes.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deltacast::tools {

// The store of one demo: a server started in `dir` (stopped by the destructor), or the one named by
// $DELTACAST_S3_ENV (an s3-server.sh env file; left running). Its credentials are exported to the
// environment the demo's processes inherit.
class DemoStore {
 public:
  // Throws Error(not_found) when scripts/s3-server.sh cannot be found ($DELTACAST_S3_SERVER, or
  // beside the executable's source tree), Error(io) when the server does not start.
  explicit DemoStore(const std::filesystem::path& dir);
  ~DemoStore();
  DemoStore(const DemoStore&) = delete;
  DemoStore& operator=(const DemoStore&) = delete;

  const std::string& endpoint() const { return env_.at("S3_ENDPOINT"); }
  const std::string& bucket() const { return env_.at("S3_BUCKET"); }
  std::string region() const { return env_.count("S3_REGION") ? env_.at("S3_REGION") : "us-east-1"; }
  bool started_here() const { return !script_.empty(); }

 private:
  std::string script_;  // empty: an outside server
  std::filesystem::path dir_;
  std::map<std::string, std::string> env_;
};

// Receiver r's (1..n) cluster in the store demo: the first half "east", the rest "west".
std::string store_demo_cluster(unsigned r, unsigned n);

// The store demo's members and store sections of the config (an explicit member list with the
// clusters above, ports from base_port).
std::string store_demo_yaml(const DemoStore& store, unsigned receivers, int base_port, const std::string& prefix);

// A store-only producer's report, completed from the receivers' summaries into the shape the demo
// table reads (steps[].refit_seconds = the last receiver's committed_at_unix of the version minus
// the step's start; changed_fraction, full_seconds, speedup, verified_receivers, receivers; full.
// payload_bytes and seconds for version 1). `summaries` are the receivers' --summary files.
void complete_store_report(nlohmann::json& report, const std::vector<nlohmann::json>& summaries);

}  // namespace deltacast::tools
