#pragma once
// What the host hears of versions (tree/receiver.h): the active version it reads from any thread
// (Receiver::version()), the on_active and on_aborted callbacks, and the counts stats() reports.
//
//  * committed(): a version committed here: counted, made active, then on_active.
//  * reached(): a version reached by catching up: made active, then on_active, when it is newer
//    than the active one.
//  * aborted(): counted at once, then `answer` runs (the replies to the producer and the
//    delegate: whoever hears the ABORTED sees the count), then on_aborted, which never delays
//    them.
//
// Thread-safety: committed/reached/aborted: the control thread; the counts: any thread.
#include <atomic>
#include <cstdint>
#include <functional>

namespace deltacast::tree {

class VersionEvents {
 public:
  // `active` is the Receiver's version(); it must outlive this object. Callbacks may be empty.
  VersionEvents(std::atomic<uint64_t>& active, std::function<void(uint64_t)> on_active,
                std::function<void(uint64_t)> on_aborted);

  void committed(uint64_t version);
  void reached(uint64_t version);
  void aborted(uint64_t version, const std::function<void()>& answer);

  uint64_t committed_count() const noexcept { return committed_; }
  uint64_t aborted_count() const noexcept { return aborted_; }

 private:
  std::atomic<uint64_t>& active_;
  const std::function<void(uint64_t)> on_active_;
  const std::function<void(uint64_t)> on_aborted_;
  std::atomic<uint64_t> committed_{0};
  std::atomic<uint64_t> aborted_{0};
};

}  // namespace deltacast::tree
