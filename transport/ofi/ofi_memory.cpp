// libfabric memory registration and remote keys (rules in ofi_memory.h).
#include "transport/ofi/ofi_memory.h"

#include <sys/uio.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstring>

#include "transport/engine_state.h"
#include "transport/ofi/ofi_engine.h"

namespace deltacast::transport::ofi {

std::vector<std::byte> OfiMemoryRegion::remote_key() const {
  uint64_t words[3] = {base_, key_, bytes_.size()};
  std::vector<std::byte> key(kRemoteKeyBytes);
  std::memcpy(key.data(), words, kRemoteKeyBytes);
  return key;
}

RemoteKey read_remote_key(const RemoteBuffer& remote, size_t bytes) {
  if (remote.key.size() != kRemoteKeyBytes)
    throw Error(Errc::invalid_argument, "remote key is not an ofi key (wrong size)");
  uint64_t words[3];
  std::memcpy(words, remote.key.data(), kRemoteKeyBytes);
  check_write_range(bytes, remote.offset, words[2]);
  return RemoteKey{.address = words[0], .key = words[1], .length = words[2]};
}

std::unique_ptr<MemoryRegion> OfiTransport::register_memory(std::span<std::byte> bytes, MemoryKind kind) {
  if (kind == MemoryKind::cuda && !hmem_)
    throw Error(Errc::unsupported,
                "ofi+" + provider_ + ": CUDA memory can not be registered here: " + cuda_memory_detail());
  uint64_t base = virt_addr_ ? reinterpret_cast<uint64_t>(bytes.data()) : 0;
  auto region = std::make_unique<OfiMemoryRegion>(*this, bytes, kind, next_key_++, base);
  std::lock_guard lock(mutex_);
  for (auto& conn : conns_) {
    if (!conn->broken) register_in(*conn, *region);
  }
  regions_.push_back(region.get());
  return region;
}

void OfiTransport::register_in(ConnState& conn, const OfiMemoryRegion& region) {
  uint64_t access = FI_SEND | FI_RECV | (rma_ ? (FI_WRITE | FI_REMOTE_WRITE) : 0);
  fid_mr* mr = nullptr;
  auto bytes = region.bytes();
  if (region.kind() == MemoryKind::cuda) {
    // Device 0 of the process: one process per GPU (CUDA_VISIBLE_DEVICES), as inference servers run.
    const iovec iov{bytes.data(), bytes.size()};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.requested_key = region.key();
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = 0;
    check(fi_mr_regattr(conn.domain, &attr, 0, &mr), "fi_mr_regattr(FI_HMEM_CUDA)");
  } else {
    check(fi_mr_reg(conn.domain, bytes.data(), bytes.size(), access, 0, region.key(), 0, &mr, nullptr), "fi_mr_reg");
  }
  conn.registrations[&region] = mr;
}

void OfiTransport::unregister(const OfiMemoryRegion& region) {
  std::lock_guard lock(mutex_);
  std::erase(regions_, &region);
  for (auto& conn : conns_) {
    auto found = conn->registrations.find(&region);
    if (found == conn->registrations.end()) continue;
    fi_close(&found->second->fid);
    conn->registrations.erase(found);
  }
}

OfiMemoryRegion::~OfiMemoryRegion() { transport_.unregister(*this); }

void* OfiTransport::local_desc(const ConnState& conn, MemoryRegion* mr) const {
  auto found = conn.registrations.find(dynamic_cast<const OfiMemoryRegion*>(mr));
  return found == conn.registrations.end() ? nullptr : fi_mr_desc(found->second);
}

}  // namespace deltacast::transport::ofi
