// UCX memory registration and remote keys (rules in ucx_memory.h).
#include "transport/ucx/ucx_memory.h"

#include <cstring>

#include "transport/engine_state.h"
#include "transport/ucx/ucx_engine.h"

namespace deltacast::transport::ucx {

UcxMemoryRegion::~UcxMemoryRegion() {
  std::lock_guard lock(mutex_);
  ucp_mem_unmap(context_, memh_);
}

std::unique_ptr<MemoryRegion> UcxTransport::register_memory(std::span<std::byte> bytes, MemoryKind kind) {
  if (kind == MemoryKind::cuda && !cuda_memory())
    throw Error(Errc::unsupported, "ucx: CUDA memory can not be registered here: " + cuda_memory_detail());
  std::lock_guard lock(mutex_);
  ucp_mem_map_params_t params{};
  params.field_mask =
      UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.memory_type = kind == MemoryKind::cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  params.address = bytes.data();
  params.length = bytes.size();
  ucp_mem_h memh = nullptr;
  ucs_status_t status = ucp_mem_map(context_, &params, &memh);
  if (status != UCS_OK) throw Error(Errc::internal, "ucp_mem_map: " + ucs_text(status));
  void* packed = nullptr;
  size_t packed_size = 0;
  status = ucp_rkey_pack(context_, memh, &packed, &packed_size);
  if (status != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    throw Error(Errc::internal, "ucp_rkey_pack: " + ucs_text(status));
  }
  std::vector<std::byte> key(16 + packed_size);
  uint64_t words[2] = {reinterpret_cast<uint64_t>(bytes.data()), bytes.size()};
  std::memcpy(key.data(), words, 16);
  std::memcpy(key.data() + 16, packed, packed_size);
  ucp_rkey_buffer_release(packed);
  return std::make_unique<UcxMemoryRegion>(mutex_, context_, memh, bytes, kind, std::move(key));
}

RemoteKey read_remote_key(const RemoteBuffer& remote, size_t bytes) {
  if (remote.key.size() <= 16) throw Error(Errc::invalid_argument, "remote key is not a ucx key (too short)");
  uint64_t words[2];
  std::memcpy(words, remote.key.data(), 16);
  check_write_range(bytes, remote.offset, words[1]);
  return RemoteKey{.address = words[0], .length = words[1], .packed_rkey = remote.key.data() + 16};
}

}  // namespace deltacast::transport::ucx
