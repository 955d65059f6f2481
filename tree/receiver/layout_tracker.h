#pragma once
// A member's checkpoint layouts (docs/protocol.md, "Checkpoint layouts"): which layout the version
// it holds has on the trainer's disk, the LAYOUTs of versions it does not hold yet, and the one
// ACK that waits for its version's LAYOUT. Pure: no sockets, threads or clock; the Session's
// answers are passed in (tests/unit/tree/test_layout_tracker.cpp).
//
//  * current() is the layout of the committed version this member holds. It changes only by
//    restart() (a WELCOME) and adopt() (a version committed or reached here); an abort leaves it.
//  * A LAYOUT is kept as pending under its version (attempt 0: a committed version's, sent to a
//    member catching up) until that version, or a newer one, is held here: adopt(version) makes
//    the pending layout at or below `version` current and drops every entry up to it.
//  * An ACK of an attempt whose data announced a LAYOUT (Session::awaits_layout) may leave only
//    once that attempt's LAYOUT is held; until then it is parked (at most one: one attempt is in
//    flight), and the LAYOUT that comes for its attempt releases it. Nobody commits a version
//    whose layout a member could not write as the trainer did.
//  * forget(attempt): the attempt ended without committing here (ABORT), or every attempt in
//    flight was dropped (attempt = max): their pending LAYOUTs and the parked ACK go; committed
//    versions' layouts (attempt 0) stay.
//  * A LAYOUT of an attempt at or below the Session's attempt floor (already ended here) is
//    ignored; one that does not fit the manifest is a corrupt message.
//
// Thread-safety: every member function may be called from any thread (one mutex). In the
// receiver, relay threads call ack_may_leave(), the control thread the rest, and the host
// current().
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "tree/protocol.h"

namespace deltacast::tree {

class LayoutTracker {
 public:
  // A (new) producer's WELCOME: nothing an earlier one announced stands. `announced` is the
  // producer's committed version's layout: current at once when the member holds that version
  // (or has no layout yet), else pending until it caught up to it.
  void restart(std::shared_ptr<const CheckpointLayout> announced, uint64_t committed_version, uint64_t held_version);
  // Before `ack` leaves: false when it must wait for its attempt's LAYOUT (it is parked then).
  // awaits_layout(attempt) is asked under the tracker's lock, so a forget() that follows the
  // attempt's end never misses an ACK parked for it.
  bool ack_may_leave(const Ack& ack, const std::function<bool(uint64_t attempt)>& awaits_layout);
  // A LAYOUT from the producer, for a manifest of `tensors` tensors, the Session's attempt floor
  // being `attempt_floor`. Returns the parked ACK it releases, if any. Throws
  // Error(corrupt_frame) when the layout does not fit the manifest.
  std::optional<Ack> take(const LayoutUpdate& update, size_t tensors, uint64_t attempt_floor);
  // The member now holds committed version `version`.
  void adopt(uint64_t version);
  // Attempts up to `attempt` ended without committing here.
  void forget(uint64_t attempt);

  // The held version's layout (null before the first WELCOME).
  std::shared_ptr<const CheckpointLayout> current() const;
  // For tests: the versions whose LAYOUT is pending, and the parked ACK.
  std::map<uint64_t, uint64_t> pending() const;  // version -> attempt
  std::optional<Ack> parked() const;

 private:
  struct Pending {
    uint64_t attempt = 0;
    std::shared_ptr<const CheckpointLayout> layout;
  };
  mutable std::mutex mutex_;
  std::shared_ptr<const CheckpointLayout> current_;
  std::map<uint64_t, Pending> pending_;  // by version
  std::optional<Ack> parked_;
};

}  // namespace deltacast::tree
