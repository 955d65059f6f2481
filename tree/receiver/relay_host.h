#pragma once
// A member's relay side across producer connections: the listener its children and peers connect
// to (opened once: its URL is the member's address for every producer), the RelayEdges serving the
// current connection (tree/relay_edges.h), and the stats of the edges stopped before, so stats()
// counts everything this member relayed.
//
// Thread-safety: listen/install/stop/current: one thread at a time (the host's, then the control
// thread). stats() and listen_url(): any thread (one mutex guards the edges' pointer and the
// totals).
#include <memory>
#include <mutex>
#include <string>

#include "transport/transport.h"
#include "tree/relay_edges.h"

namespace deltacast::tree {

class RelayHost {
 public:
  RelayHost() = default;
  RelayHost(const RelayHost&) = delete;
  RelayHost& operator=(const RelayHost&) = delete;

  // Throws what Transport::listen throws.
  void listen(transport::Transport& transport, const transport::Url& url);
  transport::Listener& listener() { return *listener_; }
  std::string listen_url() const { return listener_->local_url().str(); }

  // `edges` (started, on listener()) serve from now on.
  void install(std::unique_ptr<RelayEdges> edges);
  // Stops the current edges, if any, and adds their stats to the totals.
  void stop();
  RelayEdges* current() const { return edges_.get(); }  // null while none serve
  RelayStats stats() const;

 private:
  std::unique_ptr<transport::Listener> listener_;
  mutable std::mutex mutex_;  // edges_ (the pointer) and totals_
  std::unique_ptr<RelayEdges> edges_;
  RelayStats totals_;  // of the edges stopped
};

}  // namespace deltacast::tree
