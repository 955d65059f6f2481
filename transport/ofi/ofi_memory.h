#pragma once
// libfabric memory registration. A MemoryRegion is registered (fi_mr_reg) in the domain of every
// connection, those open now and those established later, all under the one key we requested
// for it, so one remote key serves every connection: [u64 address][u64 key][u64 length] (host
// byte order), the address being the region's own with FI_MR_VIRT_ADDR and 0 without.
// Rules: CUDA memory is registered with fi_mr_regattr (FI_HMEM_CUDA, device 0 of the process)
// where the provider offers FI_HMEM; elsewhere register_memory throws Errc::unsupported for
// MemoryKind::cuda, saying what libfabric and the provider offer. Providers that insist on
// provider-chosen keys (FI_MR_PROV_KEY) get no RMA (capabilities().rma == false). A region must
// not outlive its transport; destroying it closes its registrations under the transport's mutex,
// so it may happen on any thread.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transport/transport.h"

namespace deltacast::transport::ofi {

class OfiTransport;

inline constexpr size_t kRemoteKeyBytes = 24;  // addr, key, length (u64 each, little-endian host order)

// Registered in every connection's domain under the same requested key (providers without
// FI_MR_PROV_KEY honour it), so one remote key serves every connection.
class OfiMemoryRegion final : public MemoryRegion {
 public:
  OfiMemoryRegion(OfiTransport& transport, std::span<std::byte> bytes, MemoryKind kind, uint64_t key, uint64_t base)
      : transport_(transport), bytes_(bytes), kind_(kind), key_(key), base_(base) {}
  ~OfiMemoryRegion() override;
  std::span<std::byte> bytes() const override { return bytes_; }
  MemoryKind kind() const override { return kind_; }
  std::vector<std::byte> remote_key() const override;
  uint64_t key() const { return key_; }

 private:
  OfiTransport& transport_;
  std::span<std::byte> bytes_;
  MemoryKind kind_;
  uint64_t key_;
  uint64_t base_;  // the address the peer writes relative to (0 without FI_MR_VIRT_ADDR)
};

// A peer's remote key, read.
struct RemoteKey {
  uint64_t address = 0;  // where the region starts for fi_write (0 without FI_MR_VIRT_ADDR)
  uint64_t key = 0;
  uint64_t length = 0;
};

// Reads remote.key and checks that `bytes` at remote.offset fit in the region. Throws
// Errc::invalid_argument when the key is not an ofi key or the write overruns the region.
RemoteKey read_remote_key(const RemoteBuffer& remote, size_t bytes);

}  // namespace deltacast::transport::ofi
