// CUDA kernels for receivers whose tensors live in device memory (device_apply.h): scatter with a
// device-side undo log, restore, gather, and the additive digest computed on the device with the
// host's own term functions (codec/digest_terms.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "codec/cuda/device_apply.h"
#include "codec/cuda/device_diff.h"
#include "codec/digest_terms.h"
#include "util/error.h"

namespace deltacast::codec::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(Errc::internal, std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

void require_device() {
  if (!cuda_device_available()) throw Error(Errc::unsupported, "cuda: no CUDA device is available");
}

void require_width(unsigned width) {
  if (width != 1 && width != 2 && width != 4)
    throw Error(Errc::invalid_argument, "cuda: unit width must be 1, 2 or 4 bytes, not " + std::to_string(width));
}

constexpr unsigned kThreads = 256;

unsigned blocks_for(uint64_t n, uint64_t per_thread = 1) {
  const uint64_t threads = (n + per_thread - 1) / per_thread;
  const uint64_t b = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535u * 16u ? (b ? b : 1) : 65535u * 16u);  // grid-stride beyond
}

template <class T>
__global__ void scatter_kernel(T* __restrict__ data, const uint64_t* __restrict__ positions,
                               const uint32_t* __restrict__ new_bits, uint32_t* __restrict__ undo, uint64_t n) {
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t p = positions[k];
    if (undo) undo[k] = data[p];
    data[p] = static_cast<T>(new_bits[k]);
  }
}

template <class T>
__global__ void restore_kernel(T* __restrict__ data, const uint64_t* __restrict__ positions,
                               const uint32_t* __restrict__ bits, uint64_t n) {
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    data[positions[k]] = static_cast<T>(bits[k]);
}

template <class T>
__global__ void gather_kernel(const T* __restrict__ data, const uint64_t* __restrict__ positions,
                              uint32_t* __restrict__ out, uint64_t n) {
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    out[k] = data[positions[k]];
}

// Sum (mod 2^64) of element_hash_seeded over units [first, first + n): each thread sums a strided
// set of units, a warp folds its lanes, one atomic per warp. The sum is order-free mod 2^64.
template <class T>
__global__ void digest_kernel(const T* __restrict__ data, uint64_t first, uint64_t n, uint64_t seed,
                              unsigned long long* __restrict__ sum) {
  unsigned long long local = 0;
  for (uint64_t k = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    local += element_hash_seeded(seed, first + k, static_cast<uint32_t>(data[first + k]));
  for (int offset = 16; offset > 0; offset /= 2) local += __shfl_down_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local) atomicAdd(sum, local);
}

template <template <class> class Kernel, class... Args>
void launch_by_width(unsigned width, unsigned blocks, void* data, Args... args) {
  switch (width) {
    case 1: Kernel<uint8_t>::run(blocks, static_cast<uint8_t*>(data), args...); break;
    case 2: Kernel<uint16_t>::run(blocks, static_cast<uint16_t*>(data), args...); break;
    default: Kernel<uint32_t>::run(blocks, static_cast<uint32_t*>(data), args...); break;
  }
  check(cudaGetLastError(), "kernel launch");
}

template <class T>
struct Scatter {
  static void run(unsigned blocks, T* data, const uint64_t* p, const uint32_t* b, uint32_t* undo, uint64_t n) {
    scatter_kernel<T><<<blocks, kThreads>>>(data, p, b, undo, n);
  }
};
template <class T>
struct Restore {
  static void run(unsigned blocks, T* data, const uint64_t* p, const uint32_t* b, uint64_t n) {
    restore_kernel<T><<<blocks, kThreads>>>(data, p, b, n);
  }
};
template <class T>
struct Gather {
  static void run(unsigned blocks, T* data, const uint64_t* p, uint32_t* out, uint64_t n) {
    gather_kernel<T><<<blocks, kThreads>>>(data, p, out, n);
  }
};
template <class T>
struct Digest {
  static void run(unsigned blocks, T* data, uint64_t first, uint64_t n, uint64_t seed, unsigned long long* sum) {
    digest_kernel<T><<<blocks, kThreads>>>(data, first, n, seed, sum);
  }
};

void check_positions(const DeviceTensor& t, const uint64_t* positions, size_t count) {
  for (size_t k = 0; k < count; ++k)
    if (positions[k] >= t.units)
      throw Error(Errc::invalid_argument, "cuda: position " + std::to_string(positions[k]) + " is past the tensor's " +
                                              std::to_string(t.units) + " units");
}

}  // namespace

// ---- memory -----------------------------------------------------------------------------------

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) cudaFreeHost(data_);
    data_ = std::exchange(o.data_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}
void PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  require_device();
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
  std::memset(p, 0, bytes);
  if (data_) cudaFreeHost(data_);
  data_ = static_cast<std::byte*>(p);
  capacity_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}
void DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  require_device();
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  if (data_) cudaFree(data_);
  data_ = p;
  capacity_ = bytes;
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require_device();
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require_device();
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
}
void copy_device_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require_device();
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy device to device");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

bool is_device_pointer(const void* pointer) noexcept {
  if (!cuda_device_available()) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

void use_device(int device_id) {
  require_device();
  check(cudaSetDevice(device_id), "cudaSetDevice");
}

void device_synchronize() {
  require_device();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// ---- digest -----------------------------------------------------------------------------------

uint64_t device_slice_digest(const DeviceTensor& t, uint64_t seed, uint64_t first, uint64_t count) {
  require_device();
  require_width(t.width);
  if (first > t.units || count > t.units - first)
    throw Error(Errc::invalid_argument, "cuda: digest slice past the tensor's end");
  if (count == 0) return 0;
  thread_local DeviceBuffer sum;  // one word per thread that digests; reused
  sum.reserve(sizeof(unsigned long long));
  auto* d_sum = static_cast<unsigned long long*>(sum.data());
  check(cudaMemset(d_sum, 0, sizeof(*d_sum)), "cudaMemset");
  launch_by_width<Digest>(t.width, blocks_for(count, 16), t.data, first, count, seed, d_sum);
  unsigned long long host = 0;
  check(cudaMemcpy(&host, d_sum, sizeof(host), cudaMemcpyDeviceToHost), "cudaMemcpy digest");
  return host;
}

// ---- raw kernels --------------------------------------------------------------------------------

void device_scatter_raw(const DeviceTensor& t, const uint64_t* positions, const uint32_t* new_bits, uint32_t* undo,
                        uint64_t count) {
  require_device();
  require_width(t.width);
  if (count == 0) return;
  launch_by_width<Scatter>(t.width, blocks_for(count), t.data, positions, new_bits, undo, count);
}

void device_restore_raw(const DeviceTensor& t, const uint64_t* positions, const uint32_t* bits, uint64_t count) {
  require_device();
  require_width(t.width);
  if (count == 0) return;
  launch_by_width<Restore>(t.width, blocks_for(count), t.data, positions, bits, count);
}

// ---- DeviceScatter ------------------------------------------------------------------------------

struct DeviceScatter::Impl {
  // One batch of the undo log: its tensor and where its positions and old bits lie on the device.
  struct Batch {
    DeviceTensor tensor;
    uint64_t offset = 0;  // into positions/old_bits, in entries
    uint64_t count = 0;
  };
  std::vector<Batch> batches;
  uint64_t entries = 0;
  DeviceBuffer positions;  // uint64_t per entry, every batch since the last commit
  DeviceBuffer old_bits;   // uint32_t per entry
  DeviceBuffer new_bits;   // staging of one batch's new bits (then reused)
  PinnedBuffer staging;    // host side of one batch's positions and bits

  // Grows a device log buffer keeping its contents (the undo entries of earlier batches).
  static void grow_keep(DeviceBuffer& b, size_t bytes, size_t keep) {
    if (bytes <= b.capacity()) return;
    DeviceBuffer bigger(std::max(bytes, b.capacity() * 2));
    if (keep) check(cudaMemcpy(bigger.data(), b.data(), keep, cudaMemcpyDeviceToDevice), "cudaMemcpy undo log");
    b = std::move(bigger);
  }
};

DeviceScatter::DeviceScatter() : impl_(std::make_unique<Impl>()) {}
DeviceScatter::~DeviceScatter() = default;

uint64_t DeviceScatter::undo_entries() const noexcept { return impl_->entries; }

void DeviceScatter::scatter(const DeviceTensor& t, const uint64_t* positions, const uint32_t* new_bits, size_t count) {
  require_device();
  require_width(t.width);
  if (count == 0) return;
  check_positions(t, positions, count);
  auto& im = *impl_;
  const uint64_t at = im.entries;
  Impl::grow_keep(im.positions, (at + count) * sizeof(uint64_t), at * sizeof(uint64_t));
  Impl::grow_keep(im.old_bits, (at + count) * sizeof(uint32_t), at * sizeof(uint32_t));
  im.new_bits.reserve(count * sizeof(uint32_t));
  im.staging.reserve(count * (sizeof(uint64_t) + sizeof(uint32_t)));
  std::byte* host = im.staging.data();
  std::memcpy(host, positions, count * sizeof(uint64_t));
  std::memcpy(host + count * sizeof(uint64_t), new_bits, count * sizeof(uint32_t));
  auto* d_pos = static_cast<uint64_t*>(im.positions.data()) + at;
  check(cudaMemcpy(d_pos, host, count * sizeof(uint64_t), cudaMemcpyHostToDevice), "cudaMemcpy positions");
  check(cudaMemcpy(im.new_bits.data(), host + count * sizeof(uint64_t), count * sizeof(uint32_t),
                   cudaMemcpyHostToDevice),
        "cudaMemcpy bits");
  // From the launch on, the batch is in the log: an error after it can still be rolled back.
  im.batches.push_back({t, at, count});
  im.entries += count;
  device_scatter_raw(t, d_pos, static_cast<const uint32_t*>(im.new_bits.data()),
                     static_cast<uint32_t*>(im.old_bits.data()) + at, count);
  check(cudaDeviceSynchronize(), "scatter");
}

void DeviceScatter::rollback() {
  auto& im = *impl_;
  if (im.batches.empty()) return;
  require_device();
  for (auto b = im.batches.rbegin(); b != im.batches.rend(); ++b)
    device_restore_raw(b->tensor, static_cast<const uint64_t*>(im.positions.data()) + b->offset,
                       static_cast<const uint32_t*>(im.old_bits.data()) + b->offset, b->count);
  check(cudaDeviceSynchronize(), "rollback");
  im.batches.clear();
  im.entries = 0;
}

void DeviceScatter::commit() {
  impl_->batches.clear();
  impl_->entries = 0;
}

void DeviceScatter::gather(const DeviceTensor& t, const uint64_t* positions, uint32_t* out, size_t count) {
  require_device();
  require_width(t.width);
  if (count == 0) return;
  check_positions(t, positions, count);
  auto& im = *impl_;
  // Gathers use the tail of the log buffers, past the entries the undo log holds.
  const uint64_t at = im.entries;
  Impl::grow_keep(im.positions, (at + count) * sizeof(uint64_t), at * sizeof(uint64_t));
  im.new_bits.reserve(count * sizeof(uint32_t));
  im.staging.reserve(count * (sizeof(uint64_t) + sizeof(uint32_t)));
  std::byte* host = im.staging.data();
  std::memcpy(host, positions, count * sizeof(uint64_t));
  auto* d_pos = static_cast<uint64_t*>(im.positions.data()) + at;
  check(cudaMemcpy(d_pos, host, count * sizeof(uint64_t), cudaMemcpyHostToDevice), "cudaMemcpy positions");
  auto* d_out = static_cast<uint32_t*>(im.new_bits.data());
  launch_by_width<Gather>(t.width, blocks_for(count), t.data, static_cast<const uint64_t*>(d_pos), d_out,
                          static_cast<uint64_t>(count));
  std::byte* back = host + count * sizeof(uint64_t);
  check(cudaMemcpy(back, d_out, count * sizeof(uint32_t), cudaMemcpyDeviceToHost), "cudaMemcpy gathered bits");
  std::memcpy(out, back, count * sizeof(uint32_t));
}

}  // namespace deltacast::codec::cuda
