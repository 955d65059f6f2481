#pragma once
// AcceptingListener: the Listener of the ofi and ucx backends. A background thread accepts side
// channel sockets and runs `establish` (auth handshake + fabric setup) on each, so a client's
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
  // Runs the handshake and builds the Connection; throws deltacast::Error to refuse the peer.
  using Establish = std::function<std::unique_ptr<Connection>(Fd fd)>;
  // Binds url.host:url.port (Errc::io when it can not) and starts the accept thread.
  AcceptingListener(const Url& url, Establish establish);
  ~AcceptingListener() override;
  std::unique_ptr<Connection> accept(std::chrono::milliseconds timeout) override;
  Url local_url() const override { return url_; }
  void close() override;

 private:
  void accept_loop();

  SideListener socket_;
  Url url_;
  Establish establish_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::unique_ptr<Connection>> queue_;
  bool closed_ = false;
  std::thread thread_;
};

}  // namespace deltacast::transport::side
