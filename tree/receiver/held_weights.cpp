#include "tree/receiver/held_weights.h"

namespace deltacast::tree {

void HeldWeights::host_holds(uint64_t version, uint64_t digest) { told_ = Held{version, digest, 0}; }

const codec::Manifest& HeldWeights::set_manifest(codec::Manifest manifest) {
  return manifest_.emplace(std::move(manifest));
}

void HeldWeights::attach(codec::MutableWeights weights, uint64_t version, codec::StateDigest digest,
                         const ReceiverOptions& options) {
  buffers_ = weights;
  session_ = std::make_unique<Session>(*manifest_, std::move(weights), version, std::move(digest), options.rank,
                                       options.gated);
  store_ = std::make_unique<FrameStore>(options.retain_bytes, options.retain_versions);
}

void HeldWeights::attach_placed(codec::PlacedWeights weights, uint64_t version, uint64_t version_combined,
                                const ReceiverOptions& options) {
  placed_ = weights;
  session_ =
      std::make_unique<Session>(*manifest_, std::move(weights), version, version_combined, options.rank, options.gated);
  store_ = std::make_unique<FrameStore>(options.retain_bytes, options.retain_versions);
}

HeldWeights::Held HeldWeights::held() const {
  if (!session_) return told_;
  return Held{session_->version(), session_->digest(), session_->attempt_floor()};
}

void HeldWeights::reattach(uint32_t tensor, std::span<std::byte> memory) {
  std::lock_guard lock(buffers_mutex_);
  session_->rebind(tensor, memory);
  buffers_.tensors[tensor] = memory;
}

}  // namespace deltacast::tree
