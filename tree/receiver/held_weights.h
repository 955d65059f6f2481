#pragma once
// What a member holds (tree/receiver.h): the checkpoint's manifest, the host's buffers, the Session
// that versions them and the FrameStore of the frames it retains. Until attach(), what the host
// said at join() its buffers hold stands in for the Session's version and digest (held(): what a
// HELLO reports).
//
//  * The manifest is set once (join, from the WELCOME); the buffers, the Session and the
//    FrameStore once (attach). Neither moves after: the Session and the buffers point into the
//    manifest, the relay edges into all of them.
//  * The buffers' spans change in two places only, both under the buffers' lock: the host moving
//    a tensor (reattach()) and a catch-up snapshot landing in them (lock_buffers(), buffers()).
//
// Thread-safety: host_holds/set_manifest/attach: the host's thread, before run(). After them the
// accessors return stable pointers (the Session's and the FrameStore's own rules apply), and the
// buffers are touched only under lock_buffers() (reattach() takes it).
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "codec/digest.h"
#include "codec/manifest.h"
#include "tree/frame_store.h"
#include "tree/receiver.h"
#include "tree/session.h"

namespace deltacast::tree {

class HeldWeights {
 public:
  struct Held {
    uint64_t version = 0;
    uint64_t digest = 0;         // its combined StateDigest
    uint64_t attempt_floor = 0;  // the Session's (0 before attach)
  };
  // join(): the host's buffers hold `version` with `digest` (0, 0: all zeros, or none kept).
  void host_holds(uint64_t version, uint64_t digest);
  const codec::Manifest& set_manifest(codec::Manifest manifest);
  // `weights` (their manifest set to manifest()) hold exactly `version` with `digest`.
  void attach(codec::MutableWeights weights, uint64_t version, codec::StateDigest digest,
              const ReceiverOptions& options);
  // A placed member: `weights` (compiled against manifest()) hold their slices of `version`, whose
  // whole state's combined digest is `version_combined`.
  void attach_placed(codec::PlacedWeights weights, uint64_t version, uint64_t version_combined,
                     const ReceiverOptions& options);
  // A placed member's buffers and placement (placement null: a whole member); under lock_buffers().
  const codec::PlacedWeights& placed() const { return placed_; }

  const codec::Manifest* manifest() const { return manifest_ ? &*manifest_ : nullptr; }  // null before join
  Session* session() const { return session_.get(); }                                    // null before attach
  FrameStore* store() const { return store_.get(); }
  Held held() const;

  // The host moved `tensor` to `memory` (Session::rebind's rules).
  void reattach(uint32_t tensor, std::span<std::byte> memory);
  // Exclusive use of the buffers' spans (a snapshot landing): no reattach() meanwhile.
  std::unique_lock<std::mutex> lock_buffers() { return std::unique_lock(buffers_mutex_); }
  codec::MutableWeights& buffers() { return buffers_; }  // under lock_buffers()

 private:
  Held told_;  // what join() was told
  std::optional<codec::Manifest> manifest_;
  std::mutex buffers_mutex_;
  codec::MutableWeights buffers_;
  codec::PlacedWeights placed_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<FrameStore> store_;
};

}  // namespace deltacast::tree
