#include "tree/receiver.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "codec/frame.h"
#include "tree/membership.h"
#include "tree/protocol.h"
#include "tree/receiver_impl.h"
#include "tree/relay_link.h"
#include "tree/secure_start.h"
#include "tree/session.h"

namespace deltacast::tree {
namespace {

bool same_placement(const std::vector<codec::BufferPlacement>& a, const std::vector<codec::BufferPlacement>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& x = a[i];
    const auto& y = b[i];
    if (x.name != y.name || x.stack != y.stack || x.shape != y.shape || x.bytes != y.bytes ||
        x.parts.size() != y.parts.size())
      return false;
    for (size_t k = 0; k < x.parts.size(); ++k) {
      const auto& p = x.parts[k];
      const auto& q = y.parts[k];
      if (p.tensor != q.tensor || p.dim != q.dim || p.start != q.start || p.stop != q.stop || p.at != q.at)
        return false;
    }
  }
  return true;
}

}  // namespace

Receiver::Impl::Impl(transport::Transport& t, ReceiverOptions o, std::atomic<uint64_t>& active)
    : transport(t),
      options(std::move(o)),
      producer(transport, options),
      versions(active, options.on_active, options.on_aborted) {}

// Says HELLO with what this member holds, and takes the producer's WELCOME. Throws
// Error(connection | timeout) when the producer stays unreachable or silent, and the producer's
// refusal as an Error.
void Receiver::Impl::hello(std::chrono::milliseconds patience, bool rejoin) {
  const HeldWeights::Held h = held.held();
  Hello said{options.rank, relay.listen_url(), options.cluster, h.version, h.digest, h.attempt_floor, 0, {}};
  // A placed member states each distinct canonical slice its buffers hold.
  const auto& placement = held.placed().placement ? held.placed().placement->buffers() : options.placement;
  for (const auto& buffer : placement)
    for (const auto& part : buffer.parts) {
      HeldSlice slice{part.tensor, part.dim, part.start, part.stop};
      if (std::find(said.slices.begin(), said.slices.end(), slice) == said.slices.end()) said.slices.push_back(slice);
    }
  slices_stated = !said.slices.empty();
  auto [welcome, epoch] = producer.hello(std::move(said), patience, rejoin);
  take_welcome(std::move(welcome), epoch);
}

void Receiver::Impl::take_welcome(Welcome w, uint64_t e) {
  if (options.rank >= w.members.size())
    throw Error(Errc::invalid_argument, who() + " is not in the producer's membership of " +
                                            std::to_string(w.members.size() - 1) + " receivers");
  const codec::Manifest* manifest = held.manifest();
  if (manifest && manifest->digest() != codec::Manifest(w.tensors).digest())
    throw Error(Errc::version_mismatch, "the producer's manifest differs from the one this member holds");
  check_layout(w.layout, w.tensors.size());
  if (w.producer_urls.size() > static_cast<size_t>(kMaxProducers))
    throw Error(Errc::corrupt_frame,
                "welcome: a producer group of " + std::to_string(w.producer_urls.size()) + " ranks");
  const int producers = w.producer_urls.empty() ? 1 : static_cast<int>(w.producer_urls.size());
  auto m = Membership::from_welcome(parse_topology_kind(w.topology), e, w.members, w.forest, producers);
  auto announced = std::make_shared<const CheckpointLayout>(std::move(w.layout));
  w.layout = {};
  // A (new) producer: nothing of what an earlier one announced stands.
  layouts.restart(std::move(announced), w.committed_version, held.held().version);
  producer.take(std::move(w), std::move(m));
}

// A member the producer does not count live yet (a rejoin, or a member whose version is behind):
// reaches the producer's committed version as CATCHUP says, says READY, and waits until an EPOCH
// admits it. Returns false on BYE.
bool Receiver::Impl::catch_up() {
  Session& session = *held.session();
  // As large as a WELCOME: a LAYOUT may come (uninitialised: only what a message fills is paid).
  const auto storage = std::make_unique_for_overwrite<std::byte[]>(kWelcomeBufferBytes);
  const std::span<std::byte> buffer(storage.get(), kWelcomeBufferBytes);
  for (;;) {
    uint64_t e = 0;
    auto message = producer.recv(options.idle_timeout, buffer, &e);
    if (auto* update = std::get_if<EpochUpdate>(&message)) {
      on_epoch(*update, e);
      if (producer.membership().live(options.rank)) return true;
      continue;
    }
    if (auto* update = std::get_if<LayoutUpdate>(&message)) {
      // A committed version's (attempt 0): taken once this member reaches it.
      layouts.take(*update, held.manifest()->size(), session.attempt_floor());
      continue;
    }
    if (std::holds_alternative<Bye>(message)) return false;
    if (auto* fenced = std::get_if<Fenced>(&message))
      throw Error(Errc::state, who() + " was fenced while catching up: " + fenced->reason);
    auto* plan = std::get_if<Catchup>(&message);
    if (!plan) {
      log->warn("{}: ignoring an unexpected message while catching up", who());
      continue;
    }
    // Each source in turn (its own cluster first, the producer last) until one brings this member
    // to the version: a snapshot (when the producer says so; one from a peer at most, which may be
    // older than the version when that peer is gated) then the versions after it by replay, from
    // that peer or the next ones; the producer serves snapshots only.
    bool done = plan->mode == CatchupMode::none;
    bool have_snapshot = false;
    for (const auto& source : plan->sources) {
      if (done) break;
      const bool from_producer = source.rank == kProducerRank;
      if (plan->mode == CatchupMode::snapshot && (!have_snapshot || from_producer)) {
        if (!fetch_snapshot(source)) continue;
        have_snapshot = true;
      }
      done = session.version() >= plan->version || (!from_producer && fetch_replay(source, plan->version));
    }
    if (!done) log->warn("{}: no peer could bring version {} to {}", who(), session.version(), plan->version);
    log->info("{}: caught up to version {} (digest {:016x})", who(), session.version(), session.digest());
    producer.send(Ready{options.rank, session.version(), session.digest()});
  }
}

// Opens a FETCH link to `source` and hands each message to `handle(bytes, link)` until FETCH_END,
// which must report success; returns it. Throws Error (the link's, the peer's, or a silence of
// peer_timeout).
template <class Handle>
FetchEnd Receiver::Impl::fetch(const Member& source, const Fetch& request, Handle&& handle) {
  auto link = transport.connect(transport::Url::parse(source.url), options.connect_timeout);
  send_control(*link, request, kControlSendTimeout);
  std::vector<std::byte> buffer(producer.welcome().max_message_bytes);
  auto receive = [&](std::span<std::byte> into) {
    auto r = link->post_recv(into);
    Status status = r->wait(options.peer_timeout);
    if (status.code == Errc::timeout) {
      cancel_and_wait(*r);
      throw Error(Errc::timeout, "rank " + std::to_string(source.rank) + " sent nothing for " +
                                     std::to_string(options.peer_timeout.count()) + " ms");
    }
    if (!status.ok()) throw Error(status);
    return r->bytes();
  };
  for (;;) {
    std::span<const std::byte> bytes(buffer.data(), receive(buffer));
    if (message_type(bytes) != MessageType::fetch_end && handle(bytes, receive)) continue;
    auto message = decode_message(bytes);
    auto* end = std::get_if<FetchEnd>(&message);
    if (!end) throw Error(Errc::corrupt_frame, "unexpected message on a fetch link");
    if (end->errc != 0) throw Error(static_cast<Errc>(end->errc), end->message);
    return *end;
  }
}

// Replays committed versions session->version()+1 .. version from a peer's retained frames, each
// verified by its seal. Returns false when that peer could not serve them (the bits stay at the
// last whole version).
bool Receiver::Impl::fetch_replay(const Member& source, uint64_t version) {
  Session& session = *held.session();
  const uint64_t from = session.version();
  try {
    fetch(source, Fetch{options.rank, CatchupMode::replay, from, version}, [&](std::span<const std::byte> bytes, auto&) {
      if (message_type(bytes) != MessageType::frame) return false;
      session.replay_frame(codec::parse_frame(frame_payload(bytes)));
      return true;
    });
    if (session.version() != version)
      throw Error(Errc::state, "the replay ended at version " + std::to_string(session.version()));
    return true;
  } catch (const Error& e) {
    session.abandon_replay();
    log->warn("{}: replay of versions {}..{} from rank {} failed: {}", who(), from + 1, version, source.rank,
              e.what());
    return false;
  }
}

// Receives a peer's snapshot of its committed version straight into this member's buffers (it is
// not live: nobody reads them), then checks every byte with a full-scan digest against the one the
// peer announced; later replays check it again against the producer's frames. A placed member
// receives each piece into a bounce buffer, adds it to the whole version's digest and keeps the
// units it holds (codec::scatter_placed): it checks the whole snapshot as a whole member does. A
// snapshot that breaks off leaves the buffers zeroed at version 0, a state that is true. Returns
// false then.
bool Receiver::Impl::fetch_snapshot(const Member& source) {
  const auto buffers_lock = held.lock_buffers();  // no reattach while pieces land
  codec::MutableWeights& weights = held.buffers();
  const codec::PlacedWeights& placed = held.placed();
  const codec::Manifest& manifest = *held.manifest();
  Session& session = *held.session();
  std::vector<bool> have;
  std::vector<uint64_t> placed_digest(manifest.size(), 0);  // placed: the whole version's, per tensor
  std::vector<std::byte> bounce;
  try {
    const FetchEnd end = fetch(
        source, Fetch{options.rank, CatchupMode::snapshot, 0, 0}, [&](std::span<const std::byte> bytes, auto& receive) {
          if (message_type(bytes) != MessageType::raw) return false;
          const RawChunkHeader h = decode_raw_message(bytes);
          if (h.chunk_count > max_raw_chunk_count(manifest))
            throw Error(Errc::corrupt_frame, "snapshot: raw chunk count " + std::to_string(h.chunk_count) +
                                                 " is more pieces than the checkpoint has elements");
          if (have.empty()) have.assign(h.chunk_count, false);
          bool inside = h.tensor < manifest.size() && h.chunk_count == have.size() && h.chunk_index < have.size();
          if (inside) {
            const auto& info = manifest.at(h.tensor);
            const uint64_t w = codec::dtype_size(info.dtype);
            inside = h.byte_offset % w == 0 && h.byte_count % w == 0 && h.byte_offset <= info.nbytes() &&
                     h.byte_count <= info.nbytes() - h.byte_offset;
          }
          if (!inside) throw Error(Errc::corrupt_frame, "a snapshot piece lies outside its tensor");
          std::span<std::byte> into;
          if (placed.placement) {
            bounce.resize(h.byte_count);
            into = std::span(bounce);
          } else {
            into = weights.tensors[h.tensor].subspan(h.byte_offset, h.byte_count);
          }
          if (receive(into) != h.byte_count)
            throw Error(Errc::corrupt_frame, "a snapshot piece is shorter than announced");
          if (placed.placement) {
            const auto dtype = manifest.at(h.tensor).dtype;
            placed_digest[h.tensor] +=
                codec::slice_digest(h.tensor, dtype, h.byte_offset / codec::dtype_unit_size(dtype), into);
            codec::scatter_placed(*placed.placement, manifest, h.tensor, h.byte_offset, into, placed.buffers);
          }
          have[h.chunk_index] = true;
          return true;
        });
    if (have.empty() || std::count(have.begin(), have.end(), false) != 0)
      throw Error(Errc::corrupt_frame, "the snapshot misses pieces");
    std::optional<codec::StateDigest> digest;
    const uint64_t combined = placed.placement
                                  ? codec::StateDigest(placed_digest).combined()
                                  : digest.emplace(codec::StateDigest::full_scan(weights.as_const(), 1)).combined();
    if (combined != end.digest)
      throw Error(Errc::verify_failed, "the snapshot's bits do not match the digest rank " +
                                           std::to_string(source.rank) + " announced for version " +
                                           std::to_string(end.version));
    if (placed.placement)
      session.install_placed(end.version, end.digest);
    else
      session.install(end.version, std::move(*digest));
    log->info("{}: took a snapshot of version {} from rank {}", who(), end.version, source.rank);
    ++snapshots_taken;
    last_snapshot_source = source.rank;
    return true;
  } catch (const Error& e) {
    log->warn("{}: snapshot from rank {} failed: {}", who(), source.rank, e.what());
    if (!have.empty()) {
      if (placed.placement) {
        codec::zero_placed(*placed.placement, manifest, placed.buffers);
        session.install_placed(0, codec::StateDigest::zeros(manifest).combined());
      } else {
        for (auto& t : weights.tensors) std::memset(t.data(), 0, t.size());
        session.install(0, codec::StateDigest::full_scan(weights.as_const(), 1));
      }
    }
    return false;
  }
}

Receiver::Receiver(transport::Transport& transport, ReceiverOptions options)
    : impl_(std::make_unique<Impl>(transport, std::move(options), active_version_)) {
  const auto& o = impl_->options;
  require_authenticated(transport, {o.listen_url, o.producer_url}, o.allow_insecure, "rank " + std::to_string(o.rank));
  impl_->relay.listen(transport, transport::Url::parse(o.listen_url));
}

Receiver::~Receiver() { impl_->relay.stop(); }

std::shared_ptr<const CheckpointLayout> Receiver::layout() const {
  if (!impl_->held.manifest()) throw Error(Errc::state, "layout() before join()");
  return impl_->layouts.current();
}

std::string Receiver::listen_url() const { return impl_->relay.listen_url(); }

const codec::Manifest& Receiver::join(uint64_t held_version, uint64_t held_digest) {
  auto& d = *impl_;
  if (d.options.rank == 0) throw Error(Errc::invalid_argument, "receiver rank must be >= 1");
  d.held.host_holds(held_version, held_digest);
  d.hello(d.options.join_timeout, false);
  return d.held.set_manifest(codec::Manifest(d.producer.welcome().tensors));
}

void Receiver::attach(codec::MutableWeights weights, uint64_t version,
                      std::optional<codec::StateDigest> digest) {
  auto& d = *impl_;
  if (!d.held.manifest()) throw Error(Errc::state, "Receiver::attach before join()");
  if (!d.options.placement.empty())
    throw Error(Errc::state, "Receiver::attach: this member stated a placement at join; use attach_placed()");
  weights.manifest = d.held.manifest();
  codec::check_weights(weights.as_const());
  if (!digest) digest = codec::StateDigest::full_scan(weights.as_const());
  d.held.attach(std::move(weights), version, std::move(*digest), d.options);
  active_version_ = version;
}

void Receiver::attach_placed(std::vector<codec::BufferPlacement> placement, std::vector<std::span<std::byte>> buffers,
                             uint64_t version, uint64_t version_digest) {
  auto& d = *impl_;
  if (!d.held.manifest()) throw Error(Errc::state, "Receiver::attach_placed before join()");
  if (d.held.session()) throw Error(Errc::state, "Receiver::attach_placed: already attached");
  if (!d.options.placement.empty() && !same_placement(placement, d.options.placement))
    throw Error(Errc::invalid_argument,
                "Receiver::attach_placed: the placement differs from the one this member stated at join");
  codec::PlacedWeights placed;
  placed.placement =
      std::make_shared<const codec::Placement>(codec::Placement::compile(*d.held.manifest(), std::move(placement)));
  codec::check_placed_buffers(*placed.placement, buffers);
  placed.buffers = std::move(buffers);
  // Version 0 is all zeros by definition: the held units are zeroed here (a version 1 sent as a
  // delta from zeros applies on them); padding is left as it is.
  if (version == 0) codec::zero_placed(*placed.placement, *d.held.manifest(), placed.buffers);
  // Version 0 is all zeros by definition: its name is the all-zero model's digest.
  const uint64_t combined = version == 0 ? codec::StateDigest::zeros(*d.held.manifest()).combined() : version_digest;
  d.held.attach_placed(std::move(placed), version, combined, d.options);
  active_version_ = version;
}

std::shared_ptr<const codec::Placement> Receiver::placement() const { return impl_->held.placed().placement; }

RunSummary Receiver::run() {
  auto& d = *impl_;
  Session* session = d.held.session();
  if (!session) throw Error(Errc::state, "Receiver::run before attach()");
  for (;;) {
    Ending ending;
    try {
      ending = d.serve();
    } catch (...) {
      d.relay.stop();
      throw;
    }
    d.relay.stop();
    if (ending == Ending::bye) break;
    if (d.producer.leaving()) {
      session->drop_in_flight();
      break;
    }
    // The producer is gone (or fenced us): what was in flight is rolled back, the committed
    // version stays, and this member tries to rejoin (a restarted producer, or the same one).
    session->drop_in_flight();
    d.producer.drop();
    d.log->warn("{}: {}; keeping version {} and trying to rejoin for up to {} s", d.who(),
                ending == Ending::fenced ? "fenced by the producer" : "lost the producer", session->version(),
                d.options.producer_loss_timeout.count() / 1000);
    try {
      d.hello(d.options.producer_loss_timeout, true);
    } catch (const Error& e) {
      throw Error(Errc::connection, d.who() + ": lost the producer at " + d.options.producer_url +
                                        " and could not rejoin within timeouts.producer_loss (" +
                                        std::to_string(d.options.producer_loss_timeout.count() / 1000) +
                                        " s); version " + std::to_string(session->version()) +
                                        " is intact: " + e.what());
    }
  }
  RunSummary summary;
  summary.version = session->version();
  summary.digest = session->digest();
  summary.stats = stats();
  return summary;
}

void Receiver::stop() { impl_->producer.leave(); }

std::vector<uint64_t> Receiver::pending() const {
  const Session* session = impl_->held.session();
  return session ? session->pending() : std::vector<uint64_t>{};
}

uint64_t Receiver::applied_version() const {
  const Session* session = impl_->held.session();
  return session ? session->applied_version() : 0;
}

uint64_t Receiver::applied_digest() const {
  const Session* session = impl_->held.session();
  return session ? session->applied_digest() : 0;
}

void Receiver::set_gated(bool gated) {
  auto& d = *impl_;
  if (d.held.session()) throw Error(Errc::state, "Receiver::set_gated after attach()");
  d.options.gated = gated;
}

codec::StateDigest Receiver::applied_state_digest() const {
  const Session* session = impl_->held.session();
  return session ? session->applied_state_digest() : codec::StateDigest{};
}

uint64_t Receiver::apply_pending(const std::function<void(uint32_t, uint64_t, uint32_t)>& observe) {
  Session* session = impl_->held.session();
  if (!session) throw Error(Errc::state, "Receiver::apply_pending before attach()");
  return session->apply_pending(observe);
}

void Receiver::reattach(uint32_t tensor, std::span<std::byte> memory) {
  if (!impl_->held.session()) throw Error(Errc::state, "Receiver::reattach before attach()");
  impl_->held.reattach(tensor, memory);
}

uint64_t Receiver::digest() const {
  const Session* session = impl_->held.session();
  return session ? session->digest() : 0;
}

ReceiverStats Receiver::stats() const {
  auto& d = *impl_;
  const RelayStats s = d.relay.stats();
  ReceiverStats r;
  r.frames_received = s.frames_received;
  r.frames_forwarded = s.frames_forwarded;
  r.frames_replayed = s.frames_replayed;
  r.frames_refused = s.frames_refused;
  r.payload_bytes = s.payload_bytes;
  r.versions_committed = d.versions.committed_count();
  r.versions_aborted = d.versions.aborted_count();
  r.snapshots_taken = d.snapshots_taken;
  r.last_snapshot_source = d.last_snapshot_source;
  if (const FrameStore* store = d.held.store()) {
    const FrameStore::Retained kept = store->retained();
    r.retained_versions = kept.versions;
    r.retained_bytes = kept.bytes;
    r.retained_versions_peak = kept.peak_versions;
    r.retained_bytes_peak = kept.peak_bytes;
    r.retained_largest_version_bytes = kept.largest_version_bytes;
  }
  return r;
}

}  // namespace deltacast::tree
