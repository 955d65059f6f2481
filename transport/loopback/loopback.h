#pragma once
// The in-process loopback backend (scheme loop://NAME): both ends live in one process, messages
// are copied through a shared queue. Built for tests: a FaultHook set on a connection decides, for
// each message that connection sends, whether it is delivered, dropped, delayed, corrupted,
// truncated, or whether the link closes instead. It runs the same auth handshake as the network
// backends (so a wrong secret is refused) and keeps their message rules. Progress is made by the
// calls themselves (post, test, wait; a pending request's wait() polls every millisecond): there
// is no thread.
//
// Members. Each loopback Transport instance stands for one process ("member") of a test: the
// connections it made with connect(), the ones its listeners handed out (or still hold) and its
// listeners belong to it. A member can be killed or frozen, by kill()/freeze() below or by a
// FaultHook returning Fault::Kind::die / Fault::Kind::freeze for one of its sends:
//  * die (SIGKILL): at once every connection and listener of the member closes. Its peers'
//    pending and later requests on those links finish with Errc::connection ("loop: peer died"),
//    after they have received the messages the member sent before it died (like TCP data ahead of
//    the FIN). Later calls on the dead transport fail: connect throws Errc::connection, listen
//    throws Errc::io, posts on its connections finish with Errc::connection, accept on its
//    listeners throws Errc::state (as after Listener::close). Nothing it sends after death arrives.
//  * freeze (SIGSTOP): the member's threads may keep calling, but nothing of it makes progress:
//    sends it posts stay pending and are not delivered, messages sent to it are not delivered, its
//    posted receives do not complete (not even with an error), its listeners' accept returns
//    nullptr. Sends posted by peers towards it stay pending too (a normal loopback send completes
//    at once). This emulates the network backends' heartbeats: once the PEER's
//    TransportOptions::peer_timeout has passed since the freeze, the peer's side of each link to
//    the frozen member fails with Errc::connection ("loop: peer silent for more than N ms"): its
//    pending sends and receives finish with that status, later posts fail at once. Every link is
//    judged on its own, send-only ones included. connect() to a listener of a frozen member (or
//    from a frozen member) hangs, as the handshake gets no answer, until the connect timeout, then
//    throws Errc::timeout; if the member is thawed first, it connects normally.
//  * thaw (SIGCONT): the member resumes. Links whose peers already gave up stay failed: the
//    member's pending and later requests on them finish with Errc::connection. The others resume:
//    everything queued while frozen, in both directions, is delivered in order, and the pending
//    sends complete. A link whose peer's peer_timeout has run out by the time of thaw() is failed
//    even if the peer never touched it meanwhile (its heartbeat timer would have fired).
// Timing: all timeouts are judged against a steady clock when a call touches the link (post, test,
// wait, close, thaw, kill), so a failure fires from the peer's own wait()/test(), within about a
// millisecond of the deadline. Request::wait(timeout) on a request still held by a freeze returns
// Errc::timeout and leaves it pending. Connection::close() and Request::cancel() are local
// actions and take effect even on a frozen member (a frozen member's pending sends can be
// cancelled). Killing a frozen member works; freezing or thawing a dead one does nothing.
//
// Locks (outermost first): the name registry, then an Endpoint (listener), then a Link (one
// connection, both directions), then a member's phase record, then a request's own mutex. No two
// links or endpoints are ever held together. A FaultHook runs under its Link's lock, so it must
// not call back into the transport (kill() from a hook would self-deadlock): it returns
// Fault::Kind::die/freeze instead, and the member's phase is set under the Link's lock while the
// other links and listeners are closed after that lock is released.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "transport/transport.h"

namespace deltacast::transport::loopback {

struct Fault {
  // deliver: as normal. drop: the send succeeds, nothing arrives. delay/corrupt/truncate: see the
  // fields. close: this link closes instead (both ends see Errc::connection).
  // die / freeze: the sending side's whole member (the Transport that owns this connection) is
  // killed / frozen at this message, as kill()/freeze() would. With after = false it happens
  // before the message leaves: after die the message is lost and its send finishes with
  // Errc::connection; after freeze it is held (pending) like any send of a frozen member, and goes
  // out on thaw. With after = true the message is sent (and its send completes) first: after die
  // the peer still receives it before it sees the link fail.
  enum class Kind { deliver, drop, delay, corrupt, truncate, close, die, freeze };
  Kind kind = Kind::deliver;
  std::chrono::milliseconds delay{0};  // delay: the message (and all after it) arrives this late
  size_t offset = 0;                   // corrupt: byte flipped (mod size); truncate: bytes kept
  bool after = false;                  // die/freeze: the message is sent before the member stops
};

// Decides the fate of each message a connection sends. Called under the link's lock, in send
// order (also for sends a frozen member posts: they are judged when posted, delivered on thaw);
// `index` counts this connection's sends from 0. Must not call back into the transport.
class FaultHook {
 public:
  virtual ~FaultHook() = default;
  virtual Fault on_send(uint64_t index, std::span<const std::byte> message) = 0;
};

// A FaultHook from a function.
class FaultFunction final : public FaultHook {
 public:
  explicit FaultFunction(std::function<Fault(uint64_t, std::span<const std::byte>)> decide) : decide_(std::move(decide)) {}
  Fault on_send(uint64_t index, std::span<const std::byte> message) override { return decide_(index, message); }

 private:
  std::function<Fault(uint64_t, std::span<const std::byte>)> decide_;
};

// Installs (or, with nullptr, removes) the hook on a loopback connection's sending side.
// Throws Errc::invalid_argument when `connection` is not a loopback connection. Thread-safe.
void set_fault_hook(Connection& connection, std::shared_ptr<FaultHook> hook);

// Installs (or, with nullptr, removes) a hook for every send of a loopback transport (a member)
// on a connection that has no hook of its own, made before or after the call. `index` counts the
// sends of each connection. Tests use it to kill or freeze a member at one of its messages,
// whichever link carries it. Throws Errc::invalid_argument for a non-loopback transport.
void set_member_fault_hook(Transport& transport, std::shared_ptr<FaultHook> hook);

// Kill, freeze and thaw a loopback transport (a member), as described at the top. Each throws
// Errc::invalid_argument when `transport` is not a loopback transport. Thread-safe; must not be
// called from a FaultHook. kill and freeze take effect before they return; kill closes links and
// listeners at once, freeze needs no work until the peers' timeouts (judged lazily, see Timing).
void kill(Transport& transport);
void freeze(Transport& transport);
void thaw(Transport& transport);

}  // namespace deltacast::transport::loopback

namespace deltacast::transport {

// The backend's factory (registered as "loop" by transport/backends/). Never throws.
std::unique_ptr<Transport> make_loopback_transport(const TransportOptions& options);

}  // namespace deltacast::transport
