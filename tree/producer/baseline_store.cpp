#include "tree/producer/baseline_store.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "codec/dtype.h"
#include "util/error.h"

namespace deltacast::tree {

BaselineStore::BaselineStore(const codec::Manifest& manifest, unsigned digest_threads)
    : manifest_(manifest), digest_threads_(digest_threads) {
  bits_.resize(manifest.size());
  for (size_t i = 0; i < manifest.size(); ++i) bits_[i].resize(manifest.tensors()[i].nbytes());
  digest_ = codec::StateDigest::full_scan(weights(), digest_threads_);
}

codec::ConstWeights BaselineStore::weights() const {
  codec::ConstWeights w{&manifest_, {}};
  for (const auto& t : bits_) w.tensors.emplace_back(t.data(), t.size());
  return w;
}

void BaselineStore::record(const std::vector<SnapshotPatches::Patch>& changed) {
  for (auto* reader : readers_) reader->record(changed);
}

void BaselineStore::adopt(const codec::ConstWeights& next, uint64_t v, std::optional<codec::StateDigest> digest) {
  std::unique_lock lock(mutex_);
  std::vector<SnapshotPatches::Patch> changed;
  overwrite_with(bits_, next, readers_.empty() ? nullptr : &changed);
  record(changed);
  digest_ = digest ? std::move(*digest) : codec::StateDigest::full_scan(weights(), digest_threads_);
  version_ = v;
}

void BaselineStore::adopt(const codec::WeightsReader& next, uint64_t v, codec::StateDigest digest) {
  std::unique_lock lock(mutex_);
  std::vector<SnapshotPatches::Patch> changed;
  try {
    overwrite_with(bits_, next, readers_.empty() ? nullptr : &changed);
  } catch (const Error& e) {
    // Open snapshots keep their version: they get the old bits of what was overwritten.
    record(changed);
    lost_ = "reading version " + std::to_string(v) + " (committed) into its baseline failed: " + e.what() +
            "; a producer resumed from its state file continues the chain";
    throw Error(Errc::io, lost_);
  }
  record(changed);
  digest_ = std::move(digest);
  version_ = v;
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
  const unsigned width = static_cast<unsigned>(codec::dtype_unit_size(store_.manifest_.at(tensor).dtype));
  std::shared_lock lock(store_.mutex_);
  std::memcpy(out.data(), store_.bits_[tensor].data() + offset, out.size());
  patches_.restore_and_advance(tensor, offset / width, (offset + out.size()) / width, width, out);
}

}  // namespace deltacast::tree
