// Builds without CUDA (DELTACAST_WITH_CUDA=OFF, or no nvcc): every device call of
// codec/cuda/device_apply.h, device_diff.h and device_mirror.h reports Errc::unsupported; the memory
// classes exist so that callers compile, and allocate nothing.
#include <utility>

#include "codec/cuda/device_apply.h"
#include "codec/cuda/device_diff.h"
#include "codec/cuda/device_mirror.h"
#include "util/error.h"

namespace deltacast::codec::cuda {
namespace {

[[noreturn]] void no_cuda() {
  throw Error(Errc::unsupported, "cuda: this build has no CUDA support (DELTACAST_WITH_CUDA=OFF or no nvcc)");
}

}  // namespace

// ---- device_diff.h ----
bool cuda_built() noexcept { return false; }
bool cuda_device_available() noexcept { return false; }

uint64_t device_change_bitmap(const void*, const void*, uint64_t, unsigned, uint64_t*) { no_cuda(); }
uint64_t change_bitmap_via_device(const void*, const void*, uint64_t, unsigned, uint64_t*) { no_cuda(); }

// ---- device_apply.h ----
PinnedBuffer::~PinnedBuffer() = default;
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  data_ = std::exchange(o.data_, nullptr);
  capacity_ = std::exchange(o.capacity_, 0);
  return *this;
}
void PinnedBuffer::reserve(size_t bytes) {
  if (bytes > capacity_) no_cuda();
}

DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  data_ = std::exchange(o.data_, nullptr);
  capacity_ = std::exchange(o.capacity_, 0);
  return *this;
}
void DeviceBuffer::reserve(size_t bytes) {
  if (bytes > capacity_) no_cuda();
}

void copy_to_device(void*, const void*, size_t) { no_cuda(); }
void copy_to_host(void*, const void*, size_t) { no_cuda(); }
void copy_device_to_device(void*, const void*, size_t) { no_cuda(); }
bool is_device_pointer(const void*) noexcept { return false; }
void use_device(int) { no_cuda(); }
void device_synchronize() { no_cuda(); }
uint64_t device_slice_digest(const DeviceTensor&, uint64_t, uint64_t, uint64_t) { no_cuda(); }
void device_scatter_raw(const DeviceTensor&, const uint64_t*, const uint32_t*, uint32_t*, uint64_t) { no_cuda(); }
void device_restore_raw(const DeviceTensor&, const uint64_t*, const uint32_t*, uint64_t) { no_cuda(); }

struct DeviceScatter::Impl {};
DeviceScatter::DeviceScatter() : impl_(std::make_unique<Impl>()) {}
DeviceScatter::~DeviceScatter() = default;
void DeviceScatter::scatter(const DeviceTensor&, const uint64_t*, const uint32_t*, size_t) { no_cuda(); }
void DeviceScatter::rollback() {}
void DeviceScatter::commit() {}
uint64_t DeviceScatter::undo_entries() const noexcept { return 0; }
void DeviceScatter::gather(const DeviceTensor&, const uint64_t*, uint32_t*, size_t) { no_cuda(); }

// ---- device_mirror.h ----
struct DeviceDiffMirror::Impl {};
// NOLINTNEXTLINE(performance-unnecessary-value-param): the declaration's signature (device_mirror.h)
DeviceDiffMirror::DeviceDiffMirror(std::vector<DeviceTensor>) { no_cuda(); }
DeviceDiffMirror::~DeviceDiffMirror() = default;
size_t DeviceDiffMirror::size() const noexcept { return 0; }
PullStats DeviceDiffMirror::pull() { no_cuda(); }
const std::byte* DeviceDiffMirror::host(size_t) const noexcept { return nullptr; }
uint64_t DeviceDiffMirror::bytes(size_t) const noexcept { return 0; }
void DeviceDiffMirror::set_device(size_t, void*) { no_cuda(); }
uint64_t device_read_both(const void*, const void*, uint64_t) { no_cuda(); }

}  // namespace deltacast::codec::cuda
