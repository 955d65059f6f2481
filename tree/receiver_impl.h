#pragma once
// Receiver::Impl, shared by tree/receiver.cpp (joining, catching up, the public calls) and
// tree/receiver_serve.cpp (the control thread while live: versions, epochs, delegated commit).
// Private to dc_tree. It holds the pieces (tree/receiver/*.h, each with its own rules) and glues
// them: its methods say which piece hears what, and in which order.
//
// Threads: the host's thread runs join/attach/run; while run() serves, it is the member's control
// thread, which alone handles control inputs (the producer's messages, the commit links of a
// delegated commit, this member's own answers) from one queue, in arrival order. Relay threads
// (RelayEdges) send to the producer directly and queue their answers.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "transport/transport.h"
#include "tree/protocol.h"
#include "tree/receiver.h"
#include "tree/receiver/commit_links.h"
#include "tree/receiver/control_inbox.h"
#include "tree/receiver/held_weights.h"
#include "tree/receiver/layout_tracker.h"
#include "tree/receiver/producer_link.h"
#include "tree/receiver/relay_host.h"
#include "tree/receiver/version_events.h"
#include "util/log.h"

namespace deltacast::tree {

// How run() leaves one producer connection.
enum class Ending { bye, producer_lost, fenced };

struct Receiver::Impl {
  transport::Transport& transport;
  ReceiverOptions options;
  std::shared_ptr<spdlog::logger> log = logger("tree");
  ProducerLink producer;                    // the control link, the WELCOME and the membership; leaving
  HeldWeights held;                         // manifest, buffers, Session, FrameStore
  LayoutTracker layouts;                    // the held version's layout, LAYOUTs ahead of it, a parked ACK
  RelayHost relay;                          // the listener, the current RelayEdges, relay stats
  VersionEvents versions;                   // the active version, on_active/on_aborted, counts
  ControlInbox inbox;                       // the control thread's queue and the readers feeding it
  std::optional<CommitLinks> commit_links;  // delegated commit, while serving a producer connection
  // This link's HELLO stated the placement's slices; else a placed member states them by PLACED
  // before its first READY on the link (serve()).
  bool slices_stated = false;
  // Snapshots this member took on catch-up, and who served the last one (stats()).
  std::atomic<uint64_t> snapshots_taken{0};
  std::atomic<int64_t> last_snapshot_source{-1};

  // `active` is the Receiver's version().
  Impl(transport::Transport& t, ReceiverOptions o, std::atomic<uint64_t>& active);

  std::string who() const { return "rank " + std::to_string(options.rank); }

  // receiver.cpp. hello: ProducerLink::hello with what this member holds, then take_welcome.
  void hello(std::chrono::milliseconds patience, bool rejoin);
  void take_welcome(Welcome w, uint64_t epoch);
  bool catch_up();
  bool fetch_replay(const Member& source, uint64_t version);
  bool fetch_snapshot(const Member& source);
  template <class Handle>
  FetchEnd fetch(const Member& source, const Fetch& request, Handle&& handle);

  // receiver_serve.cpp
  void start_edges();
  // Serves versions over the current producer link until BYE, the link's loss, or a fence.
  Ending serve();
  void on_epoch(const EpochUpdate& update, uint64_t epoch);
  // Handles one input; returns an ending when serving is over.
  std::optional<Ending> handle_input(ControlInput& input);
  std::optional<Ending> handle_producer(const ControlEvent& event);
  // COMMIT (the producer's or the delegate's): commits here, archives the frames, counts, tells
  // the host. Returns the answer (ACTIVE, or a NACK) after `send` sent it.
  Message commit_here(const Commit& commit, const std::function<void(const Message&)>& send);
};

}  // namespace deltacast::tree
