#pragma once
// A member's control link to the producer, and what the producer told it there: the WELCOME, and
// the membership at the newest epoch heard (docs/protocol.md, "Rejoin and late join", "Producer
// loss", "Membership, epochs and the forest").
//
//  * hello() connects (retrying for `patience`), says HELLO and takes the WELCOME. A first join
//    waits for the WELCOME up to timeouts.join (the producer answers once every member came); a
//    rejoin only for what is left of its patience, at least one peer timeout. Every HELLO carries
//    this object's instance id: the producer fences an older instance of the same rank. The new
//    link replaces the old one once a WELCOME came on it; a refusal is thrown as its Error.
//  * take() makes a WELCOME the receiver accepted the member's view: its membership (at the
//    WELCOME's epoch), its members' URLs, its message bound. apply_epoch() moves the view to a
//    newer epoch; an EPOCH not newer than the view (a WELCOME carried it) is ignored.
//  * send() stamps each message with the view's epoch at the moment it leaves; relay threads send
//    too (REPORT, READY, their ACKs and NACKs).
//  * leave() (Receiver::stop) closes the link for good: the member does not rejoin.
//
// Thread-safety: send(), epoch(), leave() and leaving(): any thread (one mutex guards the link and
// the epoch). The rest: the host's thread while it joins, then the member's control thread.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "transport/transport.h"
#include "tree/membership.h"
#include "tree/protocol.h"
#include "tree/receiver.h"

namespace deltacast::tree {

using namespace std::chrono_literals;
inline constexpr size_t kWelcomeBufferBytes = size_t{64} << 20;  // also a LAYOUT's bound
inline constexpr auto kControlSendTimeout = 60s;

class ProducerLink {
 public:
  // `options` (the receiver's) must outlive this object.
  ProducerLink(transport::Transport& transport, const ReceiverOptions& options);

  struct Welcomed {
    Welcome welcome;
    uint64_t epoch = 0;  // the WELCOME's header's
  };
  // Says `hello` (its instance set here) on a new link. Throws Error(connection | timeout) when the
  // producer stays unreachable or silent, Error(corrupt_frame) when it answers anything but
  // WELCOME or REFUSED, and its refusal as an Error.
  Welcomed hello(Hello hello, std::chrono::milliseconds patience, bool rejoin);
  void take(Welcome welcome, Membership membership);
  // An EPOCH (its header's `epoch`): false when the view was at that epoch or newer already.
  bool apply_epoch(const EpochUpdate& update, uint64_t epoch);
  // Waits up to `timeout` for the producer's next message (at most buffer.size() bytes; its
  // header's epoch into *epoch_out). Throws Error(timeout | connection | corrupt_frame).
  Message recv(std::chrono::milliseconds timeout, std::span<std::byte> buffer, uint64_t* epoch_out = nullptr);
  // Closes the link and forgets it (the producer is lost; a rejoin opens a new one).
  void drop();

  // The view: valid after take().
  const Welcome& welcome() const { return welcome_; }
  const Membership& membership() const { return *membership_; }
  // Throws Error(invalid_argument) for a rank the WELCOME did not name.
  std::string url_of(uint32_t rank) const;
  std::shared_ptr<transport::Connection> connection() const;

  // Any thread. Throws Error(connection) when there is no link or the send fails.
  void send(const Message& message);
  uint64_t epoch() const;  // 0 before the first WELCOME
  void leave();
  bool leaving() const noexcept { return leaving_; }

 private:
  std::string who() const { return "rank " + std::to_string(options_.rank); }

  transport::Transport& transport_;
  const ReceiverOptions& options_;
  const uint64_t instance_;
  mutable std::mutex mutex_;  // link_ (the pointer) and the membership's epoch
  std::shared_ptr<transport::Connection> link_;
  Welcome welcome_;
  std::optional<Membership> membership_;
  std::atomic<bool> leaving_{false};
};

}  // namespace deltacast::tree
