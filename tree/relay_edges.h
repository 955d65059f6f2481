#pragma once
// A member's data plane: its edges in the relay forest (docs/protocol.md, "Relay edges").
//
//  * A persistent acceptor: children JOIN at any time (a new child, or an orphan re-parented
//    here). A JOIN is accepted only for a member that is this member's child in that tree at the
//    epoch the JOIN names (waiting briefly for that epoch's update when it is ahead of ours); the
//    RESUME that follows says which chunks of the in-flight attempt the child holds, and the
//    child gets the retained ones it lacks at once, then everything forwarded from then on. Chunks
//    seen here but no longer retained are reported to the producer (GAP), which sends them again.
//    The acceptor also serves FETCH (a rejoining peer's catch-up) on its own thread, and hands a
//    commit link (first message ACK or NACK: this member is a commit delegate) to the receiver.
//  * Replaceable parent links, one reader thread per tree: it connects to the parent the forest
//    names, sends JOIN and RESUME, then reads. Each data message is forwarded verbatim to the
//    children of that tree on its first sight (cut-through), or, when it is a re-send routed to
//    one member and was seen here before, only towards that member; then it is applied through
//    the Session. A failed parent link is reported to the producer (REPORT) and the reader waits
//    for the producer's next word (an EPOCH naming a new parent). Once every tree's link of the
//    latest assignment is up, the member says READY (its version and digest) to the producer:
//    that is how the producer knows a repair is done.
//  * Back-pressure: before reading the next message a reader waits until each child of its tree
//    has less than max_inflight_bytes_per_child unsent. A child that drains nothing for
//    peer_timeout is reported as stalled and dropped; a child whose link failed is reported and
//    dropped. Neither stops this member.
//
// Thread-safety: start/update/stop are called by one thread (the member's control thread); the
// other members are thread-safe.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "codec/manifest.h"
#include "transport/transport.h"
#include "tree/byte_pool.h"
#include "tree/connect_retry.h"
#include "tree/frame_store.h"
#include "tree/membership.h"
#include "tree/relay_link.h"
#include "tree/session.h"

namespace deltacast::tree {

struct RelayOptions {
  uint32_t rank = 0;
  uint64_t max_message_bytes = 0;
  size_t max_inflight_bytes_per_child = size_t{64} << 20;
  std::chrono::milliseconds peer_timeout{10'000};
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds join_timeout{120'000};
  // A producer group's data URLs (Welcome::producer_urls): the root of tree t JOINs rank
  // producer_of(t). Empty: one producer.
  std::vector<std::string> producer_urls;
};

struct RelayStats {
  uint64_t frames_received = 0;
  uint64_t frames_forwarded = 0;  // sends posted to children
  uint64_t frames_replayed = 0;   // duplicates refused by the applier (re-sends, resumes)
  uint64_t frames_refused = 0;    // wrong base, corrupt, stale attempt, ...
  uint64_t frames_resumed = 0;    // retained messages sent to a re-parented child
  uint64_t payload_bytes = 0;     // data message bytes received
  RelayStats& operator+=(const RelayStats& o) {
    frames_received += o.frames_received;
    frames_forwarded += o.frames_forwarded;
    frames_replayed += o.frames_replayed;
    frames_refused += o.frames_refused;
    frames_resumed += o.frames_resumed;
    payload_bytes += o.payload_bytes;
    return *this;
  }
};

class RelayEdges {
 public:
  struct Callbacks {
    // Sends a control message to the producer (thread-safe; may throw Error(connection)).
    std::function<void(const Message&)> to_producer;
    // After each data message of `version` was handled (fault injection); optional.
    std::function<void(uint64_t version, uint64_t handled)> on_data;
    // A connection whose first message is an ACK or NACK: a member's commit link to this member
    // as the delegate of a commit (docs/protocol.md, "Delegated commit"). The callee owns it from
    // then on. Optional: without it such connections are refused.
    std::function<void(std::shared_ptr<transport::Connection>, Message first)> on_commit_link;
  };
  RelayEdges(transport::Transport& transport, transport::Listener& listener, Session& session,
             FrameStore& store, const codec::Manifest& manifest, std::vector<Member> members,
             RelayOptions options, Callbacks callbacks);
  ~RelayEdges();
  RelayEdges(const RelayEdges&) = delete;
  RelayEdges& operator=(const RelayEdges&) = delete;

  // Starts the acceptor and one reader per tree, connecting to the parents `membership` names.
  void start(const Membership& membership);
  // Takes a new epoch: reconnects in the trees where `moves` moved this member, drops children
  // that are no longer ours (dead or moved), refuses JOINs by them from now on. `joined` members'
  // URLs are learnt.
  // `producer_urls`: a producer group's data URLs when they changed (EpochUpdate), else empty.
  void update(const Membership& membership, const std::vector<Member>& joined, const std::vector<TreeEdge>& moves,
              const std::vector<std::string>& producer_urls = {});
  // Flushes children (bounded by peer_timeout), closes every link and joins every thread.
  // Idempotent.
  void stop();

  RelayStats stats() const;
  // Idle-time work after a version ended (the receiver calls it after ACTIVE): pre-faults
  // buffers shaped like that version's frames for the next one's copies (BytePool).
  void prepare_next_version();

 private:
  struct ParentSlot;
  struct Child;
  void accept_loop();
  void serve_connection(std::shared_ptr<transport::Connection> connection);
  void serve_join(std::shared_ptr<transport::Connection> connection, const Join& join, uint64_t epoch);
  void serve_fetch(std::shared_ptr<transport::Connection> connection, const Fetch& fetch);
  void read_loop(int tree);
  Status read_from_parent(int tree, transport::Connection& parent, uint64_t generation, std::vector<std::byte>& buffer);
  std::optional<size_t> receive(int tree, transport::Connection& parent, uint64_t generation,
                                std::span<std::byte> into, Status& status);
  void handle_frame(int tree, std::span<const std::byte> message);
  bool handle_raw(int tree, transport::Connection& parent, uint64_t generation,
                  std::span<const std::byte> message, std::span<std::byte> scratch, Status& status);
  // Posts to the children a data message should reach (all on first sight; else the one towards
  // `route`); returns how many sends were posted. Requires mutex_.
  size_t forward_locked(int tree, bool first, uint32_t route, const SharedBytes& message,
                        std::span<const std::byte> body, const SharedBytes& body_owner);
  void drain_children(int tree);
  void say_ready_when_up();
  void drop_child(int tree, uint32_t rank, FailureCause cause, const std::string& detail, bool report);
  void report(const Message& message);
  void count(uint64_t RelayStats::*field, uint64_t by = 1);
  std::string url_of(uint32_t rank, int tree) const;  // parent_url with this member's view

  transport::Transport& transport_;
  transport::Listener& listener_;
  Session& session_;
  FrameStore& store_;
  BytePool copies_{size_t{64} << 20};     // the buffers of the frames this member keeps
  std::mutex sizes_mutex_;
  std::vector<size_t> frame_sizes_;       // of the frames copied since the last prepare
  const codec::Manifest& manifest_;
  const RelayOptions options_;
  const Callbacks callbacks_;

  mutable std::mutex mutex_;  // membership_, members_, children_, parents_, threads; after Session's locks
  std::condition_variable changed_;
  std::optional<Membership> membership_;
  std::vector<Member> members_;  // by rank
  std::vector<std::string> producer_urls_;                            // options_'s, then the newest EPOCH's
  std::vector<std::vector<std::shared_ptr<OutboundLink>>> children_;  // [tree]
  std::vector<std::unique_ptr<ParentSlot>> parents_;                 // [tree]
  std::vector<std::thread> readers_;
  AbandonedAttempts abandoned_;  // parent handshakes given up on when the parent changed
  std::thread acceptor_;
  TaskThreads servers_;  // one per accepted connection being served
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  uint64_t ready_epoch_ = UINT64_MAX;  // epoch of the last READY sent
  mutable std::mutex stats_mutex_;  // stats_, data_version_, data_handled_
  uint64_t data_version_ = 0;   // for on_data: the version counted
  uint64_t data_handled_ = 0;   // data messages of it handled here
  RelayStats stats_;
};

}  // namespace deltacast::tree
