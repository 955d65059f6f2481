#pragma once
// A transport peer in a separate PROCESS (fork), so tests can SIGKILL or SIGSTOP it mid-transfer.
#include <sys/types.h>

#include <string>

#include "transport/transport.h"

namespace deltacast::transport::testing {

// A forked child that listens on SCHEME://127.0.0.1:0, accepts one connection and then sends
// `message_bytes`-sized messages (byte i of message k = (k + i) & 0xff) until the link fails.
class StreamingPeer {
 public:
  StreamingPeer(const std::string& scheme, const TransportOptions& options, size_t message_bytes);
  ~StreamingPeer();  // SIGKILLs and reaps the child if still there
  StreamingPeer(const StreamingPeer&) = delete;
  StreamingPeer& operator=(const StreamingPeer&) = delete;
  const Url& url() const { return url_; }
  void signal(int signo);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  Url url_;
};

}  // namespace deltacast::transport::testing
