#pragma once
// The transport backends of this process, by scheme. The core (make_transport, Url::parse) looks
// a backend up here and never names one; transport/backends/ (generated from the build's options)
// registers every backend the build has, and each one it lacks with the reason, before main()
// runs. A binary that links no backends (dc_transport alone) knows no scheme.
//
// Rules: registration happens during static initialisation (or, in tests, before any lookup of
// that name); a name registered twice throws Errc::internal. Lookups are thread-safe and return
// pointers that stay valid for the life of the process.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "transport/transport.h"

namespace deltacast::transport {

struct BackendInfo {
  std::string name;              // the scheme before '+': "tcp", "ofi", "loop"
  bool takes_provider = false;   // the scheme is NAME+PROVIDER (ofi+tcp), and must be
  bool address_is_name = false;  // NAME://LABEL (loop://relay-3) instead of NAME://HOST:PORT
  // True when every address of this backend with this provider reaches only this machine,
  // whatever its host (loop, ofi+shm). Null: the host decides (Url::is_local).
  bool (*machine_local)(std::string_view provider) = nullptr;
  // Creates an instance (`provider` is empty for backends without one). Null when this build
  // lacks the backend: `missing` then says why ("built without UCX: ...").
  std::unique_ptr<Transport> (*make)(std::string_view provider, const TransportOptions& options) = nullptr;
  // Defaulted so that designated initializers may leave it out (GCC 12 -Wmissing-field-initializers).
  std::string missing = {};
};

// Adds a backend. Throws Error(Errc::internal) when its name is taken or empty.
void register_backend(BackendInfo info);
// The backend registered under `name` (the part of a scheme before '+'), or null.
const BackendInfo* find_backend(std::string_view name);
// Every registered backend, built or not, sorted by name.
std::vector<const BackendInfo*> registered_backends();
// The schemes they take, for error messages: "loop, ofi+PROVIDER, tcp, ucx".
std::string registered_schemes();

}  // namespace deltacast::transport
