#include "transport/engine_state.h"

namespace deltacast::transport {

bool EngineConnState::mark_broken(const Status& why) {
  if (broken) return false;
  broken = true;
  broken_status = why;
  if (liveness) liveness->shutdown();
  return true;
}

void EngineConnState::start_liveness(side::Fd fd, const TransportOptions& options) {
  liveness = std::make_unique<side::Liveness>(std::move(fd), options.heartbeat_interval, options.peer_timeout);
  peer_timeout = options.peer_timeout;
}

Status EngineConnState::check_alive(side::Clock::time_point now, bool pending) {
  if (broken || !liveness) return Status::success();
  if (peer_closing) {
    if (!pending || now - last_progress <= peer_timeout) return Status::success();
    return Status{Errc::connection, "peer closed the connection; its last messages did not arrive within " +
                                        std::to_string(peer_timeout.count()) + " ms"};
  }
  Status alive = liveness->poll(now);
  if (alive.ok() || !liveness->peer_said_goodbye()) return alive;
  peer_closing = true;
  last_progress = now;
  return Status::success();
}

void EngineConnState::say_goodbye() {
  if (liveness) liveness->say_goodbye();
}

void check_write_range(size_t bytes, uint64_t offset, uint64_t region_length) {
  if (offset > region_length || bytes > region_length - offset) {
    throw Error(Errc::invalid_argument, "RMA write of " + std::to_string(bytes) + " bytes at offset " +
                                            std::to_string(offset) + " overruns the remote region of " +
                                            std::to_string(region_length));
  }
}

}  // namespace deltacast::transport
