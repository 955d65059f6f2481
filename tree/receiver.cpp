#include "tree/receiver.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "codec/applier.h"
#include "codec/frame.h"
#include "tree/protocol.h"
#include "tree/relay_link.h"
#include "tree/topology.h"
#include "util/log.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
constexpr size_t kControlBufferBytes = size_t{1} << 20;
constexpr size_t kWelcomeBufferBytes = size_t{64} << 20;
constexpr auto kControlSendTimeout = 60s;
constexpr auto kChildStallTimeout = 300s;

// (new version, frame kind, chunk index): identifies one frame of one version.
using FrameKey = std::tuple<uint64_t, uint8_t, uint32_t>;

}  // namespace

struct Receiver::Impl {
  transport::Transport& transport;
  ReceiverOptions options;
  std::shared_ptr<spdlog::logger> log = logger("tree");
  std::unique_ptr<transport::Listener> listener;
  std::unique_ptr<transport::Connection> control;

  Welcome welcome;
  std::optional<codec::Manifest> manifest;
  std::optional<Topology> topology;
  int member = -1;  // topology index = rank - 1

  codec::MutableWeights weights;
  std::unique_ptr<codec::DeltaApplier> applier;
  // applier (the pointer), acked, nacked, pending_changes; taken before state_mutex. Chunk frames
  // are applied under a shared lock (DeltaApplier::apply is concurrent: the two parents of a
  // double binary tree apply at once); everything else takes it exclusively.
  std::shared_mutex applier_mutex;

  std::vector<std::unique_ptr<transport::Connection>> parents;          // [tree]
  std::vector<std::vector<std::unique_ptr<OutboundLink>>> children;    // [tree][i]

  std::mutex state_mutex;  // seen, retained, stats
  std::set<FrameKey> seen;
  std::vector<SharedBytes> retained;
  size_t retained_bytes = 0;
  ReceiverStats stats;
  std::set<uint64_t> acked, nacked;
  uint64_t pending_changes = 0;
  // Raw bootstrap of `raw_version` from the all-zero version 0 (guarded by applier_mutex). A
  // piece is claimed when its body starts landing in the weights and held once it landed;
  // raw_landing counts bodies still landing (ABORT waits for them before zeroing the weights).
  std::optional<uint64_t> raw_version;
  std::vector<bool> raw_claimed, raw_have;
  uint32_t raw_received = 0;
  uint64_t raw_hash = 0;  // sum of raw_piece_hash over the held pieces
  uint32_t raw_landing = 0;
  std::condition_variable_any raw_landed;

  std::atomic<bool> stopping{false};

  Impl(transport::Transport& t, ReceiverOptions o) : transport(t), options(std::move(o)) {}

  void send_to_producer(const Message& message) {
    send_control(*control, message, kControlSendTimeout);
  }

  void connect_producer();
  void build_edges();
  void read_parent(int tree);
  void handle_frame(int tree, std::span<const std::byte> message);
  void apply_frame(const codec::FrameView& view);
  std::optional<size_t> receive(int tree, std::span<std::byte> into);
  bool relay_raw(int tree, std::span<const std::byte> message, std::span<std::byte> scratch);
  std::optional<std::string> claim_raw(const RawChunkHeader& h);
  std::optional<Message> land_raw(const RawChunkHeader& h, std::optional<uint64_t> hash);
  std::optional<Message> refuse_raw(uint64_t version, Errc code, const std::string& why);
  bool first_sight(const FrameKey& key, size_t bytes);
  void forward(int tree, std::span<const std::byte> message);
  void forward(int tree, const SharedBytes& shared);
  void reset_raw();
  void forget_version();
  void forget_version_locked();
  bool handle_control(const Message& message, uint64_t& active_version);
};

void Receiver::Impl::connect_producer() {
  auto url = transport::Url::parse(options.producer_url);
  auto deadline = std::chrono::steady_clock::now() + options.join_timeout;
  // The producer may start after us (launchers start every rank at once): retry refusals.
  for (;;) {
    try {
      control = transport.connect(url, options.connect_timeout);
      return;
    } catch (const Error& e) {
      if (e.code() != Errc::connection || std::chrono::steady_clock::now() > deadline) throw;
      std::this_thread::sleep_for(200ms);
    }
  }
}

void Receiver::Impl::build_edges() {
  const int trees = topology->trees();
  parents.resize(trees);
  children.resize(trees);
  size_t expected = 0;
  for (int t = 0; t < trees; ++t) expected += topology->children(member, t).size();

  // Accept children on a thread while connecting to parents: a parent may itself be busy
  // connecting upwards, so neither side may wait for the other first.
  Status accept_status;
  std::vector<std::vector<std::unique_ptr<OutboundLink>>> accepted(trees);
  std::thread acceptor([&] {
    auto deadline = std::chrono::steady_clock::now() + options.join_timeout;
    try {
      size_t joined = 0;
      while (joined < expected) {
        if (std::chrono::steady_clock::now() > deadline)
          throw Error(Errc::timeout, "rank " + std::to_string(options.rank) + ": only " +
                                         std::to_string(joined) + " of " +
                                         std::to_string(expected) + " children joined");
        auto connection = listener->accept(500ms);
        if (!connection) continue;
        auto bytes = recv_message(*connection, kControlBufferBytes, options.connect_timeout);
        auto message = decode_message(bytes);
        auto* join = std::get_if<Join>(&message);
        if (!join) throw Error(Errc::corrupt_frame, "a child's first message is not JOIN");
        int child = static_cast<int>(join->rank) - 1;
        int tree = static_cast<int>(join->tree);
        if (tree < 0 || tree >= trees || child < 0 || child >= topology->size() ||
            topology->parent(child, tree) != member)
          throw Error(Errc::invalid_argument, "rank " + std::to_string(join->rank) +
                                                  " joined tree " + std::to_string(tree) +
                                                  " but is not a child of rank " +
                                                  std::to_string(options.rank) + " there");
        accepted[tree].push_back(std::make_unique<OutboundLink>(std::move(connection), child, tree));
        ++joined;
      }
    } catch (const Error& e) {
      accept_status = e.status();
    }
  });
  try {
    for (int t = 0; t < trees; ++t) {
      int parent = topology->parent(member, t);
      const auto& url = welcome.members.at(parent == kProducer ? 0 : parent + 1).url;
      parents[t] = transport.connect(transport::Url::parse(url), options.connect_timeout);
      send_control(*parents[t], Join{options.rank, static_cast<uint32_t>(t)}, kControlSendTimeout);
    }
  } catch (...) {
    acceptor.join();
    throw;
  }
  acceptor.join();
  if (!accept_status.ok()) throw Error(accept_status);
  // Send to children in the topology's order.
  for (int t = 0; t < trees; ++t) {
    for (int child : topology->children(member, t))
      for (auto& link : accepted[t])
        if (link && link->peer_rank() == child) children[t].push_back(std::move(link));
  }
}

// Receives the next message from the parent in `tree` into `into`. Returns its length, or
// nullopt when the receiver is stopping or the link failed (logged).
std::optional<size_t> Receiver::Impl::receive(int tree, std::span<std::byte> into) {
  auto request = parents[tree]->post_recv(into);
  Status status;
  while ((status = request->wait(500ms)).code == Errc::timeout) {
    if (stopping) {
      cancel_and_wait(*request);
      return std::nullopt;
    }
  }
  if (!status.ok()) {
    if (!stopping)
      log->error("rank {}: link to parent in tree {} failed: {}", options.rank, tree, status.message);
    return std::nullopt;
  }
  return request->bytes();
}

void Receiver::Impl::read_parent(int tree) {
  std::vector<std::byte> buffer(welcome.max_message_bytes);
  try {
    for (;;) {
      for (auto& child : children[tree])
        child->wait_below(options.max_inflight_bytes_per_child, kChildStallTimeout);
      auto bytes = receive(tree, buffer);
      if (!bytes) return;
      std::span<const std::byte> message(buffer.data(), *bytes);
      try {
        if (message_type(message) == MessageType::raw) {
          if (!relay_raw(tree, message, buffer)) return;
        } else {
          handle_frame(tree, message);
        }
      } catch (const Error& e) {
        std::lock_guard lock(state_mutex);
        ++stats.frames_refused;
        log->warn("rank {}: refused a message from the parent in tree {}: {}", options.rank, tree,
                  e.what());
      }
    }
  } catch (const Error& e) {
    log->error("rank {}: relay in tree {} stopped: {}", options.rank, tree, e.what());
  }
}

bool Receiver::Impl::first_sight(const FrameKey& key, size_t bytes) {
  std::lock_guard lock(state_mutex);
  ++stats.frames_received;
  stats.payload_bytes += bytes;
  return seen.insert(key).second;
}

// Cut-through: posts the message to every child of `tree` (one shared copy, kept until sent, and
// retained for RESUME while the retention budget lasts).
void Receiver::Impl::forward(int tree, std::span<const std::byte> message) {
  if (children[tree].empty()) return;
  forward(tree, std::make_shared<const std::vector<std::byte>>(message.begin(), message.end()));
}

void Receiver::Impl::forward(int tree, const SharedBytes& shared) {
  if (children[tree].empty()) return;
  for (auto& child : children[tree]) child->post(shared);
  std::lock_guard lock(state_mutex);
  stats.frames_forwarded += children[tree].size();
  if (retained_bytes + shared->size() <= options.retain_bytes) {
    retained.push_back(shared);
    retained_bytes += shared->size();
  }
}

void Receiver::Impl::handle_frame(int tree, std::span<const std::byte> message) {
  auto frame = frame_payload(message);
  codec::FrameView view = codec::parse_frame(frame);
  const auto& h = view.header;
  // Only the first copy of a frame is forwarded; a duplicate still goes to the applier, which
  // refuses it (replayed), so the refusal is the applier's exactly-once rule, not ours.
  if (first_sight({h.new_version, static_cast<uint8_t>(h.kind), h.chunk_index}, frame.size()))
    forward(tree, message);
  // The receive buffer stays untouched until the next receive, which waits for this apply.
  apply_frame(view);
}

// One bootstrap piece: the RAW header (`message`, in `scratch`) is followed by its bare body,
// received straight into the weights when the piece is valid and new (into `scratch` otherwise,
// and dropped), forwarded to the children from there, hashed where it landed. Returns false
// when the link can not go on (stopping, link failure, or a body that can not be skipped).
bool Receiver::Impl::relay_raw(int tree, std::span<const std::byte> message, std::span<std::byte> scratch) {
  RawChunkHeader h;
  try {
    h = decode_raw_message(message);
  } catch (const Error& e) {
    // Without a header the body's length is unknown: the stream can not be resynchronised.
    log->error("rank {}: unreadable RAW header from the parent in tree {}: {}", options.rank, tree, e.what());
    return false;
  }
  const bool first = first_sight({h.version, 0xff, h.chunk_index}, h.byte_count);
  std::span<std::byte> body;
  bool landing = false;  // the body goes into the weights
  if (first) {
    std::unique_lock lock(applier_mutex);
    if (auto why = claim_raw(h)) {
      auto refusal = refuse_raw(h.version, Errc::version_mismatch, *why);
      lock.unlock();
      if (refusal) send_to_producer(*refusal);
    } else {
      body = weights.tensors[h.tensor].subspan(h.byte_offset, h.byte_count);
      landing = true;
      ++raw_landing;
    }
  } else {
    std::lock_guard lock(state_mutex);
    ++stats.frames_replayed;
    log->warn("rank {}: refused a replayed raw chunk {} of version {}", options.rank, h.chunk_index, h.version);
  }
  // The header lies in `scratch`, which a body that does not land in the weights overwrites: such
  // a piece forwards a copy of the header taken here (and of its body once it arrived).
  SharedBytes header_copy;
  if (!landing) {
    if (h.byte_count > scratch.size()) {
      log->error("rank {}: RAW body of {} bytes exceeds the {}-byte receive buffer", options.rank,
                 h.byte_count, scratch.size());
      return false;
    }
    if (first) header_copy = std::make_shared<const std::vector<std::byte>>(message.begin(), message.end());
    body = scratch.first(h.byte_count);
  }
  const auto received = receive(tree, body);
  std::optional<uint64_t> hash;
  if (received && *received == h.byte_count) {
    if (first && !children[tree].empty()) {  // forward verbatim; a refused piece goes on too
      if (landing) {
        forward(tree, message);
        for (auto& child : children[tree]) child->post_view(body);
      } else {
        forward(tree, header_copy);
        const auto body_copy = std::make_shared<const std::vector<std::byte>>(body.begin(), body.end());
        for (auto& child : children[tree]) child->post(body_copy);
      }
    }
    if (landing) hash = raw_piece_hash(h, body);
  }
  if (landing) {
    std::optional<Message> reply;
    {
      std::lock_guard lock(applier_mutex);
      --raw_landing;
      raw_landed.notify_all();
      if (received) reply = land_raw(h, hash);
    }
    if (reply) send_to_producer(*reply);
  }
  return received.has_value();
}

std::optional<Message> Receiver::Impl::refuse_raw(uint64_t version, Errc code, const std::string& why) {
  std::lock_guard lock(state_mutex);
  ++stats.frames_refused;
  if (!nacked.insert(version).second) return std::nullopt;
  log->warn("rank {}: refused raw version {}: {}", options.rank, version, why);
  return Nack{options.rank, version, static_cast<uint32_t>(code), why};
}

// Checks a piece against the state (version 0, bounds, chunk count) and claims it; returns why
// not. Requires applier_mutex.
std::optional<std::string> Receiver::Impl::claim_raw(const RawChunkHeader& h) {
  if (applier->version() != 0 || applier->pending_version() || h.version != 1)
    return "raw bootstrap of version " + std::to_string(h.version) +
           " needs the all-zero version 0; this receiver holds " + std::to_string(applier->version());
  bool inside = h.tensor < manifest->size();
  if (inside) {
    const auto& info = manifest->at(h.tensor);
    const uint64_t w = codec::dtype_size(info.dtype);
    inside = h.byte_offset % w == 0 && h.byte_count % w == 0 && h.byte_offset <= info.nbytes() &&
             h.byte_count <= info.nbytes() - h.byte_offset;
  }
  if (!inside)
    return "raw chunk " + std::to_string(h.chunk_index) + " lies outside its tensor or splits an element";
  if (!raw_version) {
    raw_version = h.version;
    raw_claimed.assign(h.chunk_count, false);
    raw_have.assign(h.chunk_count, false);
    raw_received = 0;
    raw_hash = 0;
  }
  if (h.chunk_count != raw_have.size()) return std::string("raw chunks disagree on the chunk count");
  if (raw_claimed[h.chunk_index])
    return "raw chunk " + std::to_string(h.chunk_index) + " arrived twice";
  raw_claimed[h.chunk_index] = true;
  return std::nullopt;
}

// A claimed piece landed (hash set) or its body was cut short (hash empty): records it and
// returns the ACK once every piece is held, or the NACK. Requires applier_mutex.
std::optional<Message> Receiver::Impl::land_raw(const RawChunkHeader& h, std::optional<uint64_t> hash) {
  if (raw_version != h.version || h.chunk_index >= raw_have.size()) return std::nullopt;  // aborted meanwhile
  if (!hash)
    return refuse_raw(h.version, Errc::corrupt_frame,
                      "raw chunk " + std::to_string(h.chunk_index) + " body is shorter than announced");
  raw_hash += *hash;
  raw_have[h.chunk_index] = true;
  if (++raw_received < raw_have.size() || acked.count(h.version) || nacked.count(h.version))
    return std::nullopt;
  // Complete: every piece was hashed where it lies in the buffers; the producer hashed the same
  // pieces of its checkpoint, so equal sums mean equal bits (a misplaced piece hashes differently).
  acked.insert(h.version);
  return Ack{options.rank, h.version, raw_hash, 0};
}

void Receiver::Impl::reset_raw() {
  raw_version.reset();
  raw_claimed.clear();
  raw_have.clear();
  raw_received = 0;
  raw_hash = 0;
}

void Receiver::Impl::apply_frame(const codec::FrameView& view) {
  const uint64_t version = view.header.new_version;
  std::optional<Message> reply;
  std::optional<codec::ApplyResult> applied;
  std::optional<Error> failure;
  {
    std::shared_lock lock(applier_mutex);
    try {
      applied = applier->apply(view);
    } catch (const Error& e) {
      failure = e;
    }
  }
  {
    std::lock_guard lock(applier_mutex);
    try {
      if (failure) throw *failure;
      pending_changes += applied->changes;
      if (applier->complete() && !acked.count(version) && !nacked.count(version)) {
        try {
          applier->verify();
          acked.insert(version);
          reply = Ack{options.rank, version, applier->digest().combined(), pending_changes};
        } catch (const Error& e) {
          nacked.insert(version);
          reply = Nack{options.rank, version, static_cast<uint32_t>(e.code()), e.what()};
        }
      }
    } catch (const Error& e) {
      std::lock_guard state_lock(state_mutex);
      if (e.code() == Errc::replayed) {
        ++stats.frames_replayed;
        log->warn("rank {}: refused a replayed frame: {}", options.rank, e.what());
      } else {
        ++stats.frames_refused;
        if (nacked.insert(version).second) {
          log->warn("rank {}: refused version {}: {}", options.rank, version, e.what());
          reply = Nack{options.rank, version, static_cast<uint32_t>(e.code()), e.what()};
        }
      }
    }
  }
  if (reply) send_to_producer(*reply);
}

void Receiver::Impl::forget_version() {
  std::lock_guard applier_lock(applier_mutex);
  forget_version_locked();
}

void Receiver::Impl::forget_version_locked() {
  std::lock_guard lock(state_mutex);
  seen.clear();
  retained.clear();
  retained_bytes = 0;
  acked.clear();
  nacked.clear();
  pending_changes = 0;
}

// Returns false on BYE.
bool Receiver::Impl::handle_control(const Message& message, uint64_t& active_version) {
  if (std::holds_alternative<Bye>(message)) return false;
  if (auto* commit = std::get_if<Commit>(&message)) {
    const uint64_t v = commit->version;
    std::unique_lock lock(applier_mutex);
    const bool raw = raw_version == v && acked.count(v);
    if (!raw && !(applier->pending_version() == v && acked.count(v))) {
      forget_version_locked();
      lock.unlock();
      send_to_producer(Nack{options.rank, v, static_cast<uint32_t>(Errc::state),
                            "COMMIT for a version this receiver has not verified"});
      return true;
    }
    uint64_t digest;
    if (raw) {  // the bootstrap bits are in the buffers
      digest = raw_hash;
      reset_raw();
    } else {
      applier->commit();
      digest = applier->digest().combined();
    }
    active_version = v;
    {
      std::lock_guard state_lock(state_mutex);
      ++stats.versions_committed;
    }
    forget_version_locked();
    // ACTIVE goes out first; the rest is idle-time work, done before releasing the lock so that
    // frames of the next version wait for it: after a bootstrap, a fresh applier whose
    // StateDigest is a full scan of the buffers; then the undo log's page faults (room for ~1.6%
    // of the elements; it grows beyond that if needed).
    send_to_producer(Active{options.rank, v, digest});
    if (raw)
      applier = std::make_unique<codec::DeltaApplier>(*manifest, weights, v,
                                                      codec::StateDigest::full_scan(weights.as_const(), 1));
    applier->reserve(manifest->total_elements() / 64);
    lock.unlock();
    if (options.on_active) options.on_active(v);
    return true;
  }
  if (auto* abort = std::get_if<Abort>(&message)) {
    Message reply;
    {
      std::unique_lock lock(applier_mutex);
      if (applier->pending_version()) applier->rollback();
      // Bodies still landing in the weights would write over the zeros: wait for them.
      raw_landed.wait(lock, [&] { return raw_landing == 0; });
      if (raw_version) {  // back to the all-zero version 0
        for (auto& t : weights.tensors) std::memset(t.data(), 0, t.size());
        reset_raw();
      }
      reply = Active{options.rank, applier->version(), applier->digest().combined()};
      std::lock_guard state_lock(state_mutex);
      ++stats.versions_aborted;
    }
    log->info("rank {}: version {} aborted ({}), back at version {}", options.rank,
              abort->version, abort->reason, active_version);
    forget_version();
    send_to_producer(reply);
    return true;
  }
  if (auto* request = std::get_if<HaveRequest>(&message)) {
    Have have{options.rank, request->version, {}};
    {
      std::lock_guard lock(applier_mutex);
      if (applier->pending_version() == request->version) have.chunks = applier->applied_chunks();
      if (raw_version == request->version) have.chunks = raw_have;
    }
    send_to_producer(have);
    return true;
  }
  log->warn("rank {}: ignoring an unexpected control message", options.rank);
  return true;
}

Receiver::Receiver(transport::Transport& transport, ReceiverOptions options)
    : impl_(std::make_unique<Impl>(transport, std::move(options))) {
  impl_->listener = transport.listen(transport::Url::parse(impl_->options.listen_url));
}

Receiver::~Receiver() = default;

std::string Receiver::listen_url() const { return impl_->listener->local_url().str(); }

const codec::Manifest& Receiver::join() {
  auto& d = *impl_;
  if (d.options.rank == 0) throw Error(Errc::invalid_argument, "receiver rank must be >= 1");
  d.connect_producer();
  d.send_to_producer(Hello{d.options.rank, listen_url(), d.options.cluster, 0, 0});
  auto bytes = recv_message(*d.control, kWelcomeBufferBytes, d.options.join_timeout);
  auto message = decode_message(bytes);
  auto* welcome = std::get_if<Welcome>(&message);
  if (!welcome) throw Error(Errc::corrupt_frame, "the producer's first message is not WELCOME");
  d.welcome = std::move(*welcome);
  std::vector<std::string> labels;
  for (size_t i = 1; i < d.welcome.members.size(); ++i) labels.push_back(d.welcome.members[i].cluster);
  if (d.options.rank >= d.welcome.members.size())
    throw Error(Errc::invalid_argument, "rank " + std::to_string(d.options.rank) +
                                            " is not in the producer's membership of " +
                                            std::to_string(d.welcome.members.size()));
  d.topology.emplace(parse_topology_kind(d.welcome.topology), std::move(labels));
  d.member = static_cast<int>(d.options.rank) - 1;
  d.manifest.emplace(d.welcome.tensors);
  return *d.manifest;
}

void Receiver::attach(codec::MutableWeights weights, uint64_t version,
                      std::optional<codec::StateDigest> digest) {
  auto& d = *impl_;
  if (!d.manifest) throw Error(Errc::state, "Receiver::attach before join()");
  weights.manifest = &*d.manifest;
  codec::check_weights(weights.as_const());
  if (!digest) digest = codec::StateDigest::full_scan(weights.as_const());
  d.weights = weights;
  d.applier = std::make_unique<codec::DeltaApplier>(*d.manifest, weights, version, *digest);
  active_version_ = version;
}

RunSummary Receiver::run() {
  auto& d = *impl_;
  if (!d.applier) throw Error(Errc::state, "Receiver::run before attach()");
  d.build_edges();
  d.send_to_producer(Ready{d.options.rank});
  d.log->debug("rank {}: tree edges up", d.options.rank);

  std::vector<std::thread> readers;
  for (int t = 0; t < d.topology->trees(); ++t) readers.emplace_back([&d, t] { d.read_parent(t); });
  auto stop_readers = [&] {
    d.stopping = true;
    for (auto& reader : readers) reader.join();
  };

  uint64_t active = active_version_;
  std::vector<std::byte> buffer(kControlBufferBytes);
  try {
    for (;;) {
      auto request = d.control->post_recv(buffer);
      Status status = request->wait(d.options.idle_timeout);
      if (status.code == Errc::timeout) {
        cancel_and_wait(*request);
        throw Error(Errc::timeout, "no word from the producer for " +
                                       std::to_string(d.options.idle_timeout.count()) + " ms");
      }
      if (!status.ok()) throw Error(Errc::connection, "link to the producer failed: " + status.message);
      auto message = decode_message(std::span(buffer.data(), request->bytes()));
      bool more = d.handle_control(message, active);
      active_version_ = active;
      if (!more) break;
    }
  } catch (...) {
    stop_readers();
    throw;
  }
  stop_readers();
  for (auto& tree_children : d.children)
    for (auto& child : tree_children) child->flush(kChildStallTimeout);
  RunSummary summary;
  summary.version = active;
  summary.digest = d.applier->digest().combined();
  summary.stats = stats();
  return summary;
}

ReceiverStats Receiver::stats() const {
  std::lock_guard lock(impl_->state_mutex);
  return impl_->stats;
}

}  // namespace deltacast::tree
