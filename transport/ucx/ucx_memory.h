#pragma once
// UCX memory registration: a region is mapped with ucp_mem_map on the transport's context, and its
// remote key is [u64 address][u64 length][the rkey ucp_rkey_pack made] (host byte order), which a
// peer unpacks on its endpoint to ucp_put_nbx into the region (UcxTransport::post_write).
// Rules: CUDA memory is mapped as UCS_MEMORY_TYPE_CUDA where the context reports that memory type
// (a UCX built with CUDA, its cuda transports loaded); elsewhere register_memory throws
// Errc::unsupported for MemoryKind::cuda, naming the memory types this UCX reports. A region must
// not outlive its transport. Destroying a region unmaps it under the transport's mutex, so it may
// happen on any thread.
#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "transport/transport.h"

namespace deltacast::transport::ucx {

class UcxMemoryRegion final : public MemoryRegion {
 public:
  UcxMemoryRegion(std::mutex& mutex, ucp_context_h context, ucp_mem_h memh, std::span<std::byte> bytes, MemoryKind kind,
                  std::vector<std::byte> key)
      : mutex_(mutex), context_(context), memh_(memh), bytes_(bytes), kind_(kind), key_(std::move(key)) {}
  ~UcxMemoryRegion() override;
  std::span<std::byte> bytes() const override { return bytes_; }
  MemoryKind kind() const override { return kind_; }
  std::vector<std::byte> remote_key() const override { return key_; }
  ucp_mem_h memh() const { return memh_; }

 private:
  std::mutex& mutex_;
  ucp_context_h context_;
  ucp_mem_h memh_;
  std::span<std::byte> bytes_;
  MemoryKind kind_;
  std::vector<std::byte> key_;  // [u64 address][u64 length][packed rkey]
};

// A peer's remote key, read: the region's address and length, and its packed rkey.
struct RemoteKey {
  uint64_t address = 0;
  uint64_t length = 0;
  const void* packed_rkey = nullptr;  // points into the RemoteBuffer's key
};

// Reads remote.key and checks that `bytes` at remote.offset fit in the region. Throws
// Errc::invalid_argument when the key is not a ucx key or the write overruns the region.
RemoteKey read_remote_key(const RemoteBuffer& remote, size_t bytes);

}  // namespace deltacast::transport::ucx
