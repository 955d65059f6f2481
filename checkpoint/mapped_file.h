#pragma once
// A whole file mapped into memory (internal to dc_checkpoint). Read-only mappings are MAP_PRIVATE
// with PROT_READ; writable ones MAP_SHARED so stores reach the file.
#include <cstddef>
#include <filesystem>
#include <span>

namespace deltacast::checkpoint {

class MappedFile {
 public:
  // Maps `path`. A zero-length file yields an empty span (mmap refuses length 0).
  // Throws Error(io) naming the file and the failing call.
  MappedFile(const std::filesystem::path& path, bool writable);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
  bool writable() const noexcept { return writable_; }
  // msync(MS_SYNC) for writable mappings. Throws Error(io).
  void sync(const std::filesystem::path& path_for_errors) const;

 private:
  void release() noexcept;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool writable_ = false;
};

}  // namespace deltacast::checkpoint
