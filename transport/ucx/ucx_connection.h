#pragma once
// One UCX connection (ConnState) and the operations posted on it (Op); the engine's members that
// post, complete and fail them are in ucx_connection.cpp.
// Rules:
//  * Every connection has a UCP endpoint on the transport's one worker, created from the peer's
//    worker address with error mode PEER. Our receives match tags carrying our 32-bit recv_id with
//    a full mask; every send is tagged with the peer's id (send_tag), so connections sharing the
//    worker never mix and receives match messages in posting order.
//  * Writes are ordered before later sends: a put is followed by an endpoint flush, and sends
//    posted while a write is unflushed wait in deferred_sends until the flush finished.
//  * An Op lives in its connection's OpTable from just before its nbx post until UCX reports it
//    finished (a callback, or the post's immediate result), so the callback's user data never
//    dangles. UCX may run the callback inside the posting call: it then only records the outcome
//    and the post finishes the op once it returned (UcxTransport::track).
//  * Orderly close (close() on a connection that has not failed), as in ofi_connection.h: a FIN
//    (an empty send tagged send_tag | kFinTag; receives ignore the low 32 bits so it meets the
//    next receive in order) goes behind every send, close() waits (at most kCloseLinger) for it
//    and for an endpoint flush (every message then sits at the peer), sends GOODBYE on the side
//    channel and fails locally. The peer drains (EngineConnState::peer_closing): the receive that
//    meets the FIN finishes with Errc::connection and the connection fails once every receive
//    posted before it completed. An endpoint error is not a failure at once: GOODBYE may still be
//    on its way (the sockets race), so the endpoint is closed and the connection fails kEpErrorGrace
//    later unless GOODBYE came (then only the sends fail).
//  * Failure (side channel EOF or silence, the endpoint's error callback, a failed operation,
//    close): every pending request finishes with the first Status, receives are cancelled on the
//    worker, and the endpoint is force-closed, which makes UCX fail its sends and puts. An
//    endpoint that fails inside ucp_worker_progress is force-closed only once progress returned
//    (UcxTransport::progress): closing it there aborts on UCX's assertion that it has no request.
// Threading: everything here is guarded by UcxTransport's mutex; UCX callbacks run with it held
// (inside ucp_worker_progress, a post or ucp_request_cancel).
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "transport/basic_request.h"
#include "transport/engine_state.h"

namespace deltacast::transport::ucx {

class UcxTransport;
struct ConnState;

enum class OpKind { send, recv, put, flush, close_flush };

inline constexpr uint64_t kFinTag = 1;                        // low bits of a FIN's tag
inline constexpr uint64_t kConnTagMask = ~uint64_t{0} << 32;  // receives match the connection id only
inline constexpr std::chrono::milliseconds kCloseLinger{1000};
inline constexpr std::chrono::milliseconds kEpErrorGrace{100};

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
  ucp_tag_recv_info_t recv_info{};  // filled by UCX when a receive completes (length, sender's tag)
  uint64_t recv_index = 0;          // recv: its place in the order receives were posted
  // UCX may run the callback inside the posting call: then it only records the outcome here and
  // track() finishes the op once the post returned.
  bool in_post = true;
  bool done_in_post = false;
  ucs_status_t done_status = UCS_OK;
  size_t done_length = 0;
};

// Guarded by UcxTransport::mutex_.
struct ConnState : EngineConnState {
  UcxTransport* owner = nullptr;
  ucp_ep_h ep = nullptr;
  uint32_t recv_id = 0;   // our receives match tags with this id
  uint64_t send_tag = 0;  // the peer's receive id, shifted
  OpTable<Op> ops;
  // Sends waiting for a write flush: each request (completed with the failure if the connection
  // breaks first) and what starts it.
  struct DeferredSend {
    std::shared_ptr<BasicRequest> request;
    std::function<void()> start;
  };
  std::deque<DeferredSend> deferred_sends;
  size_t writes_unflushed = 0;
  uint64_t recvs_posted = 0;  // the next receive's recv_index
  bool closing = false;       // close() posted our FIN: no more posts
  bool fin_seen = false;      // the peer's FIN met the receive with recv_index fin_index
  uint64_t fin_index = 0;
  bool ep_failed = false;                  // the endpoint reported an error; the connection fails at ep_failed_at
  side::Clock::time_point ep_failed_at{};  // + kEpErrorGrace unless the peer said GOODBYE
  Status ep_failed_status;
  // Whether the peer is gone in order (GOODBYE or FIN): a failed send then fails only itself.
  bool peer_gone() const { return peer_closing || fin_seen; }
};

// The endpoint error handler (ucp_ep_params_t::err_handler, arg: the ConnState): fails the
// connection. Runs inside ucp_worker_progress, mutex held.
void ep_error_callback(void* arg, ucp_ep_h ep, ucs_status_t status);

}  // namespace deltacast::transport::ucx
