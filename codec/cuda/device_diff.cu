// CUDA kernels for the device-side diff. One warp forms 32 consecutive 64-element bitmap words:
// for each word it compares 2 x 32 consecutive elements (coalesced loads), and the lane that owns
// the word keeps the two ballots; the count is reduced per warp.
#include <cuda_runtime.h>

#include <string>

#include "codec/cuda/device_diff.h"
#include "util/error.h"

namespace deltacast::codec::cuda {

namespace {

template <class T>
__global__ void change_bitmap_kernel(const T* __restrict__ old_bits, const T* __restrict__ new_bits, uint64_t n,
                                     uint64_t* __restrict__ bitmap, unsigned long long* __restrict__ count) {
  const unsigned lane = threadIdx.x & 31;
  const uint64_t warp = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const uint64_t words = (n + 63) / 64;
  const uint64_t first_word = warp * 32;
  if (first_word >= words) return;  // whole warps leave together
  uint64_t mine = 0;
  for (unsigned j = 0; j < 32 && first_word + j < words; ++j) {
    const uint64_t e = (first_word + j) * 64 + lane;
    const bool lo = e < n && old_bits[e] != new_bits[e];
    const bool hi = e + 32 < n && old_bits[e + 32] != new_bits[e + 32];
    const unsigned lo_bits = __ballot_sync(0xffffffffu, lo);
    const unsigned hi_bits = __ballot_sync(0xffffffffu, hi);
    if (lane == j) mine = (static_cast<uint64_t>(hi_bits) << 32) | lo_bits;
  }
  unsigned local = 0;
  if (first_word + lane < words) {
    bitmap[first_word + lane] = mine;
    local = static_cast<unsigned>(__popcll(mine));
  }
  for (int offset = 16; offset > 0; offset /= 2) local += __shfl_down_sync(0xffffffffu, local, offset);
  if (lane == 0 && local) atomicAdd(count, static_cast<unsigned long long>(local));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(Errc::internal, std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

bool cuda_built() noexcept { return true; }

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
  const unsigned threads = 256;  // 8 warps, 32 words each
  const unsigned blocks = static_cast<unsigned>((words + 255) / 256);
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
