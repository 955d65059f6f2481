// The producer's version side: start, sending each version down the trees (deliver), the joint
// commit over the live set. Membership and repair live in tree/producer_members.cpp.
#include "tree/producer.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>

#include "tree/producer_impl.h"
#include "tree/secure_start.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
constexpr auto kRootSettleTimeout = 30s;

}  // namespace

void Producer::Impl::settle_roots() noexcept {
  for (auto& root : roots) {
    if (!root) continue;
    if (!root->flush(kRootSettleTimeout)) root->cancel_all();
  }
}

void Producer::Impl::flush_resends() {
  if (!in_flight) return;
  auto& f = *in_flight;
  for (size_t n = f.resends.size(); n > 0; --n) {
    auto [key, route] = f.resends.front();
    f.resends.pop_front();
    const int tree = f.tree_of(key);
    auto& root = roots[tree];
    if (!root || root->dead() || root->inflight_bytes() > options.max_inflight_bytes_per_root) {
      f.resends.emplace_back(key, route);  // later, once the tree has a root with room
      continue;
    }
    const Outgoing out = f.make(key, route);
    if (out.body.empty()) root->post(out.message); else root->post_pair(out.message, out.body);
    if (f.report) ++f.report->resent_chunks;
    log->debug("producer: re-sent chunk {} of version {} (route {})", key, f.version, route);
  }
}

void Producer::Impl::deliver(int tree, const Outgoing& out) {
  for (;;) {
    pump(0ms);
    flush_resends();
    if (live_ranks().empty()) throw Error(Errc::state, "every receiver failed");
    auto& root = roots[tree];
    if (!root) {
      // The new root connects as soon as it reads the EPOCH; one that does not within a few
      // peer timeouts is failed too (the next repair names another).
      if (Clock::now() - root_lost[tree] > 3 * options.peer_timeout) {
        if (auto r = membership->root(tree)) {
          fail(*r, FailureCause::unreachable, "did not join as the root of tree " + std::to_string(tree), Clock::now());
          root_lost[tree] = Clock::now();
        }
      }
      pump(50ms);
      continue;
    }
    if (root->dead()) {
      // The data link failed while its control link may still look fine: the edge is lost.
      fail(root->peer_rank(), FailureCause::link_closed, "its data link from the producer failed", Clock::now());
      continue;
    }
    if (!root->wait_below(options.max_inflight_bytes_per_root, 20ms)) {
      if (root->stalled_for() > options.peer_timeout && !stall_accusations.count(root->peer_rank()))
        stall_accusations.emplace(root->peer_rank(), Clock::now());
      continue;
    }
    if (out.body.empty()) root->post(out.message); else root->post_pair(out.message, out.body);
    return;
  }
}

// Runs one version attempt: admits members that caught up, sends everything, then the joint
// commit. `flight` carries how to (re)make each data message.
RefitReport Producer::Impl::run_version(InFlight flight, const std::function<void(InFlight&)>& send_all,
                                        const std::function<uint64_t()>& expected_digest, bool dry_run,
                                        const std::function<void()>& on_commit) {
  pump(0ms);
  admit_caught_up();
  hold_for_chasers();
  RefitReport report;
  report.version = flight.version;
  report.failed_members = std::move(failures);
  failures.clear();
  report.repair_seconds = repair_seconds;
  repair_seconds = 0;
  flight.attempt = ++attempt;
  flight.start = Clock::now();
  flight.sent.assign(flight.keys, false);
  VersionRound::Params round;
  round.version = flight.version;
  round.attempt = flight.attempt;
  round.committed_version = version;
  round.ranks = live_ranks();
  round.delegate_commit = options.delegate_commit;
  round.dry_run = dry_run;
  round.deadline = flight.start + options.version_timeout;
  round.delegate_grace = std::max(options.peer_timeout, std::chrono::milliseconds(1000));
  flight.round.emplace(std::move(round));
  flight.report = &report;
  in_flight = std::move(flight);
  // A new layout becomes the committed one with the version (an abort keeps the old one).
  const auto commit_version = [this, layout = in_flight->layout, &on_commit] {
    if (on_commit) on_commit();
    if (layout) this->layout = layout;
  };
  try {
    if (in_flight->round->members().empty()) throw Error(Errc::state, "no live receivers");
    if (in_flight->layout) {
      // Before any data of the attempt, on the control link of every member in it. Members admitted
      // later hear of it with their WELCOME or CATCHUP, once it committed.
      broadcast(LayoutUpdate{in_flight->version, in_flight->attempt, *in_flight->layout});
      for (uint32_t rank : in_flight->round->members()) control[rank].told_layout = in_flight->layout;
      log->info("version {}: the checkpoint layout changes ({} shards, {} files)", in_flight->version,
                in_flight->layout->shards.size(), in_flight->layout->files.size());
    }
    send_all(*in_flight);
    joint_commit(report, expected_digest(), commit_version);
  } catch (...) {
    // Nothing can commit now: receivers roll back what they applied of this attempt. Unless a
    // decision is out, or a delegate may have committed it: an ABORT then could cross a COMMIT.
    if (auto abort = in_flight->round->stop("the producer stopped this version"); abort && membership)
      broadcast(*abort);
    in_flight.reset();
    throw;
  }
  report.epoch = epoch();
  last_version_seconds = seconds_since(in_flight->start);
  in_flight.reset();
  return report;
}

void Producer::Impl::execute(const VersionRound::Actions& actions) {
  if (!in_flight) return;
  auto& f = *in_flight;
  if (f.round->committed() && !f.remembered) {
    remember_version(f.version, f.round->expected_digest());
    f.remembered = true;
  }
  for (const auto& action : actions) {
    if (const auto* b = std::get_if<VersionRound::Broadcast>(&action)) {
      broadcast(b->message);
    } else if (const auto* s = std::get_if<VersionRound::SendTo>(&action)) {
      if (!send_to(s->rank, s->message))
        fail(s->rank, FailureCause::link_closed,
             std::holds_alternative<Commit>(s->message) ? "COMMIT could not be sent" : "a message could not be sent",
             Clock::now());
    } else if (const auto* m = std::get_if<VersionRound::FailMember>(&action)) {
      fail(m->rank, m->cause, m->detail, Clock::now());
    } else if (const auto* r = std::get_if<VersionRound::RecordCommit>(&action)) {
      // The host records the version as committed before any member can hold it (a producer
      // state file): a producer lost after this point is resumed at this version.
      if (options.before_commit) options.before_commit(r->version, r->digest);
    } else if (const auto* w = std::get_if<VersionRound::Warn>(&action)) {
      log->warn("producer: {}", w->text);
    }
  }
  if (f.report) f.report->commit_delegate = f.round->commit_delegate();
}

void Producer::Impl::joint_commit(RefitReport& report, uint64_t expected_digest, const std::function<void()>& on_commit) {
  auto& f = *in_flight;
  VersionRound& round = *f.round;
  execute(round.sealed(expected_digest, membership->root(0), Clock::now()));
  if (round.phase() == VersionRound::Phase::delegated)
    log->debug("version {}: rank {} decides the commit", f.version, round.commit_delegate());
  bool decided = false;
  while (!round.done()) {
    const bool deciding = round.phase() == VersionRound::Phase::deciding;
    if (deciding && !decided) {
      decided = true;
      log->debug("version {}: every answer in at {:.1f} ms", f.version, 1e3 * seconds_since(f.start));
    }
    pump(20ms);
    if (!deciding) flush_resends();
    execute(round.tick(Clock::now()));
  }
  report.receivers = round.receivers();
  report.verified_receivers = round.verified_receivers();
  report.committed = round.committed();
  report.abort_reason = round.abort_reason();
  report.commit_delegate = round.commit_delegate();
  // Once COMMIT is out the version is committed: on_commit runs even when waiting fails.
  if (round.timed_out()) {
    if (report.committed && on_commit) on_commit();
    throw Error(Errc::timeout, "receivers did not confirm version " + std::to_string(round.want_active()));
  }
  report.refit_seconds = seconds_since(f.start);
  if (report.committed && on_commit) on_commit();
}

Producer::Producer(transport::Transport& transport, const codec::Manifest& manifest, ProducerOptions options)
    : impl_(std::make_unique<Impl>(transport, manifest, std::move(options))) {
  auto& d = *impl_;
  if (d.options.receivers == 0) throw Error(Errc::invalid_argument, "a producer needs receivers");
  if (d.options.encode.chunk_bytes == 0) throw Error(Errc::invalid_argument, "chunk_bytes must be positive");
  try {
    check_layout(d.options.layout, manifest.size());
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, std::string("the producer's ") + e.what());
  }
  require_authenticated(transport, {d.options.listen_url}, d.options.allow_insecure, "the producer");
  d.listener = transport.listen(transport::Url::parse(d.options.listen_url));
  // A frame covers at most chunk_bytes of checkpoint; coded values are never much larger than
  // the raw bits, and seal frames hold 8 bytes per tensor.
  d.max_message_bytes = 2 * d.options.encode.chunk_bytes + 16 * manifest.size() + (size_t{1} << 20);
  d.baseline.resize(manifest.size());
  for (size_t i = 0; i < manifest.size(); ++i) d.baseline[i].resize(manifest.tensors()[i].nbytes());
  d.baseline_digest = codec::StateDigest::full_scan(d.baseline_weights(), d.options.encode.threads);
  d.zero_digest = d.baseline_digest.combined();
  d.remember_version(0, d.zero_digest);
  d.layout = std::make_shared<const CheckpointLayout>(d.options.layout);
  if (d.options.resume) {
    // A restarted producer: the baseline is the committed version's bits, checked against the
    // digest its predecessor recorded, and the version chain goes on from there.
    const ProducerResume& r = *d.options.resume;
    const std::string v = std::to_string(r.version);
    if (r.version == 0) throw Error(Errc::invalid_argument, "resume: version 0 is a fresh start, not a resume");
    const auto known = r.history.find(r.version);
    if (known == r.history.end())
      throw Error(Errc::invalid_argument, "resume: the history lacks the digest of version " + v);
    if (r.history.rbegin()->first != r.version)
      throw Error(Errc::invalid_argument, "resume: the history holds versions newer than version " + v);
    codec::ConstWeights checked = r.baseline;
    checked.manifest = &manifest;
    codec::check_weights(checked);
    d.adopt_baseline(checked, r.version, std::nullopt);
    if (d.baseline_digest.combined() != known->second) {
      char text[128];
      std::snprintf(text, sizeof text, "resume: the baseline's digest %016llx is not version %llu's %016llx",
                    static_cast<unsigned long long>(d.baseline_digest.combined()),
                    static_cast<unsigned long long>(r.version), static_cast<unsigned long long>(known->second));
      throw Error(Errc::verify_failed, text);
    }
    d.version = r.version;
    d.attempt = r.attempt;
    d.history.clear();
    for (const auto& [version, digest] : r.history) d.remember_version(version, digest);
    d.options.resume.reset();  // its baseline spans need not outlive the constructor
  }
}

Producer::~Producer() { impl_->stop_threads(); }

std::string Producer::url() const { return impl_->listener->local_url().str(); }
const CheckpointLayout& Producer::layout() const { return *impl_->layout; }

std::shared_ptr<const CheckpointLayout> Producer::Impl::changed_layout(
    const std::optional<CheckpointLayout>& wanted) const {
  if (!wanted || *wanted == *layout) return nullptr;
  try {
    check_layout(*wanted, manifest.size());
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, std::string("the refit's ") + e.what());
  }
  return std::make_shared<const CheckpointLayout>(*wanted);
}
uint64_t Producer::version() const noexcept { return impl_->version; }
const codec::StateDigest& Producer::digest() const { return impl_->baseline_digest; }

StartReport Producer::start(std::optional<std::chrono::milliseconds> timeout) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  const uint32_t n = d.options.receivers;
  d.control.resize(n + 1);
  d.replaced.resize(n + 1);
  d.start_hellos.assign(n + 1, {});
  d.members.assign(n + 1, Member{});
  for (uint32_t r = 0; r <= n; ++r) d.members[r].rank = r;
  d.members[0] = Member{0, url(), "", true};
  d.readers = std::make_unique<ControlReaders>(kControlBufferBytes, [&d](ControlEvent e) {
    ProducerEvent event;
    event.kind = ProducerEvent::Kind::control;
    event.at = e.at;
    event.control = std::move(e);
    d.events.push(std::move(event));
  });
  d.session_start = Clock::now();
  d.start_acceptor();
  const auto deadline = Clock::now() + timeout.value_or(d.options.join_timeout);
  auto said_hello = [&] {
    uint32_t k = 0;
    for (uint32_t r = 1; r <= n; ++r) k += d.control[r].connection != nullptr || d.start_hellos[r].refused;
    return k;
  };
  while (said_hello() < n) {
    if (Clock::now() > deadline)
      throw Error(Errc::timeout, "not every receiver said HELLO in time (" + std::to_string(said_hello()) + " of " +
                                     std::to_string(n) + ")");
    d.pump(200ms);
  }
  StartReport report = d.place_members_at_start();
  d.roots.assign(d.membership->trees(), nullptr);
  d.root_lost.assign(d.membership->trees(), Clock::now());

  Welcome welcome;
  welcome.session = static_cast<uint64_t>(d.session_start.time_since_epoch().count());
  welcome.topology = std::string(topology_kind_name(d.options.topology));
  welcome.max_message_bytes = d.max_message_bytes;
  welcome.members = d.members;
  welcome.forest = d.membership->forest();
  welcome.tensors = d.manifest.tensors();
  welcome.committed_version = d.version;
  welcome.committed_digest = d.committed_digest();
  welcome.layout = *d.layout;
  // The start's "repair": every live member says READY once its parent links are up. It is
  // registered first, so that a member failed while WELCOMEs go out is not waited for.
  Impl::Repair start{Clock::now(), d.epoch(), {}};
  for (uint32_t r : d.live_ranks()) start.waiting.insert(r);
  d.repairs.push_back(start);
  for (uint32_t r = 1; r <= n; ++r) {
    if (!d.control[r].connection) continue;  // refused
    welcome.instance = d.control[r].instance;
    d.control[r].told_layout = d.layout;
    if (d.membership->live(r)) {
      if (!d.send_to(r, welcome)) d.fail(r, FailureCause::link_closed, "WELCOME could not be sent", Clock::now());
      continue;
    }
    // Not at the committed version: it catches up from live peers, as a rejoining member does.
    d.control[r].catching_up = true;
    if (!d.send_to(r, welcome) || !d.send_catchup(r, d.start_hellos[r].held_version)) d.close_control(r);
  }
  // Nobody was at the committed version: wait until the first member caught up (from the
  // producer's snapshot) and was admitted.
  while (d.live_ranks().empty()) {
    if (Clock::now() > deadline)
      throw Error(Errc::timeout, "no receiver caught up to version " + std::to_string(d.version) + " in time");
    bool anyone = false;
    for (uint32_t r = 1; r <= n; ++r) anyone = anyone || d.control[r].connection != nullptr;
    if (!anyone) throw Error(Errc::connection, "every receiver failed while catching up during start");
    d.pump(50ms);
    d.admit_caught_up();
  }
  auto up = [&] {
    if (d.repairs.size() > 0 && !d.repairs.front().waiting.empty()) return false;
    for (auto& root : d.roots)
      if (!root) return false;
    return true;
  };
  while (!up()) {
    if (Clock::now() > deadline) throw Error(Errc::timeout, "the tree did not come up in time");
    if (d.live_ranks().empty()) throw Error(Errc::connection, "every receiver failed during start");
    d.pump(50ms);
  }
  d.repair_seconds = 0;  // the start is not a repair
  d.log->info("tree of {} receivers is up ({}) at version {}: {} live, {} catching up, {} refused", n,
              welcome.topology, d.version, report.count(MemberAtStart::Role::live),
              report.count(MemberAtStart::Role::catching_up), report.count(MemberAtStart::Role::refused));
  d.idle = std::thread([&d] { d.idle_loop(); });
  return report;
}

codec::EncodeOptions Producer::Impl::refit_encode_options(const RefitOptions& refit_options) const {
  codec::EncodeOptions encode = options.encode;
  // From the all-zero state an XOR mask is the value itself; ulp distances would be huge.
  if (version == 0) encode.xor_safe_mode = codec::ValueMode::xor_bits;
  if (refit_options.value_mode) encode.xor_safe_mode = *refit_options.value_mode;
  return encode;
}

void Producer::Impl::check_can_refit() const {
  if (!membership) throw Error(Errc::state, "Producer::refit before start()");
  if (!baseline_lost.empty()) throw Error(Errc::state, "the producer cannot send another version: " + baseline_lost);
}

RefitReport Producer::refit(const codec::ConstWeights& next, const RefitOptions& refit_options) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  d.check_can_refit();
  codec::ConstWeights checked = next;
  checked.manifest = &d.manifest;
  codec::check_weights(checked);
  auto layout = d.changed_layout(refit_options.layout);
  const codec::EncodeOptions encode = d.refit_encode_options(refit_options);
  codec::DeltaEncoder encoder(d.baseline_weights(), checked, d.baseline_digest, {d.version, d.version + 1}, encode);
  return d.refit_with(encoder, std::move(layout), refit_options,
                      [&](uint64_t v, codec::StateDigest digest) { d.adopt_baseline(checked, v, std::move(digest)); });
}

RefitReport Producer::refit(const codec::WeightsReader& next, const RefitOptions& refit_options) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  d.check_can_refit();
  if (next.manifest().digest() != d.manifest.digest())
    throw Error(Errc::invalid_argument,
                "refit: the new version's tensors (names, dtypes, shapes) are not the manifest's");
  auto layout = d.changed_layout(refit_options.layout);
  const codec::EncodeOptions encode = d.refit_encode_options(refit_options);
  codec::DeltaEncoder encoder(d.baseline_weights(), next, d.baseline_digest, {d.version, d.version + 1}, encode);
  return d.refit_with(encoder, std::move(layout), refit_options,
                      [&](uint64_t v, codec::StateDigest digest) { d.adopt_baseline(next, v, std::move(digest)); });
}

RefitReport Producer::Impl::refit_with(codec::DeltaEncoder& encoder, std::shared_ptr<const CheckpointLayout> new_layout,
                                       const RefitOptions& refit_options,
                                       const std::function<void(uint64_t, codec::StateDigest)>& adopt) {
  auto& d = *this;
  const uint64_t new_version = d.version + 1;
  const uint32_t count = encoder.chunk_count();
  const TopologyKind kind = d.membership->kind();
  SharedBytes seal_frame;

  Impl::InFlight flight;
  flight.version = new_version;
  flight.layout = std::move(new_layout);
  flight.keys = count + 1;  // the seal is key `count`
  flight.tree_of = [count, kind](uint32_t key) { return key == count ? 0 : tree_for_chunk(kind, key); };
  flight.make = [&d, &encoder, &seal_frame, count](uint32_t key, uint32_t route) {
    const Envelope envelope = d.in_flight->envelope(route);
    if (key == count)
      return Outgoing{std::make_shared<const std::vector<std::byte>>(encode_frame_message(*seal_frame, envelope, d.epoch())), {}};
    return Outgoing{std::make_shared<const std::vector<std::byte>>(encode_frame_message(encoder.encode_chunk(key), envelope, d.epoch())), {}};
  };

  codec::DeltaStats total;
  double encode_seconds = 0;
  auto send_all = [&](Impl::InFlight& f) {
    RefitReport& report = *f.report;
    report.chunks = count;
    // Workers encode chunks in index order (an atomic cursor); this thread sends each one as
    // soon as it and every earlier chunk are ready, so encoding overlaps sending.
    std::vector<SharedBytes> slots(count);
    std::mutex mutex;
    std::condition_variable ready;
    std::atomic<uint32_t> cursor{0};
    std::atomic<bool> cancel{false};
    Status worker_status;
    const Envelope envelope = f.envelope(0);
    const uint64_t epoch = d.epoch();
    auto work = [&] {
      codec::DeltaStats stats;
      double seconds = 0;
      try {
        for (uint32_t i; !cancel && (i = cursor.fetch_add(1)) < count;) {
          auto t0 = Clock::now();
          auto message = std::make_shared<const std::vector<std::byte>>(
              encode_frame_message(encoder.encode_chunk(i, &stats), envelope, epoch));
          seconds += seconds_since(t0);
          std::lock_guard lock(mutex);
          slots[i] = std::move(message);
          ready.notify_all();
        }
      } catch (const Error& e) {
        std::lock_guard lock(mutex);
        if (worker_status.ok()) worker_status = e.status();
        cancel = true;
        ready.notify_all();
      }
      std::lock_guard lock(mutex);
      total.add(stats);
      encode_seconds += seconds;
    };
    if (!d.encoders) d.encoders = std::make_unique<WorkerThreads>(std::max(1u, d.options.encode.threads));
    d.encoders->start(work);
    try {
      for (uint32_t i = 0; i < count; ++i) {
        SharedBytes message;
        {
          std::unique_lock lock(mutex);
          ready.wait(lock, [&] { return slots[i] != nullptr || !worker_status.ok(); });
          if (!worker_status.ok()) throw Error(worker_status);
          message = std::move(slots[i]);
        }
        if (message->size() > d.max_message_bytes)
          throw Error(Errc::internal, "chunk frame of " + std::to_string(message->size()) +
                                          " bytes exceeds the announced message limit");
        d.deliver(f.tree_of(i), Outgoing{message, {}});
        f.sent[i] = true;
        if (i == 0) d.log->debug("version {}: first chunk posted at {:.1f} ms", f.version, 1e3 * seconds_since(f.start));
        report.frames_bytes += message->size() - kMessageHeaderSize - kEnvelopeSize;
        if (d.options.on_progress) d.options.on_progress(i + 1, count);
      }
    } catch (...) {
      cancel = true;
      d.encoders->wait();
      throw;
    }
    d.encoders->wait();
    seal_frame = std::make_shared<const std::vector<std::byte>>(encoder.seal());
    const Outgoing seal = f.make(count, 0);
    d.deliver(0, seal);
    f.sent[count] = true;
    d.log->debug("version {}: seal posted at {:.1f} ms", f.version, 1e3 * seconds_since(f.start));
    report.frames_bytes += seal_frame->size();
    report.changes = total.changes;
    report.elements = total.elements;
    report.checkpoint_bytes = total.checkpoint_bytes;
    report.encode_seconds = encode_seconds;
  };
  codec::StateDigest new_digest;
  RefitReport report = d.run_version(
      std::move(flight), send_all,
      [&] {
        new_digest = encoder.new_digest();
        return new_digest.combined();
      },
      refit_options.dry_run,
      [&] {
        d.version = new_version;  // what the members hold, even if the baseline cannot follow
        const auto adopt_start = Clock::now();
        adopt(new_version, new_digest);
        d.log->debug("version {}: the baseline took it in {:.3f} s", new_version, seconds_since(adopt_start));
      });
  d.log->info("version {} {} in {:.3f} s ({} chunks, {} payload bytes, {} changes)", report.version,
              report.committed ? "committed" : "aborted", report.refit_seconds, report.chunks, report.frames_bytes,
              report.changes);
  return report;
}

RefitReport Producer::bootstrap(const codec::ConstWeights& full) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  if (!d.membership) throw Error(Errc::state, "Producer::bootstrap before start()");
  if (d.version != 0) throw Error(Errc::state, "bootstrap needs receivers at version 0");
  codec::ConstWeights checked = full;
  checked.manifest = &d.manifest;
  codec::check_weights(checked);
  struct Piece {
    uint32_t tensor;
    uint64_t offset, size;
  };
  std::vector<Piece> pieces;
  for (uint32_t t = 0; t < d.manifest.size(); ++t) {
    const uint64_t size = checked.tensors[t].size();
    // Whole elements per piece: receivers refuse a piece that splits an element.
    const uint64_t w = codec::dtype_size(d.manifest.at(t).dtype);
    const uint64_t piece_bytes = std::max(w, d.options.encode.chunk_bytes / w * w);
    for (uint64_t off = 0; off < size; off += piece_bytes) pieces.push_back({t, off, std::min(piece_bytes, size - off)});
  }
  if (pieces.empty()) throw Error(Errc::invalid_argument, "the checkpoint holds no bytes");
  const uint32_t count = static_cast<uint32_t>(pieces.size());
  const TopologyKind kind = d.membership->kind();

  Impl::InFlight flight;
  flight.version = 1;
  flight.keys = count;
  flight.tree_of = [kind](uint32_t key) { return tree_for_chunk(kind, key); };
  auto header_of = [&](uint32_t key, uint32_t route) {
    const auto& p = pieces[key];
    return RawChunkHeader{{d.in_flight->attempt, route}, 1, key, count, p.tensor, p.offset, p.size};
  };
  flight.make = [&](uint32_t key, uint32_t route) {
    const auto h = header_of(key, route);
    return Outgoing{std::make_shared<const std::vector<std::byte>>(encode_raw_message(h, d.epoch())),
                    checked.tensors[h.tensor].subspan(h.byte_offset, h.byte_count)};
  };
  // Each piece goes out as a RAW header and a bare body sent straight from `full` (no copy):
  // every send must have finished before this returns, errors included.
  struct SettleRoots {
    Impl& d;
    ~SettleRoots() { d.settle_roots(); }
  } settle{d};
  uint64_t expected = 0;  // the sum of the pieces' hashes (raw_piece_hash) the receivers ack
  auto send_all = [&](Impl::InFlight& f) {
    RefitReport& report = *f.report;
    report.chunks = count;
    report.elements = d.manifest.total_elements();
    report.changes = report.elements;
    report.checkpoint_bytes = d.manifest.total_bytes();
    for (uint32_t i = 0; i < count; ++i) {
      const Outgoing out = f.make(i, 0);
      expected += raw_piece_hash(header_of(i, 0), out.body);
      d.deliver(f.tree_of(i), out);
      f.sent[i] = true;
      report.frames_bytes += out.body.size();
      if (d.options.on_progress) d.options.on_progress(i + 1, count);
    }
  };
  // The baseline's StateDigest (the next delta's base digest) is computed once the receivers
  // are active, off the bootstrap's critical path; receivers compute theirs the same way.
  RefitReport report = d.run_version(std::move(flight), send_all, [&] { return expected; }, false, [&] {
    d.adopt_baseline(checked, 1, std::nullopt);
    d.version = 1;
    // Rejoining members compare with the StateDigest of version 1, not the pieces' hash sum.
    d.remember_version(1, d.baseline_digest.combined());
  });
  d.log->info("full checkpoint (version 1) {} in {:.3f} s ({} raw chunks, {} bytes)",
              report.committed ? "committed" : "aborted", report.refit_seconds, report.chunks, report.frames_bytes);
  return report;
}

RefitReport Producer::publish(const std::vector<std::vector<std::byte>>& frames, uint64_t new_version,
                              uint64_t expected_digest, RefitOptions refit_options) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  if (!d.membership) throw Error(Errc::state, "Producer::publish before start()");
  auto new_layout = d.changed_layout(refit_options.layout);
  // Keys are codec chunk keys (the seal is chunk_count); duplicates in `frames` are sent as given.
  std::map<uint32_t, size_t> first_of_key;
  std::vector<uint32_t> key_of(frames.size());
  uint32_t keys = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto h = codec::parse_frame(frames[i]).header;
    key_of[i] = h.kind == codec::FrameKind::seal ? h.chunk_count : h.chunk_index;
    first_of_key.emplace(key_of[i], i);
    keys = std::max(keys, key_of[i] + 1);
  }
  const TopologyKind kind = d.membership->kind();
  std::vector<bool> is_seal(keys, false);
  for (size_t i = 0; i < frames.size(); ++i)
    if (codec::parse_frame(frames[i]).header.kind == codec::FrameKind::seal) is_seal[key_of[i]] = true;
  Impl::InFlight flight;
  flight.version = new_version;
  flight.layout = std::move(new_layout);
  flight.keys = keys;
  flight.tree_of = [kind, is_seal](uint32_t key) { return is_seal[key] ? 0 : tree_for_chunk(kind, key); };
  flight.make = [&](uint32_t key, uint32_t route) {
    auto it = first_of_key.find(key);
    if (it == first_of_key.end()) throw Error(Errc::not_found, "publish: no frame for chunk " + std::to_string(key));
    return Outgoing{std::make_shared<const std::vector<std::byte>>(
                        encode_frame_message(frames[it->second], d.in_flight->envelope(route), d.epoch())),
                    {}};
  };
  auto send_all = [&](Impl::InFlight& f) {
    for (size_t i = 0; i < frames.size(); ++i) {
      const uint32_t key = key_of[i];
      d.deliver(f.tree_of(key), Outgoing{std::make_shared<const std::vector<std::byte>>(
                                             encode_frame_message(frames[i], f.envelope(0), d.epoch())),
                                         {}});
      f.sent[key] = true;
      f.report->frames_bytes += frames[i].size();
      if (!is_seal[key]) ++f.report->chunks;
    }
  };
  RefitReport report = d.run_version(std::move(flight), send_all, [&] { return expected_digest; },
                                     refit_options.dry_run, [&] { d.version = new_version; });
  return report;
}

void Producer::finish() {
  auto& d = *impl_;
  std::unique_lock drive(d.drive);
  if (d.finished || !d.membership) return;
  d.finished = true;
  d.pump(0ms);
  // A member on its way back (restarted, fenced, or admitted while a version was in flight) is
  // given the time a join gets to reach the committed version: BYE would leave it behind.
  d.wait_for_catch_ups();
  for (auto& root : d.roots)
    if (root) root->flush(kRootSettleTimeout);
  d.broadcast(Bye{}, true);
  drive.unlock();
  d.stop_threads();
  // Nobody answers any more: a member trying to (re)join must fail fast, not wait for WELCOME.
  d.listener->close();
  while (auto event = d.events.pop(0ms))
    if (event->connection) event->connection->close();
}

}  // namespace deltacast::tree
