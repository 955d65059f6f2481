#pragma once
// UcxTransport, the engine of the UCX backend (ucx://host:port): it owns every UCX resource and
// does all the work; the handles of transport/engine_handles.h forward to it. Design, in short
// (docs/transport-ofi-ucx.md has the why):
//  * One ucp context + one worker per Transport, driven by one progress thread; every ucp call is
//    serialised by the Transport's mutex (UCS_THREAD_MODE_SINGLE), so user threads may post
//    concurrently.
//  * Tag matching (ucp_tag_send_nbx / ucp_tag_recv_nbx): UCX's fastest, best-tuned path (eager for
//    small, rendezvous for large messages: on tcp under error mode PEER as 512 KiB active-message
//    fragments, see kTcpSettings in ucx_transport.cpp), message boundaries and truncation
//    detection are native, and no fragmentation is needed (ucx_connection.h).
//  * The TCP side channel (transport/side_channel.h) authenticates the peer before any UCX
//    endpoint exists, carries the worker addresses + receive ids, and then heartbeats: EOF or
//    silence fails the link (UCX alone reports neither a SIGSTOPped peer nor an orderly close).
//  * Progress: the thread spins only while completions keep coming (kSpinWindow); otherwise it arms
//    the worker (ucp_worker_arm) and sleeps in epoll on the worker's event fd plus an eventfd that
//    every post writes, so a quiet transfer costs no CPU and a new event wakes it at once. (The
//    earlier 100 us back-off sleeps made tcp rendezvous transfers run at ~0.4x of ucx_perftest.)
//  * RMA: ucp_mem_map + ucp_rkey_pack (ucx_memory.h); post_write = ucp_put_nbx + ucp_ep_flush_nbx,
//    and sends posted while a write is unflushed wait for the flush.
// Threading: the entry points the handles call (listen, connect, register_memory, post_*,
// close_connection) may be called from any thread and take mutex_ where they need it; the members
// marked "mutex_ held", and the UCX callbacks, run with it held. Failures of a link never throw
// from post_*: they finish requests (transport/transport.h).
#include <ucp/api/ucp.h>
#include <ucs/memory/memory_type.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "transport/basic_request.h"
#include "transport/side_channel.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_connection.h"
#include "util/log.h"

namespace deltacast::transport::ucx {

inline std::string ucs_text(ucs_status_t status) { return ucs_status_string(status); }

class UcxTransport final : public Transport, public std::enable_shared_from_this<UcxTransport> {
 public:
  // ucx_transport.cpp: the context, worker and progress thread; what the backend offers.
  explicit UcxTransport(const TransportOptions& options);
  ~UcxTransport() override;
  Capabilities capabilities() const override;
  const TransportOptions& options() const { return options_; }
  // Whether this UCX registers CUDA memory (its context reports UCS_MEMORY_TYPE_CUDA), and the
  // memory types it reports, as Capabilities::cuda_memory_detail says them.
  bool cuda_memory() const;
  std::string cuda_memory_detail() const;

  // ucx_connect.cpp: connections over the side channel.
  std::unique_ptr<Listener> listen(const Url& url) override;
  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) override;
  // Creates the endpoint to the peer at the other end of an authenticated side channel. Throws.
  std::shared_ptr<ConnState> establish(side::Fd fd, bool is_server, side::Clock::time_point deadline);

  // ucx_memory.cpp.
  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override;

  // ucx_connection.cpp: posts, completions, failure.
  std::shared_ptr<Request> post_send(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> message,
                                     MemoryRegion* mr);
  std::shared_ptr<Request> post_recv(const std::shared_ptr<ConnState>& conn, std::span<std::byte> buffer,
                                     MemoryRegion* mr);
  std::shared_ptr<Request> post_write(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> local,
                                      MemoryRegion* local_mr, const RemoteBuffer& remote);
  void close_connection(const std::shared_ptr<ConnState>& conn, const Status& why);
  // Fails the connection at once (no FIN, no linger): Connection::abort.
  void abort_connection(const std::shared_ptr<ConnState>& conn, const Status& why);
  // UCX callbacks (run inside ucp_worker_progress, a post or ucp_request_cancel, mutex_ held).
  void callback(Op* op, ucs_status_t status, size_t received);
  void finished(Op* op, ucs_status_t status, size_t received);
  void fail(ConnState& conn, const Status& why);
  // The endpoint's error callback: closes it, and fails the connection unless the peer is
  // closing in order (see ucx_connection.h). mutex_ held.
  void endpoint_failed(ConnState& conn, const Status& why);

 private:
  // ucx_connection.cpp.
  // Registers an op before its nbx post (so a callback run inside the post finds it).
  Op* begin(std::unique_ptr<Op> op);
  // Settles a nbx post: immediate completion, error, or a request finished later by a callback.
  void track(Op* op, ucs_status_ptr_t result);
  void start_send(const std::shared_ptr<ConnState>& conn, const std::shared_ptr<BasicRequest>& request,
                  std::span<const std::byte> message, MemoryRegion* mr, uint64_t tag_bits = 0);
  // Posts our FIN behind every send; null when the connection failed, is closing or its peer is.
  std::shared_ptr<Request> post_fin(const std::shared_ptr<ConnState>& conn);          // mutex_ held
  std::shared_ptr<Request> post_close_flush(const std::shared_ptr<ConnState>& conn);  // mutex_ held
  // After the peer's FIN: fails the connection once no receive posted before it is pending.
  void finish_drain(ConnState& conn);  // mutex_ held
  // Liveness of every connection, and the grace of failed endpoints. mutex_ held.
  void check_connections(side::Clock::time_point now);
  // Force-closes `ep`; its close request is reaped later (closing_). mutex_ held.
  void close_ep(ucp_ep_h ep);

  // ucx_progress.cpp.
  void progress_loop();
  // ucp_worker_progress, then the force-close of every endpoint fail() met inside it. mutex_ held.
  unsigned progress();
  // Frees the ep close requests (closing_) UCX has finished. mutex_ held.
  void reap_closed_eps();
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
  uint64_t memory_types_ = 0;  // UCS_BIT(ucs_memory_type_t) UCX supports here (ucp_context_query)
  uint32_t next_recv_id_ = 1;
  std::mutex mutex_;
  std::vector<std::shared_ptr<ConnState>> conns_;
  std::vector<void*> closing_;          // ep close requests still in flight
  bool progressing_ = false;            // inside progress(): UCX callbacks may run
  std::vector<ucp_ep_h> eps_to_close_;  // failed inside progress(), closed once it returns
  side::Fd wake_fd_;                    // eventfd written by wake()
  side::Fd epoll_fd_;                   // watches the worker's event fd and wake_fd_
  bool sleeping_ = false;               // the progress thread is in (or about to enter) epoll_wait; mutex_
  bool stop_ = false;
  std::thread progress_;
  std::shared_ptr<spdlog::logger> log_ = logger("transport");
};

}  // namespace deltacast::transport::ucx
