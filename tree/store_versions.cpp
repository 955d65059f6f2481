#include "tree/store_versions.h"

#include <algorithm>
#include <cstring>

#include "tree/producer/raw_pieces.h"
#include "tree/protocol.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

objstore::VersionStoreOptions under(const StoreLayout& layout, const char* what) {
  return objstore::VersionStoreOptions{layout.prefix.empty() ? what : layout.prefix + "/" + what, layout.part_bytes,
                                       layout.parallel, layout.retain_versions};
}

}  // namespace

StorePublisher::StorePublisher(const codec::Manifest& manifest, objstore::S3Client& client, const StoreLayout& layout)
    : manifest_(manifest), deltas_(client, under(layout, "deltas")), snapshots_(client, under(layout, "snapshots")) {}

objstore::VersionManifest StorePublisher::publish_delta(uint64_t version, uint64_t base_version, uint64_t epoch,
                                                        uint64_t digest,
                                                        const std::vector<std::vector<std::byte>>& frames) {
  const std::vector<std::span<const std::byte>> spans(frames.begin(), frames.end());
  return deltas_.publish(version, base_version, epoch, digest, spans, "delta");
}

objstore::VersionManifest StorePublisher::publish_snapshot(uint64_t version, uint64_t epoch,
                                                           const codec::ConstWeights& weights, uint64_t piece_bytes) {
  codec::check_weights(weights);
  std::vector<codec::PartRange> whole;
  for (uint32_t t = 0; t < manifest_.size(); ++t) whole.push_back({t, 0, manifest_.at(t).units()});
  const auto pieces = raw_pieces(manifest_, whole, piece_bytes);
  std::vector<std::vector<std::byte>> records;
  records.reserve(pieces.size());
  for (uint32_t i = 0; i < pieces.size(); ++i) {
    const RawPiece& p = pieces[i];
    RawChunkHeader h;
    h.version = version;
    h.chunk_index = i;
    h.chunk_count = static_cast<uint32_t>(pieces.size());
    h.tensor = p.tensor;
    h.byte_offset = p.offset;
    h.byte_count = p.size;
    std::vector<std::byte> record = encode_raw_message(h);
    const auto body = weights.tensors[p.tensor].subspan(p.offset, p.size);
    record.insert(record.end(), body.begin(), body.end());
    records.push_back(std::move(record));
  }
  const uint64_t digest = codec::StateDigest::full_scan(weights, 1).combined();
  const std::vector<std::span<const std::byte>> spans(records.begin(), records.end());
  return snapshots_.publish(version, 0, epoch, digest, spans, "snapshot");
}

void StorePublisher::prune() {
  deltas_.prune();
  snapshots_.prune();
}

StoreFollower::StoreFollower(const codec::Manifest& manifest, objstore::S3Client& client, const StoreLayout& layout,
                             codec::MutableWeights weights, uint64_t version, codec::StateDigest digest)
    : manifest_(manifest),
      deltas_(client, under(layout, "deltas")),
      snapshots_(client, under(layout, "snapshots")),
      weights_(std::move(weights)),
      applier_(std::make_unique<codec::DeltaApplier>(manifest, weights_, version, std::move(digest))) {}

StoreFollower::~StoreFollower() = default;

uint64_t StoreFollower::version() const { return applier_->version(); }
uint64_t StoreFollower::digest() const { return applier_->version_combined(); }

bool StoreFollower::replay(uint64_t v) {
  objstore::VersionManifest m;
  try {
    m = deltas_.manifest(v);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found) return false;
    throw;
  }
  if (m.base_version != applier_->version()) return false;
  const auto frames = deltas_.frames(m);
  try {
    for (const auto& frame : frames) {
      stats_.bytes_downloaded += frame.size();
      applier_->apply(frame);
    }
    if (!applier_->complete())
      throw Error(Errc::corrupt_frame, "store: delta " + std::to_string(v) + " lacks chunks or its seal");
    applier_->verify();
    applier_->commit();
  } catch (const Error&) {
    if (applier_->pending_version()) applier_->rollback();
    throw;
  }
  ++stats_.deltas_applied;
  return true;
}

void StoreFollower::take_snapshot(uint64_t v) {
  const objstore::VersionManifest m = snapshots_.manifest(v);
  const auto records = snapshots_.frames(m);
  std::vector<bool> have;
  try {
    for (const auto& record : records) {
      stats_.bytes_downloaded += record.size();
      // A RAW message's header has a fixed size: the record's first bytes, its body the rest.
      static const size_t prefix = [] {
        RawChunkHeader any;
        any.chunk_count = 1;
        return encode_raw_message(any).size();
      }();
      if (record.size() < prefix)
        throw Error(Errc::corrupt_frame, "store: snapshot " + std::to_string(v) + " holds a record that is not RAW");
      const RawChunkHeader h = decode_raw_message(std::span(record).first(prefix));
      const auto body = std::span(record).subspan(prefix);
      if (h.version != v || h.chunk_count > max_raw_chunk_count(manifest_) || h.tensor >= manifest_.size() ||
          body.size() != h.byte_count || h.byte_offset > manifest_.at(h.tensor).nbytes() ||
          h.byte_count > manifest_.at(h.tensor).nbytes() - h.byte_offset)
        throw Error(Errc::corrupt_frame, "store: snapshot " + std::to_string(v) + ": a piece outside its tensor");
      if (have.empty()) have.assign(h.chunk_count, false);
      if (h.chunk_count != have.size() || h.chunk_index >= have.size() || have[h.chunk_index])
        throw Error(Errc::corrupt_frame, "store: snapshot " + std::to_string(v) + ": pieces disagree");
      std::memcpy(weights_.tensors[h.tensor].data() + h.byte_offset, body.data(), body.size());
      have[h.chunk_index] = true;
    }
    if (have.empty() || std::count(have.begin(), have.end(), false) != 0)
      throw Error(Errc::corrupt_frame, "store: snapshot " + std::to_string(v) + " misses pieces");
    auto digest = codec::StateDigest::full_scan(weights_.as_const(), 1);
    if (digest.combined() != m.digest)
      throw Error(Errc::verify_failed, "store: snapshot " + std::to_string(v) + "'s bits do not match its manifest");
    applier_ = std::make_unique<codec::DeltaApplier>(manifest_, weights_, v, std::move(digest));
  } catch (const Error&) {
    if (!have.empty()) {  // bits of two versions: back to the all-zero version 0, a true state
      for (auto& t : weights_.tensors) std::memset(t.data(), 0, t.size());
      applier_ = std::make_unique<codec::DeltaApplier>(manifest_, weights_, 0,
                                                       codec::StateDigest::full_scan(weights_.as_const(), 1));
    }
    throw;
  }
  ++stats_.snapshots_taken;
}

uint64_t StoreFollower::catch_up() {
  const uint64_t newest_delta = deltas_.latest().value_or(0);
  const uint64_t newest_snapshot = snapshots_.latest().value_or(0);
  const uint64_t target = std::max(newest_delta, newest_snapshot);
  if (version() >= target) return version();
  // Replay from here while the store has each delta; else the newest snapshot, then replay.
  while (version() < newest_delta && replay(version() + 1)) {
  }
  if (version() >= target) return version();
  if (newest_snapshot > version()) {
    take_snapshot(newest_snapshot);
    while (version() < newest_delta && replay(version() + 1)) {
    }
  }
  if (version() < target)
    throw Error(Errc::not_found, "store: version " + std::to_string(version() + 1) +
                                     " is neither a delta nor reachable from a snapshot (held " +
                                     std::to_string(version()) + ", the store's newest " + std::to_string(target) +
                                     ")");
  return version();
}

}  // namespace deltacast::tree
