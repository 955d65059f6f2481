#pragma once
// A whole file mapped into memory (internal to dc_checkpoint). Read-only mappings are MAP_PRIVATE
// with PROT_READ; writable ones MAP_SHARED so stores reach the file. The file stays open as long as
// the mapping (one descriptor each), so pread (SafetensorsFile::read) reads the very file mapped.
//
// Read-only mappings are advised MADV_HUGEPAGE: where the kernel and the file system hold file
// pages in large folios (seen with Linux 6.18 and ext4), pages read in through the mapping then come in
// 2 MiB folios, mapped with 2 MiB entries. A checkpoint read in 4 KiB pages is slow to read again
// through a mapping (a diff of a 1 GB pair 4x slower: docs/performance.md, "deltacast diff against a read") and to read
// cold. The advice is ignored where the kernel has no transparent huge pages. Measured cost: the first read(2) of a
// file whose pages a mapping read in this way is slow, once (up to ~1 s per GB here).
//
// A file truncated by another process while it is mapped (a trainer rewriting a checkpoint in
// place) makes the next touch of a page past its new end raise SIGBUS (as does a read error of
// the storage under a mapped page). The process cannot go on from there, but it does not die
// unexplained: while any MappedFile exists, a SIGBUS handler (installed with the first mapping,
// chained to the one it replaced) writes to stderr which file could not be read and why, then
// lets the signal take its course (the previous handler, or the default action: exit status
// 128 + SIGBUS). Up to kTrackedMappings mappings are named; a fault outside them is left to the
// previous handler untouched.
#include <cstddef>
#include <filesystem>
#include <span>

namespace deltacast::checkpoint {

inline constexpr size_t kTrackedMappings = 1024;

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
  // The file's descriptor, open as long as the mapping (for pread of the same file the mapping
  // shows, even after another file was renamed over its path).
  int fd() const noexcept { return fd_; }
  // msync(MS_SYNC) for writable mappings. Throws Error(io).
  void sync(const std::filesystem::path& path_for_errors) const;

 private:
  void release() noexcept;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool writable_ = false;
  int fd_ = -1;
  int slot_ = -1;  // this mapping's entry in the SIGBUS handler's table (-1: none)
};

}  // namespace deltacast::checkpoint
