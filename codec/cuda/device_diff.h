#pragma once
// GPU-side diff for weights that live in CUDA memory (GPUDirect producers): a change bitmap and
// count computed on the device, so only the bitmap (1/16 of a BF16 checkpoint) and the changed
// values cross PCIe. Built only when CUDA is available (DELTACAST_WITH_CUDA); at run time without a
// device every call reports Errc::unsupported and cuda_device_available() is false.
#include <cstdint>

namespace deltacast::codec::cuda {

// True when this build has the CUDA kernels (DELTACAST_WITH_CUDA found nvcc), device or not.
bool cuda_built() noexcept;
// True when this build has CUDA kernels and a CUDA device is usable. Never throws.
bool cuda_device_available() noexcept;

// Device buffers old_bits/new_bits hold n elements of `width` bytes (1, 2 or 4). Writes a bitmap
// (bit i of word i/64 = element i changed) into the device buffer `bitmap` (ceil(n/64) words) and
// returns the number of changed elements. Throws Error(unsupported) without CUDA or a device,
// Error(internal) on a CUDA failure, Error(invalid_argument) for a bad width.
uint64_t device_change_bitmap(const void* old_bits, const void* new_bits, uint64_t n, unsigned width,
                              uint64_t* bitmap);

// Host convenience for tests and tools: copies host arrays to the device, runs
// device_change_bitmap and copies the bitmap back (host `bitmap` holds ceil(n/64) words).
uint64_t change_bitmap_via_device(const void* old_bits, const void* new_bits, uint64_t n, unsigned width,
                                  uint64_t* bitmap);

}  // namespace deltacast::codec::cuda
