#include "tests/transport/peer_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace deltacast::transport::testing {
namespace {

// Runs in the child; never returns.
[[noreturn]] void serve(const std::string& scheme, const TransportOptions& options, size_t message_bytes, int port_fd) {
  int code = 0;
  try {
    auto transport = make_transport(scheme, options);
    auto listener = transport->listen(Url::parse(scheme + "://127.0.0.1:0"));
    std::string url = listener->local_url().str();
    if (::write(port_fd, url.c_str(), url.size() + 1) < 0) ::_exit(3);
    ::close(port_fd);
    auto connection = listener->accept(std::chrono::seconds(20));
    if (!connection) ::_exit(4);
    std::vector<std::vector<std::byte>> buffers(2, std::vector<std::byte>(message_bytes));
    for (uint64_t k = 0;; ++k) {
      auto& buffer = buffers[k % 2];
      for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<std::byte>((k + i) & 0xff);
      auto status = connection->post_send(buffer)->wait(std::chrono::seconds(60));
      if (!status.ok()) break;
    }
  } catch (...) {
    code = 5;
  }
  ::_exit(code);
}

}  // namespace

StreamingPeer::StreamingPeer(const std::string& scheme, const TransportOptions& options, size_t message_bytes) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(Errc::io, "pipe failed");
  pid_ = ::fork();
  if (pid_ < 0) throw Error(Errc::io, "fork failed");
  if (pid_ == 0) {
    ::close(fds[0]);
    serve(scheme, options, message_bytes, fds[1]);
  }
  ::close(fds[1]);
  char text[256] = {};
  size_t got = 0;
  while (got < sizeof text - 1) {
    ssize_t n = ::read(fds[0], text + got, sizeof text - 1 - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
    if (std::memchr(text, '\0', got) != nullptr) break;
  }
  ::close(fds[0]);
  if (got == 0) throw Error(Errc::connection, "peer process died before listening");
  url_ = Url::parse(text);
}

void StreamingPeer::signal(int signo) { ::kill(pid_, signo); }

StreamingPeer::~StreamingPeer() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

}  // namespace deltacast::transport::testing
