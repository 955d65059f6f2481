#include "tree/producer/baseline_store.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "codec/dtype.h"
#include "util/error.h"

namespace deltacast::tree {

namespace {

uint64_t unit_bytes(const codec::Manifest& manifest, uint32_t tensor) {
  return codec::dtype_unit_size(manifest.at(tensor).dtype);
}

bool before(const codec::PartRange& a, const codec::PartRange& b) {
  return a.tensor != b.tensor ? a.tensor < b.tensor : a.begin < b.begin;
}

}  // namespace

BaselineStore::BaselineStore(const codec::Manifest& manifest, unsigned digest_threads)
    : manifest_(manifest), digest_threads_(digest_threads) {
  for (uint32_t t = 0; t < manifest.size(); ++t) {
    ranges_.push_back({t, 0, manifest.at(t).units()});
    bits_.emplace_back(manifest.at(t).nbytes());
  }
  digest_ = codec::StateDigest::full_scan(weights(), digest_threads_);
}

BaselineStore::BaselineStore(const codec::Manifest& manifest, std::vector<codec::PartRange> part,
                             unsigned digest_threads)
    : manifest_(manifest), digest_threads_(digest_threads), whole_(false) {
  std::erase_if(part, [](const codec::PartRange& r) { return r.begin == r.end; });
  std::sort(part.begin(), part.end(), before);
  for (size_t i = 0; i < part.size(); ++i) {
    const auto& r = part[i];
    if (r.tensor >= manifest.size() || r.begin > r.end || r.end > manifest.at(r.tensor).units())
      throw Error(Errc::invalid_argument,
                  "baseline: a range of tensor index " + std::to_string(r.tensor) + " lies outside the manifest");
    if (i > 0 && part[i - 1].tensor == r.tensor && part[i - 1].end > r.begin)
      throw Error(Errc::invalid_argument, "baseline: two ranges of tensor '" + manifest.at(r.tensor).name +
                                              "' overlap at unit " + std::to_string(r.begin));
  }
  ranges_ = std::move(part);
  for (const auto& r : ranges_) bits_.emplace_back(r.units() * unit_bytes(manifest, r.tensor));
  digest_ = held_digest();
}

uint64_t BaselineStore::bytes() const noexcept {
  uint64_t total = 0;
  for (const auto& b : bits_) total += b.size();
  return total;
}

codec::ConstWeights BaselineStore::weights() const {
  if (!whole_) throw Error(Errc::state, "baseline: a producer rank's part holds no whole weights");
  codec::ConstWeights w{&manifest_, {}};
  for (const auto& t : bits_) w.tensors.emplace_back(t.data(), t.size());
  return w;
}

std::span<const std::byte> BaselineStore::held(uint32_t tensor, uint64_t offset, uint64_t size) const {
  const uint64_t width = tensor < manifest_.size() ? unit_bytes(manifest_, tensor) : 1;
  const codec::PartRange key{tensor, offset / width, 0};
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), key, before);
  if (it != ranges_.begin()) {
    --it;
    const uint64_t first = it->begin * width, end = it->end * width;
    if (it->tensor == tensor && first <= offset && offset <= end && size <= end - offset)
      return std::span<const std::byte>(bits_[static_cast<size_t>(it - ranges_.begin())]).subspan(offset - first, size);
  }
  throw Error(Errc::invalid_argument, "baseline: bytes [" + std::to_string(offset) + ", " +
                                          std::to_string(offset + size) + ") of tensor index " +
                                          std::to_string(tensor) + " are not held here");
}

void BaselineStore::Reader::read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const {
  const auto from = store_.held(tensor, offset, out.size());
  if (!out.empty()) std::memcpy(out.data(), from.data(), out.size());
}

void BaselineStore::record(const std::vector<SnapshotPatches::Patch>& changed) {
  for (auto* reader : readers_) reader->record(changed);
}

void BaselineStore::adopt(const codec::ConstWeights& next, uint64_t v, std::optional<codec::StateDigest> digest) {
  if (!whole_) throw Error(Errc::state, "baseline: a producer rank's part adopts from a reader");
  std::unique_lock lock(mutex_);
  std::vector<SnapshotPatches::Patch> changed;
  overwrite_with(bits_, next, readers_.empty() ? nullptr : &changed);
  record(changed);
  digest_ = digest ? std::move(*digest) : codec::StateDigest::full_scan(weights(), digest_threads_);
  version_ = v;
}

void BaselineStore::adopt(const codec::WeightsReader& next, uint64_t v, std::optional<codec::StateDigest> digest) {
  std::unique_lock lock(mutex_);
  std::vector<SnapshotPatches::Patch> changed;
  try {
    overwrite_with(bits_, ranges_, next, readers_.empty() ? nullptr : &changed);
  } catch (const Error& e) {
    // Open snapshots keep their version: they get the old bits of what was overwritten.
    record(changed);
    lost_ = "reading version " + std::to_string(v) + " (committed) into its baseline failed: " + e.what() +
            "; a producer resumed from its state file continues the chain";
    throw Error(Errc::io, lost_);
  }
  record(changed);
  digest_ = digest ? std::move(*digest) : held_digest();
  version_ = v;
}

codec::StateDigest BaselineStore::held_digest() const {
  if (whole_) return codec::StateDigest::full_scan(weights(), digest_threads_);
  std::vector<uint64_t> sums(manifest_.size(), 0);
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const auto& r = ranges_[i];
    sums[r.tensor] += codec::slice_digest(r.tensor, manifest_.at(r.tensor).dtype, r.begin, bits_[i]);
  }
  return codec::StateDigest(std::move(sums));
}

std::unique_ptr<BaselineStore::Snapshot> BaselineStore::open_snapshot() {
  std::unique_lock lock(mutex_);
  if (!lost_.empty()) throw Error(Errc::state, "the producer holds no committed version: " + lost_);
  if (version_ == 0) throw Error(Errc::state, "the producer has committed no version yet");
  std::unique_ptr<Snapshot> snapshot(new Snapshot(*this, version_, digest_.combined()));
  readers_.push_back(&snapshot->patches_);
  return snapshot;
}

BaselineStore::Snapshot::Snapshot(BaselineStore& store, uint64_t version, uint64_t digest)
    : store_(store), version_(version), digest_(digest) {}

BaselineStore::Snapshot::~Snapshot() {
  std::unique_lock lock(store_.mutex_);
  std::erase(store_.readers_, &patches_);
}

void BaselineStore::Snapshot::read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) {
  const unsigned width = static_cast<unsigned>(unit_bytes(store_.manifest_, tensor));
  std::shared_lock lock(store_.mutex_);
  const auto from = store_.held(tensor, offset, out.size());
  if (!out.empty()) std::memcpy(out.data(), from.data(), out.size());
  patches_.restore_and_advance(tensor, offset / width, (offset + out.size()) / width, width, out);
}

}  // namespace deltacast::tree
