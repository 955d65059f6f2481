#pragma once
// Reusable, uninitialised byte buffers and zstd contexts for the hot paths (internal header).
// Fresh std::vector<std::byte>(n) zero-fills and, above glibc's mmap threshold, page-faults on every
// call; a per-thread buffer that only grows avoids both.
#include <cstddef>
#include <memory>

#include <zstd.h>

namespace deltacast::codec {

class ScratchBuffer {
 public:
  std::byte* get(size_t n) {
    if (n > capacity_) {
      capacity_ = std::max(n, capacity_ + capacity_ / 2);
      data_.reset(new std::byte[capacity_]);
    }
    return data_.get();
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t capacity_ = 0;
};

struct ZstdContexts {
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx{ZSTD_createCCtx(), ZSTD_freeCCtx};
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx{ZSTD_createDCtx(), ZSTD_freeDCtx};
  // The calling thread's contexts.
  static ZstdContexts& local() {
    thread_local ZstdContexts contexts;
    return contexts;
  }
};

}  // namespace deltacast::codec
