#pragma once
// Receiver::Impl, shared by tree/receiver.cpp (joining, catching up, the public calls) and
// tree/receiver_serve.cpp (the control thread while live: versions, epochs, delegated commit).
// Private to dc_tree.
//
// Threads: the host's thread runs join/attach/run; while run() serves, it is the member's control
// thread, which alone handles control inputs (the producer's messages, the commit links of a
// delegated commit, this member's own answers) from one queue, in arrival order. Relay threads
// (RelayEdges) send to the producer directly and queue their answers.
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "codec/manifest.h"
#include "transport/transport.h"
#include "tree/delegated_commit.h"
#include "tree/frame_store.h"
#include "tree/membership.h"
#include "tree/protocol.h"
#include "tree/receiver.h"
#include "tree/receiver/layout_tracker.h"
#include "tree/relay_edges.h"
#include "tree/relay_link.h"
#include "tree/session.h"
#include "util/log.h"

namespace deltacast::tree {

using namespace std::chrono_literals;
inline constexpr size_t kWelcomeBufferBytes = size_t{64} << 20;
inline constexpr auto kControlSendTimeout = 60s;

// How run() leaves one producer connection.
enum class Ending { bye, producer_lost, fenced };

// One input of the control thread. A link's kind is in the low bits of its ControlEvent
// generation (the rest tells its links apart).
struct ControlInput {
  enum class Kind : uint64_t {
    producer = 0,
    from_delegate = 1,
    from_member = 2,
    own_answer = 3,
    delegate_link = 4,
    member_link = 5
  };
  Kind kind = Kind::producer;
  ControlEvent event;                                 // rank, message (or the link's failure)
  std::shared_ptr<transport::Connection> connection;  // delegate_link (connected, or null), member_link
};

// A commit link (docs/protocol.md, "Delegated commit"), either end. Sends never block the control
// thread: they are posted (OutboundLink), and a frozen peer only fills the link's queue.
struct CommitLink {
  uint64_t id = 0;  // its reader's link id
  std::shared_ptr<transport::Connection> connection;
  std::shared_ptr<OutboundLink> out;
  CommitLink() = default;
  CommitLink(uint64_t link_id, std::shared_ptr<transport::Connection> c, uint32_t peer)
      : id(link_id),
        connection(c),
        out(std::make_shared<OutboundLink>(std::make_unique<SharedConnection>(c), peer, -1)) {}
  explicit operator bool() const { return connection != nullptr; }
  // Posts `message`. Throws Error(connection) when the link already failed.
  void send(const Message& message, uint64_t epoch) {
    if (out->dead()) throw Error(Errc::connection, "the commit link failed");
    out->post(std::make_shared<const std::vector<std::byte>>(encode_message(message, epoch)));
  }
  void close() {
    if (out) out->cancel_all();
    if (connection) connection->close();
  }
};

struct Receiver::Impl {
  transport::Transport& transport;
  ReceiverOptions options;
  std::shared_ptr<spdlog::logger> log = logger("tree");
  std::unique_ptr<transport::Listener> listener;
  const uint64_t instance;

  std::shared_ptr<transport::Connection> control;
  std::mutex control_mutex;  // control (the pointer) and `epoch` for sends from relay threads
  Welcome welcome;
  std::optional<codec::Manifest> manifest;
  std::optional<Membership> membership;

  codec::MutableWeights weights;
  std::mutex weights_mutex;  // weights' spans: a snapshot landing vs reattach()
  std::unique_ptr<Session> session;
  std::unique_ptr<FrameStore> store;
  std::unique_ptr<RelayEdges> edges;
  mutable std::mutex edges_mutex;  // edges (the pointer) and relay_totals, for stats()
  RelayStats relay_totals;         // of edges already stopped
  uint64_t versions_committed = 0, versions_aborted = 0;
  std::atomic<uint64_t>* active_version = nullptr;
  uint64_t held_version = 0, held_digest = 0;  // what join() was told the host holds
  FetchEnd snapshot_end;                       // the last snapshot's version and digest

  LayoutTracker layouts;             // the held version's checkpoint layout, LAYOUTs ahead of it, a parked ACK
  std::atomic<bool> leaving{false};  // stop(): run() returns instead of rejoining

  // ---- the control thread while serving (tree/receiver_serve.cpp) ----
  EventQueue<ControlInput> inputs;
  std::unique_ptr<ControlReaders> readers;  // the producer link and commit links, while serving
  uint64_t next_link = 1;                   // link ids (ControlEvent generation >> 3)
  std::optional<DelegatedCommit> delegation;
  // Member side: the link to the current delegate (connecting: `outbox` waits for it).
  uint32_t link_delegate = 0;
  CommitLink delegate_link;
  bool connecting = false;
  std::vector<Message> outbox;
  TaskThreads connectors;
  // Delegate side: each member's commit link (by rank: link id, connection).
  std::map<uint32_t, CommitLink> member_links;

  Impl(transport::Transport& t, ReceiverOptions o);

  uint64_t epoch() const { return membership ? membership->epoch() : 0; }
  void send_to_producer(const Message& message) {
    std::shared_ptr<transport::Connection> link;
    uint64_t e;
    {
      std::lock_guard lock(control_mutex);
      link = control;
      e = epoch();
    }
    if (!link) throw Error(Errc::connection, "no link to the producer");
    send_control(*link, message, kControlSendTimeout, e);
  }
  std::string who() const { return "rank " + std::to_string(options.rank); }

  // Connects (retrying for `patience`), says HELLO and takes the WELCOME (receiver.cpp). A first
  // join waits for the WELCOME up to timeouts.join (the producer answers once every member came);
  // a rejoin (`rejoin`) only for what is left of `patience`, at least one peer timeout.
  void hello(std::chrono::milliseconds patience, bool rejoin);
  Message recv_control(std::chrono::milliseconds timeout, std::span<std::byte> buffer, uint64_t* epoch_out = nullptr);
  void take_welcome(Welcome w, uint64_t epoch);
  bool catch_up();
  bool fetch_replay(const Member& source, uint64_t version);
  bool fetch_snapshot(const Member& source);
  template <class Handle>
  void fetch(const Member& source, const Fetch& request, Handle&& handle);

  // receiver_serve.cpp
  void start_edges();
  void stop_edges();
  // Serves versions over the current producer link until BYE, the link's loss, or a fence.
  Ending serve();
  void on_epoch(const EpochUpdate& update, uint64_t epoch);
  // Handles one input; returns an ending when serving is over.
  std::optional<Ending> handle_input(ControlInput& input);
  std::optional<Ending> handle_producer(const ControlEvent& event);
  // COMMIT (the producer's or the delegate's): commits here, archives the frames, counts, tells
  // the host. Returns the answer (ACTIVE, or a NACK) after `send` sent it.
  Message commit_here(const Commit& commit, const std::function<void(const Message&)>& send);
  // Delegated commit glue (the DelegatedCommit hooks).
  DelegatedCommit::Hooks delegation_hooks();
  void send_to_delegate(uint32_t delegate, const Message& message);
  // Opens the link to link_delegate when answers wait in the outbox and no attempt is running.
  void connect_delegate();
  void send_to_member(uint32_t rank, const Message& message);
  // Starts reading `connection` as a link of `kind`; returns its id.
  uint64_t read_link(ControlInput::Kind kind, uint32_t rank, std::shared_ptr<transport::Connection> connection,
                     size_t max_bytes = 0);
  void close_links();
  std::string url_of(uint32_t rank) const;
};

}  // namespace deltacast::tree
