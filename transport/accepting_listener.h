#pragma once
// AcceptingListener: the Listener of the ofi and ucx backends. A background thread accepts side
// channel sockets and gives each to a setup thread of its own, which authenticates it (server side
// of the HMAC handshake) and runs `establish` (fabric setup), so a client's connect() completes
// even while nobody sits in accept(), and a peer that stalls in its setup (frozen, cut off, or
// sending nothing) holds only its own connection, never the ones behind it, for up to
// `setup_timeout`. accept() takes finished connections from a queue. Peers that fail setup are
// logged and dropped. Thread-safe.
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "transport/side_channel.h"
#include "transport/transport.h"

namespace deltacast::transport::side {

class AcceptingListener final : public Listener {
 public:
  // Builds the Connection over an authenticated side channel, finishing by `deadline`; throws
  // deltacast::Error to refuse the peer.
  using Establish = std::function<std::unique_ptr<Connection>(Fd fd, Clock::time_point deadline)>;
  // At most this many peers in setup at once; more wait in the socket's backlog.
  static constexpr size_t kMaxSetups = 64;
  // Binds url.host:url.port (Errc::io when it can not) and starts the accept thread. Each peer has
  // `setup_timeout` for the handshake and `establish`.
  AcceptingListener(const Url& url, std::string secret, std::chrono::milliseconds setup_timeout, Establish establish);
  ~AcceptingListener() override;
  std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) override;
  Url local_url() const override { return url_; }
  // Stops accepting, ends the setups in flight at once (their sockets shut down), and closes the
  // socket and every connection set up but not yet accepted.
  void close() override;

 private:
  // A peer's setup: its thread, and a second descriptor of its socket by which close() ends it
  // (the setup's own may have moved into the connection). `done` once the thread has nothing left
  // to do but return.
  struct Setup {
    Fd watch;
    std::thread thread;
    bool done = false;
  };

  void accept_loop();
  void set_up(Fd fd, std::list<Setup>::iterator setup);
  // Joins the setups that are done (the accept thread, between accepts).
  void reap_setups();

  SideListener socket_;
  Url url_;
  std::string secret_;
  std::chrono::milliseconds setup_timeout_;
  Establish establish_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::unique_ptr<Connection>> queue_;
  std::list<Setup> setups_;
  bool closed_ = false;
  std::thread thread_;
};

}  // namespace deltacast::transport::side
