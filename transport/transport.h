#pragma once
// deltacast's transport interface: reliable, ordered, message-oriented connections between two
// processes, independent of the wire (TCP/Asio, libfabric, UCX, in-process loopback).
//
// Rules every backend follows (the conformance suite in tests/transport/ checks them):
//  * Messages, not streams. Each post_send is delivered as exactly one message to exactly one
//    post_recv on the other side, whole or not at all, in the order the sends were posted on that
//    connection. Receives are matched to incoming messages in the order they were posted.
//  * Asynchronous, one model. post_* returns a Request at once; test() polls, wait(timeout) blocks,
//    cancel() asks to withdraw. The caller keeps the buffer alive and unmodified (send) or untouched
//    (recv) until the request has finished (test() is true), also after cancel().
//  * Failure is a completion, never a hang. A peer that closes, is killed, or stays silent longer
//    than TransportOptions::peer_timeout (backends send heartbeats every heartbeat_interval) makes
//    every pending request of that connection finish with Errc::connection; later posts finish
//    with the same status immediately. A message larger than the posted receive buffer finishes
//    that receive with Errc::invalid_argument and closes the connection (the stream can not be
//    resynchronised). A message larger than max_message_bytes is refused before allocation.
//  * Authenticated. connect/accept run the mutual HMAC-SHA256 challenge-response of
//    transport/auth.h over TransportOptions::secret before any payload byte is read; a peer
//    without the secret never yields a Connection (connect throws Errc::auth; the listener drops
//    it and keeps listening). The secret is never logged.
//  * Thread-safety: every member function of Transport, Listener, Connection and Request may be
//    called from any thread, concurrently. Sends posted concurrently from several threads are
//    delivered in the order the post_send calls took effect.
//  * Lifetime: a Transport must outlive the listeners, connections and memory regions it made.
//    Destroying a Connection or Listener closes it.
//  * Capabilities: a backend answers what it can do (Capabilities) and throws Errc::unsupported
//    for the rest (CUDA memory, RMA) rather than emulating it silently.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/error.h"

namespace deltacast::transport {

// Where to listen or connect. The forms of the backends deltacast has (each backend registers its
// own: transport/backend_registry.h):
//   tcp://HOST:PORT            the Asio TCP backend
//   ofi+PROVIDER://HOST:PORT   libfabric with that provider (ofi+tcp, ofi+shm, ...)
//   ucx://HOST:PORT            UCX (transports chosen by UCX_TLS)
//   loop://NAME                in-process loopback (tests); NAME is kept in `host`, port is 0
// HOST may be a name, an IPv4 address or a bracketed IPv6 address; PORT 0 asks for any free port.
struct Url {
  std::string scheme;    // tcp | ofi | ucx | loop
  std::string provider;  // libfabric provider for ofi ("tcp" for ofi+tcp); empty otherwise
  std::string host;
  uint16_t port = 0;

  // Parses a URL of the forms above: the scheme must be a registered backend's (built or not), and
  // the backend says whether it takes a +PROVIDER and whether its address is HOST:PORT or NAME.
  // Throws Error(Errc::invalid_argument) naming what is wrong.
  static Url parse(std::string_view text);
  // The canonical text form; Url::parse(u.str()) == u.
  std::string str() const;
  // True when only this machine can reach the address: a backend that says so for its provider
  // (the in-process loopback transport, libfabric's shm provider), or a numeric 127.0.0.0/8 or ::1 host, or "localhost"
  // (no DNS look-up). Everything else counts as exposed, wildcard addresses (0.0.0.0, ::) included.
  bool is_local() const;
  // "tcp", "ofi+shm", "ucx", "loop": the key make_transport takes.
  std::string full_scheme() const;
  bool operator==(const Url&) const = default;
};

enum class MemoryKind { host, cuda };

struct Capabilities {
  std::string backend;          // full scheme, e.g. "ofi+tcp"
  bool rma = false;             // Connection::post_write works
  bool cuda_memory = false;     // register_memory(…, MemoryKind::cuda) works
  bool zero_copy_send = false;  // sends go from the caller's buffer without a staging copy
  size_t max_message = 0;       // largest message one post_send may carry
  bool authenticated = false;   // a shared secret is set: every connection proves it (auth.h)
  // How CUDA memory is registered, or why it is not: for ucx and ofi what the library and
  // provider say at run time (e.g. "UCX 1.13.1 supports memory types host, ...: no cuda"); the
  // default, for tcp and loop, that they move bytes through host memory only.
  std::string cuda_memory_detail = "this backend moves bytes through host memory only";
};

struct TransportOptions {
  // Shared secret bytes for mutual authentication. Never logged. Empty means "no secret": both
  // sides must then be empty too (the handshake still runs, so mismatches are still refused).
  std::string secret;
  std::chrono::milliseconds connect_timeout{10'000};    // connect + handshake
  std::chrono::milliseconds heartbeat_interval{1'000};  // idle connections send one this often
  std::chrono::milliseconds peer_timeout{5'000};        // silence after which the peer is dead
  size_t max_message_bytes = size_t{1} << 30;           // 1 GiB; bigger frames are refused
  // Egress cap of this transport (all its connections together), in bytes per second; 0 = none.
  // make_transport then paces every send and RMA write (transport/paced/paced_transport.h).
  uint64_t egress_bytes_per_second = 0;
  // Token-bucket depth of that cap; 0 = 10 ms at the rate, at least 64 KiB.
  uint64_t egress_burst_bytes = 0;
};

// Loads the shared secret (a file readable by group or others is refused, as ssh refuses such
// keys: Errc::config): from `file` when it is not empty (the whole file, one trailing newline
// stripped), else from the environment variable DELTACAST_SECRET. Throws Errc::io when the file can
// not be read, Errc::config when neither source gives a non-empty secret. Thread-safe.
std::string load_secret(const std::string& file = {});
// A fresh shared secret: 32 random bytes (OpenSSL RAND_bytes) as 64 hex digits, for a job that
// makes its own (`deltacast demo`, `bench link`, benchmarks). Throws Errc::internal if OpenSSL
// cannot draw them.
std::string random_secret();

// Memory the backend may send from / receive into without copies, and (with RMA) write into
// remotely. Obtained from Transport::register_memory; stays valid until destroyed.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual std::span<std::byte> bytes() const = 0;
  virtual MemoryKind kind() const = 0;
  // A serialisable key a peer passes in RemoteBuffer to post_write into this region; empty when
  // the backend has no RMA.
  virtual std::vector<std::byte> remote_key() const = 0;
};

// Target of an RMA write: a peer's MemoryRegion::remote_key() plus an offset into that region.
struct RemoteBuffer {
  std::vector<std::byte> key;
  uint64_t offset = 0;
};

// One posted operation. All members are thread-safe.
class Request {
 public:
  virtual ~Request() = default;
  // True once the request finished, successfully or not. Never blocks for long.
  virtual bool test() = 0;
  // Blocks until finished or `timeout` passed. Returns the final status, or Errc::timeout when
  // still pending (the request stays pending and may be waited on again).
  virtual Status wait(std::chrono::milliseconds timeout) = 0;
  // Asks to withdraw the request. One not yet started finishes with Errc::cancelled; one already
  // moving bytes may still finish normally. Wait for it before reusing the buffer.
  virtual void cancel() = 0;
  // Final status once finished; Errc::state ("pending") before.
  virtual Status status() = 0;
  // Bytes transferred: the message length for a finished receive, the sent length for a send.
  virtual size_t bytes() = 0;
};

// An authenticated, ordered, message-oriented link to one peer (see the rules above).
class Connection {
 public:
  virtual ~Connection() = default;
  // Posts one message. `mr`, when given, must contain `message` (lets RMA-capable backends skip
  // registration). Never throws for link failures: the request completes with the error.
  // Throws Errc::invalid_argument when message.size() > max_message_bytes.
  virtual std::shared_ptr<Request> post_send(std::span<const std::byte> message,
                                             MemoryRegion* mr = nullptr) = 0;
  // Posts a receive for the next unmatched message. Completes with bytes() = message length
  // (<= buffer.size()); a longer message completes it with Errc::invalid_argument and closes the
  // connection.
  virtual std::shared_ptr<Request> post_recv(std::span<std::byte> buffer,
                                             MemoryRegion* mr = nullptr) = 0;
  // One-sided write of `local` into the peer's registered memory. Only when capabilities().rma;
  // the default throws Errc::unsupported. Ordered with respect to later sends on this connection.
  virtual std::shared_ptr<Request> post_write(std::span<const std::byte> local, MemoryRegion* local_mr,
                                              const RemoteBuffer& remote);
  // Closes the link; pending requests finish with Errc::connection. Idempotent. Orderly: what was
  // sent still reaches a live peer ahead of the close, and a backend may wait for that (ofi, ucx:
  // up to a linger of min(1 s, peer_timeout) on the caller's thread).
  virtual void close() = 0;
  // Closes the link without waiting for anything sent to reach the peer: for a link given up on
  // (its peer failed or froze, its sends will never finish). Pending requests finish with
  // Errc::connection at once; the peer may lose messages it had not received. Idempotent. The
  // default is close(), for backends whose close never waits on the caller's thread (tcp drains
  // on its io thread, loopback).
  virtual void abort() { close(); }
  // The peer's address in URL form, for logs ("tcp://127.0.0.1:40312").
  virtual std::string peer() const = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Returns the next authenticated connection, or nullptr when none arrived within `timeout`.
  // Peers that fail authentication are dropped (and logged) without surfacing here.
  // Throws Errc::state after close().
  virtual std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) = 0;
  // The bound address, with the real port when port 0 was asked.
  virtual Url local_url() const = 0;
  // Stops listening and closes every connection that arrived but was not accepted yet (its
  // client sees the link fail at once). Idempotent.
  virtual void close() = 0;
};

// One backend instance; owns its progress engine (thread(s)).
class Transport {
 public:
  virtual ~Transport() = default;
  // Starts listening. Throws Errc::invalid_argument for a URL of another scheme, Errc::io when the
  // address can not be bound.
  virtual std::unique_ptr<Listener> listen(const Url& url) = 0;
  // Connects and authenticates within `timeout`. Throws Errc::connection (refused/unreachable),
  // Errc::timeout, Errc::auth (secret mismatch), Errc::invalid_argument (wrong scheme).
  virtual std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) = 0;
  // Registers memory for zero-copy / RMA use. Throws Errc::unsupported for MemoryKind::cuda unless
  // capabilities().cuda_memory.
  virtual std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) = 0;
  virtual Capabilities capabilities() const = 0;
};

// Creates a transport for a full scheme ("tcp", "loop", "ofi+tcp", "ofi+shm", "ucx"), from the
// backends registered in this process (transport/backend_registry.h), paced when
// options.egress_bytes_per_second is set. Throws Errc::unsupported when the backend is known but not
// built (the message says why), Errc::invalid_argument when the scheme is unknown or its provider
// part is missing or not allowed.
std::unique_ptr<Transport> make_transport(std::string_view scheme, const TransportOptions& options);
// True when make_transport(scheme, …) would find a built backend.
bool backend_built(std::string_view scheme);
// Names of the built backends ("loop", "ofi", "tcp", "ucx"), sorted.
std::vector<std::string> built_backends();

}  // namespace deltacast::transport
