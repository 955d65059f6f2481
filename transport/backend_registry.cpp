// The backend registry and make_transport over it (transport/backend_registry.h).
#include "transport/backend_registry.h"

#include <map>
#include <mutex>

#include "transport/paced/paced_transport.h"

namespace deltacast::transport {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendInfo, std::less<>> backends;  // nodes: pointers stay valid
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::string registered_schemes() {
  std::string names;
  for (const BackendInfo* b : registered_backends()) {
    if (!names.empty()) names += ", ";
    names += b->name + (b->takes_provider ? "+PROVIDER" : "");
  }
  return names.empty() ? "none: this program links no transport backend" : names;
}

void register_backend(BackendInfo info) {
  if (info.name.empty()) throw Error(Errc::internal, "a transport backend without a name");
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::string name = info.name;
  if (!r.backends.emplace(name, std::move(info)).second) {
    throw Error(Errc::internal, "transport backend '" + name + "' registered twice");
  }
}

const BackendInfo* find_backend(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.backends.find(name);
  return it == r.backends.end() ? nullptr : &it->second;
}

std::vector<const BackendInfo*> registered_backends() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<const BackendInfo*> all;
  for (const auto& [name, info] : r.backends) all.push_back(&info);
  return all;
}

std::unique_ptr<Transport> make_transport(std::string_view scheme, const TransportOptions& options) {
  std::string_view name = scheme;
  std::string_view provider;
  if (auto plus = scheme.find('+'); plus != std::string_view::npos) {
    name = scheme.substr(0, plus);
    provider = scheme.substr(plus + 1);
  }
  const BackendInfo* backend = find_backend(name);
  if (backend == nullptr) {
    throw Error(Errc::invalid_argument,
                "unknown transport scheme '" + std::string(scheme) + "' (" + registered_schemes() + ")");
  }
  if (backend->takes_provider == provider.empty()) {
    throw Error(Errc::invalid_argument,
                backend->takes_provider
                    ? "transport '" + std::string(scheme) + "' needs a provider (" + backend->name + "+PROVIDER)"
                    : "transport '" + std::string(name) + "' takes no '+provider'");
  }
  if (backend->make == nullptr) {
    throw Error(Errc::unsupported,
                "transport '" + std::string(scheme) + "' is not built into this deltacast: " + backend->missing);
  }
  auto transport = backend->make(provider, options);
  if (options.egress_bytes_per_second > 0) transport = make_paced_transport(std::move(transport), options);
  return transport;
}

bool backend_built(std::string_view scheme) {
  const BackendInfo* backend = find_backend(scheme.substr(0, scheme.find('+')));
  return backend != nullptr && backend->make != nullptr;
}

std::vector<std::string> built_backends() {
  std::vector<std::string> names;
  for (const BackendInfo* b : registered_backends()) {
    if (b->make != nullptr) names.push_back(b->name);
  }
  return names;
}

}  // namespace deltacast::transport
