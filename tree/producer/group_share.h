#pragma once
// One rank's share of a producer group's version (docs/producer-group.md): what it sends down its
// own trees, how it sends one key again, and what its part's baseline keeps once the version
// committed. Two kinds, the same flow around them (group.cpp at the coordinator, group_rank.cpp
// at a part rank):
//   * a delta of its part (refit): frames of its chunks; the coordinator adds the seal;
//   * version 1 as its part's RAW pieces (bootstrap): no seal; members ack the sum of every
//     piece's hash, and the version is recorded under the sum of the parts' StateDigests.
#include <memory>

#include "tree/producer/impl.h"

namespace deltacast::tree {

class Producer::Impl::GroupShare {
 public:
  virtual ~GroupShare() = default;
  // Version 1's RAW pieces (else a delta with a seal).
  virtual bool raw() const noexcept = 0;
  // The version's data keys by rank: rank r's are [first()[r], first()[r + 1]).
  virtual const std::vector<uint32_t>& first() const noexcept = 0;
  // Sends every key of this rank's part of `f` (as `begin` says: on the base whose combined digest
  // is begin.base_digest, cut for the placed members' slices it names) down its trees. Returns
  // what its GROUP_SENT says: counts and the part's digests, and for placed members the part's
  // slice deltas and scans (rank, version and attempt are the caller's). Throws Error when the
  // part cannot go out.
  virtual GroupSent send(Producer::Impl::InFlight& f, const GroupBegin& begin) = 0;
  // One of this rank's keys of the attempt in flight again (a re-send for member `route`).
  virtual Outgoing make(uint32_t key, uint32_t route) = 0;
  // The version committed: this rank's part of the baseline takes the new bits (`own`: its part's
  // digest, from send()).
  virtual void adopt(uint64_t v, codec::StateDigest own) = 0;
};

}  // namespace deltacast::tree
