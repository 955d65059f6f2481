#pragma once
// A registered host buffer for backends that need no registration with hardware (tcp, loopback):
// it only remembers the span; no RMA, so its remote key is empty.
#include <span>
#include <vector>

#include "transport/transport.h"

namespace deltacast::transport {

class HostRegion final : public MemoryRegion {
 public:
  explicit HostRegion(std::span<std::byte> bytes) : bytes_(bytes) {}
  std::span<std::byte> bytes() const override { return bytes_; }
  MemoryKind kind() const override { return MemoryKind::host; }
  std::vector<std::byte> remote_key() const override { return {}; }

 private:
  std::span<std::byte> bytes_;
};

}  // namespace deltacast::transport
