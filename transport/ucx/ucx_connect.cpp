// Setting a UCX connection up over the side channel (transport/engine_handles.h runs the
// handshake, then calls establish): the worker addresses and receive ids are exchanged as the
// setup blobs, each side creates its endpoint from the peer's address (error mode PEER), and the
// client's READY byte says its endpoint exists, so the server may send.
#include <cstring>
#include <vector>

#include "transport/engine_handles.h"
#include "transport/ucx/ucx_engine.h"

namespace deltacast::transport::ucx {

using side::Clock;

namespace {

constexpr size_t kMaxSetupBlob = size_t{64} * 1024;

void check_scheme(const Url& url) {
  if (url.scheme != "ucx") throw Error(Errc::invalid_argument, "ucx transport can not use URL " + url.str());
}

}  // namespace

std::unique_ptr<Listener> UcxTransport::listen(const Url& url) {
  check_scheme(url);
  return listen_over_side_channel<ConnState>(shared_from_this(), url);
}

std::unique_ptr<Connection> UcxTransport::connect(const Url& url, std::chrono::milliseconds timeout) {
  check_scheme(url);
  return connect_over_side_channel<ConnState>(shared_from_this(), url, timeout);
}

std::shared_ptr<ConnState> UcxTransport::establish(side::Fd fd, bool is_server, Clock::time_point deadline) {
  auto conn = std::make_shared<ConnState>();
  conn->owner = this;
  conn->peer_url = "ucx://" + side::peer_address(fd.get());
  std::vector<std::byte> mine;
  {
    std::lock_guard lock(mutex_);
    conn->recv_id = next_recv_id_++;
    ucp_address_t* address = nullptr;
    size_t length = 0;
    ucs_status_t status = ucp_worker_get_address(worker_, &address, &length);
    if (status != UCS_OK) throw Error(Errc::internal, "ucp_worker_get_address: " + ucs_text(status));
    mine.resize(4 + length);
    std::memcpy(mine.data(), &conn->recv_id, 4);
    std::memcpy(mine.data() + 4, address, length);
    ucp_worker_release_address(worker_, address);
  }
  std::vector<std::byte> theirs = side::exchange_setup_blobs(fd.get(), is_server, mine, kMaxSetupBlob, deadline);
  if (theirs.size() < 5) throw Error(Errc::corrupt_frame, "ucx: peer's setup blob is too short");
  uint32_t peer_id = 0;
  std::memcpy(&peer_id, theirs.data(), 4);
  conn->send_tag = uint64_t{peer_id} << 32;
  {
    std::lock_guard lock(mutex_);
    ucp_ep_params_t params{};
    params.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(theirs.data() + 4);
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = ep_error_callback;
    params.err_handler.arg = conn.get();
    ucs_status_t status = ucp_ep_create(worker_, &params, &conn->ep);
    if (status != UCS_OK) throw Error(Errc::connection, "ucp_ep_create: " + ucs_text(status));
  }
  try {
    side::exchange_ready(fd.get(), is_server, deadline);
  } catch (...) {
    std::lock_guard lock(mutex_);
    fail(*conn, Status{Errc::connection, "setup failed"});
    conns_.push_back(conn);  // kept until its forced close finished
    throw;
  }
  std::lock_guard lock(mutex_);
  conn->start_liveness(std::move(fd), options_);
  conns_.push_back(conn);
  wake();
  return conn;
}

}  // namespace deltacast::transport::ucx
