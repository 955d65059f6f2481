// `deltacast transports`: what each transport backend of this build offers on this machine, as the
// backend reports it at run time (Transport::capabilities): RMA, zero-copy sends, the largest
// message, and CUDA memory with how it is registered or why it can not be (for ucx and ofi, what
// the UCX and libfabric libraries and providers say). Backends this build lacks are listed with
// the reason; a backend that fails to start here (no provider, no device) with its error.
// --json prints one object per scheme instead of the table.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/cli.h"
#include "transport/backend_registry.h"
#include "transport/transport.h"
#include "util/error.h"

namespace deltacast::tools::transports_command {  // its own namespace: unity builds batch the commands together
namespace {

// The schemes to report: each built backend's (ofi with the providers deltacast uses), and each
// missing one's name.
std::vector<std::string> schemes_of(const transport::BackendInfo& backend) {
  if (backend.name == "ofi") return {"ofi+tcp", "ofi+shm"};
  return {backend.name};
}

nlohmann::json report(const std::string& scheme, const transport::BackendInfo& backend) {
  nlohmann::json row{{"scheme", scheme}, {"built", backend.make != nullptr}};
  if (!backend.make) {
    row["error"] = backend.missing;
    return row;
  }
  transport::TransportOptions options;
  options.secret = transport::random_secret();  // a capability report opens no connection
  try {
    const auto caps = transport::make_transport(scheme, options)->capabilities();
    row["rma"] = caps.rma;
    row["zero_copy_send"] = caps.zero_copy_send;
    row["max_message_bytes"] = caps.max_message;
    row["cuda_memory"] = caps.cuda_memory;
    row["cuda_memory_detail"] = caps.cuda_memory_detail;
  } catch (const Error& e) {
    row["error"] = std::string(errc_name(e.code())) + ": " + e.what();
  }
  return row;
}

void run_transports(bool json) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto* backend : transport::registered_backends())
    for (const auto& scheme : schemes_of(*backend)) rows.push_back(report(scheme, *backend));
  if (json) {
    std::printf("%s\n", rows.dump(2).c_str());
    return;
  }
  for (const auto& row : rows) {
    if (row.contains("error")) {
      std::printf("%-8s %s: %s\n", row["scheme"].get<std::string>().c_str(),
                  row["built"].get<bool>() ? "does not start here" : "not built",
                  row["error"].get<std::string>().c_str());
      continue;
    }
    std::printf("%-8s rma %-3s zero-copy send %-3s cuda memory %-3s (%s)\n", row["scheme"].get<std::string>().c_str(),
                row["rma"].get<bool>() ? "yes" : "no", row["zero_copy_send"].get<bool>() ? "yes" : "no",
                row["cuda_memory"].get<bool>() ? "yes" : "no", row["cuda_memory_detail"].get<std::string>().c_str());
  }
}

void setup(CLI::App& parent) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = parent.add_subcommand(
      "transports", "what each transport backend offers here (RMA, zero-copy, CUDA memory and why), from the backends");
  cmd->add_flag("--json", *json, "one JSON object per scheme");
  cmd->callback([json] { run_transports(*json); });
}

// NOLINTNEXTLINE(cert-err58-cpp): registration at start-up, as in every cmd_*.cpp
const CommandRegistrar registrar{"transports", &setup};

}  // namespace
}  // namespace deltacast::tools::transports_command
