#pragma once
// Writing changes into tensors that live in CUDA memory (receivers whose weights are on the GPU),
// and proving them bit-exact there. docs/embedding.md, "CUDA buffers", says how a receiver uses it.
//
// Rules:
//  * Tensors are addressed in code units (codec::dtype_unit_size: 1, 2 or 4 bytes; an 8-byte
//    dtype is two 4-byte units), like every codec element index. Bits are passed as uint32_t.
//  * Device pointers are the caller's (cudaMalloc or a framework's allocator) and are never freed
//    here. Host arrays passed in may be pageable: they are staged through pinned buffers that a
//    DeviceScatter keeps and reuses across versions.
//  * Every call is synchronous (it returns when the device finished) and runs on the current
//    device of the calling thread (cudaSetDevice is the caller's job).
//  * Errors: Error(unsupported) in a build without CUDA or on a machine without a device;
//    Error(invalid_argument) for a bad width or a position past the tensor; Error(internal) when a
//    CUDA call fails (the message names it). After an Error the undo log still describes every
//    write that reached the device, so rollback() is always possible.
// Built with nvcc when DELTACAST_HAVE_CUDA; codec/cuda/nocuda.cpp otherwise.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace deltacast::codec::cuda {

// Page-locked host memory (cudaHostAlloc), which the device reads and writes by DMA. Grows, never
// shrinks; contents are not kept across a grow.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) { reserve(bytes); }
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  void reserve(size_t bytes);  // at least `bytes` (zero-filled when newly allocated)
  std::byte* data() const noexcept { return data_; }
  size_t capacity() const noexcept { return capacity_; }

 private:
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
};

// Device memory owned by this object (cudaMalloc), same growth rule. For undo logs, staging of
// position lists, tests and benchmarks.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { reserve(bytes); }
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  void reserve(size_t bytes);
  void* data() const noexcept { return data_; }
  size_t capacity() const noexcept { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// Plain copies (synchronous). host may be pageable or pinned.
void copy_to_device(void* device_dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, size_t bytes);
void copy_device_to_device(void* device_dst, const void* device_src, size_t bytes);
// True when `pointer` is device memory (or managed memory) that kernels can write; never throws.
bool is_device_pointer(const void* pointer) noexcept;
// Makes device `device_id` current for the calling thread (cudaSetDevice).
void use_device(int device_id);
// Blocks until the current device is idle (benchmarks).
void device_synchronize();

// One tensor in device memory: `units` code units of `width` bytes (1, 2 or 4) at `data`.
struct DeviceTensor {
  void* data = nullptr;
  uint64_t units = 0;
  unsigned width = 2;
};

// The per-tensor additive digest (codec/digest.h: tensor_digest / slice_digest) of units
// [first, first + count) of a device tensor, computed on the device: the same 64-bit value the
// host computes for the same bits. `seed` is tensor_digest_seed(tensor index).
uint64_t device_slice_digest(const DeviceTensor& tensor, uint64_t seed, uint64_t first, uint64_t count);
inline uint64_t device_tensor_digest(const DeviceTensor& tensor, uint64_t seed) {
  return device_slice_digest(tensor, seed, 0, tensor.units);
}

// Writes (position, new bits) lists into device tensors, saving the old bits in an undo log that
// stays on the device, until commit() drops it or rollback() restores it. Reuses its pinned and
// device staging across versions (grows to the largest batch seen).
//
// Within one scatter() the positions must be distinct (the codec's changes of one version are);
// later scatters may write positions written before: rollback undoes batches newest first, so the
// bits before the first batch come back whatever the overlaps.
class DeviceScatter {
 public:
  DeviceScatter();
  ~DeviceScatter();
  DeviceScatter(const DeviceScatter&) = delete;
  DeviceScatter& operator=(const DeviceScatter&) = delete;

  // tensor[positions[k]] = new_bits[k] (low `width` bytes) for k < count. Host arrays.
  void scatter(const DeviceTensor& tensor, const uint64_t* positions, const uint32_t* new_bits, size_t count);
  // Restores every write since the last commit()/rollback(), newest batch first.
  void rollback();
  // Forgets the undo log (the writes stay).
  void commit();
  // Units written since the last commit()/rollback() (undo entries held on the device).
  uint64_t undo_entries() const noexcept;

  // out[k] = tensor[positions[k]] for k < count (host arrays): the old bits a decoder needs
  // (ulp-delta values) without copying the tensor back.
  void gather(const DeviceTensor& tensor, const uint64_t* positions, uint32_t* out, size_t count);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Device-side kernels without staging, for callers whose lists already are on the device
// (benchmarks, the producer's gather): positions/new_bits/undo are device pointers.
void device_scatter_raw(const DeviceTensor& tensor, const uint64_t* positions, const uint32_t* new_bits,
                        uint32_t* undo_bits, uint64_t count);
void device_restore_raw(const DeviceTensor& tensor, const uint64_t* positions, const uint32_t* undo_bits,
                        uint64_t count);

}  // namespace deltacast::codec::cuda
