// The libfabric backend's engine: its construction (fi_getinfo for the provider, the fabric, the
// progress thread) and destruction, what the provider offers, and the factory. The other concerns
// have a file each: ofi_connect.cpp (setting a connection up over the side channel),
// ofi_connection.cpp (posts, completions, failure), ofi_memory.cpp (registration, remote keys),
// ofi_progress.cpp (the progress thread). Design: ofi_transport.h, docs/transport-ofi-ucx.md.
#include "transport/ofi/ofi_transport.h"

#include <dlfcn.h>
#include <sys/eventfd.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "transport/engine_handles.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/shm_names.h"
#include "util/log.h"
#include "util/signal_dispositions.h"

namespace deltacast::transport::ofi {
namespace {

// tcp;ofi_rxm's settings where the environment does not give them (each read once, when libfabric
// initialises its providers at the process's first fi_getinfo; bench figures in
// docs/transport-ofi-ucx.md, "rxm settings"):
//  * no shared receive context (FI_OFI_RXM_USE_SRX=0): with it, every endpoint's fi_enable
//    allocated and cleared ~68 MB (210 ms idle, seconds on a loaded machine, where a listener's
//    serial setups timed out). Each deltacast connection has an endpoint of its own: nothing to share;
//  * 4 KiB eager buffers (FI_OFI_RXM_BUFFER_SIZE, 16 KiB by default): rxm's connection set up on
//    the first send cleared ~50 ms worth of buffer pools with 16 KiB; deltacast's frames are far
//    larger than either and go by rendezvous, its control messages fit in 4 KiB;
//  * connection-manager progress every 1 ms instead of 10 ms (FI_OFI_RXM_CM_PROGRESS_INTERVAL):
//    the first message on a new connection waited up to 10 ms for it, on every hop of a repair;
//  * rendezvous by RMA write, not read (FI_OFI_RXM_USE_RNDV_WRITE=1): with reads, the tcp
//    provider of libfabric 1.17.0 (Debian 12) cancels a receive of read data in flight twice when
//    an endpoint closes, and rxm's flush of the second cancellation (op_context NULL) crashes
//    fi_close: a relay's children died closing their links to a straggler failed mid-bootstrap
//    (ctest recovery_netns_straggler_bootstrap_ofi; fixed upstream in 1.18, ofiwg/libfabric#8660).
//    Written data arrives as internal transfers, whose cancellation is silent. Every deltacast
//    process sets it, so both ends of a link agree; link throughput the same or better
//    (docs/transport-ofi-ucx.md, "rxm settings").
void set_rxm_defaults() {
  ::setenv("FI_OFI_RXM_USE_SRX", "0", 0);
  ::setenv("FI_OFI_RXM_BUFFER_SIZE", "4096", 0);
  ::setenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL", "1000", 0);
  ::setenv("FI_OFI_RXM_USE_RNDV_WRITE", "1", 0);
}

// Asks fi_getinfo for an RDM endpoint with tagged messages (and RMA with write-then-send order
// when `want_rma`, device memory (FI_HMEM) when `want_hmem`). Returns nullptr when the provider
// can not give that.
fi_info* query(const std::string& provider, bool want_rma, bool want_hmem) {
  fi_info* hints = fi_allocinfo();
  hints->caps = FI_MSG | FI_TAGGED | FI_SEND | FI_RECV | (want_rma ? (FI_RMA | FI_WRITE | FI_REMOTE_WRITE) : 0) |
                (want_hmem ? FI_HMEM : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | (want_hmem ? FI_MR_HMEM : 0);
  hints->domain_attr->threading = FI_THREAD_SAFE;  // shm shares peer maps across domains of one process
  hints->tx_attr->msg_order = FI_ORDER_SAS | (want_rma ? FI_ORDER_SAW : 0);
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->cq_data_size = 8;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  // Sockaddr providers bind to loopback unless told otherwise; the per-connection endpoint then
  // binds to the side channel's local address (see establish() in ofi_connect.cpp).
  const char* node = nullptr;
  uint64_t flags = 0;
  if (provider != "shm") {
    const char* source = std::getenv("DELTACAST_OFI_SOURCE");
    node = source != nullptr ? source : "127.0.0.1";
    flags = FI_SOURCE;
  }
  if (provider != "shm") set_rxm_defaults();
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 9), node, nullptr, flags, hints, &info);
  fi_freeinfo(hints);
  return rc == 0 ? info : nullptr;
}

// Whether the NVIDIA driver's library loads here (what FI_HMEM_CUDA needs at run time); no CUDA
// library is linked.
bool cuda_driver_loads() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return false;
  ::dlclose(driver);
  return true;
}

}  // namespace

OfiTransport::OfiTransport(std::string provider, const TransportOptions& options)
    : provider_(std::move(provider)), options_(options) {
  // fi_getinfo and fi_fabric may open provider libraries (dlopen): the host's signal handlers are
  // put back if one of them replaces any.
  SignalDispositionGuard keep_host_handlers;
  // RMA first, then device memory: a provider with both gives both; FI_HMEM is asked for apart so
  // that its absence (a libfabric built without CUDA, or a provider without it) costs nothing else,
  // and only where a CUDA driver loads: shm offers FI_HMEM on a machine without a GPU too, and its
  // host transfers need not take the HMEM paths there.
  cuda_driver_ = cuda_driver_loads();
  for (const bool want_rma : {true, false}) {
    info_ = cuda_driver_ ? query(provider_, want_rma, true) : nullptr;
    hmem_ = info_ != nullptr;
    if (!info_) info_ = query(provider_, want_rma, false);
    rma_ = want_rma;
    if (info_) break;
  }
  if (!info_) {
    throw Error(Errc::unsupported, "libfabric provider '" + provider_ + "' offers no RDM endpoint with tagged messages here");
  }
  virt_addr_ = (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  // One remote key for all connections needs keys we choose, not provider keys.
  if (info_->domain_attr->mr_mode & FI_MR_PROV_KEY) rma_ = false;
  if (info_->ep_attr->max_msg_size > 0) fragment_ = std::min<size_t>(fragment_, info_->ep_attr->max_msg_size);
  check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
  if (provider_ == "shm") {
    if (size_t removed = remove_stale_shm_regions(); removed > 0) {
      log_->info("ofi+shm: removed {} shared-memory regions left by killed deltacast processes", removed);
    }
  }
  log_->debug("ofi: provider {} ({}), domain {}, rma {}, fragment {} bytes", provider_, info_->fabric_attr->prov_name,
              info_->domain_attr->name ? info_->domain_attr->name : "?", rma_, fragment_);
  wake_fd_ = side::Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) poll_ok_ = false;
  progress_ = std::thread([this] { progress_loop(); });
}

OfiTransport::~OfiTransport() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    for (auto& conn : conns_) fail(*conn, Status{Errc::connection, "transport destroyed"});
    conns_.clear();
    wake();
  }
  if (progress_.joinable()) progress_.join();
  if (fabric_) fi_close(&fabric_->fid);
  fi_freeinfo(info_);
}

std::string OfiTransport::cuda_memory_detail() const {
  const uint32_t version = fi_version();
  const std::string who = "libfabric " + std::to_string(FI_MAJOR(version)) + "." + std::to_string(FI_MINOR(version)) +
                          " provider " + provider_;
  if (hmem_) return who + " offers FI_HMEM: CUDA memory is registered with FI_HMEM_CUDA (device 0 of the process)";
  if (!cuda_driver_) return "no CUDA driver here (libcuda.so.1 does not load): " + who + " was not asked for FI_HMEM";
  return who + " does not offer FI_HMEM (fi_info -p " + provider_ + " -c FI_HMEM finds nothing): no CUDA memory";
}

Capabilities OfiTransport::capabilities() const {
  Capabilities caps;
  caps.backend = "ofi+" + provider_;
  caps.rma = rma_;
  caps.cuda_memory = hmem_;
  caps.cuda_memory_detail = cuda_memory_detail();
  caps.zero_copy_send = true;
  caps.max_message = options_.max_message_bytes;
  caps.authenticated = !options_.secret.empty();
  return caps;
}

}  // namespace deltacast::transport::ofi

namespace deltacast::transport {

std::unique_ptr<Transport> make_ofi_transport(std::string_view provider, const TransportOptions& options) {
  return std::make_unique<EngineTransport<ofi::OfiTransport>>(
      std::make_shared<ofi::OfiTransport>(std::string(provider), options));
}

}  // namespace deltacast::transport
