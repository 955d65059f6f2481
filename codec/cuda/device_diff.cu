// CUDA kernels for the device-side diff. One warp handles 32 consecutive 64-element words: each
// lane compares its 64 elements and forms one bitmap word; the count is reduced per block.
#include <cuda_runtime.h>

#include <string>

#include "codec/cuda/device_diff.h"
#include "util/error.h"

namespace deltacast::codec::cuda {

namespace {

template <class T>
__global__ void change_bitmap_kernel(const T* __restrict__ old_bits, const T* __restrict__ new_bits, uint64_t n,
                                     uint64_t* __restrict__ bitmap, unsigned long long* __restrict__ count) {
  const uint64_t word = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  const uint64_t words = (n + 63) / 64;
  unsigned local = 0;
  if (word < words) {
    uint64_t bits = 0;
    const uint64_t begin = word * 64;
    const uint64_t end = begin + 64 < n ? begin + 64 : n;
    for (uint64_t i = begin; i < end; ++i) bits |= static_cast<uint64_t>(old_bits[i] != new_bits[i]) << (i - begin);
    bitmap[word] = bits;
    local = static_cast<unsigned>(__popcll(bits));
  }
  for (int offset = 16; offset > 0; offset /= 2) local += __shfl_down_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local) atomicAdd(count, static_cast<unsigned long long>(local));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(Errc::internal, std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

bool cuda_device_available() noexcept {
  int count = 0;
  // No driver gives cudaErrorInsufficientDriver (35), no device cudaErrorNoDevice (100): both "none".
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

uint64_t device_change_bitmap(const void* old_bits, const void* new_bits, uint64_t n, unsigned width,
                              uint64_t* bitmap) {
  if (!cuda_device_available()) throw Error(Errc::unsupported, "cuda: no CUDA device is available");
  if (width != 1 && width != 2 && width != 4) throw Error(Errc::invalid_argument, "cuda: element width must be 1, 2 or 4");
  unsigned long long* count = nullptr;
  check(cudaMalloc(&count, sizeof(*count)), "cudaMalloc");
  check(cudaMemset(count, 0, sizeof(*count)), "cudaMemset");
  const uint64_t words = (n + 63) / 64;
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>((words + threads - 1) / threads);
  if (blocks > 0) {
    switch (width) {
      case 1: change_bitmap_kernel<<<blocks, threads>>>(static_cast<const uint8_t*>(old_bits), static_cast<const uint8_t*>(new_bits), n, bitmap, count); break;
      case 2: change_bitmap_kernel<<<blocks, threads>>>(static_cast<const uint16_t*>(old_bits), static_cast<const uint16_t*>(new_bits), n, bitmap, count); break;
      default: change_bitmap_kernel<<<blocks, threads>>>(static_cast<const uint32_t*>(old_bits), static_cast<const uint32_t*>(new_bits), n, bitmap, count); break;
    }
    check(cudaGetLastError(), "kernel launch");
  }
  unsigned long long host_count = 0;
  check(cudaMemcpy(&host_count, count, sizeof(host_count), cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(count);
  return host_count;
}

uint64_t change_bitmap_via_device(const void* old_bits, const void* new_bits, uint64_t n, unsigned width,
                                  uint64_t* bitmap) {
  if (!cuda_device_available()) throw Error(Errc::unsupported, "cuda: no CUDA device is available");
  const size_t bytes = n * width, words = (n + 63) / 64;
  void *d_old = nullptr, *d_new = nullptr;
  uint64_t* d_map = nullptr;
  check(cudaMalloc(&d_old, bytes ? bytes : 1), "cudaMalloc");
  check(cudaMalloc(&d_new, bytes ? bytes : 1), "cudaMalloc");
  check(cudaMalloc(&d_map, (words ? words : 1) * 8), "cudaMalloc");
  check(cudaMemcpy(d_old, old_bits, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(d_new, new_bits, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  const uint64_t changed = device_change_bitmap(d_old, d_new, n, width, d_map);
  check(cudaMemcpy(bitmap, d_map, words * 8, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(d_old);
  cudaFree(d_new);
  cudaFree(d_map);
  return changed;
}

}  // namespace deltacast::codec::cuda
