#pragma once
// A member's side of delegated commits over one producer connection (docs/protocol.md,
// "Delegated commit"): the DelegatedCommit that decides (tree/delegated_commit.h) and the commit
// links it speaks over. One object per producer connection, driven by the control thread alone:
// destroying it closes every link and joins its connection attempts.
//
//  * Member side: answers for the delegate go on one link to it, opened on the first answer and
//    replaced when the DELEGATE names another member. Connecting runs on a task thread, never on
//    the control thread; answers wait in an outbox meanwhile, and go once the link is up. When the
//    delegate cannot be reached they are dropped: the producer has them too and decides. A COMMIT
//    on that link is committed here and answered on it.
//  * Delegate side: a member's link is accepted by the relay edges (its first message is an ACK
//    or NACK) and kept by rank; a newer link from the same rank replaces the older one. What the
//    DelegatedCommit sends a member goes on that member's link; a failed link tells it the member
//    will not answer ACTIVE here.
//  * Sends never block the control thread: they are posted (OutboundLink), and a frozen peer only
//    fills its link's queue. Messages of a link already replaced are ignored.
//
// Thread-safety: the control thread only; the connection attempts report through the ControlInbox.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "transport/transport.h"
#include "tree/delegated_commit.h"
#include "tree/receiver/control_inbox.h"
#include "tree/receiver/producer_link.h"
#include "tree/relay_link.h"
#include "util/log.h"

namespace deltacast::tree {

class CommitLinks {
 public:
  // Commits `commit` here and returns the answer (ACTIVE, or a NACK) after `send` sent it.
  using CommitHere = std::function<Message(const Commit&, const std::function<void(const Message&)>& send)>;
  // `options`, `inbox` and `producer` (live ranks, members' URLs, the epoch, the producer's link)
  // must outlive this object.
  CommitLinks(transport::Transport& transport, const ReceiverOptions& options, ControlInbox& inbox,
              ProducerLink& producer, CommitHere commit_here, std::shared_ptr<spdlog::logger> log);
  ~CommitLinks();
  CommitLinks(const CommitLinks&) = delete;
  CommitLinks& operator=(const CommitLinks&) = delete;

  // The producer's word (DelegatedCommit's rules): a DELEGATE; the end of an attempt (its COMMIT or
  // ABORT); an EPOCH.
  void delegate(const Delegate& d) { decision_.delegate(d); }
  void ended(uint64_t attempt) { decision_.ended(attempt); }
  void membership_changed() { decision_.membership_changed(); }
  // This member's own ACK or NACK, once the producer was sent it.
  void own_answer(const Message& answer) { decision_.own_answer(answer); }
  // An input of any kind but producer.
  void handle(ControlInput& input);

 private:
  // A commit link, either end.
  struct Link {
    uint64_t id = 0;  // its reader's link id
    std::shared_ptr<transport::Connection> connection;
    std::shared_ptr<OutboundLink> out;
    Link() = default;
    Link(uint64_t link_id, const std::shared_ptr<transport::Connection>& c, uint32_t peer);
    explicit operator bool() const { return connection != nullptr; }
    // Posts `message`. Throws Error(connection) when the link already failed.
    void send(const Message& message, uint64_t epoch);
    void close();
  };
  DelegatedCommit::Hooks hooks();  // decision_'s
  void send_to_delegate(uint32_t delegate, const Message& message);
  // Opens the link to delegate_ when answers wait in the outbox and no attempt is running.
  void connect_delegate();
  void delegate_connected(const ControlInput& input);
  void from_delegate(const ControlInput& input);
  void send_to_member(uint32_t rank, const Message& message);
  void member_connected(const ControlInput& input);
  void from_member(const ControlInput& input);
  std::string who() const { return "rank " + std::to_string(options_.rank); }

  transport::Transport& transport_;
  const ReceiverOptions& options_;
  ControlInbox& inbox_;
  ProducerLink& producer_;
  const CommitHere commit_here_;
  std::shared_ptr<spdlog::logger> log_;
  DelegatedCommit decision_;
  // Member side: the link to the current delegate (connecting: outbox_ waits for it).
  uint32_t delegate_ = 0;
  Link delegate_link_;
  bool connecting_ = false;
  std::vector<Message> outbox_;
  TaskThreads connectors_;
  // Delegate side: each member's commit link, by rank.
  std::map<uint32_t, Link> member_links_;
};

}  // namespace deltacast::tree
