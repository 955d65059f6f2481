#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/host_region.h"
#include "transport/auth.h"
#include "transport/basic_request.h"
#include "transport/loopback/loopback.h"

namespace deltacast::transport::loopback {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Link;
struct Endpoint;

// Where a member (one LoopTransport) stands. Changes only running -> frozen -> running and
// anything -> dead.
enum class Phase { running, frozen, dead };

struct PhaseRecord {
  Phase phase = Phase::running;
  Clock::time_point frozen_since;
};

// One LoopTransport's phase and the links and listeners it owns. Its mutex is innermost but for a
// request's own (see the lock order in loopback.h): it is taken under a Link or Endpoint lock,
// and never held while taking another lock.
class Member {
 public:
  explicit Member(milliseconds patience) : peer_timeout(patience) {}

  // How long this member's side of a link waits on a silent (frozen) peer.
  const milliseconds peer_timeout;

  PhaseRecord phase() const {
    std::lock_guard lock(mutex_);
    return record_;
  }
  // Phase changes; each returns whether it changed anything.
  bool mark_dead() {
    std::lock_guard lock(mutex_);
    if (record_.phase == Phase::dead) return false;
    record_.phase = Phase::dead;
    return true;
  }
  bool mark_frozen(Clock::time_point now) {
    std::lock_guard lock(mutex_);
    if (record_.phase != Phase::running) return false;
    record_ = PhaseRecord{Phase::frozen, now};
    return true;
  }
  bool mark_running() {
    std::lock_guard lock(mutex_);
    if (record_.phase != Phase::frozen) return false;
    record_.phase = Phase::running;
    return true;
  }

  // Records a link or listener of this member. Refused (false) once dead, so that kill() sees
  // every link made before it and none is made after it.
  bool adopt(const std::shared_ptr<Link>& link) { return adopt_into(links_, link); }
  bool adopt(const std::shared_ptr<Endpoint>& endpoint) { return adopt_into(endpoints_, endpoint); }
  std::vector<std::shared_ptr<Link>> links() const { return alive(links_); }
  std::vector<std::shared_ptr<Endpoint>> endpoints() const { return alive(endpoints_); }

  // The hook for sends on this member's links that have none of their own.
  std::shared_ptr<FaultHook> hook() const {
    std::lock_guard lock(mutex_);
    return hook_;
  }
  void set_hook(std::shared_ptr<FaultHook> hook) {
    std::lock_guard lock(mutex_);
    hook_ = std::move(hook);
  }

 private:
  template <typename T>
  bool adopt_into(std::vector<std::weak_ptr<T>>& list, const std::shared_ptr<T>& item) {
    std::lock_guard lock(mutex_);
    if (record_.phase == Phase::dead) return false;
    std::erase_if(list, [](const std::weak_ptr<T>& p) { return p.expired(); });
    list.push_back(item);
    return true;
  }
  template <typename T>
  std::vector<std::shared_ptr<T>> alive(const std::vector<std::weak_ptr<T>>& list) const {
    std::lock_guard lock(mutex_);
    std::vector<std::shared_ptr<T>> out;
    for (const auto& weak : list) {
      if (auto item = weak.lock()) out.push_back(std::move(item));
    }
    return out;
  }

  mutable std::mutex mutex_;
  PhaseRecord record_;
  std::shared_ptr<FaultHook> hook_;
  std::vector<std::weak_ptr<Link>> links_;
  std::vector<std::weak_ptr<Endpoint>> endpoints_;
};

Status connection_error(std::string message) { return Status{Errc::connection, std::move(message)}; }

// Both directions of one connection, under one lock. side 0 = connecting end, 1 = accepting end.
// The members' phases are read at each update_locked(): a dead or frozen member needs no work on
// its links until they are next touched.
struct Link {
  struct Message {
    std::vector<std::byte> bytes;
    Clock::time_point deliver_at;
  };
  struct PostedRecv {
    std::shared_ptr<BasicRequest> request;
    std::span<std::byte> buffer;
  };
  // A send not yet handed to the peer because one end is frozen; its request stays pending.
  struct HeldSend {
    std::shared_ptr<BasicRequest> request;
    std::vector<std::byte> bytes;  // after corrupt/truncate
    milliseconds delay{0};
    size_t size = 0;  // the posted length, reported by the request
    bool dropped = false;
  };

  std::mutex mutex;
  std::shared_ptr<Member> members[2];
  PhaseRecord seen[2];            // the members' phases as of the last update_locked()
  std::deque<Message> inbox[2];   // messages handed over, waiting for side i
  std::deque<PostedRecv> posted[2];
  std::deque<HeldSend> held[2];   // side i's sends not handed over yet (one end frozen)
  std::shared_ptr<FaultHook> hooks[2];
  uint64_t sent[2] = {0, 0};
  bool closed = false;
  Status failure[2];              // once closed: what side i's requests finish with
  bool drain[2] = {false, false};  // once closed: side i still receives inbox[i] first
  size_t max_message = 0;

  // Closes the link: from now on side i's requests finish with status[i], after side i received
  // what is in its inbox when keep[i], else at once (the inbox is dropped). Completing the
  // requests is left to settle_locked().
  void break_locked(const Status (&status)[2], const bool (&keep)[2]) {
    if (closed) return;
    closed = true;
    for (int side : {0, 1}) {
      failure[side] = status[side];
      drain[side] = keep[side];
      if (!keep[side]) inbox[side].clear();
    }
  }
  void close_locked(const Status& status, int forced_side = -1) {
    break_locked({status, status}, {false, false});
    update_locked(forced_side);
  }

  // Brings the link up to date with the clock and the members' phases: fails it when a member
  // died or a frozen member's peer ran out of patience, hands over held sends when both ends run,
  // and completes what can complete. `forced_side` completes that side's requests even when its
  // member is frozen (its own close()).
  void update_locked(int forced_side = -1) {
    auto now = Clock::now();
    seen[0] = members[0]->phase();
    seen[1] = members[1]->phase();
    if (!closed) fail_stopped_member_locked(now);
    for (int side : {0, 1}) {
      if (!closed && seen[side].phase == Phase::running && seen[1 - side].phase == Phase::running) {
        release_held_locked(side, now);
      }
    }
    bool was_closed = closed;
    settle_locked(now, forced_side);
    if (!was_closed && closed) settle_locked(now, forced_side);  // an oversize message closed it
  }

  void fail_stopped_member_locked(Clock::time_point now) {
    if (seen[0].phase == Phase::dead || seen[1].phase == Phase::dead) {
      Status status[2];
      bool keep[2];
      for (int side : {0, 1}) {
        bool dead = seen[side].phase == Phase::dead;
        status[side] = connection_error(dead ? "loop: this transport was killed" : "loop: peer died");
        keep[side] = !dead;
      }
      break_locked(status, keep);
      return;
    }
    for (int side : {0, 1}) {
      int other = 1 - side;
      auto patience = members[side]->peer_timeout;
      if (seen[side].phase != Phase::running || seen[other].phase != Phase::frozen) continue;
      if (now - seen[other].frozen_since < patience) continue;
      auto ms = std::to_string(patience.count());
      Status status[2];
      status[side] = connection_error("loop: peer silent for more than " + ms + " ms");
      status[other] = connection_error("loop: the peer dropped this link after " + ms +
                                       " ms of silence while this transport was frozen");
      break_locked(status, {false, false});
      return;
    }
  }

  void settle_locked(Clock::time_point now, int forced_side) {
    for (int side : {0, 1}) {
      if (side == forced_side || seen[side].phase != Phase::frozen) pump_locked(side, now);
    }
  }

  // Appends a message for side `to`. Ordering holds even when delayed: a later message never
  // overtakes an earlier one.
  void enqueue_locked(int to, std::vector<std::byte> bytes, milliseconds delay, Clock::time_point now) {
    Message message{std::move(bytes), now};
    if (!inbox[to].empty()) message.deliver_at = std::max(message.deliver_at, inbox[to].back().deliver_at);
    message.deliver_at += delay;
    inbox[to].push_back(std::move(message));
  }

  void release_held_locked(int side, Clock::time_point now) {
    while (!held[side].empty()) {
      HeldSend send = std::move(held[side].front());
      held[side].pop_front();
      if (!send.dropped) enqueue_locked(1 - side, std::move(send.bytes), send.delay, now);
      send.request->complete(Status::success(), send.size);
    }
  }

  // Completes side `side`'s requests that can complete: on a closed link its held sends fail and
  // its receives get what is left to drain, then fail; on an open one ready messages are matched
  // with posted receives. Caller holds the lock and has checked that the side may progress.
  void pump_locked(int side, Clock::time_point now) {
    if (closed) {
      for (auto& send : held[side]) send.request->complete(failure[side], 0);
      held[side].clear();
    }
    while (!posted[side].empty()) {
      if (inbox[side].empty()) {
        if (!closed) return;
        posted[side].front().request->complete(failure[side], 0);
        posted[side].pop_front();
        continue;
      }
      if (inbox[side].front().deliver_at > now) return;
      Message message = std::move(inbox[side].front());
      inbox[side].pop_front();
      PostedRecv recv = std::move(posted[side].front());
      posted[side].pop_front();
      if (message.bytes.size() > recv.buffer.size()) {
        recv.request->complete(Status{Errc::invalid_argument, "loop: message of " + std::to_string(message.bytes.size()) +
                                                                  " bytes exceeds the posted buffer of " +
                                                                  std::to_string(recv.buffer.size()) + " bytes"},
                               0);
        Status status = connection_error("loop: connection closed after an oversize message");
        break_locked({status, status}, {false, false});
        inbox[side].clear();  // also when the link was already closed and draining
        continue;
      }
      if (!message.bytes.empty()) std::memcpy(recv.buffer.data(), message.bytes.data(), message.bytes.size());
      recv.request->complete(Status::success(), message.bytes.size());
    }
  }

  // Posts one send from `side`. Returns true when its fault killed the sending member: the caller
  // then closes that member's other links and listeners once this lock is released.
  bool send_locked(int side, std::span<const std::byte> message, const std::shared_ptr<BasicRequest>& request) {
    update_locked();
    if (closed) {
      // A frozen member's request stays pending until thaw (it fails then).
      if (seen[side].phase == Phase::frozen) {
        held[side].push_back(HeldSend{request, {}, milliseconds{0}, 0, true});
      } else {
        request->complete(failure[side], 0);
      }
      return false;
    }
    Fault fault;
    const auto hook = hooks[side] ? hooks[side] : members[side]->hook();
    if (hook) fault = hook->on_send(sent[side], message);
    sent[side]++;
    HeldSend send{request, std::vector<std::byte>(message.begin(), message.end()), milliseconds{0}, message.size(), false};
    switch (fault.kind) {
      case Fault::Kind::deliver:
        break;
      case Fault::Kind::drop:
        send.dropped = true;
        break;
      case Fault::Kind::delay:
        send.delay = fault.delay;
        break;
      case Fault::Kind::corrupt:
        if (!send.bytes.empty()) send.bytes[fault.offset % send.bytes.size()] ^= std::byte{0x5a};
        break;
      case Fault::Kind::truncate:
        send.bytes.resize(std::min(fault.offset, send.bytes.size()));
        break;
      case Fault::Kind::close:
        close_locked(connection_error("loop: link closed by fault injection"));
        request->complete(failure[side], 0);
        return false;
      case Fault::Kind::die:
      case Fault::Kind::freeze:
        if (!fault.after) {
          bool died = stop_member_locked(side, fault.kind);
          if (closed) request->complete(failure[side], 0);  // died: the message is lost
          else transmit_locked(side, std::move(send));     // froze: the message is held
          return died;
        }
        break;
    }
    transmit_locked(side, std::move(send));
    if (fault.kind == Fault::Kind::die || fault.kind == Fault::Kind::freeze) return stop_member_locked(side, fault.kind);
    return false;
  }

  bool stop_member_locked(int side, Fault::Kind kind) {
    bool died = kind == Fault::Kind::die ? members[side]->mark_dead() : false;
    if (kind == Fault::Kind::freeze) members[side]->mark_frozen(Clock::now());
    update_locked();
    return died;
  }

  // Hands a send to the peer, or holds it while either end is frozen (or earlier ones are held).
  void transmit_locked(int side, HeldSend send) {
    bool hold = seen[side].phase != Phase::running || seen[1 - side].phase != Phase::running || !held[side].empty();
    if (hold) {
      held[side].push_back(std::move(send));
      return;
    }
    auto now = Clock::now();
    if (!send.dropped) {
      enqueue_locked(1 - side, std::move(send.bytes), send.delay, now);
      pump_locked(1 - side, now);
    }
    send.request->complete(Status::success(), send.size);
  }
};

// The Request of loopback posts: waiting on it brings its link up to date every millisecond, which
// is how deliveries and freeze timeouts happen without a thread.
class LoopRequest final : public BasicRequest {
 public:
  explicit LoopRequest(std::shared_ptr<Link> link) : link_(std::move(link)) {}

 protected:
  void progress() override {
    if (finished()) return;
    std::lock_guard lock(link_->mutex);
    link_->update_locked();
  }
  std::chrono::milliseconds progress_interval() const override { return std::chrono::milliseconds(1); }

 private:
  std::shared_ptr<Link> link_;
};

// Withdraws a request still queued on `side` (a posted receive, or a send held by a freeze).
std::function<void()> withdraw_hook(const std::shared_ptr<Link>& link, const std::shared_ptr<BasicRequest>& request,
                                    int side) {
  std::weak_ptr<Link> weak_link = link;
  std::weak_ptr<BasicRequest> weak_request = request;
  return [weak_link, weak_request, side] {
    auto shared_link = weak_link.lock();
    auto r = weak_request.lock();
    if (!shared_link || !r) return;
    std::lock_guard lock(shared_link->mutex);
    auto withdraw = [&](auto& queue) {
      auto it = std::find_if(queue.begin(), queue.end(), [&](const auto& entry) { return entry.request == r; });
      if (it == queue.end()) return;
      queue.erase(it);
      r->complete(Status{Errc::cancelled, "request cancelled"}, 0);
    };
    withdraw(shared_link->posted[side]);
    withdraw(shared_link->held[side]);
  };
}

class LoopConnection final : public Connection {
 public:
  LoopConnection(std::shared_ptr<Link> link, int side, std::string peer)
      : link_(std::move(link)), side_(side), peer_(std::move(peer)) {}
  ~LoopConnection() override { close(); }

  std::shared_ptr<Request> post_send(std::span<const std::byte> message, MemoryRegion*) override;

  std::shared_ptr<Request> post_recv(std::span<std::byte> buffer, MemoryRegion*) override {
    auto request = std::make_shared<LoopRequest>(link_);
    request->set_cancel_hook(withdraw_hook(link_, request, side_));
    std::lock_guard lock(link_->mutex);
    link_->posted[side_].push_back(Link::PostedRecv{request, buffer});
    link_->update_locked();
    return request;
  }

  // Like a TCP close: what this side sent before is still delivered to the peer, which then
  // sees the link fail; what was waiting for this side is dropped.
  void close() override {
    std::lock_guard lock(link_->mutex);
    const Status status = connection_error("loop: connection closed");
    bool keep[2] = {false, false};
    keep[1 - side_] = true;
    link_->break_locked({status, status}, keep);
    link_->update_locked(side_);
  }

  std::string peer() const override { return peer_; }

  void set_hook(std::shared_ptr<FaultHook> hook) {
    std::lock_guard lock(link_->mutex);
    link_->hooks[side_] = std::move(hook);
  }

 private:
  std::shared_ptr<Link> link_;
  int side_;
  std::string peer_;
};

// A listening name: pending connections wait here for accept().
struct Endpoint {
  std::mutex mutex;
  std::condition_variable ready_cv;
  std::deque<std::unique_ptr<Connection>> ready;
  std::string name;
  std::string secret;
  size_t max_message = 0;
  bool closed = false;
  std::shared_ptr<Member> owner;

  // Closed, or its member is dead (kill() closes it right after). Caller holds the lock.
  bool shut_locked() const { return closed || owner->phase().phase == Phase::dead; }
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<std::string, std::weak_ptr<Endpoint>>& registry() {
  static std::map<std::string, std::weak_ptr<Endpoint>> names;
  return names;
}

// Stops listening: frees the name and drops connections not yet accepted. Idempotent.
void close_endpoint(const std::shared_ptr<Endpoint>& endpoint) {
  {
    std::lock_guard lock(registry_mutex());
    auto it = registry().find(endpoint->name);
    if (it != registry().end() && it->second.lock() == endpoint) registry().erase(it);
  }
  std::lock_guard lock(endpoint->mutex);
  endpoint->closed = true;
  endpoint->ready.clear();
  endpoint->ready_cv.notify_all();
}

// After a member is marked dead: fails each of its links and closes each of its listeners now,
// one lock at a time (its links would also fail when next touched).
void close_everything_of(const Member& member) {
  for (const auto& link : member.links()) {
    std::lock_guard lock(link->mutex);
    link->update_locked();
  }
  for (const auto& endpoint : member.endpoints()) close_endpoint(endpoint);
}

void thaw_member(Member& member) {
  if (member.phase().phase != Phase::frozen) return;
  auto links = member.links();
  // While still frozen: peers whose patience ran out during the freeze drop their links now, even
  // those that touched nothing meanwhile.
  for (const auto& link : links) {
    std::lock_guard lock(link->mutex);
    link->update_locked();
  }
  if (!member.mark_running()) return;
  for (const auto& link : links) {
    std::lock_guard lock(link->mutex);
    link->update_locked();  // hands over what was held, completes what can complete
  }
  for (const auto& endpoint : member.endpoints()) {
    std::lock_guard lock(endpoint->mutex);  // so that a waiting accept() can not miss the wake-up
    endpoint->ready_cv.notify_all();
  }
}

std::shared_ptr<Request> LoopConnection::post_send(std::span<const std::byte> message, MemoryRegion*) {
  if (message.size() > link_->max_message) {
    throw Error(Errc::invalid_argument, "loop: message of " + std::to_string(message.size()) +
                                            " bytes exceeds max_message_bytes " + std::to_string(link_->max_message));
  }
  auto request = std::make_shared<LoopRequest>(link_);
  request->set_cancel_hook(withdraw_hook(link_, request, side_));
  bool died;
  {
    std::lock_guard lock(link_->mutex);
    died = link_->send_locked(side_, message, request);
  }
  if (died) close_everything_of(*link_->members[side_]);
  return request;
}

class LoopListener final : public Listener {
 public:
  LoopListener(std::shared_ptr<Endpoint> endpoint, Url url) : endpoint_(std::move(endpoint)), url_(std::move(url)) {}
  ~LoopListener() override { close(); }

  // A frozen member's listener hands out nothing; thaw_member() wakes the wait.
  std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(endpoint_->mutex);
    if (endpoint_->shut_locked()) throw Error(Errc::state, "loop: accept on a closed listener " + url_.str());
    auto ready = [this] { return !endpoint_->ready.empty() && endpoint_->owner->phase().phase == Phase::running; };
    endpoint_->ready_cv.wait_for(lock, timeout, [&] { return endpoint_->shut_locked() || ready(); });
    if (endpoint_->shut_locked() || !ready()) return nullptr;
    auto connection = std::move(endpoint_->ready.front());
    endpoint_->ready.pop_front();
    return connection;
  }

  Url local_url() const override { return url_; }

  void close() override { close_endpoint(endpoint_); }

 private:
  std::shared_ptr<Endpoint> endpoint_;
  Url url_;
};

class LoopTransport final : public Transport {
 public:
  explicit LoopTransport(const TransportOptions& options)
      : options_(options), member_(std::make_shared<Member>(options.peer_timeout)) {}

  std::unique_ptr<Listener> listen(const Url& url) override {
    check_scheme(url);
    if (member_->phase().phase == Phase::dead) throw Error(Errc::io, "loop: listen on a killed transport");
    auto endpoint = std::make_shared<Endpoint>();
    endpoint->name = url.host;
    endpoint->secret = options_.secret;
    endpoint->max_message = options_.max_message_bytes;
    endpoint->owner = member_;
    {
      std::lock_guard lock(registry_mutex());
      auto& slot = registry()[url.host];
      if (slot.lock()) throw Error(Errc::io, "loop: name '" + url.host + "' is already listening");
      slot = endpoint;
    }
    if (!member_->adopt(endpoint)) {  // killed meanwhile
      close_endpoint(endpoint);
      throw Error(Errc::io, "loop: listen on a killed transport");
    }
    return std::make_unique<LoopListener>(endpoint, url);
  }

  // While either member is frozen the handshake gets no answer: poll until it thaws or `timeout`.
  std::unique_ptr<Connection> connect(const Url& url, std::chrono::milliseconds timeout) override {
    check_scheme(url);
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (member_->phase().phase == Phase::dead) throw Error(Errc::connection, "loop: connect from a killed transport");
      std::shared_ptr<Endpoint> endpoint;
      {
        std::lock_guard lock(registry_mutex());
        auto it = registry().find(url.host);
        if (it != registry().end()) endpoint = it->second.lock();
      }
      if (!endpoint) throw Error(Errc::connection, "loop: nothing listens on " + url.str());
      {
        std::lock_guard lock(endpoint->mutex);
        if (endpoint->shut_locked()) throw Error(Errc::connection, "loop: " + url.str() + " stopped listening");
        if (endpoint->owner->phase().phase == Phase::running && member_->phase().phase == Phase::running) {
          return connect_locked(*endpoint, url);
        }
      }
      auto now = Clock::now();
      if (now >= deadline) {
        throw Error(Errc::timeout, "loop: no answer from " + url.str() + " within " + std::to_string(timeout.count()) +
                                       " ms (a frozen transport)");
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(1), deadline - now));
    }
  }

  std::unique_ptr<MemoryRegion> register_memory(std::span<std::byte> bytes, MemoryKind kind) override {
    if (kind != MemoryKind::host) throw Error(Errc::unsupported, "loop: CUDA memory registration is not supported");
    return std::make_unique<HostRegion>(bytes);
  }

  Capabilities capabilities() const override {
    return Capabilities{"loop", false, false, false, options_.max_message_bytes, !options_.secret.empty()};
  }

  Member& member() { return *member_; }

 private:
  static void check_scheme(const Url& url) {
    if (url.scheme != "loop") throw Error(Errc::invalid_argument, "loop transport given a '" + url.full_scheme() + "' URL");
  }

  // Caller holds endpoint.mutex.
  std::unique_ptr<Connection> connect_locked(Endpoint& endpoint, const Url& url) {
    // The same three messages the network backends exchange, run in-process.
    auth::ClientHandshake client(options_.secret);
    auth::ServerHandshake server(endpoint.secret);
    auto challenge = server.challenge(client.hello());
    auto proof = client.answer(challenge);  // throws Errc::auth on a secret mismatch
    server.verify(proof);
    auto link = std::make_shared<Link>();
    link->max_message = std::min(options_.max_message_bytes, endpoint.max_message);
    link->members[0] = member_;
    link->members[1] = endpoint.owner;
    if (!endpoint.owner->adopt(link) || !member_->adopt(link)) {
      throw Error(Errc::connection, "loop: a transport was killed while connecting to " + url.str());
    }
    endpoint.ready.push_back(std::make_unique<LoopConnection>(link, 1, "loop://" + url.host + "#client"));
    endpoint.ready_cv.notify_one();
    return std::make_unique<LoopConnection>(link, 0, url.str());
  }

  TransportOptions options_;
  std::shared_ptr<Member> member_;
};

Member& member_of(Transport& transport, const char* what) {
  auto* loop = dynamic_cast<LoopTransport*>(&transport);
  if (loop == nullptr) throw Error(Errc::invalid_argument, std::string(what) + ": not a loopback transport");
  return loop->member();
}

}  // namespace

void set_fault_hook(Connection& connection, std::shared_ptr<FaultHook> hook) {
  auto* loop = dynamic_cast<LoopConnection*>(&connection);
  if (loop == nullptr) throw Error(Errc::invalid_argument, "set_fault_hook: not a loopback connection");
  loop->set_hook(std::move(hook));
}

void set_member_fault_hook(Transport& transport, std::shared_ptr<FaultHook> hook) {
  member_of(transport, "set_member_fault_hook").set_hook(std::move(hook));
}

void kill(Transport& transport) {
  auto& member = member_of(transport, "kill");
  if (member.mark_dead()) close_everything_of(member);
}

void freeze(Transport& transport) { member_of(transport, "freeze").mark_frozen(Clock::now()); }

void thaw(Transport& transport) { thaw_member(member_of(transport, "thaw")); }

}  // namespace deltacast::transport::loopback

namespace deltacast::transport {

std::unique_ptr<Transport> make_loopback_transport(const TransportOptions& options) {
  return std::make_unique<loopback::LoopTransport>(options);
}

}  // namespace deltacast::transport
