#pragma once
// Keeps tensors in CUDA memory equal to pinned host mirrors that a DeltaApplier verifies and
// commits (the receiver's CUDA path; docs/embedding.md, "CUDA buffers"):
//   1. the applier writes a committed version into the mirrors (gated: apply_next_staged), and its
//      observer calls note(tensor, element) for every element about to be written;
//   2. sync(digest) scatters the noted elements' new bits (read from the mirrors) into the device
//      tensors with the undo log on the device, computes each touched tensor's digest on the
//      device and compares it with the mirrors' committed per-tensor digest;
//   3. on a mismatch it restores every touched device tensor from the undo log, marks them for a
//      whole copy at the next sync, and throws Error(verify_failed) naming the tensor.
// A tensor whose mirror changed other than through noted writes (the bootstrap, a snapshot) is
// marked whole (mark_whole) and copied whole (pinned host to device) and then verified the same way.
//
// Host code over device_apply.h: it builds without CUDA (every device call then reports
// Error(unsupported)); collect_changes is the pure part, tested on any machine.
// Not thread-safe: one thread at a time (the receiver serialises its device syncs).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/cuda/device_apply.h"
#include "codec/digest.h"

namespace deltacast::codec::cuda {

struct MirroredTensor {
  uint32_t index = 0;                   // manifest index
  DeviceTensor device;                  // the caller's CUDA memory
  std::span<const std::byte> mirror;    // its pinned host mirror (units x width bytes)
};

struct SyncStats {
  uint64_t scattered = 0;      // units written by the scatter kernel
  uint64_t whole_bytes = 0;    // bytes copied whole
  uint64_t tensors_checked = 0;
};

// Sorts and de-duplicates `positions` (units of one tensor, possibly noted once per version) and
// reads each one's bits from `mirror` (width 1, 2 or 4) into new_bits. Pure host code.
void collect_changes(std::vector<uint64_t>& positions, std::span<const std::byte> mirror, unsigned width,
                     std::vector<uint32_t>& new_bits);

class DeviceMirrorSync {
 public:
  // `manifest_size`: how many tensors the manifest has (note() ignores the ones not mirrored).
  // Every tensor starts marked whole.
  DeviceMirrorSync(std::vector<MirroredTensor> tensors, size_t manifest_size);

  // Records that manifest tensor `tensor`'s unit `element` is about to change in its mirror.
  void note(uint32_t tensor, uint64_t element);
  // The mirrors changed wholesale: the next sync copies every tensor whole.
  void mark_all_whole();
  // The mirrors and the device agree now (a restarted server's device tensors were copied into
  // the mirrors): nothing to copy at the next sync.
  void mark_all_synced();
  // Brings the device tensors to the mirrors' bits and verifies them against `mirror_digest` (the
  // committed per-tensor digests of what the mirrors hold). Throws Error(verify_failed) after
  // restoring the touched tensors (above), or a device error.
  SyncStats sync(const StateDigest& mirror_digest);
  // Whole-device audit: every mirrored tensor's device digest against `mirror_digest`.
  void audit(const StateDigest& mirror_digest) const;

 private:
  struct Slot {
    MirroredTensor tensor;
    uint64_t seed = 0;
    bool whole = true;
    std::vector<uint64_t> noted;
  };
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_;  // manifest index -> slot, -1 when not mirrored
  DeviceScatter scatter_;
  std::vector<uint32_t> bits_;
};

}  // namespace deltacast::codec::cuda
