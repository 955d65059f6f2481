// libfabric backend: see ofi_transport.h for the design and docs/transport-ofi-ucx.md for why.
#include "transport/engine_handles.h"
#include "transport/ofi/ofi_transport.h"

#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <condition_variable>
#include <functional>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "transport/accepting_listener.h"
#include "transport/basic_request.h"
#include "transport/ofi/shm_names.h"
#include "transport/side_channel.h"
#include "util/log.h"

namespace deltacast::transport::ofi {
namespace {

using namespace std::chrono_literals;
using side::Clock;

// Tag layout: [kind:2][sequence:22][length or fragment index:40].
constexpr uint64_t kKindData = uint64_t{1} << 62;
constexpr uint64_t kKindCont = uint64_t{2} << 62;
constexpr int kSeqShift = 40;
constexpr uint64_t kSeqMask = (uint64_t{1} << 22) - 1;
constexpr uint64_t kLowMask = (uint64_t{1} << 40) - 1;
constexpr size_t kFragmentCap = size_t{64} << 20;  // pipelines large messages
constexpr size_t kMaxAddressBytes = 4096;
constexpr size_t kMaxSendsInFlight = 64;   // per connection; more wait in the backlog
constexpr size_t kMaxRecvsInFlight = 256;  // also below every provider's rx queue size seen
constexpr size_t kRemoteKeyBytes = 24;  // addr, key, length (u64 each, little-endian host order)

std::string fi_text(int rc) { return fi_strerror(rc < 0 ? -rc : rc); }

void check(int rc, const std::string& what) {
  if (rc != 0) throw Error(Errc::internal, "libfabric " + what + " failed: " + fi_text(rc));
}

struct Message {
  std::shared_ptr<BasicRequest> request;
  std::byte* buffer = nullptr;
  size_t capacity = 0;
  size_t total = 0;
  size_t pending = 0;  // fragments posted and not yet completed
};

enum class OpKind { send, recv_first, recv_cont, write };

// The provider's per-operation context must be the first member (FI_CONTEXT2 mode).
struct Op {
  fi_context2 context{};
  OpKind kind = OpKind::send;
  std::shared_ptr<Message> message;
  bool posted = false;  // false while it waits in ConnState::backlog
};

using PostFn = std::function<ssize_t(void* context)>;

class OfiTransport;
class OfiMemoryRegion;

// One fabric endpoint to one peer plus its side channel. Guarded by OfiTransport::mutex_.
struct ConnState {
  fid_domain* domain = nullptr;  // its own: providers share receive queues across a domain's endpoints
  fid_ep* ep = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  std::unique_ptr<side::Liveness> liveness;
  std::unordered_map<Op*, std::unique_ptr<Op>> ops;
  std::unordered_map<const OfiMemoryRegion*, fid_mr*> registrations;
  // Posts the provider refused with -FI_EAGAIN (queue full), retried in order by the progress
  // thread; later posts queue behind them so message order holds.
  std::deque<std::pair<Op*, PostFn>> backlog;
  uint32_t send_seq = 0;
  size_t sends_in_flight = 0;  // bounded: shm corrupts its queues when posted beyond their size
  size_t recvs_in_flight = 0;
  bool broken = false;
  Status broken_status;
  std::string peer_url;
  bool has_pending() const { return !ops.empty(); }
};

class OfiTransport;

// Registered in every connection's domain under the same requested key (providers without
// FI_MR_PROV_KEY honour it), so one remote key serves every connection.
class OfiMemoryRegion final : public MemoryRegion {
 public:
  OfiMemoryRegion(OfiTransport& transport, std::span<std::byte> bytes, uint64_t key, uint64_t base)
      : transport_(transport), bytes_(bytes), key_(key), base_(base) {}
  ~OfiMemoryRegion() override;
  std::span<std::byte> bytes() const override { return bytes_; }
  MemoryKind kind() const override { return MemoryKind::host; }
  std::vector<std::byte> remote_key() const override {
    uint64_t words[3] = {base_, key_, bytes_.size()};
    std::vector<std::byte> key(kRemoteKeyBytes);
    std::memcpy(key.data(), words, kRemoteKeyBytes);
    return key;
  }
  uint64_t key() const { return key_; }

 private:
  OfiTransport& transport_;
  std::span<std::byte> bytes_;
  uint64_t key_;
  uint64_t base_;  // the address the peer writes relative to (0 without FI_MR_VIRT_ADDR)
};

class OfiTransport final : public Transport, public std::enable_shared_from_this<OfiTransport> {
 public:
  OfiTransport(std::string provider, const TransportOptions& options);
  ~OfiTransport() override;

  std::unique_ptr<Listener> listen(const Url& url) override;
  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) override;
  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override;
  Capabilities capabilities() const override;

  // Sets up the fabric endpoint over an authenticated side channel. Throws on failure.
  std::shared_ptr<ConnState> establish(side::Fd fd, bool is_server, Clock::time_point deadline);

  std::shared_ptr<Request> post_send(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> message,
                                     MemoryRegion* mr);
  std::shared_ptr<Request> post_recv(const std::shared_ptr<ConnState>& conn, std::span<std::byte> buffer,
                                     MemoryRegion* mr);
  std::shared_ptr<Request> post_write(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> local,
                                      MemoryRegion* local_mr, const RemoteBuffer& remote);
  void close_connection(const std::shared_ptr<ConnState>& conn, const Status& why);
  const std::string& provider() const { return provider_; }
  const TransportOptions& options() const { return options_; }

 private:
  // Posts one operation; queues it in the backlog while the provider says -FI_EAGAIN. mutex_ held.
  bool post_op(ConnState& conn, std::unique_ptr<Op> op, const PostFn& post);
  void drive(ConnState& conn);                 // mutex_ held
  void retry_backlog(ConnState& conn);         // mutex_ held
  ssize_t try_post(ConnState& conn, Op* raw, const PostFn& post);  // mutex_ held
  void handle(ConnState& conn, Op* op, const fi_cq_tagged_entry& entry);
  void handle_error(ConnState& conn, const fi_cq_err_entry& err);
  void fail(ConnState& conn, const Status& why);  // mutex_ held
  void progress_loop();
  void* local_desc(const ConnState& conn, MemoryRegion* mr) const;
  void register_in(ConnState& conn, const OfiMemoryRegion& region);  // mutex_ held
 public:
  void unregister(const OfiMemoryRegion& region);
 private:
  std::vector<const OfiMemoryRegion*> regions_;

  std::string provider_;
  TransportOptions options_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  size_t fragment_ = kFragmentCap;
  bool rma_ = false;
  bool virt_addr_ = false;
  std::atomic<uint64_t> next_key_{1};

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<ConnState>> conns_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread progress_;
  std::shared_ptr<spdlog::logger> log_ = logger("transport");
};

std::shared_ptr<BasicRequest> finished_request(Status status, size_t bytes = 0) {
  auto request = std::make_shared<BasicRequest>();
  request->complete(std::move(status), bytes);
  return request;
}

// Asks fi_getinfo for an RDM endpoint with tagged messages (and RMA with write-then-send order
// when `want_rma`). Returns nullptr when the provider can not give that.
fi_info* query(const std::string& provider, bool want_rma) {
  fi_info* hints = fi_allocinfo();
  hints->caps = FI_MSG | FI_TAGGED | FI_SEND | FI_RECV | (want_rma ? (FI_RMA | FI_WRITE | FI_REMOTE_WRITE) : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_SAFE;  // shm shares peer maps across domains of one process
  hints->tx_attr->msg_order = FI_ORDER_SAS | (want_rma ? FI_ORDER_SAW : 0);
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->cq_data_size = 8;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  // Sockaddr providers bind to loopback unless told otherwise; the per-connection endpoint then
  // binds to the side channel's local address (see establish()).
  const char* node = nullptr;
  uint64_t flags = 0;
  if (provider != "shm") {
    const char* source = std::getenv("DELTACAST_OFI_SOURCE");
    node = source != nullptr ? source : "127.0.0.1";
    flags = FI_SOURCE;
  }
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 9), node, nullptr, flags, hints, &info);
  fi_freeinfo(hints);
  return rc == 0 ? info : nullptr;
}

OfiTransport::OfiTransport(std::string provider, const TransportOptions& options)
    : provider_(std::move(provider)), options_(options) {
  info_ = query(provider_, true);
  rma_ = info_ != nullptr;
  if (!info_) info_ = query(provider_, false);
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
  progress_ = std::thread([this] { progress_loop(); });
}

OfiTransport::~OfiTransport() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    for (auto& conn : conns_) fail(*conn, Status{Errc::connection, "transport destroyed"});
    conns_.clear();
  }
  wake_.notify_all();
  if (progress_.joinable()) progress_.join();
  if (fabric_) fi_close(&fabric_->fid);
  fi_freeinfo(info_);
}

Capabilities OfiTransport::capabilities() const {
  Capabilities caps;
  caps.backend = "ofi+" + provider_;
  caps.rma = rma_;
  caps.cuda_memory = false;  // this libfabric has no CUDA (FI_HMEM) support built in
  caps.zero_copy_send = true;
  caps.max_message = options_.max_message_bytes;
  caps.authenticated = !options_.secret.empty();
  return caps;
}

std::unique_ptr<MemoryRegion> OfiTransport::register_memory(std::span<std::byte> bytes, MemoryKind kind) {
  if (kind != MemoryKind::host) throw Error(Errc::unsupported, "ofi+" + provider_ + ": CUDA memory is not supported by this build");
  uint64_t base = virt_addr_ ? reinterpret_cast<uint64_t>(bytes.data()) : 0;
  auto region = std::make_unique<OfiMemoryRegion>(*this, bytes, next_key_++, base);
  std::lock_guard lock(mutex_);
  for (auto& conn : conns_) {
    if (!conn->broken) register_in(*conn, *region);
  }
  regions_.push_back(region.get());
  return region;
}

void OfiTransport::register_in(ConnState& conn, const OfiMemoryRegion& region) {
  uint64_t access = FI_SEND | FI_RECV | (rma_ ? (FI_WRITE | FI_REMOTE_WRITE) : 0);
  fid_mr* mr = nullptr;
  auto bytes = region.bytes();
  check(fi_mr_reg(conn.domain, bytes.data(), bytes.size(), access, 0, region.key(), 0, &mr, nullptr), "fi_mr_reg");
  conn.registrations[&region] = mr;
}

void OfiTransport::unregister(const OfiMemoryRegion& region) {
  std::lock_guard lock(mutex_);
  std::erase(regions_, &region);
  for (auto& conn : conns_) {
    auto found = conn->registrations.find(&region);
    if (found == conn->registrations.end()) continue;
    fi_close(&found->second->fid);
    conn->registrations.erase(found);
  }
}

OfiMemoryRegion::~OfiMemoryRegion() { transport_.unregister(*this); }

void* OfiTransport::local_desc(const ConnState& conn, MemoryRegion* mr) const {
  auto found = conn.registrations.find(dynamic_cast<const OfiMemoryRegion*>(mr));
  return found == conn.registrations.end() ? nullptr : fi_mr_desc(found->second);
}

std::shared_ptr<ConnState> OfiTransport::establish(side::Fd fd, bool is_server, Clock::time_point deadline) {
  auto conn = std::make_shared<ConnState>();
  conn->peer_url = "ofi+" + provider_ + "://" + side::peer_address(fd.get());
  std::vector<std::byte> my_name;
  {
    std::lock_guard lock(mutex_);
    fi_info* info = fi_dupinfo(info_);
    // Bind the endpoint to the address the side channel uses: pins loopback peers to lo.
    if (info->addr_format == FI_SOCKADDR_IN || info->addr_format == FI_SOCKADDR_IN6 || info->addr_format == FI_SOCKADDR) {
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        if (local.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&local)->sin_port = 0;
        if (local.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&local)->sin6_port = 0;
        std::free(info->src_addr);
        info->src_addr = std::malloc(len);
        std::memcpy(info->src_addr, &local, len);
        info->src_addrlen = len;
        info->addr_format = local.ss_family == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
      }
    }
    if (info->addr_format == FI_ADDR_STR && provider_ == "shm") {
      // A name of our own, not the pid-derived default a killed process may have left behind.
      std::string name = unique_shm_endpoint_name();
      std::free(info->src_addr);
      info->src_addr = strdup(name.c_str());
      info->src_addrlen = name.size() + 1;
    }
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_attr.size = info->tx_attr->size + info->rx_attr->size;  // every posted op fits
    int rc = fi_domain(fabric_, info, &conn->domain, nullptr);
    if (rc == 0) rc = fi_endpoint(conn->domain, info, &conn->ep, nullptr);
    fi_freeinfo(info);
    check(rc, "fi_domain/fi_endpoint");
    check(fi_av_open(conn->domain, &av_attr, &conn->av, nullptr), "fi_av_open");
    check(fi_cq_open(conn->domain, &cq_attr, &conn->cq, nullptr), "fi_cq_open");
    check(fi_ep_bind(conn->ep, &conn->av->fid, 0), "fi_ep_bind(av)");
    check(fi_ep_bind(conn->ep, &conn->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    check(fi_enable(conn->ep), "fi_enable");
    for (const auto* region : regions_) register_in(*conn, *region);
    size_t len = kMaxAddressBytes;
    my_name.resize(len);
    check(fi_getname(&conn->ep->fid, my_name.data(), &len), "fi_getname");
    my_name.resize(len);
  }
  auto release = [&] {
    std::lock_guard lock(mutex_);
    fail(*conn, Status{Errc::connection, "setup failed"});
  };
  try {
    std::vector<std::byte> peer_name;
    if (is_server) {
      peer_name = side::recv_blob(fd.get(), kMaxAddressBytes, deadline);
      side::send_blob(fd.get(), my_name, deadline);
    } else {
      side::send_blob(fd.get(), my_name, deadline);
      peer_name = side::recv_blob(fd.get(), kMaxAddressBytes, deadline);
    }
    if (log_->should_log(spdlog::level::debug)) {
      char mine[256] = "", theirs[256] = "";
      size_t a = sizeof mine, b = sizeof theirs;
      fi_av_straddr(conn->av, my_name.data(), mine, &a);
      fi_av_straddr(conn->av, peer_name.data(), theirs, &b);
      log_->debug("ofi: endpoint {} <-> peer {}", mine, theirs);
    }
    {
      std::lock_guard lock(mutex_);
      int inserted = fi_av_insert(conn->av, peer_name.data(), 1, &conn->peer, 0, nullptr);
      if (inserted != 1) throw Error(Errc::connection, "fi_av_insert of the peer address failed");
    }
    // READY: the client's AV holds the server, so the server may send at once.
    std::byte ready{'R'};
    if (is_server) {
      side::read_exact(fd.get(), std::span(&ready, 1), deadline);
    } else {
      side::write_exact(fd.get(), std::span(&ready, 1), deadline);
    }
  } catch (...) {
    release();
    throw;
  }
  std::lock_guard lock(mutex_);
  conn->liveness = std::make_unique<side::Liveness>(std::move(fd), options_.heartbeat_interval, options_.peer_timeout);
  conns_.push_back(conn);
  wake_.notify_all();
  return conn;
}

bool OfiTransport::post_op(ConnState& conn, std::unique_ptr<Op> op, const PostFn& post) {
  Op* raw = op.get();
  conn.ops.emplace(raw, std::move(op));
  if (conn.broken) return false;
  // Continuation receives match exact tags, so they need not queue behind other posts (and
  // must not: the receives ahead of them may wait for messages sent after this one).
  if (conn.backlog.empty() || raw->kind == OpKind::recv_cont) {
    ssize_t rc = try_post(conn, raw, post);
    if (rc == -FI_EAGAIN) {
      drive(conn);
      if (conn.broken) return false;
      rc = try_post(conn, raw, post);
    }
    if (rc == 0) {
      wake_.notify_all();  // the progress thread may be sleeping: there is work now
      return true;
    }
    if (rc != -FI_EAGAIN) {
      fail(conn, Status{Errc::connection, "libfabric post failed: " + fi_text(static_cast<int>(rc))});
      return false;
    }
  }
  conn.backlog.emplace_back(raw, post);
  wake_.notify_all();
  return true;
}

ssize_t OfiTransport::try_post(ConnState& conn, Op* raw, const PostFn& post) {
  bool is_send = raw->kind == OpKind::send || raw->kind == OpKind::write;
  if (is_send && conn.sends_in_flight >= kMaxSendsInFlight) return -FI_EAGAIN;
  if (raw->kind == OpKind::recv_first && conn.recvs_in_flight >= kMaxRecvsInFlight) return -FI_EAGAIN;
  ssize_t rc = post(&raw->context);
  if (rc == 0) {
    raw->posted = true;
    ++(is_send ? conn.sends_in_flight : conn.recvs_in_flight);
  }
  return rc;
}

void OfiTransport::retry_backlog(ConnState& conn) {
  while (!conn.broken && !conn.backlog.empty()) {
    auto& [raw, post] = conn.backlog.front();
    ssize_t rc = try_post(conn, raw, post);
    if (rc == -FI_EAGAIN) return;
    if (rc != 0) {
      fail(conn, Status{Errc::connection, "libfabric post failed: " + fi_text(static_cast<int>(rc))});
      return;
    }
    conn.backlog.pop_front();
  }
}

std::shared_ptr<Request> OfiTransport::post_send(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> message,
                                                 MemoryRegion* mr) {
  if (message.size() > options_.max_message_bytes) {
    throw Error(Errc::invalid_argument, "message of " + std::to_string(message.size()) + " bytes exceeds max_message_bytes " +
                                            std::to_string(options_.max_message_bytes));
  }
  std::lock_guard lock(mutex_);
  if (conn->broken) return finished_request(conn->broken_status);
  auto msg = std::make_shared<Message>();
  msg->request = std::make_shared<BasicRequest>();
  msg->total = message.size();
  uint64_t seq = (conn->send_seq++ & kSeqMask) << kSeqShift;
  size_t count = message.empty() ? 1 : (message.size() + fragment_ - 1) / fragment_;
  msg->pending = count;
  void* desc = local_desc(*conn, mr);
  for (size_t i = 0; i < count; ++i) {
    size_t offset = i * fragment_;
    size_t len = std::min(fragment_, message.size() - offset);
    auto op = std::make_unique<Op>();
    op->kind = OpKind::send;
    op->message = msg;
    auto* buf = const_cast<std::byte*>(message.data()) + offset;
    bool posted = false;
    if (i == 0) {
      // First fragment: an untagged message whose remote CQ data carries sequence and length.
      uint64_t data = kKindData | seq | message.size();
      posted = post_op(*conn, std::move(op), [ep = conn->ep, buf, len, desc, peer = conn->peer, data](void* ctx) {
        return fi_senddata(ep, buf, len, desc, data, peer, ctx);
      });
    } else {
      uint64_t tag = kKindCont | seq | i;
      posted = post_op(*conn, std::move(op), [ep = conn->ep, buf, len, desc, peer = conn->peer, tag](void* ctx) {
        return fi_tsend(ep, buf, len, desc, peer, tag, ctx);
      });
    }
    if (!posted) break;
  }
  return msg->request;
}

std::shared_ptr<Request> OfiTransport::post_recv(const std::shared_ptr<ConnState>& conn, std::span<std::byte> buffer,
                                                 MemoryRegion* mr) {
  std::lock_guard lock(mutex_);
  if (conn->broken) return finished_request(conn->broken_status);
  auto msg = std::make_shared<Message>();
  msg->request = std::make_shared<BasicRequest>();
  msg->buffer = buffer.data();
  msg->capacity = buffer.size();
  msg->pending = 1;
  auto op = std::make_unique<Op>();
  op->kind = OpKind::recv_first;
  op->message = msg;
  Op* raw = op.get();
  size_t len = std::min(buffer.size(), fragment_);
  void* desc = local_desc(*conn, mr);
  bool posted = post_op(*conn, std::move(op), [ep = conn->ep, buf = buffer.data(), len, desc](void* ctx) {
    return fi_recv(ep, buf, len, desc, FI_ADDR_UNSPEC, ctx);
  });
  if (posted) {
    // Only the first fragment can be withdrawn; the provider reports FI_ECANCELED for it.
    std::weak_ptr<ConnState> weak = conn;
    msg->request->set_cancel_hook([this, weak, raw] {
      auto locked = weak.lock();
      if (!locked) return;
      std::lock_guard hook_lock(mutex_);
      if (locked->broken || locked->ops.count(raw) == 0) return;
      if (raw->posted) {
        fi_cancel(&locked->ep->fid, &raw->context);
        return;
      }
      std::erase_if(locked->backlog, [raw](const auto& entry) { return entry.first == raw; });
      raw->message->request->complete(Status{Errc::cancelled, "receive cancelled"}, 0);
      locked->ops.erase(raw);
    });
  }
  return msg->request;
}

std::shared_ptr<Request> OfiTransport::post_write(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> local,
                                                  MemoryRegion* local_mr, const RemoteBuffer& remote) {
  if (!rma_) throw Error(Errc::unsupported, "ofi+" + provider_ + " offers no RMA write here");
  if (remote.key.size() != kRemoteKeyBytes) throw Error(Errc::invalid_argument, "remote key is not an ofi key (wrong size)");
  uint64_t words[3];
  std::memcpy(words, remote.key.data(), kRemoteKeyBytes);
  if (remote.offset > words[2] || local.size() > words[2] - remote.offset) {
    throw Error(Errc::invalid_argument, "RMA write of " + std::to_string(local.size()) + " bytes at offset " +
                                            std::to_string(remote.offset) + " overruns the remote region of " + std::to_string(words[2]));
  }
  std::lock_guard lock(mutex_);
  if (conn->broken) return finished_request(conn->broken_status);
  auto msg = std::make_shared<Message>();
  msg->request = std::make_shared<BasicRequest>();
  msg->total = local.size();
  size_t count = local.empty() ? 0 : (local.size() + fragment_ - 1) / fragment_;
  if (count == 0) {
    msg->request->complete(Status::success(), 0);
    return msg->request;
  }
  msg->pending = count;
  void* desc = local_desc(*conn, local_mr);
  for (size_t i = 0; i < count; ++i) {
    size_t offset = i * fragment_;
    size_t len = std::min(fragment_, local.size() - offset);
    auto op = std::make_unique<Op>();
    op->kind = OpKind::write;
    op->message = msg;
    auto* buf = const_cast<std::byte*>(local.data()) + offset;
    uint64_t addr = words[0] + remote.offset + offset;
    if (!post_op(*conn, std::move(op), [ep = conn->ep, buf, len, desc, peer = conn->peer, addr, key = words[1]](void* ctx) { return fi_write(ep, buf, len, desc, peer, addr, key, ctx); })) break;
  }
  return msg->request;
}

void OfiTransport::drive(ConnState& conn) {
  fi_cq_tagged_entry entries[32];
  while (!conn.broken) {
    ssize_t n = fi_cq_read(conn.cq, entries, 32);
    if (n == -FI_EAGAIN) return;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(conn.cq, &err, 0) > 0) handle_error(conn, err);
      continue;
    }
    if (n < 0) {
      fail(conn, Status{Errc::connection, "fi_cq_read failed: " + fi_text(static_cast<int>(n))});
      return;
    }
    for (ssize_t i = 0; i < n && !conn.broken; ++i) handle(conn, static_cast<Op*>(entries[i].op_context), entries[i]);
  }
}

void OfiTransport::handle(ConnState& conn, Op* raw, const fi_cq_tagged_entry& entry) {
  auto found = conn.ops.find(raw);
  if (found == conn.ops.end()) return;
  std::unique_ptr<Op> op = std::move(found->second);
  conn.ops.erase(found);
  if (op->posted) --(op->kind == OpKind::send || op->kind == OpKind::write ? conn.sends_in_flight : conn.recvs_in_flight);
  Message& msg = *op->message;
  if (op->kind == OpKind::recv_first) {
    if ((entry.flags & FI_REMOTE_CQ_DATA) == 0) {
      msg.request->complete(Status{Errc::corrupt_frame, "first fragment without its length (no remote CQ data)"}, 0);
      fail(conn, Status{Errc::connection, "peer speaks another protocol"});
      return;
    }
    msg.total = entry.data & kLowMask;
    if (msg.total > msg.capacity) {
      msg.request->complete(Status{Errc::invalid_argument, "message of " + std::to_string(msg.total) +
                                                              " bytes is larger than the receive buffer of " + std::to_string(msg.capacity)},
                            0);
      fail(conn, Status{Errc::connection, "connection closed after an oversized message"});
      return;
    }
    size_t count = msg.total == 0 ? 1 : (msg.total + fragment_ - 1) / fragment_;
    uint64_t seq = entry.data & (kSeqMask << kSeqShift);
    msg.pending = count - 1;
    for (size_t i = 1; i < count; ++i) {
      size_t offset = i * fragment_;
      size_t len = std::min(fragment_, msg.total - offset);
      auto cont = std::make_unique<Op>();
      cont->kind = OpKind::recv_cont;
      cont->message = op->message;
      std::byte* buf = msg.buffer + offset;
      uint64_t tag = kKindCont | seq | i;
      if (!post_op(conn, std::move(cont), [ep = conn.ep, buf, len, tag](void* ctx) { return fi_trecv(ep, buf, len, nullptr, FI_ADDR_UNSPEC, tag, 0, ctx); })) return;
    }
  } else {
    --msg.pending;
  }
  if (msg.pending == 0) msg.request->complete(Status::success(), msg.total);
}

void OfiTransport::handle_error(ConnState& conn, const fi_cq_err_entry& err) {
  auto* raw = static_cast<Op*>(err.op_context);
  auto found = conn.ops.find(raw);
  if (found == conn.ops.end()) return;
  std::unique_ptr<Op> op = std::move(found->second);
  conn.ops.erase(found);
  if (op->posted) --(op->kind == OpKind::send || op->kind == OpKind::write ? conn.sends_in_flight : conn.recvs_in_flight);
  int code = err.err < 0 ? -err.err : err.err;
  if (code == FI_ECANCELED) {
    op->message->request->complete(Status{Errc::cancelled, "receive cancelled"}, 0);
    return;
  }
  if (code == FI_ETRUNC || code == FI_EMSGSIZE) {
    op->message->request->complete(
        Status{Errc::invalid_argument, "message larger than the receive buffer of " + std::to_string(op->message->capacity) + " bytes"}, 0);
    fail(conn, Status{Errc::connection, "connection closed after an oversized message"});
    return;
  }
  Status why{Errc::connection, "libfabric completion error: " + fi_text(err.err)};
  op->message->request->complete(why, 0);
  fail(conn, why);
}

void OfiTransport::fail(ConnState& conn, const Status& why) {
  if (conn.broken) return;
  conn.broken = true;
  conn.broken_status = why;
  if (conn.liveness) conn.liveness->shutdown();
  // Closing the endpoint first guarantees the provider no longer touches user buffers.
  if (conn.ep) fi_close(&conn.ep->fid);
  if (conn.cq) fi_close(&conn.cq->fid);
  if (conn.av) fi_close(&conn.av->fid);
  for (auto& [region, mr] : conn.registrations) fi_close(&mr->fid);
  conn.registrations.clear();
  if (conn.domain) fi_close(&conn.domain->fid);
  conn.domain = nullptr;
  conn.ep = nullptr;
  conn.cq = nullptr;
  conn.av = nullptr;
  conn.backlog.clear();
  for (auto& [raw, op] : conn.ops) op->message->request->complete(why, 0);
  conn.ops.clear();
  log_->debug("ofi: connection to {} closed: {}", conn.peer_url, why.message);
}

void OfiTransport::close_connection(const std::shared_ptr<ConnState>& conn, const Status& why) {
  std::lock_guard lock(mutex_);
  fail(*conn, why);
  std::erase(conns_, conn);
}

// Spins while requests are pending (manual-progress providers move data only inside
// fi_cq_read, so a sleeping thread stalls the transfer), backs off to short sleeps once nothing
// has completed for a while, and sleeps on the condition variable between heartbeats when idle.
// "A while" adapts to the transfer: 4x the last gap between completions (2..50 ms), so a stream
// of large messages (8 MiB at ~2 GB/s completes every ~4 ms) is never slept through, while a
// receive posted for a message that does not come stops burning CPU after at most 50 ms.
void OfiTransport::progress_loop() {
  constexpr std::chrono::microseconds kMinSpin = 2ms;
  constexpr std::chrono::microseconds kMaxSpin = 50ms;
  auto last_activity = Clock::now();
  auto last_liveness = Clock::now();
  std::chrono::microseconds spin_window = kMinSpin;
  std::unique_lock lock(mutex_);
  while (!stop_) {
    bool pending = false;
    bool progressed = false;
    auto now = Clock::now();
    bool check_liveness = now - last_liveness >= 2ms;
    for (auto& conn : conns_) {
      if (conn->broken) continue;
      size_t before = conn->ops.size();
      drive(*conn);
      retry_backlog(*conn);
      progressed = progressed || conn->ops.size() != before;
      if (check_liveness && !conn->broken) {
        Status alive = conn->liveness->poll(now);
        if (!alive.ok()) fail(*conn, alive);
      }
      pending = pending || conn->has_pending();
    }
    if (progressed) {
      auto gap = std::chrono::duration_cast<std::chrono::microseconds>(now - last_activity);
      spin_window = std::clamp<std::chrono::microseconds>(4 * gap, kMinSpin, kMaxSpin);
      last_activity = now;
    }
    if (check_liveness) last_liveness = now;
    if (!pending) {
      auto slice = std::min<std::chrono::milliseconds>(options_.heartbeat_interval / 2, 50ms);
      wake_.wait_for(lock, std::max<std::chrono::milliseconds>(slice, 1ms));
      last_activity = Clock::now();
      spin_window = kMinSpin;
    } else if (now - last_activity > spin_window) {
      lock.unlock();
      std::this_thread::sleep_for(100us);
      lock.lock();
    } else {
      lock.unlock();
      sched_yield();
      lock.lock();
    }
  }
}

using OfiConnection = EngineConnection<OfiTransport, ConnState>;

// The Transport handed out: owns the shared engine so connections can keep it reachable.
using OfiTransportHandle = EngineTransport<OfiTransport>;

void check_scheme(const Url& url, const std::string& provider) {
  if (url.scheme != "ofi" || url.provider != provider) {
    throw Error(Errc::invalid_argument, "ofi+" + provider + " transport can not use URL " + url.str());
  }
}

std::unique_ptr<Listener> OfiTransport::listen(const Url& url) {
  check_scheme(url, provider_);
  auto self = shared_from_this();
  return std::make_unique<side::AcceptingListener>(
      url, options().secret, options().connect_timeout,
      [self](side::Fd fd, Clock::time_point deadline) -> std::unique_ptr<Connection> {
        return std::make_unique<OfiConnection>(self, self->establish(std::move(fd), true, deadline));
      });
}

std::unique_ptr<Connection> OfiTransport::connect(const Url& url, std::chrono::milliseconds timeout) {
  check_scheme(url, provider_);
  const auto deadline = Clock::now() + timeout;
  side::Fd fd = side::connect_authenticated(url.host, url.port, options_.secret, deadline);
  return std::make_unique<OfiConnection>(shared_from_this(), establish(std::move(fd), false, deadline));
}

}  // namespace
}  // namespace deltacast::transport::ofi

namespace deltacast::transport {

std::unique_ptr<Transport> make_ofi_transport(std::string_view provider, const TransportOptions& options) {
  return std::make_unique<ofi::OfiTransportHandle>(std::make_shared<ofi::OfiTransport>(std::string(provider), options));
}

}  // namespace deltacast::transport
