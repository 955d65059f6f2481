#pragma once
// A private, heap-owned copy of a set of weights: what `apply` and `demo` mutate so that the
// source (a mapped file, the simulator) is never touched.
#include <cstddef>
#include <memory>
#include <vector>

#include "codec/manifest.h"

namespace deltacast::tools {

class OwnedWeights {
 public:
  // Copies every tensor of `source` (and its manifest). Throws Error(invalid_argument) when the
  // source does not match its manifest.
  explicit OwnedWeights(const codec::ConstWeights& source);
  OwnedWeights(const OwnedWeights&) = delete;
  OwnedWeights& operator=(const OwnedWeights&) = delete;

  const codec::Manifest& manifest() const noexcept { return *manifest_; }
  codec::ConstWeights view() const;
  codec::MutableWeights mutable_view();
  // Overwrites the contents with `source` (same manifest required; throws Error(invalid_argument)).
  void assign(const codec::ConstWeights& source);

 private:
  std::unique_ptr<codec::Manifest> manifest_;  // stable address: views point at it
  std::vector<std::vector<std::byte>> tensors_;
};

// True when both hold the same manifest digest and identical bytes in every tensor (memcmp).
bool bitwise_equal(const codec::ConstWeights& a, const codec::ConstWeights& b);

}  // namespace deltacast::tools
