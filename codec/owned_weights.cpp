#include "codec/owned_weights.h"

#include <cstring>

#include "util/error.h"

namespace deltacast::codec {

OwnedWeights::OwnedWeights(const ConstWeights& source) {
  check_weights(source);
  manifest_ = std::make_unique<Manifest>(*source.manifest);
  tensors_.reserve(source.tensors.size());
  for (const auto& t : source.tensors) tensors_.emplace_back(t.begin(), t.end());
}

ConstWeights OwnedWeights::view() const {
  ConstWeights w{manifest_.get(), {}};
  for (const auto& t : tensors_) w.tensors.emplace_back(t);
  return w;
}

MutableWeights OwnedWeights::mutable_view() {
  MutableWeights w{manifest_.get(), {}};
  for (auto& t : tensors_) w.tensors.emplace_back(t);
  return w;
}

void OwnedWeights::assign(const ConstWeights& source) {
  check_weights(source);
  if (source.manifest->digest() != manifest_->digest()) {
    throw Error(Errc::invalid_argument, "OwnedWeights::assign: weights belong to another manifest");
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!source.tensors[i].empty()) std::memcpy(tensors_[i].data(), source.tensors[i].data(), tensors_[i].size());
  }
}

bool bitwise_equal(const ConstWeights& a, const ConstWeights& b) {
  if (a.manifest->digest() != b.manifest->digest() || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].size() != b.tensors[i].size()) return false;
    if (!a.tensors[i].empty() && std::memcmp(a.tensors[i].data(), b.tensors[i].data(), a.tensors[i].size()) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace deltacast::codec
