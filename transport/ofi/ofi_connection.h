#pragma once
// One libfabric connection (ConnState) and the operations posted on it (Op, Message); the
// engine's members that post, complete and fail them are in ofi_connection.cpp.
// Rules:
//  * Every connection has its own FI_EP_RDM endpoint in its own domain, with its own AV (holding
//    the one peer) and CQ: providers share receive queues across a domain's endpoints.
//  * A message starts with one untagged fi_senddata whose remote CQ data carries
//    [kind:2][sequence:22][length:40], so a receive posted for "the next message" learns the
//    length; a message longer than the fragment size (the provider's max_msg_size, at most 64 MiB)
//    continues as tagged sends with exact tags [CONT][sequence][index], which the receiver posts
//    once the first fragment arrived. A message longer than the receive buffer finishes the receive
//    with Errc::invalid_argument and fails the connection.
//  * Flow control: at most kMaxSendsInFlight sends (and RMA writes) and kMaxRecvsInFlight first
//    fragments are posted per connection; the rest, and posts the provider refuses with
//    -FI_EAGAIN, wait in an ordered backlog that the progress thread retries, so message order
//    holds. Continuation receives bypass the backlog (exact tags; see post_op).
//  * An Op lives in its connection's OpTable from its post until its completion (or error
//    completion) is read from the CQ; its fi_context2 is the op context the provider hands back.
//  * Orderly close (close() on a connection that has not failed): a FIN, an empty first fragment
//    of kind FIN, is posted behind every send already posted; close() waits for its completion
//    (at most kCloseLinger), then sends GOODBYE on the side channel and fails the connection
//    locally as below. The peer, told by GOODBYE that a FIN follows, keeps the connection up past
//    the side channel's EOF (EngineConnState::peer_closing): its receives take the messages still
//    on the fabric, in order, and the receive that meets the FIN finishes with Errc::connection.
//    Once every receive posted before that one and every continuation has completed, the peer
//    fails the connection ("peer closed the connection"), so a close never overtakes a message
//    whose send completed before it. A killed peer says no GOODBYE: its EOF fails at once.
//  * Failure (a CQ error, a failed post, side channel EOF or silence, close): the endpoint is
//    closed first, so the provider no longer touches user buffers, then the CQ, AV, memory
//    registrations and domain; every pending request finishes with the first Status.
// Threading: everything here is guarded by OfiTransport's mutex (which serialises every libfabric
// call); completions are read by the progress thread, or by a post that met -FI_EAGAIN.
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>

#include "transport/basic_request.h"
#include "transport/engine_state.h"

namespace deltacast::transport::ofi {

// Tag layout: [kind:2][sequence:22][length or fragment index:40].
inline constexpr uint64_t kKindData = uint64_t{1} << 62;
inline constexpr uint64_t kKindCont = uint64_t{2} << 62;
inline constexpr uint64_t kKindFin = uint64_t{3} << 62;  // remote CQ data of the close marker
inline constexpr uint64_t kKindMask = uint64_t{3} << 62;
inline constexpr int kSeqShift = 40;
inline constexpr uint64_t kSeqMask = (uint64_t{1} << 22) - 1;
inline constexpr uint64_t kLowMask = (uint64_t{1} << 40) - 1;
inline constexpr size_t kFragmentCap = size_t{64} << 20;  // pipelines large messages
inline constexpr size_t kMaxSendsInFlight = 64;           // per connection; more wait in the backlog
inline constexpr size_t kMaxRecvsInFlight = 256;          // also below every provider's rx queue size seen
// How long close() waits for its FIN to leave: it leaves at once unless the peer stopped reading.
inline constexpr std::chrono::milliseconds kCloseLinger{1000};

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
  bool posted = false;      // false while it waits in ConnState::backlog
  uint64_t recv_index = 0;  // recv_first: its place in the order receives were posted
};

using PostFn = std::function<ssize_t(void* context)>;

class OfiMemoryRegion;

// One fabric endpoint to one peer plus its side channel. Guarded by OfiTransport::mutex_.
struct ConnState : EngineConnState {
  fid_domain* domain = nullptr;  // its own: providers share receive queues across a domain's endpoints
  fid_ep* ep = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  int cq_fd = -1;  // the CQ's wait object (FI_WAIT_FD), owned by the CQ; -1 when the provider has none
  fi_addr_t peer = FI_ADDR_UNSPEC;
  OpTable<Op> ops;
  std::unordered_map<const OfiMemoryRegion*, fid_mr*> registrations;
  // Posts the provider refused with -FI_EAGAIN (queue full), retried in order by the progress
  // thread; later posts queue behind them so message order holds.
  std::deque<std::pair<Op*, PostFn>> backlog;
  uint32_t send_seq = 0;
  size_t sends_in_flight = 0;  // bounded: shm corrupts its queues when posted beyond their size
  size_t recvs_in_flight = 0;
  uint64_t recvs_posted = 0;  // recv_first ops ever posted: the next one's recv_index
  bool closing = false;       // close() posted our FIN: no more posts
  bool fin_seen = false;      // the peer's FIN met the receive with recv_index fin_index
  uint64_t fin_index = 0;
  bool has_pending() const { return !ops.empty(); }
};

}  // namespace deltacast::transport::ofi
