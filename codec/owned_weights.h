#pragma once
// A private, heap-owned copy of a set of weights: what a host mutates so that the source (a
// mapped file, the simulator) is never touched. Used by the CLI and the benchmarks.
#include <cstddef>
#include <memory>
#include <vector>

#include "codec/manifest.h"

namespace deltacast::codec {

class OwnedWeights {
 public:
  // Copies every tensor of `source` (and its manifest). Throws Error(invalid_argument) when the
  // source does not match its manifest.
  explicit OwnedWeights(const ConstWeights& source);
  OwnedWeights(const OwnedWeights&) = delete;
  OwnedWeights& operator=(const OwnedWeights&) = delete;

  const Manifest& manifest() const noexcept { return *manifest_; }
  ConstWeights view() const;
  MutableWeights mutable_view();
  // Overwrites the contents with `source` (same manifest required; throws Error(invalid_argument)).
  void assign(const ConstWeights& source);

 private:
  std::unique_ptr<Manifest> manifest_;  // stable address: views point at it
  std::vector<std::vector<std::byte>> tensors_;
};

// True when both hold the same manifest digest and identical bytes in every tensor (memcmp).
bool bitwise_equal(const ConstWeights& a, const ConstWeights& b);

}  // namespace deltacast::codec
