#pragma once
// The per-connection bookkeeping of the engine backends (ofi, ucx: one engine object per Transport
// that owns every resource, see transport/engine_handles.h), written once:
//  * EngineConnState, the part of a connection's state both keep: the heartbeat half of its side
//    channel (transport/side_channel.h), its URL for logs, and whether and why it failed. Failure
//    is recorded once; the first Status is what every later post and pending request finishes with.
//    An orderly close by the peer (its side channel's GOODBYE, then EOF) is not a failure yet: the
//    connection drains (peer_closing) until the peer's FIN arrives on the fabric behind its last
//    messages, and fails only then, or when nothing moves for peer_timeout while requests wait.
//  * OpTable, the operations a connection has handed to its fabric and not yet seen complete. The
//    fabric hands each op's address back on completion (libfabric's op context, UCX's user data);
//    the table owns the op until the engine takes it out, so that address never dangles.
//  * check_write_range, the bounds rule of Connection::post_write that both apply to the region
//    length their remote keys carry.
// Threading: none of this locks. A backend guards it with its engine's one mutex and calls it
// with that mutex held; nothing here calls user code or the fabric.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/side_channel.h"
#include "transport/transport.h"

namespace deltacast::transport {

struct EngineConnState {
  std::unique_ptr<side::Liveness> liveness;  // set once the connection is established
  bool broken = false;
  Status broken_status;  // why it failed, once broken
  std::string peer_url;  // "ucx://10.0.0.2:41234", for Connection::peer() and logs
  // The peer said GOODBYE and closed its side channel: no new sends; receives drain the fabric.
  bool peer_closing = false;
  // The last completion or post, or the GOODBYE: while draining, peer_timeout after it with
  // requests still pending fails the connection (the FIN never came).
  side::Clock::time_point last_progress{};
  std::chrono::milliseconds peer_timeout{0};  // the options' (start_liveness)

  // Records the first failure: broken, broken_status, and the side channel closed (the peer sees
  // EOF at once). Returns false, changing nothing, when the connection had already failed.
  bool mark_broken(const Status& why);
  // Hands the established side channel to the heartbeat half (options' interval and timeout).
  void start_liveness(side::Fd fd, const TransportOptions& options);
  // Reads heartbeats and sends one when due (side::Liveness::poll): Errc::connection when the peer
  // is dead, success otherwise, also when the connection already failed or has no side channel yet.
  // An EOF after GOODBYE sets peer_closing and is success; while draining, `pending` requests
  // with nothing moving for peer_timeout are Errc::connection.
  Status check_alive(side::Clock::time_point now, bool pending);
  // Sends GOODBYE on the side channel (an orderly close: the FIN has left); then mark_broken.
  void say_goodbye();
  // The peer closed in order or its FIN arrived: sends would go nowhere.
  static Status peer_closed() { return Status{Errc::connection, "peer closed the connection"}; }
};

template <class Op>
class OpTable {
 public:
  // Takes ownership of `op` and returns the address to hand to the fabric.
  Op* add(std::unique_ptr<Op> op) {
    Op* raw = op.get();
    ops_.emplace(raw, std::move(op));
    return raw;
  }
  // Removes `op` and returns it; null when it is not (or no longer) in the table.
  std::unique_ptr<Op> take(Op* op) {
    auto found = ops_.find(op);
    if (found == ops_.end()) return nullptr;
    std::unique_ptr<Op> owned = std::move(found->second);
    ops_.erase(found);
    return owned;
  }
  // Removes and destroys `op`, if there.
  void erase(Op* op) { ops_.erase(op); }
  bool contains(Op* op) const { return ops_.count(op) != 0; }
  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }
  // The ops now in the table, for a loop that may take some of them out as it goes.
  std::vector<Op*> list() const {
    std::vector<Op*> ops;
    ops.reserve(ops_.size());
    for (const auto& entry : ops_) ops.push_back(entry.first);
    return ops;
  }
  // Destroys every op.
  void clear() { ops_.clear(); }

 private:
  std::unordered_map<Op*, std::unique_ptr<Op>> ops_;
};

// Throws Errc::invalid_argument unless `bytes` at `offset` fit in a remote region of
// `region_length` bytes.
void check_write_range(size_t bytes, uint64_t offset, uint64_t region_length);

}  // namespace deltacast::transport
