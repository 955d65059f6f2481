// The UCX connection's data path: posting sends, receives and RMA writes, settling each UCX
// operation (immediate completion, callback, error), and failing a connection. Rules in
// ucx_connection.h.
#include "transport/ucx/ucx_connection.h"

#include <string>
#include <vector>

#include "transport/ucx/ucx_engine.h"
#include "transport/ucx/ucx_memory.h"

namespace deltacast::transport::ucx {
namespace {

void send_callback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->ucx_request = request;
  op->transport->callback(op, status, op->bytes);
}

void recv_callback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->ucx_request = request;
  if (info != nullptr) op->recv_info = *info;
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

}  // namespace

void ep_error_callback(void* arg, ucp_ep_h, ucs_status_t status) {
  // The ConnState is kept alive by the transport's list until its endpoint is closed.
  auto* conn = static_cast<ConnState*>(arg);
  conn->owner->endpoint_failed(*conn, Status{Errc::connection, "UCX endpoint failed: " + ucs_text(status)});
}

void UcxTransport::endpoint_failed(ConnState& conn, const Status& why) {
  if (conn.broken || conn.ep_failed) return;
  // The peer may have closed in order with its GOODBYE still in flight: look now, and give it
  // kEpErrorGrace (check_connections) before failing receives that may still take its messages.
  Status alive = conn.check_alive(side::Clock::now(), true);
  if (!alive.ok()) return fail(conn, alive);
  conn.ep_failed = true;
  conn.ep_failed_at = side::Clock::now();
  conn.ep_failed_status = why;
  if (conn.ep != nullptr) {
    if (progressing_) {
      eps_to_close_.push_back(conn.ep);  // as in fail(): not inside ucp_worker_progress
    } else {
      close_ep(conn.ep);
    }
    conn.ep = nullptr;
  }
}

void UcxTransport::finish_drain(ConnState& conn) {
  if (!conn.fin_seen || conn.broken) return;
  for (Op* op : conn.ops.list()) {
    if (op->kind == OpKind::recv && op->recv_index < conn.fin_index) return;
  }
  fail(conn, EngineConnState::peer_closed());  // receives posted after the FIN's find nothing
}

Op* UcxTransport::begin(std::unique_ptr<Op> op) {
  ConnState& conn = *op->conn;
  return conn.ops.add(std::move(op));
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
  auto conn = op->conn;
  std::unique_ptr<Op> owned = conn->ops.take(op);  // in the table from begin() until here
  if (op->ucx_request != nullptr) ucp_request_free(op->ucx_request);
  if (op->rkey != nullptr) ucp_rkey_destroy(op->rkey);
  conn->last_progress = side::Clock::now();
  if (op->kind == OpKind::put) return;  // the flush that follows completes the write request
  if (op->kind == OpKind::close_flush) {
    op->request->complete(status == UCS_OK ? Status::success() : Status{Errc::connection, ucs_text(status)}, 0);
    return;
  }
  if (op->kind == OpKind::recv && status == UCS_OK && (op->recv_info.sender_tag & kFinTag) != 0) {
    op->request->complete(EngineConnState::peer_closed(), 0);  // after everything the peer sent
    conn->fin_seen = true;
    conn->fin_index = op->recv_index;
    finish_drain(*conn);
    return;
  }
  if (op->kind != OpKind::recv && status != UCS_OK && (conn->peer_gone() || conn->ep_failed)) {
    // The peer's endpoint is gone; its messages may still be draining here.
    op->request->complete(conn->peer_gone() ? EngineConnState::peer_closed() : conn->ep_failed_status, 0);
    if (op->kind == OpKind::flush && conn->writes_unflushed > 0) --conn->writes_unflushed;
    return;
  }
  if (op->kind == OpKind::flush) {
    if (conn->writes_unflushed > 0) --conn->writes_unflushed;
    if (op->request)
      op->request->complete(
          status == UCS_OK ? Status::success() : Status{Errc::connection, "UCX write failed: " + ucs_text(status)},
          op->bytes);
    if (status != UCS_OK) fail(*conn, Status{Errc::connection, "UCX write flush failed: " + ucs_text(status)});
    while (conn->writes_unflushed == 0 && !conn->deferred_sends.empty()) {
      auto next = std::move(conn->deferred_sends.front());
      conn->deferred_sends.pop_front();
      next.start();
    }
    return;
  }
  if (status == UCS_OK) {
    op->request->complete(Status::success(), op->kind == OpKind::recv ? received : op->bytes);
  } else if (status == UCS_ERR_CANCELED && !conn->broken) {
    op->request->complete(Status{Errc::cancelled, "receive cancelled"}, 0);
  } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    op->request->complete(Status{Errc::invalid_argument, "message larger than the receive buffer of " +
                                                             std::to_string(op->capacity) + " bytes"},
                          0);
    fail(*conn, Status{Errc::connection, "connection closed after an oversized message"});
  } else {
    Status why =
        conn->broken ? conn->broken_status : Status{Errc::connection, "UCX operation failed: " + ucs_text(status)};
    op->request->complete(why, 0);
    fail(*conn, why);
  }
  finish_drain(*conn);
}

void UcxTransport::fail(ConnState& conn, const Status& why) {
  if (!conn.mark_broken(why)) return;
  // Sends never started: no UCX operation will finish them, so they fail here.
  for (auto& deferred : conn.deferred_sends) deferred.request->complete(why, 0);
  conn.deferred_sends.clear();
  // Receives sit on the shared worker: cancel them (their callbacks finish the requests). A
  // forced close makes UCX finish every send/put on the endpoint with an error.
  for (Op* op : conn.ops.list()) {
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

void UcxTransport::start_send(const std::shared_ptr<ConnState>& conn, const std::shared_ptr<BasicRequest>& request,
                              std::span<const std::byte> message, MemoryRegion* mr, uint64_t tag_bits) {
  if (conn->broken || conn->ep == nullptr) {
    request->complete(conn->broken ? conn->broken_status : conn->ep_failed_status, 0);
    return;
  }
  auto op = new_op(this, conn, OpKind::send, request, message.size());
  ucp_request_param_t params = op_params(op.get(), mr);
  Op* raw = begin(std::move(op));
  conn->last_progress = side::Clock::now();
  track(raw, ucp_tag_send_nbx(conn->ep, message.data(), message.size(), conn->send_tag | tag_bits, &params));
}

std::shared_ptr<Request> UcxTransport::post_send(const std::shared_ptr<ConnState>& conn,
                                                 std::span<const std::byte> message, MemoryRegion* mr) {
  std::lock_guard lock(mutex_);  // the handle checked the size (transport/engine_handles.h)
  if (!conn->broken && conn->closing) return finished_request(Status{Errc::connection, "connection closed locally"});
  if (!conn->broken && conn->peer_gone()) return finished_request(EngineConnState::peer_closed());
  auto request = std::make_shared<BasicRequest>();
  if (conn->writes_unflushed > 0 || !conn->deferred_sends.empty()) {
    std::weak_ptr<ConnState> weak = conn;
    conn->deferred_sends.push_back({request, [this, weak, request, message, mr] {
                                      if (auto locked = weak.lock()) start_send(locked, request, message, mr);
                                    }});
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
  if (conn->closing) return finished_request(Status{Errc::connection, "connection closed locally"});
  auto op = new_op(this, conn, OpKind::recv, std::make_shared<BasicRequest>(), 0);
  op->capacity = buffer.size();
  op->recv_index = conn->recvs_posted++;
  conn->last_progress = side::Clock::now();
  auto request = op->request;
  ucp_request_param_t params = op_params(op.get(), mr);
  params.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // the callback reports the length
  params.cb.recv = recv_callback;
  params.recv_info.tag_info = &op->recv_info;
  Op* raw = begin(std::move(op));
  ucs_status_ptr_t result =
      ucp_tag_recv_nbx(worker_, buffer.data(), buffer.size(), uint64_t{conn->recv_id} << 32, kConnTagMask, &params);
  bool pending = UCS_PTR_IS_PTR(result) && !raw->done_in_post;
  track(raw, result);
  if (pending) {
    std::weak_ptr<ConnState> weak = conn;
    request->set_cancel_hook([this, weak, raw] {
      auto locked = weak.lock();
      if (!locked) return;
      std::lock_guard hook_lock(mutex_);
      // A receive not yet matched is withdrawn; a matched one finishes normally.
      if (locked->ops.contains(raw) && raw->ucx_request != nullptr) ucp_request_cancel(worker_, raw->ucx_request);
    });
  }
  wake();
  return request;
}

std::shared_ptr<Request> UcxTransport::post_write(const std::shared_ptr<ConnState>& conn,
                                                  std::span<const std::byte> local, MemoryRegion* local_mr,
                                                  const RemoteBuffer& remote) {
  const RemoteKey remote_key = read_remote_key(remote, local.size());
  std::lock_guard lock(mutex_);
  if (conn->broken) return finished_request(conn->broken_status);
  if (conn->closing) return finished_request(Status{Errc::connection, "connection closed locally"});
  if (conn->peer_gone() || conn->ep_failed) return finished_request(EngineConnState::peer_closed());
  ucp_rkey_h rkey = nullptr;
  ucs_status_t status = ucp_ep_rkey_unpack(conn->ep, remote_key.packed_rkey, &rkey);
  if (status != UCS_OK) throw Error(Errc::invalid_argument, "ucp_ep_rkey_unpack: " + ucs_text(status));
  auto request = std::make_shared<BasicRequest>();
  auto put = new_op(this, conn, OpKind::put, nullptr, 0);
  put->rkey = rkey;
  ucp_request_param_t params = op_params(put.get(), local_mr);
  ++conn->writes_unflushed;
  Op* put_raw = begin(std::move(put));
  track(put_raw, ucp_put_nbx(conn->ep, local.data(), local.size(), remote_key.address + remote.offset, rkey, &params));
  if (conn->broken) return request->complete(conn->broken_status, 0), request;
  // Flush: the write request finishes when the data is in the peer's memory.
  auto flush = new_op(this, conn, OpKind::flush, request, local.size());
  ucp_request_param_t flush_params = op_params(flush.get(), nullptr);
  Op* flush_raw = begin(std::move(flush));
  track(flush_raw, conn->broken ? UCS_STATUS_PTR(UCS_ERR_CANCELED) : ucp_ep_flush_nbx(conn->ep, &flush_params));
  wake();
  return request;
}

std::shared_ptr<Request> UcxTransport::post_fin(const std::shared_ptr<ConnState>& conn) {
  // Read the side channel first: a peer that already closed gets no FIN.
  if (!conn->broken && !conn->peer_closing) {
    Status alive = conn->check_alive(side::Clock::now(), true);
    if (!alive.ok()) fail(*conn, alive);
  }
  if (conn->broken || conn->closing || conn->peer_gone() || conn->ep_failed) return nullptr;
  conn->closing = true;
  auto request = std::make_shared<BasicRequest>();
  if (conn->writes_unflushed > 0 || !conn->deferred_sends.empty()) {  // behind them, as post_send
    std::weak_ptr<ConnState> weak = conn;
    conn->deferred_sends.push_back({request, [this, weak, request] {
                                      if (auto locked = weak.lock()) start_send(locked, request, {}, nullptr, kFinTag);
                                    }});
  } else {
    start_send(conn, request, {}, nullptr, kFinTag);
  }
  wake();
  return request;
}

std::shared_ptr<Request> UcxTransport::post_close_flush(const std::shared_ptr<ConnState>& conn) {
  if (conn->broken || conn->ep == nullptr) return finished_request(Status{Errc::connection, "connection failed"});
  auto flush = new_op(this, conn, OpKind::close_flush, std::make_shared<BasicRequest>(), 0);
  auto request = flush->request;
  ucp_request_param_t params = op_params(flush.get(), nullptr);
  Op* raw = begin(std::move(flush));
  track(raw, ucp_ep_flush_nbx(conn->ep, &params));
  wake();
  return request;
}

void UcxTransport::abort_connection(const std::shared_ptr<ConnState>& conn, const Status& why) {
  std::unique_lock lock(mutex_);
  fail(*conn, why);
}

void UcxTransport::close_connection(const std::shared_ptr<ConnState>& conn, const Status& why) {
  std::unique_lock lock(mutex_);
  if (auto fin = post_fin(conn)) {
    // The progress thread completes the FIN, then the flush: every message is at the peer.
    const auto deadline = side::Clock::now() + std::min<std::chrono::milliseconds>(kCloseLinger, options_.peer_timeout);
    auto left = [&](const std::shared_ptr<Request>& request) {
      lock.unlock();
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - side::Clock::now());
      bool ok = request->wait(std::max(wait, std::chrono::milliseconds{0})).ok();
      lock.lock();
      return ok;
    };
    if (left(fin) && left(post_close_flush(conn))) conn->say_goodbye();
  }
  fail(*conn, why);
}

}  // namespace deltacast::transport::ucx
