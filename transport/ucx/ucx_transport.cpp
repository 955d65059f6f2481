// UCX backend (ucx://host:port). Design, in short (docs/transport-ofi-ucx.md has the why):
//  * One ucp context + one worker per Transport, driven by one progress thread; every ucp call is
//    serialised by the Transport's mutex (UCS_THREAD_MODE_SINGLE), so user threads may post
//    concurrently.
//  * Tag matching (ucp_tag_send_nbx / ucp_tag_recv_nbx): UCX's fastest, best-tuned path (eager for
//    small, rendezvous for large messages: on tcp under error mode PEER as 512 KiB active-message
//    fragments, see apply of kTcpSettings), message boundaries and truncation detection
//    are native, and no fragmentation is needed. Each Connection owns a 32-bit receive id; the peer
//    tags every message with it (full-mask match), so connections sharing the worker never mix and
//    receives match messages in posting order.
//  * The TCP side channel (transport/side_channel.h) authenticates the peer before any UCX
//    endpoint exists, carries the worker addresses + receive ids, and then heartbeats: EOF or
//    silence fails the link (UCX alone reports neither a SIGSTOPped peer nor an orderly close).
//  * Progress: the thread spins only while completions keep coming (kSpinWindow); otherwise it arms
//    the worker (ucp_worker_arm) and sleeps in epoll on the worker's event fd plus an eventfd that
//    every post writes, so a quiet transfer costs no CPU and a new event wakes it at once. (The
//    earlier 100 us back-off sleeps made tcp rendezvous transfers run at ~0.4x of ucx_perftest.)
//  * RMA: ucp_mem_map + ucp_rkey_pack; post_write = ucp_put_nbx + ucp_ep_flush_nbx, and sends
//    posted while a write is unflushed wait for the flush (writes are ordered before later sends).
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "transport/accepting_listener.h"
#include "transport/basic_request.h"
#include "transport/engine_handles.h"
#include "transport/side_channel.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_transport.h"
#include "util/log.h"

namespace deltacast::transport::ucx {
namespace {

using namespace std::chrono_literals;
using side::Clock;

constexpr uint64_t kFullMask = ~uint64_t{0};
constexpr size_t kMaxSetupBlob = 64 * 1024;

std::string ucs_text(ucs_status_t status) { return ucs_status_string(status); }

class UcxTransport;
struct ConnState;

enum class OpKind { send, recv, put, flush };

// Lives until UCX reports the operation finished (callback or immediate completion), so the
// callback's user_data never dangles.
struct Op {
  UcxTransport* transport = nullptr;
  std::shared_ptr<ConnState> conn;
  OpKind kind = OpKind::send;
  std::shared_ptr<BasicRequest> request;
  size_t bytes = 0;
  size_t capacity = 0;
  void* ucx_request = nullptr;
  ucp_rkey_h rkey = nullptr;
  ucp_tag_recv_info_t recv_info{};  // filled by UCX when a receive completes immediately
  // UCX may run the callback inside the posting call: then it only records the outcome here and
  // track() finishes the op once the post returned.
  bool in_post = true;
  bool done_in_post = false;
  ucs_status_t done_status = UCS_OK;
  size_t done_length = 0;
};

// Guarded by UcxTransport::mutex_.
struct ConnState {
  UcxTransport* owner = nullptr;
  ucp_ep_h ep = nullptr;
  uint32_t recv_id = 0;  // our receives match tags with this id
  uint64_t send_tag = 0; // the peer's receive id, shifted
  std::unique_ptr<side::Liveness> liveness;
  std::unordered_set<Op*> ops;
  std::deque<std::function<void()>> deferred_sends;  // waiting for a write flush
  size_t writes_unflushed = 0;
  bool broken = false;
  Status broken_status;
  std::string peer_url;
};

class UcxMemoryRegion final : public MemoryRegion {
 public:
  UcxMemoryRegion(std::mutex& mutex, ucp_context_h context, ucp_mem_h memh, std::span<std::byte> bytes,
                  std::vector<std::byte> key)
      : mutex_(mutex), context_(context), memh_(memh), bytes_(bytes), key_(std::move(key)) {}
  ~UcxMemoryRegion() override {
    std::lock_guard lock(mutex_);
    ucp_mem_unmap(context_, memh_);
  }
  std::span<std::byte> bytes() const override { return bytes_; }
  MemoryKind kind() const override { return MemoryKind::host; }
  std::vector<std::byte> remote_key() const override { return key_; }
  ucp_mem_h memh() const { return memh_; }

 private:
  std::mutex& mutex_;
  ucp_context_h context_;
  ucp_mem_h memh_;
  std::span<std::byte> bytes_;
  std::vector<std::byte> key_;  // [u64 address][u64 length][packed rkey]
};

std::shared_ptr<BasicRequest> finished_request(Status status, size_t bytes = 0) {
  auto request = std::make_shared<BasicRequest>();
  request->complete(std::move(status), bytes);
  return request;
}

class UcxTransport final : public Transport, public std::enable_shared_from_this<UcxTransport> {
 public:
  explicit UcxTransport(const TransportOptions& options);
  ~UcxTransport() override;

  std::unique_ptr<Listener> listen(const Url& url) override;
  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) override;
  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override;
  Capabilities capabilities() const override;

  std::shared_ptr<ConnState> establish(side::Fd fd, bool is_server, Clock::time_point deadline);
  std::shared_ptr<Request> post_send(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> message, MemoryRegion* mr);
  std::shared_ptr<Request> post_recv(const std::shared_ptr<ConnState>& conn, std::span<std::byte> buffer, MemoryRegion* mr);
  std::shared_ptr<Request> post_write(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> local,
                                      MemoryRegion* local_mr, const RemoteBuffer& remote);
  void close_connection(const std::shared_ptr<ConnState>& conn, const Status& why);
  const TransportOptions& options() const { return options_; }

  // UCX callbacks (run inside ucp_worker_progress, a post or ucp_request_cancel, mutex_ held).
  void callback(Op* op, ucs_status_t status, size_t received);
  void finished(Op* op, ucs_status_t status, size_t received);
  void fail(ConnState& conn, const Status& why);

 private:
  // Registers an op before its nbx post (so a callback run inside the post finds it).
  Op* begin(std::unique_ptr<Op> op);
  // Settles a nbx post: immediate completion, error, or a request finished later by a callback.
  void track(Op* op, ucs_status_ptr_t result);
  void start_send(const std::shared_ptr<ConnState>& conn, const std::shared_ptr<BasicRequest>& request,
                  std::span<const std::byte> message, MemoryRegion* mr);
  void progress_loop();
  // ucp_worker_progress, then the force-close of every endpoint fail() met inside it. mutex_ held.
  unsigned progress();
  // Force-closes `ep`; its close request is reaped later (closing_). mutex_ held.
  void close_ep(ucp_ep_h ep);
  // Creates the eventfd and the epoll set over it and the worker's event fd. Throws Errc::internal.
  void setup_wakeup();
  // Wakes the progress thread out of epoll_wait (a post, a new connection). mutex_ held. A no-op
  // while the thread is awake: it sees the new work before it next arms, and a syscall per post
  // would cost more than the post itself for small messages.
  void wake();
  // Sleeps until the worker has an event, wake() is called or `timeout` passes. Called without mutex_.
  void wait_for_events(std::chrono::milliseconds timeout);

  TransportOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  uint32_t next_recv_id_ = 1;
  std::mutex mutex_;
  std::vector<std::shared_ptr<ConnState>> conns_;
  std::vector<void*> closing_;  // ep close requests still in flight
  bool progressing_ = false;    // inside progress(): UCX callbacks may run
  std::vector<ucp_ep_h> eps_to_close_;  // failed inside progress(), closed once it returns
  side::Fd wake_fd_;   // eventfd written by wake()
  side::Fd epoll_fd_;  // watches the worker's event fd and wake_fd_
  bool sleeping_ = false;  // the progress thread is in (or about to enter) epoll_wait; mutex_
  bool stop_ = false;
  std::thread progress_;
  std::shared_ptr<spdlog::logger> log_ = logger("transport");
};

void send_callback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->ucx_request = request;
  op->transport->callback(op, status, op->bytes);
}

void recv_callback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->ucx_request = request;
  op->transport->callback(op, status, info != nullptr ? info->length : 0);
}

// A new operation of `kind` on `conn`, finishing `request` (bytes: reported on success).
std::unique_ptr<Op> new_op(UcxTransport* transport, const std::shared_ptr<ConnState>& conn, OpKind kind,
                           std::shared_ptr<BasicRequest> request, size_t bytes) {
  auto op = std::make_unique<Op>();
  op->transport = transport;
  op->conn = conn;
  op->kind = kind;
  op->request = std::move(request);
  op->bytes = bytes;
  return op;
}

// Parameters that route UCX's completion of a send, put or flush to `op`, with `mr`'s memory
// handle when it is a UCX region.
ucp_request_param_t op_params(Op* op, MemoryRegion* mr) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.cb.send = send_callback;
  params.user_data = op;
  if (auto* ucx_mr = dynamic_cast<UcxMemoryRegion*>(mr)) {
    params.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    params.memh = ucx_mr->memh();
  }
  return params;
}

void ep_error_callback(void* arg, ucp_ep_h, ucs_status_t status) {
  // The ConnState is kept alive by the transport's list until its endpoint is closed.
  auto* conn = static_cast<ConnState*>(arg);
  conn->owner->fail(*conn, Status{Errc::connection, "UCX endpoint failed: " + ucs_text(status)});
}

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

UcxTransport::UcxTransport(const TransportOptions& options) : options_(options) {
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
      std::erase_if(closing_, [](void* request) {
        if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
        ucp_request_free(request);
        return true;
      });
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

Capabilities UcxTransport::capabilities() const {
  Capabilities caps;
  caps.backend = "ucx";
  caps.rma = true;
  caps.cuda_memory = false;  // UCX here is built without CUDA
  caps.zero_copy_send = true;
  caps.max_message = options_.max_message_bytes;
  caps.authenticated = !options_.secret.empty();
  return caps;
}

std::unique_ptr<MemoryRegion> UcxTransport::register_memory(std::span<std::byte> bytes, MemoryKind kind) {
  if (kind != MemoryKind::host) throw Error(Errc::unsupported, "ucx: CUDA memory is not supported by this build");
  std::lock_guard lock(mutex_);
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = bytes.data();
  params.length = bytes.size();
  ucp_mem_h memh = nullptr;
  ucs_status_t status = ucp_mem_map(context_, &params, &memh);
  if (status != UCS_OK) throw Error(Errc::internal, "ucp_mem_map: " + ucs_text(status));
  void* packed = nullptr;
  size_t packed_size = 0;
  status = ucp_rkey_pack(context_, memh, &packed, &packed_size);
  if (status != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    throw Error(Errc::internal, "ucp_rkey_pack: " + ucs_text(status));
  }
  std::vector<std::byte> key(16 + packed_size);
  uint64_t words[2] = {reinterpret_cast<uint64_t>(bytes.data()), bytes.size()};
  std::memcpy(key.data(), words, 16);
  std::memcpy(key.data() + 16, packed, packed_size);
  ucp_rkey_buffer_release(packed);
  return std::make_unique<UcxMemoryRegion>(mutex_, context_, memh, bytes, std::move(key));
}

std::shared_ptr<ConnState> UcxTransport::establish(side::Fd fd, bool is_server, Clock::time_point deadline) {
  auto conn = std::make_shared<ConnState>();
  conn->owner = this;
  conn->peer_url = "ucx://" + side::peer_address(fd.get());
  std::vector<std::byte> mine;
  {
    std::lock_guard lock(mutex_);
    conn->recv_id = next_recv_id_++;
    ucp_address_t* address = nullptr;
    size_t length = 0;
    ucs_status_t status = ucp_worker_get_address(worker_, &address, &length);
    if (status != UCS_OK) throw Error(Errc::internal, "ucp_worker_get_address: " + ucs_text(status));
    mine.resize(4 + length);
    std::memcpy(mine.data(), &conn->recv_id, 4);
    std::memcpy(mine.data() + 4, address, length);
    ucp_worker_release_address(worker_, address);
  }
  std::vector<std::byte> theirs;
  if (is_server) {
    theirs = side::recv_blob(fd.get(), kMaxSetupBlob, deadline);
    side::send_blob(fd.get(), mine, deadline);
  } else {
    side::send_blob(fd.get(), mine, deadline);
    theirs = side::recv_blob(fd.get(), kMaxSetupBlob, deadline);
  }
  if (theirs.size() < 5) throw Error(Errc::corrupt_frame, "ucx: peer's setup blob is too short");
  uint32_t peer_id = 0;
  std::memcpy(&peer_id, theirs.data(), 4);
  conn->send_tag = uint64_t{peer_id} << 32;
  {
    std::lock_guard lock(mutex_);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(theirs.data() + 4);
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = ep_error_callback;
    params.err_handler.arg = conn.get();
    ucs_status_t status = ucp_ep_create(worker_, &params, &conn->ep);
    if (status != UCS_OK) throw Error(Errc::connection, "ucp_ep_create: " + ucs_text(status));
  }
  try {
    std::byte ready{'R'};
    if (is_server) {
      side::read_exact(fd.get(), std::span(&ready, 1), deadline);
    } else {
      side::write_exact(fd.get(), std::span(&ready, 1), deadline);
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    fail(*conn, Status{Errc::connection, "setup failed"});
    conns_.push_back(conn);  // kept until its forced close finished
    throw;
  }
  std::lock_guard lock(mutex_);
  conn->liveness = std::make_unique<side::Liveness>(std::move(fd), options_.heartbeat_interval, options_.peer_timeout);
  conns_.push_back(conn);
  wake();
  return conn;
}

Op* UcxTransport::begin(std::unique_ptr<Op> op) {
  Op* raw = op.release();
  raw->conn->ops.insert(raw);
  return raw;
}

void UcxTransport::callback(Op* op, ucs_status_t status, size_t received) {
  if (op->in_post) {
    op->done_in_post = true;
    op->done_status = status;
    op->done_length = received;
    return;
  }
  finished(op, status, received);
}

void UcxTransport::track(Op* raw, ucs_status_ptr_t result) {
  raw->in_post = false;
  if (raw->done_in_post) {
    if (UCS_PTR_IS_PTR(result)) raw->ucx_request = result;
    finished(raw, raw->done_status, raw->done_length);
  } else if (result == nullptr) {
    finished(raw, UCS_OK, raw->kind == OpKind::recv ? raw->recv_info.length : raw->bytes);
  } else if (UCS_PTR_IS_ERR(result)) {
    finished(raw, UCS_PTR_STATUS(result), 0);
  } else {
    raw->ucx_request = result;
  }
}

void UcxTransport::finished(Op* op, ucs_status_t status, size_t received) {
  std::unique_ptr<Op> owned(op);
  auto conn = op->conn;
  conn->ops.erase(op);
  if (op->ucx_request != nullptr) ucp_request_free(op->ucx_request);
  if (op->rkey != nullptr) ucp_rkey_destroy(op->rkey);
  if (op->kind == OpKind::put) return;  // the flush that follows completes the write request
  if (op->kind == OpKind::flush) {
    if (conn->writes_unflushed > 0) --conn->writes_unflushed;
    if (op->request) op->request->complete(status == UCS_OK ? Status::success() : Status{Errc::connection, "UCX write failed: " + ucs_text(status)}, op->bytes);
    if (status != UCS_OK) fail(*conn, Status{Errc::connection, "UCX write flush failed: " + ucs_text(status)});
    while (conn->writes_unflushed == 0 && !conn->deferred_sends.empty()) {
      auto next = std::move(conn->deferred_sends.front());
      conn->deferred_sends.pop_front();
      next();
    }
    return;
  }
  if (status == UCS_OK) {
    op->request->complete(Status::success(), op->kind == OpKind::recv ? received : op->bytes);
  } else if (status == UCS_ERR_CANCELED && !conn->broken) {
    op->request->complete(Status{Errc::cancelled, "receive cancelled"}, 0);
  } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    op->request->complete(Status{Errc::invalid_argument, "message larger than the receive buffer of " + std::to_string(op->capacity) + " bytes"}, 0);
    fail(*conn, Status{Errc::connection, "connection closed after an oversized message"});
  } else {
    Status why = conn->broken ? conn->broken_status : Status{Errc::connection, "UCX operation failed: " + ucs_text(status)};
    op->request->complete(why, 0);
    fail(*conn, why);
  }
}

void UcxTransport::fail(ConnState& conn, const Status& why) {
  if (conn.broken) return;
  conn.broken = true;
  conn.broken_status = why;
  if (conn.liveness) conn.liveness->shutdown();
  for (auto& deferred : conn.deferred_sends) (void)deferred;  // their requests fail below
  conn.deferred_sends.clear();
  // Receives sit on the shared worker: cancel them (their callbacks finish the requests). A
  // forced close makes UCX finish every send/put on the endpoint with an error.
  std::vector<Op*> ops(conn.ops.begin(), conn.ops.end());
  for (Op* op : ops) {
    if (op->request) op->request->complete(why, 0);
    if (op->kind == OpKind::recv && op->ucx_request != nullptr) ucp_request_cancel(worker_, op->ucx_request);
  }
  if (conn.ep != nullptr) {
    // Inside ucp_worker_progress UCX may be failing this endpoint's requests one by one (a request
    // callback brought us here): closing the endpoint there aborts the process on UCX's assertion
    // that it has no request left (ucp_ep.c, proto_reqs; seen in bench/recovery chaos with ucx).
    // It is closed once progress returns.
    if (progressing_) {
      eps_to_close_.push_back(conn.ep);
    } else {
      close_ep(conn.ep);
    }
    conn.ep = nullptr;
  }
  log_->debug("ucx: connection to {} closed: {}", conn.peer_url, why.message);
}

void UcxTransport::close_ep(ucp_ep_h ep) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t closing = ucp_ep_close_nbx(ep, &params);
  if (UCS_PTR_IS_PTR(closing)) closing_.push_back(closing);
}

unsigned UcxTransport::progress() {
  progressing_ = true;
  const unsigned events = ucp_worker_progress(worker_);
  // A forced close finishes the endpoint's requests, whose callbacks may fail more connections.
  while (!eps_to_close_.empty()) {
    const std::vector<ucp_ep_h> eps = std::move(eps_to_close_);
    eps_to_close_.clear();
    for (ucp_ep_h ep : eps) close_ep(ep);
  }
  progressing_ = false;
  return events;
}

void UcxTransport::start_send(const std::shared_ptr<ConnState>& conn, const std::shared_ptr<BasicRequest>& request,
                              std::span<const std::byte> message, MemoryRegion* mr) {
  if (conn->broken) {
    request->complete(conn->broken_status, 0);
    return;
  }
  auto op = new_op(this, conn, OpKind::send, request, message.size());
  ucp_request_param_t params = op_params(op.get(), mr);
  Op* raw = begin(std::move(op));
  track(raw, ucp_tag_send_nbx(conn->ep, message.data(), message.size(), conn->send_tag, &params));
}

std::shared_ptr<Request> UcxTransport::post_send(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> message,
                                                 MemoryRegion* mr) {
  if (message.size() > options_.max_message_bytes) {
    throw Error(Errc::invalid_argument, "message of " + std::to_string(message.size()) + " bytes exceeds max_message_bytes " +
                                            std::to_string(options_.max_message_bytes));
  }
  std::lock_guard lock(mutex_);
  auto request = std::make_shared<BasicRequest>();
  if (conn->writes_unflushed > 0 || !conn->deferred_sends.empty()) {
    std::weak_ptr<ConnState> weak = conn;
    conn->deferred_sends.push_back([this, weak, request, message, mr] {
      if (auto locked = weak.lock()) start_send(locked, request, message, mr);
    });
    if (conn->broken) request->complete(conn->broken_status, 0);
    return request;
  }
  start_send(conn, request, message, mr);
  wake();
  return request;
}

std::shared_ptr<Request> UcxTransport::post_recv(const std::shared_ptr<ConnState>& conn, std::span<std::byte> buffer,
                                                 MemoryRegion* mr) {
  std::lock_guard lock(mutex_);
  if (conn->broken) return finished_request(conn->broken_status);
  auto op = new_op(this, conn, OpKind::recv, std::make_shared<BasicRequest>(), 0);
  op->capacity = buffer.size();
  auto request = op->request;
  ucp_request_param_t params = op_params(op.get(), mr);
  params.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // the callback reports the length
  params.cb.recv = recv_callback;
  params.recv_info.tag_info = &op->recv_info;
  Op* raw = begin(std::move(op));
  ucs_status_ptr_t result = ucp_tag_recv_nbx(worker_, buffer.data(), buffer.size(), uint64_t{conn->recv_id} << 32, kFullMask, &params);
  bool pending = UCS_PTR_IS_PTR(result) && !raw->done_in_post;
  track(raw, result);
  if (pending) {
    std::weak_ptr<ConnState> weak = conn;
    request->set_cancel_hook([this, weak, raw] {
      auto locked = weak.lock();
      if (!locked) return;
      std::lock_guard hook_lock(mutex_);
      // A receive not yet matched is withdrawn; a matched one finishes normally.
      if (locked->ops.count(raw) != 0 && raw->ucx_request != nullptr) ucp_request_cancel(worker_, raw->ucx_request);
    });
  }
  wake();
  return request;
}

std::shared_ptr<Request> UcxTransport::post_write(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> local,
                                                  MemoryRegion* local_mr, const RemoteBuffer& remote) {
  if (remote.key.size() <= 16) throw Error(Errc::invalid_argument, "remote key is not a ucx key (too short)");
  uint64_t words[2];
  std::memcpy(words, remote.key.data(), 16);
  if (remote.offset > words[1] || local.size() > words[1] - remote.offset) {
    throw Error(Errc::invalid_argument, "RMA write of " + std::to_string(local.size()) + " bytes at offset " +
                                            std::to_string(remote.offset) + " overruns the remote region of " + std::to_string(words[1]));
  }
  std::lock_guard lock(mutex_);
  if (conn->broken) return finished_request(conn->broken_status);
  ucp_rkey_h rkey = nullptr;
  ucs_status_t status = ucp_ep_rkey_unpack(conn->ep, remote.key.data() + 16, &rkey);
  if (status != UCS_OK) throw Error(Errc::invalid_argument, "ucp_ep_rkey_unpack: " + ucs_text(status));
  auto request = std::make_shared<BasicRequest>();
  auto put = new_op(this, conn, OpKind::put, nullptr, 0);
  put->rkey = rkey;
  ucp_request_param_t params = op_params(put.get(), local_mr);
  ++conn->writes_unflushed;
  Op* put_raw = begin(std::move(put));
  track(put_raw, ucp_put_nbx(conn->ep, local.data(), local.size(), words[0] + remote.offset, rkey, &params));
  if (conn->broken) return request->complete(conn->broken_status, 0), request;
  // Flush: the write request finishes when the data is in the peer's memory.
  auto flush = new_op(this, conn, OpKind::flush, request, local.size());
  ucp_request_param_t flush_params = op_params(flush.get(), nullptr);
  Op* flush_raw = begin(std::move(flush));
  track(flush_raw, conn->broken ? UCS_STATUS_PTR(UCS_ERR_CANCELED) : ucp_ep_flush_nbx(conn->ep, &flush_params));
  wake();
  return request;
}

void UcxTransport::close_connection(const std::shared_ptr<ConnState>& conn, const Status& why) {
  std::lock_guard lock(mutex_);
  fail(*conn, why);
}

void UcxTransport::setup_wakeup() {
  int worker_fd = -1;
  ucs_status_t status = ucp_worker_get_efd(worker_, &worker_fd);
  if (status != UCS_OK) throw Error(Errc::internal, "ucp_worker_get_efd: " + ucs_text(status));
  wake_fd_ = side::Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  epoll_fd_ = side::Fd(epoll_create1(EPOLL_CLOEXEC));
  if (!wake_fd_ || !epoll_fd_) throw Error(Errc::internal, std::string("eventfd/epoll_create1: ") + std::strerror(errno));
  for (int fd : {worker_fd, wake_fd_.get()}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      throw Error(Errc::internal, std::string("epoll_ctl: ") + std::strerror(errno));
    }
  }
}

void UcxTransport::wake() {
  if (!sleeping_) return;
  sleeping_ = false;
  uint64_t one = 1;
  // Fails only with EAGAIN when the counter is saturated, which still leaves the fd readable.
  [[maybe_unused]] ssize_t written = ::write(wake_fd_.get(), &one, sizeof one);
}

void UcxTransport::wait_for_events(std::chrono::milliseconds timeout) {
  epoll_event events[2];
  int count = epoll_wait(epoll_fd_.get(), events, 2, static_cast<int>(timeout.count()));
  for (int i = 0; i < count; ++i) {
    if (events[i].data.fd != wake_fd_.get()) continue;
    uint64_t drained = 0;
    [[maybe_unused]] ssize_t got = ::read(wake_fd_.get(), &drained, sizeof drained);
  }
}

// Spin (progress + sched_yield) while completions keep arriving: on a busy link the next event is
// microseconds away and a sleep/wake round trip would cost more. Once the link is quiet for
// kSpinWindow, arm the worker and sleep in epoll: UCX's event fd (or a post's wake()) ends the
// sleep at once. The epoll timeout only paces liveness checks and the reaping of ep close
// requests; it is 1 ms while requests are pending, a safety net should a transport not signal.
void UcxTransport::progress_loop() {
  constexpr auto kSpinWindow = 200us;
  constexpr int kMaxProgressBurst = 64;  // bounded so liveness checks still run under load
  auto last_activity = Clock::now();
  auto last_liveness = Clock::now();
  std::unique_lock lock(mutex_);
  while (!stop_) {
    int burst = 0;
    while (burst < kMaxProgressBurst && progress() != 0) ++burst;
    auto now = Clock::now();
    if (burst > 0) last_activity = now;
    if (now - last_liveness >= 2ms) {
      last_liveness = now;
      for (auto& conn : conns_) {
        if (conn->broken || !conn->liveness) continue;
        Status alive = conn->liveness->poll(now);
        if (!alive.ok()) fail(*conn, alive);
      }
      std::erase_if(closing_, [](void* request) {
        if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
        ucp_request_free(request);
        return true;
      });
      // Connections that are closed and have no UCX operation left are forgotten.
      std::erase_if(conns_, [](const std::shared_ptr<ConnState>& conn) {
        return conn->broken && conn->ops.empty() && conn.use_count() == 1;
      });
    }
    bool pending = !closing_.empty();
    for (auto& conn : conns_) pending = pending || !conn->ops.empty();
    if (pending && now - last_activity < kSpinWindow) {
      lock.unlock();
      sched_yield();
      lock.lock();
      continue;
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;  // events arrived since the last progress
    auto idle_slice = std::clamp<std::chrono::milliseconds>(options_.heartbeat_interval / 2, 1ms, 50ms);
    sleeping_ = true;
    lock.unlock();
    wait_for_events(pending ? 1ms : idle_slice);
    lock.lock();
    sleeping_ = false;
  }
}

using UcxConnection = EngineConnection<UcxTransport, ConnState>;

using UcxTransportHandle = EngineTransport<UcxTransport>;

void check_scheme(const Url& url) {
  if (url.scheme != "ucx") throw Error(Errc::invalid_argument, "ucx transport can not use URL " + url.str());
}

std::unique_ptr<Listener> UcxTransport::listen(const Url& url) {
  check_scheme(url);
  auto self = shared_from_this();
  return std::make_unique<side::AcceptingListener>(
      url, options().secret, options().connect_timeout,
      [self](side::Fd fd, Clock::time_point deadline) -> std::unique_ptr<Connection> {
        return std::make_unique<UcxConnection>(self, self->establish(std::move(fd), true, deadline));
      });
}

std::unique_ptr<Connection> UcxTransport::connect(const Url& url, std::chrono::milliseconds timeout) {
  check_scheme(url);
  const auto deadline = Clock::now() + timeout;
  side::Fd fd = side::connect_authenticated(url.host, url.port, options_.secret, deadline);
  return std::make_unique<UcxConnection>(shared_from_this(), establish(std::move(fd), false, deadline));
}

}  // namespace
}  // namespace deltacast::transport::ucx

namespace deltacast::transport {

std::unique_ptr<Transport> make_ucx_transport(const TransportOptions& options) {
  return std::make_unique<ucx::UcxTransportHandle>(std::make_shared<ucx::UcxTransport>(options));
}

}  // namespace deltacast::transport
