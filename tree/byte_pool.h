#pragma once
// BytePool: recycled, pre-faulted buffers for the frames a relay keeps. Every frame a member
// relays is copied once (forwarded, retained for RESUME, archived for replays: retain_versions),
// so each version allocates ~its payload in frame-sized blocks while the archive still holds the
// older versions. Fresh heap pages fault on first touch, and on a VM a fault costs tens of
// microseconds: that made a clean delta refit ~1.3x slower (commit 7884d61). The pool
// moves the faults off the critical path: between versions (idle time) the relay pre-faults
// buffers shaped like the last version's frames (prewarm), frames copy into them, and buffers
// whose last owner lets go return to the pool with their pages.
//
// Thread-safe. Buffers may outlive the pool (they are then freed normally).
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace deltacast::tree {

class BytePool {
 public:
  // Holds at most `max_pooled_bytes` of free buffers (by capacity).
  explicit BytePool(size_t max_pooled_bytes);
  // A shared copy of `bytes`, in a pooled buffer when one fits (capacity at most 2x + 4 KiB).
  std::shared_ptr<const std::vector<std::byte>> copy(std::span<const std::byte> bytes);
  // Makes the free buffers one version's frames: for each of `sizes` (one buffer per entry) a
  // free buffer that copy() would pick is kept, or a touched one (rounded up to 4 KiB) is added as
  // far as the cap allows; free buffers no size claimed are freed. Called once per version with the
  // last version's frame sizes, the pool holds about one version's frames, however many versions.
  void prewarm(const std::vector<size_t>& sizes);
  size_t pooled_bytes() const;

 private:
  struct State {
    mutable std::mutex mutex;
    std::multimap<size_t, std::unique_ptr<std::vector<std::byte>>> free;  // by capacity
    size_t pooled = 0;
    size_t max_pooled = 0;
  };
  std::shared_ptr<State> state_;
};

}  // namespace deltacast::tree
