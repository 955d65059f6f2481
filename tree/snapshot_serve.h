#pragma once
// Serving a rejoining member's catch-up (FETCH, docs/protocol.md "Rejoin"), shared by a peer's
// relay edges and the producer (the last resort when no peer can serve):
//  * SnapshotPatches: what keeps a snapshot consistent while the bits it reads change under it.
//    Whoever overwrites bits hands every open reader the old bits of what it overwrites beyond the
//    reader's cursor (a layer); a read copies the current bits, then puts back each layer's bits,
//    newest layer first, so the oldest (the snapshot's version) wins.
//  * CatchupSender: the FETCH link's sending side, with flow control, a stalled-fetcher bound and
//    the snapshot's piece stream.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "codec/manifest.h"
#include "codec/partition.h"
#include "tree/protocol.h"
#include "tree/relay_link.h"

namespace deltacast::tree {

class SnapshotPatches {
 public:
  struct Patch {
    uint32_t tensor;
    uint64_t element;
    uint32_t bits;
    bool operator<(const Patch& o) const { return tensor != o.tensor ? tensor < o.tensor : element < o.element; }
  };
  // Keeps the old bits of elements about to be overwritten (any order; those before the cursor
  // are dropped: they were read already). One call per overwrite (a version).
  void record(std::vector<Patch> written);
  // Puts back into `out` (elements [first, end) of `tensor`, `width` bytes each, little-endian
  // host) the bits every recorded layer kept, newest first; then forgets everything before `end`
  // in that tensor and moves the cursor there. Reads go forward in (tensor, element) order.
  void restore_and_advance(uint32_t tensor, uint64_t first, uint64_t end, unsigned width, std::span<std::byte> out);

 private:
  std::vector<std::vector<Patch>> layers_;  // oldest first, each sorted
  uint32_t cursor_tensor_ = 0;
  uint64_t cursor_element_ = 0;
};

// Makes `bits` (one buffer per tensor of next's manifest, holding another version) hold the
// version `next` holds. With `old_bits`, each stretch is compared with the new bits before it is
// overwritten, and `old_bits` receives the old bits of every unit that changed (for the open
// readers' SnapshotPatches::record).
void overwrite_with(std::vector<std::vector<std::byte>>& bits, const codec::ConstWeights& next,
                    std::vector<SnapshotPatches::Patch>* old_bits);
// The same with `next` read in pieces of codec::kReadPieceBytes into a buffer that stays in the
// cache, each copied into `bits` from there (not read straight into `bits`: on the paravirtualized
// machine this was measured on, the kernel's first write into pages the process wrote itself ran
// ~20x slower than the copy: commit 2137013, bench/codec/first_write.c). A failed read throws Error(io) naming the
// tensor and byte offset, with the reader's message; `bits` then hold neither version, and `old_bits` holds the old
// bits of every unit that was overwritten before it.
void overwrite_with(std::vector<std::vector<std::byte>>& bits, const codec::WeightsReader& next,
                    std::vector<SnapshotPatches::Patch>* old_bits);
// The same for a producer rank's part: bits[i] holds `ranges[i]` (units of one tensor) and gets
// next's bits of that range.
void overwrite_with(std::vector<std::vector<std::byte>>& bits, std::span<const codec::PartRange> ranges,
                    const codec::WeightsReader& next, std::vector<SnapshotPatches::Patch>* old_bits);

class CatchupSender {
 public:
  // `fetcher`: the rank reading (for messages). A fetcher that drains nothing for peer_timeout,
  // or `stopping`, ends the stream with Error(connection).
  CatchupSender(std::shared_ptr<transport::Connection> connection, uint32_t fetcher, size_t max_inflight_bytes,
                std::chrono::milliseconds peer_timeout, const std::atomic<bool>& stopping);
  // Posts a message (and a RAW body right after it), waiting for room.
  void send(const SharedBytes& message, SharedBytes body = nullptr);
  // Streams a snapshot of `version`: every tensor in pieces of whole elements (at most a quarter
  // of max_message_bytes), in manifest order, each filled by read(tensor, byte offset, out).
  // Returns the number of pieces.
  using Read = std::function<void(uint32_t tensor, uint64_t offset, std::span<std::byte> out)>;
  uint32_t send_snapshot(const codec::Manifest& manifest, uint64_t max_message_bytes, uint64_t version,
                         const Read& read);
  // Posts FETCH_END and waits (up to peer_timeout) for everything to leave.
  void finish(const FetchEnd& end);

 private:
  OutboundLink link_;
  const uint32_t fetcher_;
  const size_t max_inflight_bytes_;
  const std::chrono::milliseconds peer_timeout_;
  const std::atomic<bool>& stopping_;
};

}  // namespace deltacast::tree
