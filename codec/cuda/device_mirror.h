#pragma once
// The producer's side of CUDA tensors: a host mirror of device tensors kept equal to them by
// diffs computed on the device (the change-bitmap kernel of device_diff.h), so that only the
// bitmap (1 bit per unit) and the changed values cross PCIe. The host encoder (and tree::Producer)
// then reads the mirror as it reads any host tensor, and its frames are those of the same bits in
// host memory: byte-identical (encode_from_device in device_encode.h, tested on a GPU).
//
// Memory: per tensor, a pinned host mirror (1x) and a device baseline copy (1x, what the mirror
// holds, which the next diff compares against), plus the bitmap and the changed values of one
// tensor at a time.
// Rules as in device_apply.h (synchronous, current device, Error(unsupported) without CUDA).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "codec/cuda/device_apply.h"

namespace deltacast::codec::cuda {

struct PullStats {
  uint64_t units = 0;           // units covered
  uint64_t changed = 0;         // units that differed from the mirror
  uint64_t bitmap_bytes = 0;    // device to host: bitmaps
  uint64_t value_bytes = 0;     // device to host: changed values
  uint64_t full_bytes = 0;      // device to host: whole tensors (the first pull, set_device)
};

class DeviceDiffMirror {
 public:
  // `tensors`: caller-owned device tensors (they must outlive the mirror or be re-pointed with
  // set_device). Allocates the mirrors and baselines; nothing is copied until pull().
  explicit DeviceDiffMirror(std::vector<DeviceTensor> tensors);
  ~DeviceDiffMirror();
  DeviceDiffMirror(const DeviceDiffMirror&) = delete;
  DeviceDiffMirror& operator=(const DeviceDiffMirror&) = delete;

  size_t size() const noexcept;
  // Makes every host mirror hold the device tensors' bits now: the first time (and after
  // set_device) by a whole copy, afterwards by a device diff against the baseline, the bitmap and
  // the changed values copied back and patched into the mirror (the baseline is patched on the
  // device in the same kernel). Do not write the device tensors while it runs.
  PullStats pull();
  // The host mirror of tensor i (units x width bytes, pinned): valid until the mirror is
  // destroyed; changes only in pull().
  const std::byte* host(size_t i) const noexcept;
  uint64_t bytes(size_t i) const noexcept;
  // Tensor i moved to `data` (same size): the next pull copies it whole.
  void set_device(size_t i, void* data);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// For benchmarks: a kernel that reads both device buffers once (bytes each) and folds them into
// one word, the floor a device diff is measured against. Returns the fold (to keep it honest).
uint64_t device_read_both(const void* a, const void* b, uint64_t bytes);

}  // namespace deltacast::codec::cuda
