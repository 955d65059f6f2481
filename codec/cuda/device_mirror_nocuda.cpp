// Builds without CUDA: a DeviceDiffMirror cannot be made (see device_mirror.h).
#include "codec/cuda/device_mirror.h"

#include "util/error.h"

namespace deltacast::codec::cuda {

namespace {
[[noreturn]] void no_cuda() {
  throw Error(Errc::unsupported, "cuda: this build has no CUDA support (DELTACAST_WITH_CUDA=OFF or no nvcc)");
}
}  // namespace

struct DeviceDiffMirror::Impl {};
DeviceDiffMirror::DeviceDiffMirror(std::vector<DeviceTensor>) { no_cuda(); }
DeviceDiffMirror::~DeviceDiffMirror() = default;
size_t DeviceDiffMirror::size() const noexcept { return 0; }
PullStats DeviceDiffMirror::pull() { no_cuda(); }
const std::byte* DeviceDiffMirror::host(size_t) const noexcept { return nullptr; }
uint64_t DeviceDiffMirror::bytes(size_t) const noexcept { return 0; }
void DeviceDiffMirror::set_device(size_t, void*) { no_cuda(); }
uint64_t device_read_both(const void*, const void*, uint64_t) { no_cuda(); }

}  // namespace deltacast::codec::cuda
