#pragma once
// The data messages a member keeps, keyed by (version, chunk):
//  * the in-flight attempt: which chunks it has seen (first sight decides forwarding) and, within
//    a byte budget, the messages themselves, so a re-parented child's RESUME is served from here;
//    RAW pieces are kept as their header, their body being where it landed in the weights;
//  * the last `retain_versions` committed delta versions, whole (every chunk and the seal), so a
//    rejoining peer can catch up by replaying them.
// Chunk indexes: a chunk frame's chunk_index, the seal is chunk_count (one past the last chunk).
//
// Thread-safety: every member function may be called from any thread.
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "tree/relay_link.h"

namespace deltacast::tree {

struct StoredMessage {
  uint32_t chunk = 0;
  int tree = 0;                       // the tree it travels (and arrived) on
  SharedBytes message;                // the FRAME or RAW message; null when over the budget
  std::span<const std::byte> body;    // RAW: the piece's bytes (empty until landed)
  SharedBytes body_owner;             // RAW: keeps `body` alive when it is a copy, not the weights
  bool raw = false;                   // a RAW piece (its body follows the message)
  bool passed = false;                // RAW: landed and passed on, body not kept (passed_on)
};

class FrameStore {
 public:
  FrameStore(size_t in_flight_budget, uint32_t retain_versions);

  // Records that chunk `chunk` of (attempt, version) arrived on `tree`. Returns true at its first
  // sight; then `message` is kept while the budget lasts. A new attempt forgets the previous one.
  bool first_sight(uint64_t attempt, uint64_t version, uint32_t chunk, int tree, const SharedBytes& message);
  // RAW: the piece's body is at `body` (servable from now on): where it landed in the weights, or
  // a copy `owner` keeps alive (a piece this member refused but passes on).
  void landed(uint64_t attempt, uint32_t chunk, std::span<const std::byte> body, SharedBytes owner = nullptr);
  // RAW: the piece landed and went on to the children, but its body is not kept (a placed member:
  // it landed in a bounce buffer, not in the weights; docs/placement.md). A child that lacks it
  // later is sent a GAP (the producer re-sends it).
  void passed_on(uint64_t attempt, uint32_t chunk);
  // Forgets a sighting (a RAW body cut short: the piece may arrive again).
  void forget(uint64_t attempt, uint32_t chunk);

  struct ResumeState {
    uint64_t version = 0;
    uint64_t attempt = 0;
    std::vector<bool> have;  // bit i: chunk i seen (the seal at chunk_count)
  };
  // What this member holds of the in-flight attempt (for its own RESUME to a new parent).
  ResumeState resume_state() const;

  // What to send a child that joined tree `tree` holding `have` of (attempt): the kept messages
  // of that tree it lacks, and the chunks it lacks that were seen here but not kept (gaps).
  struct ResumePlan {
    std::vector<StoredMessage> send;
    std::vector<uint32_t> gaps;
    uint64_t version = 0;
    uint64_t attempt = 0;
  };
  ResumePlan plan_resume(int tree, uint64_t attempt, const std::vector<bool>& have) const;

  // The in-flight attempt ended: committed (archived when it was a delta and every message of it
  // was kept: a committed version was complete here, so its chunks are 0..K with the seal at K)
  // or aborted (dropped).
  void end_attempt(uint64_t attempt, bool committed);
  // Every message of committed versions from+1 .. to, in order (chunks, then the seal), or
  // nullopt when any of them is not archived.
  std::optional<std::vector<SharedBytes>> archived(uint64_t from, uint64_t to) const;
  // The newest archived version (0 when none).
  uint64_t newest_archived() const;

  // What the archive holds now, and the most it ever held (the memory retain_versions bounds):
  // bytes are the archived messages' sizes (buffers the archive keeps alive; a message being
  // forwarded at the same moment shares its buffer). largest_version_bytes: the largest one
  // version archived so far, so `peak_bytes <= retain_versions * largest_version_bytes` holds.
  struct Retained {
    uint32_t versions = 0;
    uint64_t bytes = 0;
    uint32_t peak_versions = 0;
    uint64_t peak_bytes = 0;
    uint64_t largest_version_bytes = 0;
  };
  Retained retained() const;

 private:
  const size_t budget_;
  const uint32_t retain_versions_;
  mutable std::mutex mutex_;
  uint64_t attempt_ = 0;
  uint64_t version_ = 0;
  std::map<uint32_t, StoredMessage> in_flight_;
  size_t kept_bytes_ = 0;
  std::map<uint64_t, std::vector<SharedBytes>> archive_;  // version -> chunks then seal
  std::map<uint64_t, uint64_t> archive_bytes_;            // version -> its messages' bytes
  Retained retained_;
};

}  // namespace deltacast::tree
