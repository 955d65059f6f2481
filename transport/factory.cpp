// The backend table: which schemes this build can serve. Backends that depend on optional
// libraries are compiled in only when their CMake option found the library (see CMakeLists.txt).
#include <string>

#include "transport/paced/paced_transport.h"
#include "transport/transport.h"

namespace deltacast::transport {
namespace {

struct Backend {
  std::string_view name;  // the part of the scheme before '+'
  bool takes_provider;    // ofi+PROVIDER
  std::unique_ptr<Transport> (*make)(std::string_view provider, const TransportOptions& options);
};

constexpr Backend kBackends[] = {
    {"tcp", false, [](std::string_view, const TransportOptions& o) { return make_tcp_transport(o); }},
    {"loop", false, [](std::string_view, const TransportOptions& o) { return make_loopback_transport(o); }},
#ifdef DELTACAST_WITH_OFI
    {"ofi", true, [](std::string_view p, const TransportOptions& o) { return make_ofi_transport(p, o); }},
#endif
#ifdef DELTACAST_WITH_UCX
    {"ucx", false, [](std::string_view, const TransportOptions& o) { return make_ucx_transport(o); }},
#endif
};

const Backend* find_backend(std::string_view name) {
  for (const auto& backend : kBackends) {
    if (backend.name == name) return &backend;
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<Transport> make_transport(std::string_view scheme, const TransportOptions& options) {
  std::string_view name = scheme;
  std::string_view provider;
  if (auto plus = scheme.find('+'); plus != std::string_view::npos) {
    name = scheme.substr(0, plus);
    provider = scheme.substr(plus + 1);
  }
  bool known = name == "tcp" || name == "loop" || name == "ofi" || name == "ucx";
  if (!known) throw Error(Errc::invalid_argument, "unknown transport scheme '" + std::string(scheme) + "'");
  const Backend* backend = find_backend(name);
  if (backend == nullptr) {
    throw Error(Errc::unsupported, "transport '" + std::string(scheme) + "' is not built into this deltacast");
  }
  if (backend->takes_provider == provider.empty()) {
    throw Error(Errc::invalid_argument, backend->takes_provider
                                            ? "transport '" + std::string(scheme) + "' needs a provider (ofi+tcp)"
                                            : "transport '" + std::string(name) + "' takes no '+provider'");
  }
  auto transport = backend->make(provider, options);
  if (options.egress_bytes_per_second > 0) transport = make_paced_transport(std::move(transport), options);
  return transport;
}

bool backend_built(std::string_view scheme) {
  return find_backend(scheme.substr(0, scheme.find('+'))) != nullptr;
}

std::vector<std::string> built_backends() {
  std::vector<std::string> names;
  for (const auto& backend : kBackends) names.emplace_back(backend.name);
  return names;
}

}  // namespace deltacast::transport
