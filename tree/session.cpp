#include "tree/session.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "util/log.h"

namespace deltacast::tree {
namespace {

// Deltas: codec::DeltaApplier (exactly once per chunk, verified by the seal's digests, undo log).
class DeltaVersion final : public VersionApplier {
 public:
  explicit DeltaVersion(codec::DeltaApplier& applier) : applier_(applier) {}
  uint64_t apply_frame(const codec::FrameView& view) override { return applier_.apply(view).changes; }
  bool complete() const override { return applier_.complete(); }
  // The seal's combined digest: verify() proved the bits (placed: the parts) equal to it.
  uint64_t verify() override {
    applier_.verify();
    return applier_.pending_combined();
  }
  uint64_t commit() override {
    applier_.commit();
    return applier_.version_combined();
  }
  void rollback() override {
    if (applier_.pending_version()) applier_.rollback();
  }

 private:
  codec::DeltaApplier& applier_;
};

// Which pieces of the bootstrap (version 1's raw bytes into the all-zero version 0) were claimed
// and which landed, and the sum of the landed pieces' hashes: the version is verified by that sum
// (order-free). Callers hold their own lock.
class PieceLedger {
 public:
  // Checks piece `h` against the manifest and claims it. Throws Error(version_mismatch,
  // corrupt_frame, replayed).
  void claim(const codec::Manifest& manifest, const RawChunkHeader& h) {
    if (h.version != 1)
      throw Error(Errc::version_mismatch, "raw bootstrap of version " + std::to_string(h.version) +
                                              " needs the all-zero version 0 and version 1");
    bool inside = h.tensor < manifest.size();
    if (inside) {
      const auto& info = manifest.at(h.tensor);
      const uint64_t w = codec::dtype_size(info.dtype);
      inside = h.byte_offset % w == 0 && h.byte_count % w == 0 && h.byte_offset <= info.nbytes() &&
               h.byte_count <= info.nbytes() - h.byte_offset;
    }
    if (!inside)
      throw Error(Errc::corrupt_frame, "raw chunk " + std::to_string(h.chunk_index) +
                                           " lies outside its tensor or splits an element");
    if (h.chunk_count > max_raw_chunk_count(manifest))
      throw Error(Errc::corrupt_frame, "raw chunk count " + std::to_string(h.chunk_count) +
                                           " is more pieces than the checkpoint has elements");
    if (claimed_.empty()) {
      claimed_.assign(h.chunk_count, false);
      have_.assign(h.chunk_count, false);
    }
    if (h.chunk_count != have_.size() || h.chunk_index >= have_.size())
      throw Error(Errc::corrupt_frame, "raw chunks disagree on the chunk count");
    if (claimed_[h.chunk_index])
      throw Error(Errc::replayed, "raw chunk " + std::to_string(h.chunk_index) + " arrived twice");
    claimed_[h.chunk_index] = true;
  }
  // Piece `chunk` landed with `hash`, or was cut short (nullopt: it may be claimed again).
  // False when the ledger does not know it.
  bool land(uint32_t chunk, std::optional<uint64_t> hash) {
    if (chunk >= have_.size()) return false;
    if (!hash) {
      claimed_[chunk] = false;
      return true;
    }
    hash_ += *hash;
    have_[chunk] = true;
    ++received_;
    return true;
  }
  bool complete() const { return !have_.empty() && received_ == have_.size(); }
  uint64_t hash_sum() const { return hash_; }
  void reset() {
    claimed_.clear();
    have_.clear();
    received_ = 0;
    hash_ = 0;
  }

 private:
  std::vector<bool> claimed_, have_;
  uint32_t received_ = 0;
  uint64_t hash_ = 0;
};

// What both bootstraps share: the ledger under a lock. Every piece was hashed as it landed; the
// producer hashed the same pieces of its checkpoint, so equal sums mean equal bits (a misplaced
// piece hashes differently).
class PieceBootstrap : public VersionApplier {
 public:
  explicit PieceBootstrap(const codec::Manifest& manifest) : manifest_(manifest) {}
  bool complete() const final {
    std::lock_guard lock(mutex_);
    return ledger_.complete();
  }
  uint64_t verify() final {
    std::lock_guard lock(mutex_);
    return ledger_.hash_sum();
  }

 protected:
  const codec::Manifest& manifest_;
  mutable std::mutex mutex_;
  PieceLedger ledger_;
};

// The bootstrap of a whole member. Each piece is claimed before its body lands straight in the
// weights and hashed where it landed. Rollback is a memset to zero.
class RawBootstrap final : public PieceBootstrap {
 public:
  RawBootstrap(const codec::Manifest& manifest, codec::MutableWeights weights)
      : PieceBootstrap(manifest), weights_(std::move(weights)) {}

  std::span<std::byte> claim_piece(const RawChunkHeader& h, SharedBytes&) override {
    std::lock_guard lock(mutex_);
    ledger_.claim(manifest_, h);
    return weights_.tensors[h.tensor].subspan(h.byte_offset, h.byte_count);
  }
  void land_piece(const RawChunkHeader& h, std::optional<uint64_t> hash) override {
    std::lock_guard lock(mutex_);
    ledger_.land(h.chunk_index, hash);
  }
  uint64_t commit() override {
    std::lock_guard lock(mutex_);
    const uint64_t digest = ledger_.hash_sum();
    ledger_.reset();
    return digest;
  }
  void rollback() override {
    std::lock_guard lock(mutex_);
    for (auto& t : weights_.tensors) std::memset(t.data(), 0, t.size());
    ledger_.reset();
  }

 private:
  codec::MutableWeights weights_;
};

// The bootstrap of a placed member (docs/placement.md, "Bootstrap and catch-up"). A piece's body
// lands in a bounce buffer (the relay passes it on to the children from there); once it landed,
// the units the placement holds are copied into the buffers (codec::scatter_placed), and the
// piece's share of the whole version's StateDigest is added up: a placed member sees every byte
// of version 1 go by, so it learns the name (combined digest) of the version it holds, as a
// whole member does by its full scan. Rollback zeroes the held units.
class PlacedBootstrap final : public PieceBootstrap {
 public:
  PlacedBootstrap(const codec::Manifest& manifest, codec::PlacedWeights weights)
      : PieceBootstrap(manifest), weights_(std::move(weights)), per_tensor_(manifest.size(), 0) {}

  std::span<std::byte> claim_piece(const RawChunkHeader& h, SharedBytes& bounce) override {
    std::lock_guard lock(mutex_);
    ledger_.claim(manifest_, h);
    auto buffer = std::make_shared<std::vector<std::byte>>(h.byte_count);
    bodies_[h.chunk_index] = buffer;
    bounce = buffer;
    return std::span(*buffer);
  }
  void land_piece(const RawChunkHeader& h, std::optional<uint64_t> hash) override {
    std::shared_ptr<std::vector<std::byte>> body;
    {
      std::lock_guard lock(mutex_);
      auto it = bodies_.find(h.chunk_index);
      if (it == bodies_.end()) return;
      body = std::move(it->second);
      bodies_.erase(it);
      if (!hash) {
        ledger_.land(h.chunk_index, std::nullopt);
        return;
      }
    }
    // Outside the lock: pieces cover disjoint canonical ranges, so their held units are disjoint.
    codec::scatter_placed(*weights_.placement, manifest_, h.tensor, h.byte_offset, *body, weights_.buffers);
    const auto dtype = manifest_.at(h.tensor).dtype;
    const uint64_t share = codec::slice_digest(h.tensor, dtype, h.byte_offset / codec::dtype_unit_size(dtype), *body);
    std::lock_guard lock(mutex_);
    per_tensor_[h.tensor] += share;
    ledger_.land(h.chunk_index, hash);
  }
  uint64_t commit() override {
    std::lock_guard lock(mutex_);
    const uint64_t digest = ledger_.hash_sum();
    committed_ = codec::StateDigest(per_tensor_);
    reset_locked();
    return digest;
  }
  std::optional<codec::StateDigest> committed_state() const override {
    std::lock_guard lock(mutex_);
    return committed_;
  }
  void rollback() override {
    std::lock_guard lock(mutex_);
    codec::zero_placed(*weights_.placement, manifest_, weights_.buffers);
    reset_locked();
  }

 private:
  void reset_locked() {
    ledger_.reset();
    bodies_.clear();
    std::fill(per_tensor_.begin(), per_tensor_.end(), 0);
  }

  codec::PlacedWeights weights_;
  std::map<uint32_t, std::shared_ptr<std::vector<std::byte>>> bodies_;  // claimed, not landed
  std::vector<uint64_t> per_tensor_;                                    // StateDigest of what landed
  std::optional<codec::StateDigest> committed_;
};

}  // namespace

uint64_t VersionApplier::apply_frame(const codec::FrameView& view) {
  throw Error(Errc::version_mismatch, "a delta frame of version " + std::to_string(view.header.new_version) +
                                          " arrived during a raw bootstrap");
}

std::span<std::byte> VersionApplier::claim_piece(const RawChunkHeader& h, SharedBytes&) {
  throw Error(Errc::version_mismatch, "raw bootstrap of version " + std::to_string(h.version) +
                                          " needs the all-zero version 0");
}

void VersionApplier::land_piece(const RawChunkHeader&, std::optional<uint64_t>) {}

Session::Session(const codec::Manifest& manifest, codec::MutableWeights weights, uint64_t version,
                 codec::StateDigest digest, uint32_t rank, bool gated)
    : manifest_(manifest),
      weights_(std::move(weights)),
      rank_(rank),
      delta_mode_(gated ? codec::DeltaApplier::Mode::staged : codec::DeltaApplier::Mode::in_place),
      committed_version_(version) {
  committed_digest_ = digest.combined();
  reset_delta_locked(version, std::move(digest));
  raw_ = std::make_unique<RawBootstrap>(manifest_, weights_);
}

Session::Session(const codec::Manifest& manifest, codec::PlacedWeights weights, uint64_t version,
                 uint64_t version_combined, uint32_t rank, bool gated)
    : manifest_(manifest),
      placed_(std::move(weights)),
      rank_(rank),
      delta_mode_(gated ? codec::DeltaApplier::Mode::staged : codec::DeltaApplier::Mode::in_place),
      committed_version_(version) {
  if (!placed_->placement) throw Error(Errc::invalid_argument, "placed buffers without a placement");
  codec::check_placed_buffers(*placed_->placement, placed_->buffers);
  committed_digest_ = version_combined;
  reset_placed_locked(version, version_combined);
  name_committed_locked(version, version_combined);
  raw_ = std::make_unique<PlacedBootstrap>(manifest_, *placed_);
}

void Session::reset_placed_locked(uint64_t version, uint64_t version_combined) {
  auto parts = codec::placed_part_digests(manifest_, *placed_->placement, placed_->buffers);
  delta_applier_ = std::make_unique<codec::DeltaApplier>(manifest_, *placed_, version, version_combined,
                                                         std::move(parts), delta_mode_);
  delta_ = std::make_unique<DeltaVersion>(*delta_applier_);
}

void Session::name_committed_locked(uint64_t version, uint64_t combined) {
  if (!placed_) return;
  names_[version] = combined;
  names_.erase(names_.begin(), names_.lower_bound(delta_applier_->buffers_version()));
}

void Session::reset_delta_locked(uint64_t version, codec::StateDigest digest) {
  delta_applier_ = std::make_unique<codec::DeltaApplier>(manifest_, weights_, version, std::move(digest), delta_mode_);
  delta_ = std::make_unique<DeltaVersion>(*delta_applier_);
}

Session::~Session() = default;

bool Session::admit(DataKind kind, uint64_t attempt, uint64_t version, bool new_layout,
                    std::chrono::milliseconds wait_for_end) {
  std::unique_lock lock(state_mutex_);
  if (wait_for_end.count() > 0 && in_flight_ && in_flight_->attempt < attempt)
    attempt_ended_.wait_for(lock, wait_for_end, [&] { return !in_flight_ || in_flight_->attempt >= attempt; });
  if (attempt <= floor_) return false;
  if (in_flight_) {
    if (in_flight_->attempt != attempt || in_flight_->version != version) return false;
    in_flight_->new_layout = in_flight_->new_layout || new_layout;  // the producer flags every message alike
    return true;
  }
  InFlight f;
  f.attempt = attempt;
  f.version = version;
  f.kind = kind;
  f.new_layout = new_layout;
  f.admitted_at = std::chrono::steady_clock::now();
  in_flight_ = f;
  return true;
}

uint64_t Session::InFlight::receive_us() const {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - admitted_at).count());
}

bool Session::awaits_layout(uint64_t attempt) const {
  std::lock_guard lock(state_mutex_);
  return in_flight_ && in_flight_->attempt == attempt && in_flight_->new_layout;
}

// The bootstrap lands raw only on the all-zero version 0; anything else goes to the delta
// applier, which refuses what does not fit its state. Resolved under the data lock, so a commit
// that replaces the delta applier (after a bootstrap) is never raced: data calls wait for it.
VersionApplier* Session::applier_locked(DataKind kind) const {
  if (kind == DataKind::raw) return committed_version_ == 0 ? raw_.get() : nullptr;
  return delta_.get();
}

std::optional<Message> Session::refuse_locked(uint64_t version, const Error& e) {
  if (!in_flight_ || in_flight_->nacked || in_flight_->acked) return std::nullopt;
  in_flight_->nacked = true;
  logger("tree")->warn("rank {}: refused version {}: {}", rank_, version, e.what());
  return Nack{rank_, version, static_cast<uint32_t>(e.code()), e.what(), in_flight_->attempt};
}

Session::Outcome Session::apply_frame(uint64_t attempt, const codec::FrameView& view) {
  Outcome out;
  const uint64_t version = view.header.new_version;
  std::shared_lock data(data_mutex_);
  VersionApplier* applier;
  {
    std::lock_guard lock(state_mutex_);
    if (!in_flight_ || in_flight_->attempt != attempt) return out;  // ended meanwhile: stale
    applier = applier_locked(in_flight_->kind);
  }
  std::optional<Error> failure;
  uint64_t changes = 0;
  try {
    if (!applier)
      throw Error(Errc::version_mismatch, "raw bootstrap needs the all-zero version 0; this member holds " +
                                              std::to_string(committed_version_));
    changes = applier->apply_frame(view);
  } catch (const Error& e) {
    failure = e;
  }
  std::lock_guard lock(state_mutex_);
  if (!in_flight_ || in_flight_->attempt != attempt) return out;
  if (failure) {
    if (failure->code() == Errc::replayed) {
      out.replayed = true;
      return out;
    }
    out.refused = true;
    out.reply = refuse_locked(version, *failure);
    return out;
  }
  in_flight_->changes += changes;
  if (!in_flight_->acked && !in_flight_->nacked && applier->complete()) {
    try {
      const uint64_t digest = applier->verify();
      in_flight_->acked = true;
      out.reply = Ack{rank_, version, digest, in_flight_->changes, in_flight_->attempt, in_flight_->receive_us()};
    } catch (const Error& e) {
      out.reply = refuse_locked(version, e);
    }
  }
  return out;
}

std::optional<std::span<std::byte>> Session::claim_piece(uint64_t attempt, const RawChunkHeader& h,
                                                         std::optional<Message>& reply, SharedBytes* bounce) {
  // The shared lock stays held until land_piece: commit/abort wait for bodies still landing.
  data_mutex_.lock_shared();
  VersionApplier* applier = nullptr;
  {
    std::lock_guard lock(state_mutex_);
    if (in_flight_ && in_flight_->attempt == attempt) applier = applier_locked(in_flight_->kind);
    if (!in_flight_ || in_flight_->attempt != attempt) {
      data_mutex_.unlock_shared();
      return std::nullopt;
    }
  }
  try {
    if (!applier)
      throw Error(Errc::version_mismatch, "raw bootstrap of version " + std::to_string(h.version) +
                                              " needs the all-zero version 0; this member holds " +
                                              std::to_string(committed_version_));
    SharedBytes owner;
    auto body = applier->claim_piece(h, owner);
    if (bounce) *bounce = std::move(owner);
    return body;
  } catch (const Error& e) {
    if (e.code() != Errc::replayed) {
      std::lock_guard lock(state_mutex_);
      reply = refuse_locked(h.version, e);
    }
    data_mutex_.unlock_shared();
    return std::nullopt;
  }
}

std::optional<Message> Session::land_piece(const RawChunkHeader& h, std::optional<uint64_t> hash) {
  std::optional<Message> reply;
  VersionApplier* applier = nullptr;
  {
    std::lock_guard lock(state_mutex_);
    applier = in_flight_ ? applier_locked(in_flight_->kind) : nullptr;
  }
  // Outside the state lock (a placed member copies and hashes the piece here); the shared data
  // lock taken by claim_piece keeps the applier and the attempt in place meanwhile.
  if (applier) applier->land_piece(h, hash);
  {
    std::lock_guard lock(state_mutex_);
    if (applier && in_flight_) {
      if (hash && !in_flight_->acked && !in_flight_->nacked && applier->complete()) {
        in_flight_->acked = true;
        reply = Ack{rank_, h.version, applier->verify(), 0, in_flight_->attempt, in_flight_->receive_us()};
      }
    }
  }
  data_mutex_.unlock_shared();
  return reply;
}

void Session::end_in_flight_locked(uint64_t attempt) {
  floor_ = std::max(floor_, attempt);
  in_flight_.reset();
  attempt_ended_.notify_all();
}

void Session::commit(const Commit& commit, const std::function<void(const Message&)>& send) {
  std::unique_lock data(data_mutex_);
  VersionApplier* applier = nullptr;
  {
    std::lock_guard lock(state_mutex_);
    const bool ours = in_flight_ && in_flight_->attempt == commit.attempt &&
                      in_flight_->version == commit.version && in_flight_->acked;
    if (!ours && commit.attempt != 0 && committed_attempt_ == commit.attempt && committed_version_ == commit.version) {
      // Already committed here (a delegated commit, then the producer's own COMMIT of the same
      // attempt after the delegate failed): the same answer again.
      const Active again{rank_, committed_version_, committed_answer_};
      data.unlock();
      send(again);
      return;
    }
    if (!ours) {
      data.unlock();
      send(Nack{rank_, commit.version, static_cast<uint32_t>(Errc::state),
                "COMMIT for a version this member has not verified", commit.attempt});
      return;
    }
    applier = applier_locked(in_flight_->kind);
  }
  const bool bootstrap = applier == raw_.get();
  {
    std::lock_guard lock(state_mutex_);
    if (!bootstrap)
      for (auto* reader : snapshots_) reader->record(*delta_applier_);
  }
  // ACTIVE names the digest the version was verified by (after a bootstrap: the pieces' hash sum).
  const uint64_t active_digest = applier->commit();
  {
    std::lock_guard lock(state_mutex_);
    committed_version_ = commit.version;
    committed_digest_ = bootstrap ? active_digest : delta_applier_->version_combined();
    committed_attempt_ = commit.attempt;
    committed_answer_ = active_digest;
    end_in_flight_locked(commit.attempt);
    if (!bootstrap) name_committed_locked(commit.version, committed_digest_);
  }
  send(Active{rank_, commit.version, active_digest});
  // Idle-time work, before the data lock is released so that frames of the next version wait:
  // after a bootstrap, a fresh delta applier whose StateDigest is a full scan of the buffers (the
  // session says version 1 only with that digest); then the undo log's page faults (room for
  // ~1.6% of the elements; it grows if needed).
  // A placed member learnt the version's StateDigest from the pieces (it holds only its slices).
  if (bootstrap && placed_) {
    const uint64_t combined = applier->committed_state().value_or(codec::StateDigest{}).combined();
    std::lock_guard lock(state_mutex_);
    committed_digest_ = combined;
    reset_placed_locked(commit.version, combined);
    name_committed_locked(commit.version, combined);
  } else if (bootstrap) {
    auto digest = codec::StateDigest::full_scan(weights_.as_const(), 1);
    std::lock_guard lock(state_mutex_);
    committed_digest_ = digest.combined();
    reset_delta_locked(commit.version, std::move(digest));
  }
  delta_applier_->reserve(manifest_.total_elements() / 64);
}

Message Session::abort(const Abort& abort) {
  std::unique_lock data(data_mutex_);
  std::lock_guard lock(state_mutex_);
  if (in_flight_ && in_flight_->attempt <= abort.attempt) {
    if (auto* applier = applier_locked(in_flight_->kind)) applier->rollback();
    end_in_flight_locked(abort.attempt);
  }
  floor_ = std::max(floor_, abort.attempt);
  return Active{rank_, committed_version_, committed_digest_};
}

void Session::drop_in_flight() {
  std::unique_lock data(data_mutex_);
  std::lock_guard lock(state_mutex_);
  if (!in_flight_) return;
  if (auto* applier = applier_locked(in_flight_->kind)) applier->rollback();
  end_in_flight_locked(in_flight_->attempt);
}

uint64_t Session::version() const {
  std::lock_guard lock(state_mutex_);
  return committed_version_;
}

uint64_t Session::digest() const {
  std::lock_guard lock(state_mutex_);
  return committed_digest_;
}

uint64_t Session::attempt_floor() const {
  std::lock_guard lock(state_mutex_);
  return floor_;
}

std::optional<uint64_t> Session::in_flight_version() const {
  std::lock_guard lock(state_mutex_);
  return in_flight_ ? std::optional(in_flight_->version) : std::nullopt;
}

std::optional<uint64_t> Session::in_flight_attempt() const {
  std::lock_guard lock(state_mutex_);
  return in_flight_ ? std::optional(in_flight_->attempt) : std::nullopt;
}

bool Session::replay_frame(const codec::FrameView& view) {
  std::unique_lock data(data_mutex_);
  {
    std::lock_guard lock(state_mutex_);
    if (in_flight_) throw Error(Errc::state, "a catch-up replay while a version is in flight");
  }
  try {
    delta_applier_->apply(view);
    if (!delta_applier_->complete()) return false;
    delta_applier_->verify();
    {
      std::lock_guard lock(state_mutex_);
      for (auto* reader : snapshots_) reader->record(*delta_applier_);
    }
    delta_applier_->commit();
  } catch (const Error&) {
    if (delta_applier_->pending_version()) delta_applier_->rollback();
    throw;
  }
  std::lock_guard lock(state_mutex_);
  committed_version_ = delta_applier_->version();
  committed_attempt_ = 0;
  committed_digest_ = delta_applier_->version_combined();
  name_committed_locked(committed_version_, committed_digest_);
  return true;
}

void Session::install(uint64_t version, codec::StateDigest digest) {
  std::unique_lock data(data_mutex_);
  std::lock_guard lock(state_mutex_);
  if (in_flight_) throw Error(Errc::state, "a snapshot installed while a version is in flight");
  if (placed_) throw Error(Errc::internal, "Session::install on a placed member (install_placed)");
  committed_version_ = version;
  committed_attempt_ = 0;
  committed_digest_ = digest.combined();
  reset_delta_locked(version, std::move(digest));  // pending gated versions are superseded
}

void Session::install_placed(uint64_t version, uint64_t version_combined) {
  std::unique_lock data(data_mutex_);
  std::lock_guard lock(state_mutex_);
  if (in_flight_) throw Error(Errc::state, "a snapshot installed while a version is in flight");
  if (!placed_) throw Error(Errc::internal, "Session::install_placed on a whole member (install)");
  committed_version_ = version;
  committed_attempt_ = 0;
  committed_digest_ = version_combined;
  reset_placed_locked(version, version_combined);  // pending gated versions are superseded
  names_.clear();
  name_committed_locked(version, version_combined);
}

std::unique_ptr<Session::SnapshotReader> Session::begin_snapshot() {
  std::shared_lock data(data_mutex_);  // not in the middle of a commit (its digest is final)
  std::lock_guard lock(state_mutex_);
  if (committed_version_ == 0) throw Error(Errc::state, "a member at version 0 has no snapshot to serve");
  if (placed_) throw Error(Errc::unsupported, "a placed member holds only its slices: it serves no snapshots");
  // Gated with versions pending: the buffers hold an older committed version; serve that one (the
  // fetcher replays the rest from the retained frames). apply_pending() keeps it consistent.
  const bool older = !delta_applier_->staged_versions().empty();
  std::unique_ptr<SnapshotReader> reader(
      older ? new SnapshotReader(*this, delta_applier_->buffers_version(), delta_applier_->buffers_digest().combined())
            : new SnapshotReader(*this, committed_version_, committed_digest_));
  snapshots_.push_back(reader.get());
  return reader;
}

Session::SnapshotReader::~SnapshotReader() {
  std::lock_guard lock(session_.state_mutex_);
  std::erase(session_.snapshots_, this);
}

void Session::SnapshotReader::record(const codec::DeltaApplier& applier) {
  std::vector<SnapshotPatches::Patch> written;
  applier.for_each_written([&](uint32_t tensor, uint64_t element, uint32_t bits) {
    written.push_back({tensor, element, bits});
  });
  patches_.record(std::move(written));
}

std::vector<uint64_t> Session::pending() const {
  std::shared_lock data(data_mutex_);
  return delta_applier_->staged_versions();
}

uint64_t Session::applied_version() const {
  std::shared_lock data(data_mutex_);  // the applier is not replaced meanwhile
  return delta_applier_->buffers_version();  // in place: its committed version
}

uint64_t Session::applied_digest() const {
  std::shared_lock data(data_mutex_);
  if (placed_) {  // the whole version's name: the part digests do not add up to it
    const uint64_t held = delta_applier_->buffers_version();
    std::lock_guard lock(state_mutex_);
    const auto it = names_.find(held);
    return it == names_.end() ? 0 : it->second;
  }
  return delta_applier_->buffers_digest().combined();
}

codec::StateDigest Session::applied_state_digest() const {
  std::shared_lock data(data_mutex_);
  return delta_applier_->buffers_digest();
}

uint64_t Session::apply_pending(const std::function<void(uint32_t, uint64_t, uint32_t)>& observe) {
  // Shared: snapshot reads (exclusive) never see a half-written version; staging of the next
  // version goes on (the applier orders it with these writes).
  std::shared_lock data(data_mutex_);
  for (;;) {
    std::unique_lock lock(state_mutex_);  // no reader opens or closes meanwhile
    if (snapshots_.empty()) {
      lock.unlock();
      if (!delta_applier_->apply_next_staged(observe)) break;
      continue;
    }
    std::vector<SnapshotPatches::Patch> written;
    if (!delta_applier_->apply_next_staged([&](uint32_t tensor, uint64_t element, uint32_t bits) {
          written.push_back({tensor, element, bits});
          if (observe) observe(tensor, element, bits);
        }))
      break;
    for (auto* reader : snapshots_) reader->patches_.record(written);
  }
  return delta_applier_->buffers_version();
}

void Session::rebind(uint32_t tensor, std::span<std::byte> memory) {
  std::unique_lock data(data_mutex_);
  std::lock_guard lock(state_mutex_);
  if (placed_) throw Error(Errc::unsupported, "rebind of placed buffers is not supported");
  if (committed_version_ == 0 || (in_flight_ && in_flight_->kind == DataKind::raw))
    throw Error(Errc::state, "a tensor can be re-registered once the bootstrap committed");
  if (tensor >= manifest_.size()) throw Error(Errc::not_found, "no tensor " + std::to_string(tensor));
  delta_applier_->rebind(tensor, memory);  // checks the size, the bits, and that nothing is written
  weights_.tensors[tensor] = memory;
  raw_ = std::make_unique<RawBootstrap>(manifest_, weights_);
}

void Session::SnapshotReader::read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) {
  const unsigned width = static_cast<unsigned>(codec::dtype_unit_size(session_.manifest_.at(tensor).dtype));
  const uint64_t first = offset / width;
  const uint64_t end = first + out.size() / width;
  std::unique_lock data(session_.data_mutex_);  // no write runs while the bits are copied
  std::lock_guard lock(session_.state_mutex_);
  std::memcpy(out.data(), session_.weights_.tensors[tensor].data() + offset, out.size());
  // Newest first: a version in flight, then each committed layer back to version_; the last
  // patch written for an element is the oldest, its bits at version_.
  if (session_.delta_applier_->pending_version()) {  // a version in flight, or a replay under way
    session_.delta_applier_->for_each_written([&](uint32_t t, uint64_t element, uint32_t bits) {
      if (t == tensor && element >= first && element < end)
        std::memcpy(out.data() + (element - first) * width, &bits, width);
    });
  }
  patches_.restore_and_advance(tensor, first, end, width, out);
}

void Session::abandon_replay() {
  std::unique_lock data(data_mutex_);
  if (delta_applier_->pending_version()) delta_applier_->rollback();
}

std::unique_lock<std::shared_mutex> Session::lock_data() { return std::unique_lock(data_mutex_); }

}  // namespace deltacast::tree
