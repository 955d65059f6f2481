// The libfabric connection's data path: posting sends, receives and RMA writes (fragmented, with
// the in-flight bounds and the ordered backlog), reading a connection's CQ and settling each
// completion or error, and failing a connection. Rules in ofi_connection.h.
#include "transport/ofi/ofi_connection.h"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <string>

#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_memory.h"

namespace deltacast::transport::ofi {

bool OfiTransport::post_op(ConnState& conn, std::unique_ptr<Op> op, const PostFn& post) {
  Op* raw = conn.ops.add(std::move(op));
  if (conn.broken) return false;
  conn.last_progress = side::Clock::now();
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
      wake();  // the progress thread may be sleeping: there is work now
      return true;
    }
    if (rc != -FI_EAGAIN) {
      fail(conn, Status{Errc::connection, "libfabric post failed: " + fi_text(static_cast<int>(rc))});
      return false;
    }
  }
  conn.backlog.emplace_back(raw, post);
  wake();
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

std::shared_ptr<Request> OfiTransport::post_send(const std::shared_ptr<ConnState>& conn,
                                                 std::span<const std::byte> message, MemoryRegion* mr) {
  std::lock_guard lock(mutex_);  // the handle checked the size (transport/engine_handles.h)
  if (conn->broken) return finished_request(conn->broken_status);
  if (conn->closing) return finished_request(Status{Errc::connection, "connection closed locally"});
  if (conn->peer_closing || conn->fin_seen) return finished_request(EngineConnState::peer_closed());
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
  if (conn->closing) return finished_request(Status{Errc::connection, "connection closed locally"});
  auto msg = std::make_shared<Message>();
  msg->request = std::make_shared<BasicRequest>();
  msg->buffer = buffer.data();
  msg->capacity = buffer.size();
  msg->pending = 1;
  auto op = std::make_unique<Op>();
  op->kind = OpKind::recv_first;
  op->message = msg;
  op->recv_index = conn->recvs_posted++;
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
      if (locked->broken || !locked->ops.contains(raw)) return;
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

std::shared_ptr<Request> OfiTransport::post_write(const std::shared_ptr<ConnState>& conn,
                                                  std::span<const std::byte> local, MemoryRegion* local_mr,
                                                  const RemoteBuffer& remote) {
  if (!rma_) throw Error(Errc::unsupported, "ofi+" + provider_ + " offers no RMA write here");
  const RemoteKey remote_key = read_remote_key(remote, local.size());
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
    uint64_t addr = remote_key.address + remote.offset + offset;
    if (!post_op(*conn, std::move(op),
                 [ep = conn->ep, buf, len, desc, peer = conn->peer, addr, key = remote_key.key](void* ctx) {
                   return fi_write(ep, buf, len, desc, peer, addr, key, ctx);
                 }))
      break;
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
      finish_drain(conn);
      continue;
    }
    if (n < 0) {
      fail(conn, Status{Errc::connection, "fi_cq_read failed: " + fi_text(static_cast<int>(n))});
      return;
    }
    for (ssize_t i = 0; i < n && !conn.broken; ++i) {
      handle(conn, static_cast<Op*>(entries[i].op_context), entries[i]);
      finish_drain(conn);
    }
  }
}

void OfiTransport::handle(ConnState& conn, Op* raw, const fi_cq_tagged_entry& entry) {
  std::unique_ptr<Op> op = conn.ops.take(raw);
  if (!op) return;
  conn.last_progress = side::Clock::now();
  if (op->posted)
    --(op->kind == OpKind::send || op->kind == OpKind::write ? conn.sends_in_flight : conn.recvs_in_flight);
  Message& msg = *op->message;
  if (op->kind == OpKind::recv_first) {
    if ((entry.flags & FI_REMOTE_CQ_DATA) == 0) {
      msg.request->complete(Status{Errc::corrupt_frame, "first fragment without its length (no remote CQ data)"}, 0);
      fail(conn, Status{Errc::connection, "peer speaks another protocol"});
      return;
    }
    if ((entry.data & kKindMask) == kKindFin) {  // the peer closed after everything ahead of this
      msg.request->complete(EngineConnState::peer_closed(), 0);
      conn.fin_seen = true;
      conn.fin_index = op->recv_index;
      return;
    }
    msg.total = entry.data & kLowMask;
    if (msg.total > msg.capacity) {
      msg.request->complete(Status{Errc::invalid_argument, "message of " + std::to_string(msg.total) +
                                                               " bytes is larger than the receive buffer of " +
                                                               std::to_string(msg.capacity)},
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
      if (!post_op(conn, std::move(cont), [ep = conn.ep, buf, len, tag](void* ctx) {
            return fi_trecv(ep, buf, len, nullptr, FI_ADDR_UNSPEC, tag, 0, ctx);
          }))
        return;
    }
  } else {
    --msg.pending;
  }
  if (msg.pending == 0) msg.request->complete(Status::success(), msg.total);
}

void OfiTransport::handle_error(ConnState& conn, const fi_cq_err_entry& err) {
  auto* raw = static_cast<Op*>(err.op_context);
  std::unique_ptr<Op> op = conn.ops.take(raw);
  if (!op) return;
  if (op->posted)
    --(op->kind == OpKind::send || op->kind == OpKind::write ? conn.sends_in_flight : conn.recvs_in_flight);
  conn.last_progress = side::Clock::now();
  int code = err.err < 0 ? -err.err : err.err;
  const bool is_send = op->kind == OpKind::send || op->kind == OpKind::write;
  // A peer that closed in order may reset the link under our own sends before its GOODBYE is read
  // (the sockets race): look, so that the messages it sent before closing are still received.
  if (is_send && !conn.peer_closing) (void)conn.check_alive(side::Clock::now(), true);
  if (is_send && (conn.peer_closing || conn.fin_seen)) {
    op->message->request->complete(EngineConnState::peer_closed(), 0);
    return;
  }
  if (code == FI_ECANCELED) {
    op->message->request->complete(Status{Errc::cancelled, "receive cancelled"}, 0);
    return;
  }
  if (code == FI_ETRUNC || code == FI_EMSGSIZE) {
    op->message->request->complete(Status{Errc::invalid_argument, "message larger than the receive buffer of " +
                                                                      std::to_string(op->message->capacity) + " bytes"},
                                   0);
    fail(conn, Status{Errc::connection, "connection closed after an oversized message"});
    return;
  }
  Status why{Errc::connection, "libfabric completion error: " + fi_text(err.err)};
  op->message->request->complete(why, 0);
  fail(conn, why);
}

void OfiTransport::fail(ConnState& conn, const Status& why) {
  if (!conn.mark_broken(why)) return;
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
  for (Op* op : conn.ops.list()) op->message->request->complete(why, 0);
  conn.ops.clear();
  log_->debug("ofi: connection to {} closed: {}", conn.peer_url, why.message);
}

std::shared_ptr<Request> OfiTransport::post_fin(ConnState& conn) {
  // Read the side channel first: a peer that already closed gets no FIN (shm would write into the
  // shared memory of an endpoint that is gone: seen to crash when both ends live in one process).
  if (!conn.broken && !conn.peer_closing) {
    Status alive = conn.check_alive(side::Clock::now(), true);
    if (!alive.ok()) fail(conn, alive);
  }
  if (conn.broken || conn.closing || conn.peer_closing || conn.fin_seen) return nullptr;
  conn.closing = true;
  auto msg = std::make_shared<Message>();
  msg->request = std::make_shared<BasicRequest>();
  msg->pending = 1;
  auto op = std::make_unique<Op>();
  op->kind = OpKind::send;
  op->message = msg;
  // Behind every send posted before (the backlog keeps the order); SAS order on the fabric.
  uint64_t data = kKindFin | ((conn.send_seq++ & kSeqMask) << kSeqShift);
  if (!post_op(conn, std::move(op), [ep = conn.ep, peer = conn.peer, data](void* ctx) {
        return fi_senddata(ep, nullptr, 0, nullptr, data, peer, ctx);
      }))
    return nullptr;
  return msg->request;
}

void OfiTransport::finish_drain(ConnState& conn) {
  if (!conn.fin_seen || conn.broken) return;
  for (Op* op : conn.ops.list()) {
    if (op->kind == OpKind::recv_cont) return;
    if (op->kind == OpKind::recv_first && op->recv_index < conn.fin_index) return;
  }
  fail(conn, EngineConnState::peer_closed());  // receives posted after the FIN's find nothing
}

void OfiTransport::abort_connection(const std::shared_ptr<ConnState>& conn, const Status& why) {
  std::unique_lock lock(mutex_);
  forget(conn, why);
}

void OfiTransport::forget(const std::shared_ptr<ConnState>& conn, const Status& why) {
  fail(*conn, why);
  std::erase(conns_, conn);
}

void OfiTransport::close_connection(const std::shared_ptr<ConnState>& conn, const Status& why) {
  std::unique_lock lock(mutex_);
  if (auto fin = post_fin(*conn)) {
    lock.unlock();  // the progress thread completes the FIN (and whatever is ahead of it)
    const bool left = fin->wait(std::min<std::chrono::milliseconds>(kCloseLinger, options_.peer_timeout)).ok();
    lock.lock();
    if (left) conn->say_goodbye();
  }
  forget(conn, why);
}

}  // namespace deltacast::transport::ofi
