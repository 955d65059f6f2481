#pragma once
// The manifest: the ordered list of tensors (name, dtype, shape) in checkpoint order. A change is
// placed at the canonical coordinate (tensor index in this order, flat row-major element index),
// which does not depend on how trainer or receiver shard the tensor.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "codec/dtype.h"

namespace deltacast::codec {

struct TensorInfo {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<uint64_t> shape;

  uint64_t numel() const noexcept;   // product of shape (1 for a scalar, 0 if any dim is 0)
  uint64_t nbytes() const noexcept;  // numel * dtype_size
  // Code units (dtype_unit_size): numel, or 2 * numel for 8-byte dtypes. The codec's element
  // indices (frames, digests, chunk slices) count units.
  uint64_t units() const noexcept;
};

class Manifest {
 public:
  Manifest() = default;
  // Validates: names non-empty and unique. Throws Error(invalid_argument) otherwise.
  explicit Manifest(std::vector<TensorInfo> tensors);

  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  size_t size() const noexcept { return tensors_.size(); }
  const TensorInfo& at(uint32_t index) const;  // throws Error(not_found) when out of range
  std::optional<uint32_t> find(std::string_view name) const;
  uint64_t total_bytes() const noexcept;
  uint64_t total_elements() const noexcept;
  // xxh3-64 over a canonical serialisation of (name, dtype, shape) in order. Two manifests with
  // the same digest describe the same coordinate space.
  uint64_t digest() const noexcept { return digest_; }

 private:
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, uint32_t> index_;
  uint64_t digest_ = 0;
};

// Caller-owned bytes for every tensor of a manifest, in manifest order (tensors[i] holds exactly
// manifest.at(i).nbytes() bytes). The codec never allocates or frees these.
struct ConstWeights {
  const Manifest* manifest = nullptr;
  std::vector<std::span<const std::byte>> tensors;
};
struct MutableWeights {
  const Manifest* manifest = nullptr;
  std::vector<std::span<std::byte>> tensors;
  ConstWeights as_const() const;
};

// Throws Error(invalid_argument) unless weights has one span of the right size per tensor.
void check_weights(const ConstWeights& weights);

// A version's bytes read on demand (pread of the checkpoint files) instead of spans into a
// mapping: the encoder reads each slice in pieces small enough to stay in a core's cache
// (encoder.h), so a diff costs one read of each file whatever page sizes the page cache holds it
// in, and a file truncated under it is an error instead of SIGBUS.
class WeightsReader {
 public:
  virtual ~WeightsReader() = default;
  virtual const Manifest& manifest() const noexcept = 0;
  // Copies bytes [offset, offset + out.size()) of tensor `tensor` (manifest order) into `out`.
  // Requires offset + out.size() <= the tensor's nbytes(). Safe to call from several threads at
  // once. Throws Error(io) naming the file when it cannot be read (a short read included).
  virtual void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const = 0;
};

// A WeightsReader over weights in memory (a trainer rank's tensors). A producer group's rank
// holds only its part: a tensor's span may be empty (or short) where the rank holds none of it;
// a read there throws Error(invalid_argument) naming the tensor. `weights` must hold one span per
// tensor and outlive the reader.
class SpanReader final : public WeightsReader {
 public:
  explicit SpanReader(ConstWeights weights);
  const Manifest& manifest() const noexcept override { return *weights_.manifest; }
  void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const override;

 private:
  ConstWeights weights_;
};

}  // namespace deltacast::codec
