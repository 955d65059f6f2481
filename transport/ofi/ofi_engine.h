#pragma once
// OfiTransport, the engine of the libfabric backend (ofi+PROVIDER://host:port): it owns every
// libfabric resource and does all the work; the handles of transport/engine_handles.h forward to
// it. Design in ofi_transport.h and docs/transport-ofi-ucx.md; per connection in ofi_connection.h,
// memory in ofi_memory.h.
// Threading: one mutex per Transport serialises every libfabric call and guards every connection.
// The entry points the handles call (listen, connect, register_memory, post_*, close_connection)
// and unregister may be called from any thread and take it where they need it; the private members
// run with it held, except progress_loop, the one progress thread, which takes it and reads every
// connection's CQ. Failures of a link never throw from post_*: they finish requests
// (transport/transport.h).
#include <rdma/fabric.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "transport/ofi/ofi_connection.h"
#include "transport/side_channel.h"
#include "transport/transport.h"
#include "util/log.h"

namespace deltacast::transport::ofi {

inline std::string fi_text(int rc) { return fi_strerror(rc < 0 ? -rc : rc); }

// Throws Errc::internal naming `what` unless rc is 0.
inline void check(int rc, const std::string& what) {
  if (rc != 0) throw Error(Errc::internal, "libfabric " + what + " failed: " + fi_text(rc));
}

class OfiTransport final : public Transport, public std::enable_shared_from_this<OfiTransport> {
 public:
  // ofi_transport.cpp: the fabric and the progress thread; what the provider offers.
  OfiTransport(std::string provider, const TransportOptions& options);
  ~OfiTransport() override;
  Capabilities capabilities() const override;
  // What the provider said of device memory, as Capabilities::cuda_memory_detail says it.
  std::string cuda_memory_detail() const;
  const std::string& provider() const { return provider_; }
  const TransportOptions& options() const { return options_; }

  // ofi_connect.cpp: connections over the side channel.
  std::unique_ptr<Listener> listen(const Url& url) override;
  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) override;
  // Sets up the fabric endpoint over an authenticated side channel. Throws on failure.
  std::shared_ptr<ConnState> establish(side::Fd fd, bool is_server, side::Clock::time_point deadline);

  // ofi_memory.cpp.
  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override;
  // Closes the region's registrations in every connection (from ~OfiMemoryRegion).
  void unregister(const OfiMemoryRegion& region);

  // ofi_connection.cpp: posts, completions, failure.
  std::shared_ptr<Request> post_send(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> message,
                                     MemoryRegion* mr);
  std::shared_ptr<Request> post_recv(const std::shared_ptr<ConnState>& conn, std::span<std::byte> buffer,
                                     MemoryRegion* mr);
  std::shared_ptr<Request> post_write(const std::shared_ptr<ConnState>& conn, std::span<const std::byte> local,
                                      MemoryRegion* local_mr, const RemoteBuffer& remote);
  void close_connection(const std::shared_ptr<ConnState>& conn, const Status& why);
  // Fails the connection at once (no FIN, no linger): Connection::abort.
  void abort_connection(const std::shared_ptr<ConnState>& conn, const Status& why);

 private:
  // ofi_connection.cpp.
  // Posts one operation; queues it in the backlog while the provider says -FI_EAGAIN. mutex_ held.
  bool post_op(ConnState& conn, std::unique_ptr<Op> op, const PostFn& post);
  void drive(ConnState& conn);                                     // mutex_ held
  void retry_backlog(ConnState& conn);                             // mutex_ held
  ssize_t try_post(ConnState& conn, Op* raw, const PostFn& post);  // mutex_ held
  void handle(ConnState& conn, Op* op, const fi_cq_tagged_entry& entry);
  void handle_error(ConnState& conn, const fi_cq_err_entry& err);
  // Posts our FIN (ofi_connection.h, orderly close); null when the connection failed, is closing
  // or its peer is. mutex_ held.
  std::shared_ptr<Request> post_fin(ConnState& conn);
  // After the peer's FIN: fails the connection once nothing ahead of the FIN is pending. mutex_ held.
  void finish_drain(ConnState& conn);
  void fail(ConnState& conn, const Status& why);  // mutex_ held
  // fail(), and the connection leaves conns_ (the progress thread stops reading it). mutex_ held.
  void forget(const std::shared_ptr<ConnState>& conn, const Status& why);

  // ofi_memory.cpp.
  void* local_desc(const ConnState& conn, MemoryRegion* mr) const;
  void register_in(ConnState& conn, const OfiMemoryRegion& region);  // mutex_ held

  // ofi_progress.cpp.
  void progress_loop();
  // Sleeps in poll() on every live connection's CQ wait fd and wake_fd_ for up to `timeout`, after
  // fi_trywait says nothing is ready; returns false, not sleeping, when some CQ has no wait fd or
  // fi_trywait fails (the caller sleeps briefly instead). `lock` holds mutex_ on entry and return.
  bool sleep_in_poll(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout);
  // Ends a sleep of the progress thread (the condition variable's or sleep_in_poll's). mutex_ held.
  void wake();

  std::vector<const OfiMemoryRegion*> regions_;

  std::string provider_;
  TransportOptions options_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  size_t fragment_ = kFragmentCap;
  bool rma_ = false;
  bool hmem_ = false;         // the provider offers FI_HMEM (device memory registered with FI_HMEM_CUDA)
  bool cuda_driver_ = false;  // libcuda.so.1 loads here (FI_HMEM is asked for only then)
  bool virt_addr_ = false;
  std::atomic<uint64_t> next_key_{1};

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<ConnState>> conns_;
  std::condition_variable wake_;
  side::Fd wake_fd_;      // an eventfd that ends sleep_in_poll
  bool in_poll_ = false;  // the progress thread sleeps in poll(): posts write wake_fd_
  bool poll_ok_ = true;   // false after fi_trywait failed once: spin and short sleeps as before
  bool stop_ = false;
  std::thread progress_;
  std::shared_ptr<spdlog::logger> log_ = logger("transport");
};

}  // namespace deltacast::transport::ofi
