// DeviceDiffMirror (device_mirror.h): device diff, compaction of the changed values, and the
// host-side patch of the pinned mirror.
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <cstring>
#include <string>
#include <vector>

#include "codec/cuda/device_diff.h"
#include "codec/cuda/device_mirror.h"
#include "util/error.h"

namespace deltacast::codec::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(Errc::internal, std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

__global__ void word_counts_kernel(const uint64_t* __restrict__ bitmap, uint64_t words, uint64_t* __restrict__ counts) {
  for (uint64_t w = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    counts[w] = static_cast<uint64_t>(__popcll(bitmap[w]));
}

// values[offsets[w] + r] = next[unit of the r-th set bit of word w]; the baseline takes the same
// value there, so after the kernel it equals `next` again.
template <class T>
__global__ void compact_kernel(const T* __restrict__ next, T* __restrict__ baseline, const uint64_t* __restrict__ bitmap,
                               const uint64_t* __restrict__ offsets, uint64_t words, T* __restrict__ values) {
  for (uint64_t w = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    uint64_t bits = bitmap[w];
    uint64_t o = offsets[w];
    while (bits) {
      const uint64_t p = w * 64 + static_cast<uint64_t>(__ffsll(static_cast<long long>(bits)) - 1);
      const T v = next[p];
      values[o++] = v;
      baseline[p] = v;
      bits &= bits - 1;
    }
  }
}

__global__ void read_both_kernel(const uint4* __restrict__ a, const uint4* __restrict__ b, uint64_t n,
                                 unsigned long long* __restrict__ out) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint4 x = a[i], y = b[i];
    local += (x.x ^ y.x) + (x.y ^ y.y) + (x.z ^ y.z) + (x.w ^ y.w);
  }
  for (int offset = 16; offset > 0; offset /= 2) local += __shfl_down_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local) atomicAdd(out, local);
}

unsigned grid(uint64_t n) {
  const uint64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b == 0 ? 1 : (b < (1u << 20) ? b : (1u << 20)));
}

}  // namespace

struct DeviceDiffMirror::Impl {
  struct Entry {
    DeviceTensor device;
    PinnedBuffer mirror;
    DeviceBuffer baseline;
    bool whole = true;  // the next pull copies the tensor whole
    uint64_t bytes() const { return device.units * device.width; }
  };
  std::vector<Entry> entries;
  DeviceBuffer bitmap, counts, offsets, values, scan_temp;
  PinnedBuffer host_bitmap, host_values;

  void pull_diff(Entry& e, PullStats& stats);
};

DeviceDiffMirror::DeviceDiffMirror(std::vector<DeviceTensor> tensors) : impl_(std::make_unique<Impl>()) {
  if (!cuda_device_available()) throw Error(Errc::unsupported, "cuda: no CUDA device is available");
  for (const auto& t : tensors) {
    if (t.width != 1 && t.width != 2 && t.width != 4)
      throw Error(Errc::invalid_argument, "cuda: unit width must be 1, 2 or 4 bytes");
    Impl::Entry e;
    e.device = t;
    e.mirror.reserve(e.bytes() ? e.bytes() : 1);
    e.baseline.reserve(e.bytes() ? e.bytes() : 1);
    impl_->entries.push_back(std::move(e));
  }
}

DeviceDiffMirror::~DeviceDiffMirror() = default;

size_t DeviceDiffMirror::size() const noexcept { return impl_->entries.size(); }
const std::byte* DeviceDiffMirror::host(size_t i) const noexcept { return impl_->entries[i].mirror.data(); }
uint64_t DeviceDiffMirror::bytes(size_t i) const noexcept { return impl_->entries[i].bytes(); }

void DeviceDiffMirror::set_device(size_t i, void* data) {
  if (i >= impl_->entries.size()) throw Error(Errc::invalid_argument, "cuda: no mirrored tensor " + std::to_string(i));
  impl_->entries[i].device.data = data;
  impl_->entries[i].whole = true;
}

PullStats DeviceDiffMirror::pull() {
  PullStats stats;
  for (auto& e : impl_->entries) {
    stats.units += e.device.units;
    if (e.bytes() == 0) continue;
    if (e.whole) {
      check(cudaMemcpy(e.mirror.data(), e.device.data, e.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy mirror");
      check(cudaMemcpy(e.baseline.data(), e.device.data, e.bytes(), cudaMemcpyDeviceToDevice), "cudaMemcpy baseline");
      check(cudaDeviceSynchronize(), "baseline copy");
      stats.full_bytes += e.bytes();
      e.whole = false;
      continue;
    }
    impl_->pull_diff(e, stats);
  }
  return stats;
}

void DeviceDiffMirror::Impl::pull_diff(Entry& e, PullStats& stats) {
  const uint64_t n = e.device.units;
  const unsigned w = e.device.width;
  const uint64_t words = (n + 63) / 64;
  bitmap.reserve(words * 8);
  auto* d_bitmap = static_cast<uint64_t*>(bitmap.data());
  const uint64_t changed = device_change_bitmap(e.baseline.data(), e.device.data, n, w, d_bitmap);
  stats.changed += changed;
  if (changed == 0) return;  // nothing crosses PCIe but the count
  // Offsets of each word's values: an exclusive sum of the words' popcounts (64-bit, so a
  // tensor with more than 2^32 changes sums without overflow).
  counts.reserve(words * sizeof(uint64_t));
  offsets.reserve(words * sizeof(uint64_t));
  auto* d_counts = static_cast<uint64_t*>(counts.data());
  auto* d_offsets = static_cast<uint64_t*>(offsets.data());
  word_counts_kernel<<<grid(words), 256>>>(d_bitmap, words, d_counts);
  check(cudaGetLastError(), "word counts");
  size_t temp_bytes = 0;
  check(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, d_counts, d_offsets, words), "cub scan size");
  scan_temp.reserve(temp_bytes ? temp_bytes : 1);
  check(cub::DeviceScan::ExclusiveSum(scan_temp.data(), temp_bytes, d_counts, d_offsets, words), "cub scan");
  values.reserve(changed * w);
  switch (w) {
    case 1:
      compact_kernel<uint8_t><<<grid(words), 256>>>(static_cast<const uint8_t*>(e.device.data),
                                                    static_cast<uint8_t*>(e.baseline.data()), d_bitmap, d_offsets, words,
                                                    static_cast<uint8_t*>(values.data()));
      break;
    case 2:
      compact_kernel<uint16_t><<<grid(words), 256>>>(static_cast<const uint16_t*>(e.device.data),
                                                     static_cast<uint16_t*>(e.baseline.data()), d_bitmap, d_offsets,
                                                     words, static_cast<uint16_t*>(values.data()));
      break;
    default:
      compact_kernel<uint32_t><<<grid(words), 256>>>(static_cast<const uint32_t*>(e.device.data),
                                                     static_cast<uint32_t*>(e.baseline.data()), d_bitmap, d_offsets,
                                                     words, static_cast<uint32_t*>(values.data()));
      break;
  }
  check(cudaGetLastError(), "compact");
  host_bitmap.reserve(words * 8);
  host_values.reserve(changed * w);
  check(cudaMemcpy(host_bitmap.data(), d_bitmap, words * 8, cudaMemcpyDeviceToHost), "cudaMemcpy bitmap");
  check(cudaMemcpy(host_values.data(), values.data(), changed * w, cudaMemcpyDeviceToHost), "cudaMemcpy values");
  stats.bitmap_bytes += words * 8;
  stats.value_bytes += changed * w;
  // Patch the mirror in bitmap order (the compaction's order).
  const auto* map = reinterpret_cast<const uint64_t*>(host_bitmap.data());
  const std::byte* v = host_values.data();
  std::byte* m = e.mirror.data();
  for (uint64_t word = 0; word < words; ++word)
    for (uint64_t bits = map[word]; bits; bits &= bits - 1) {
      const uint64_t p = word * 64 + static_cast<uint64_t>(__builtin_ctzll(bits));
      std::memcpy(m + p * w, v, w);
      v += w;
    }
}

uint64_t device_read_both(const void* a, const void* b, uint64_t bytes) {
  if (!cuda_device_available()) throw Error(Errc::unsupported, "cuda: no CUDA device is available");
  if (bytes % 16 != 0) throw Error(Errc::invalid_argument, "cuda: device_read_both needs a multiple of 16 bytes");
  DeviceBuffer out(sizeof(unsigned long long));
  check(cudaMemset(out.data(), 0, sizeof(unsigned long long)), "cudaMemset");
  const uint64_t n = bytes / 16;
  read_both_kernel<<<grid(n / 4 + 1), 256>>>(static_cast<const uint4*>(a), static_cast<const uint4*>(b), n,
                                             static_cast<unsigned long long*>(out.data()));
  check(cudaGetLastError(), "read both");
  unsigned long long host = 0;
  check(cudaMemcpy(&host, out.data(), sizeof(host), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

}  // namespace deltacast::codec::cuda
