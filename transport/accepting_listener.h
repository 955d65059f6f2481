#pragma once
// AcceptingListener: the Listener of the ofi and ucx backends. A background thread accepts side
// channel sockets, authenticates each (server side of the HMAC handshake) and runs `establish`
// (fabric setup) on it, so a client's
// connect() completes even while nobody sits in accept(); accept() takes finished connections
// from a queue. Peers that fail setup are logged and dropped. Thread-safe.
#include <condition_variable>
#include <deque>
#include <functional>
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
  // Binds url.host:url.port (Errc::io when it can not) and starts the accept thread. Each peer has
  // `setup_timeout` for the handshake and `establish`.
  AcceptingListener(const Url& url, std::string secret, std::chrono::milliseconds setup_timeout, Establish establish);
  ~AcceptingListener() override;
  std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) override;
  Url local_url() const override { return url_; }
  // Stops accepting, closes the socket and every connection set up but not yet accepted.
  void close() override;

 private:
  void accept_loop();

  SideListener socket_;
  Url url_;
  std::string secret_;
  std::chrono::milliseconds setup_timeout_;
  Establish establish_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::unique_ptr<Connection>> queue_;
  bool closed_ = false;
  std::thread thread_;
};

}  // namespace deltacast::transport::side
