// Builds without CUDA: the device diff reports "unsupported" (see device_diff.h).
#include "codec/cuda/device_diff.h"
#include "util/error.h"

namespace deltacast::codec::cuda {

bool cuda_built() noexcept { return false; }
bool cuda_device_available() noexcept { return false; }

uint64_t device_change_bitmap(const void*, const void*, uint64_t, unsigned, uint64_t*) {
  throw Error(Errc::unsupported, "cuda: this build has no CUDA support (DELTACAST_WITH_CUDA=OFF or no nvcc)");
}
uint64_t change_bitmap_via_device(const void*, const void*, uint64_t, unsigned, uint64_t*) {
  throw Error(Errc::unsupported, "cuda: this build has no CUDA support (DELTACAST_WITH_CUDA=OFF or no nvcc)");
}

}  // namespace deltacast::codec::cuda
