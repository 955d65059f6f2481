// The UCX backend's engine: its construction (context, worker, progress thread) and destruction,
// what it offers, and the factory. The other concerns have a file each: ucx_connect.cpp (setting a
// connection up over the side channel), ucx_connection.cpp (posts, completions, failure),
// ucx_memory.cpp (registration, remote keys), ucx_progress.cpp (the progress thread, wakeups).
#include "transport/ucx/ucx_transport.h"

#include <unistd.h>

#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "transport/engine_handles.h"
#include "transport/ucx/ucx_engine.h"
#include "util/log.h"
#include "util/signal_dispositions.h"

namespace deltacast::transport::ucx {

using namespace std::chrono_literals;
using side::Clock;

namespace {

// UCX settings we change from UCX's defaults, unless the environment sets them (env wins).
// RX_SEG_SIZE (env UCX_TCP_RX_SEG_SIZE, default 64 KiB): with UCP_ERR_HANDLING_MODE_PEER, UCX 1.13
// selects no zero-copy RMA lane on tcp (under error handling it wants memory invalidation, which
// the tcp md lacks), so a large tag message travels as active-message rendezvous fragments of at
// most RX_SEG_SIZE: one sendmsg/recv, one header and one progress round per fragment. 512 KiB
// fragments made 8 MiB messages ~1.3x faster on loopback (docs/transport-ofi-ucx.md).
struct UcxSetting {
  const char* env;    // the variable a user sets
  const char* key;    // the name ucp_config_modify takes (UCT keys go without their TCP_ prefix)
  const char* value;
};
constexpr UcxSetting kTcpSettings[] = {{"UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "512K"}};

// Reads the UCX configuration from the environment, plus our tcp settings when `tune_tcp`;
// `*tuned` says whether any of them was applied.
ucp_config_t* read_config(bool tune_tcp, bool* tuned) {
  *tuned = false;
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) throw Error(Errc::internal, "ucp_config_read: " + ucs_text(status));
  for (const auto& setting : kTcpSettings) {
    if (!tune_tcp || std::getenv(setting.env) != nullptr) continue;
    status = ucp_config_modify(config, setting.key, setting.value);
    if (status == UCS_OK) {
      *tuned = true;
    } else {
      logger("transport")->debug("ucx: {}={} not applied: {}", setting.env, setting.value, ucs_text(status));
    }
  }
  return config;
}

// Whether the context opened a tcp resource ("resource N : md M dev D flags -- tcp/DEV" in
// ucp_context_print_info, the only API that lists them).
bool has_tcp_resource(ucp_context_h context) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return true;  // assume tcp: the worst case is one UCX warning
  ucp_context_print_info(context, stream);
  std::fclose(stream);
  std::string info(text, size);
  std::free(text);
  for (size_t at = info.find("resource"); at != std::string::npos; at = info.find("resource", at + 1)) {
    size_t line_end = info.find('\n', at);
    if (info.substr(at, line_end - at).find(" tcp/") != std::string::npos) return true;
  }
  return false;
}

}  // namespace

UcxTransport::UcxTransport(const TransportOptions& options) : options_(options) {
  // ucp_init and ucp_worker_create open UCX's transport modules (dlopen): the host's signal
  // handlers are put back if one of them replaces any.
  SignalDispositionGuard keep_host_handlers;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  // A tcp setting that no tcp interface consumes makes ucp_worker_create print a warning on
  // stdout ("invalid configuration"): without a tcp resource, start again without our settings.
  for (bool tune_tcp : {true, false}) {
    bool tuned = false;
    ucp_config_t* config = read_config(tune_tcp, &tuned);
    ucs_status_t status = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (status != UCS_OK) throw Error(Errc::unsupported, "ucp_init: " + ucs_text(status));
    if (!tuned || has_tcp_resource(context_)) break;
    ucp_cleanup(context_);
    context_ = nullptr;
  }
  ucp_context_attr_t context_attr{};
  context_attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &context_attr) == UCS_OK) memory_types_ = context_attr.memory_types;
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // our mutex serialises every call
  ucs_status_t status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) {
    ucp_cleanup(context_);
    throw Error(Errc::internal, "ucp_worker_create: " + ucs_text(status));
  }
  try {
    setup_wakeup();
  } catch (...) {
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    throw;
  }
  std::random_device random;
  next_recv_id_ = random() | 1;  // distinct ids across transports help when reading traces
  progress_ = std::thread([this] { progress_loop(); });
}

UcxTransport::~UcxTransport() {
  {
    std::unique_lock lock(mutex_);
    for (auto& conn : conns_) fail(*conn, Status{Errc::connection, "transport destroyed"});
    // Let cancellations and forced closes finish so no callback outlives us.
    auto deadline = Clock::now() + 2s;
    for (;;) {
      progress();
      reap_closed_eps();
      bool busy = !closing_.empty();
      for (auto& conn : conns_) busy = busy || !conn->ops.empty();
      if (!busy || Clock::now() > deadline) break;
    }
    conns_.clear();
    stop_ = true;
  }
  uint64_t one = 1;  // unconditional: the thread may be past its last check of stop_
  [[maybe_unused]] ssize_t written = ::write(wake_fd_.get(), &one, sizeof one);
  if (progress_.joinable()) progress_.join();
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

bool UcxTransport::cuda_memory() const { return (memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0; }

std::string UcxTransport::cuda_memory_detail() const {
  std::string types;
  for (int t = UCS_MEMORY_TYPE_HOST; t < UCS_MEMORY_TYPE_LAST; ++t)
    if (memory_types_ & UCS_BIT(t)) types += (types.empty() ? "" : ", ") + std::string(ucs_memory_type_names[t]);
  std::string text = "UCX " + std::string(ucp_get_version_string()) + " supports memory types " +
                     (types.empty() ? "(none reported)" : types);
  return cuda_memory()
             ? text + ": CUDA memory is registered as UCS_MEMORY_TYPE_CUDA"
             : text + ": no cuda (a UCX built with CUDA and its cuda transports loaded has it; see ucx_info -d)";
}

Capabilities UcxTransport::capabilities() const {
  Capabilities caps;
  caps.backend = "ucx";
  caps.rma = true;
  caps.cuda_memory = cuda_memory();
  caps.cuda_memory_detail = cuda_memory_detail();
  caps.zero_copy_send = true;
  caps.max_message = options_.max_message_bytes;
  caps.authenticated = !options_.secret.empty();
  return caps;
}

}  // namespace deltacast::transport::ucx

namespace deltacast::transport {

std::unique_ptr<Transport> make_ucx_transport(const TransportOptions& options) {
  return std::make_unique<EngineTransport<ucx::UcxTransport>>(std::make_shared<ucx::UcxTransport>(options));
}

}  // namespace deltacast::transport
