// Setting a libfabric connection up over the side channel (transport/engine_handles.h runs the
// handshake, then calls establish): an endpoint with its own domain, AV and CQ, bound to the
// side channel's local address; the endpoint names are exchanged as the setup blobs, each side
// inserts the peer's into its AV, and the client's READY byte says its AV holds the server, so the
// server may send.
#include <netinet/in.h>
#include <sys/socket.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/engine_handles.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_memory.h"
#include "transport/ofi/shm_names.h"

namespace deltacast::transport::ofi {

using side::Clock;

namespace {

constexpr size_t kMaxAddressBytes = 4096;

void check_scheme(const Url& url, const std::string& provider) {
  if (url.scheme != "ofi" || url.provider != provider) {
    throw Error(Errc::invalid_argument, "ofi+" + provider + " transport can not use URL " + url.str());
  }
}

}  // namespace

std::unique_ptr<Listener> OfiTransport::listen(const Url& url) {
  check_scheme(url, provider_);
  return listen_over_side_channel<ConnState>(shared_from_this(), url);
}

std::unique_ptr<Connection> OfiTransport::connect(const Url& url, std::chrono::milliseconds timeout) {
  check_scheme(url, provider_);
  return connect_over_side_channel<ConnState>(shared_from_this(), url, timeout);
}

std::shared_ptr<ConnState> OfiTransport::establish(side::Fd fd, bool is_server, Clock::time_point deadline) {
  auto conn = std::make_shared<ConnState>();
  conn->peer_url = "ofi+" + provider_ + "://" + side::peer_address(fd.get());
  std::vector<std::byte> my_name;
  {
    std::lock_guard lock(mutex_);
    fi_info* info = fi_dupinfo(info_);
    // Bind the endpoint to the address the side channel uses: pins loopback peers to lo.
    if (info->addr_format == FI_SOCKADDR_IN || info->addr_format == FI_SOCKADDR_IN6 ||
        info->addr_format == FI_SOCKADDR) {
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) == 0) {
        if (local.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&local)->sin_port = 0;
        if (local.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&local)->sin6_port = 0;
        std::free(info->src_addr);
        info->src_addr = std::malloc(len);
        std::memcpy(info->src_addr, &local, len);
        info->src_addrlen = len;
        info->addr_format = local.ss_family == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
      }
    }
    if (info->addr_format == FI_ADDR_STR && provider_ == "shm") {
      // A name of our own, not the pid-derived default a killed process may have left behind.
      std::string name = unique_shm_endpoint_name();
      std::free(info->src_addr);
      info->src_addr = strdup(name.c_str());
      info->src_addrlen = name.size() + 1;
    }
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.wait_obj = FI_WAIT_FD;  // the progress thread sleeps in poll() on it (ofi_progress.cpp)
    cq_attr.size = info->tx_attr->size + info->rx_attr->size;  // every posted op fits
    int rc = fi_domain(fabric_, info, &conn->domain, nullptr);
    if (rc == 0) rc = fi_endpoint(conn->domain, info, &conn->ep, nullptr);
    fi_freeinfo(info);
    check(rc, "fi_domain/fi_endpoint");
    check(fi_av_open(conn->domain, &av_attr, &conn->av, nullptr), "fi_av_open");
    if (fi_cq_open(conn->domain, &cq_attr, &conn->cq, nullptr) == 0 &&
        fi_control(&conn->cq->fid, FI_GETWAIT, &conn->cq_fd) != 0) {
      conn->cq_fd = -1;
    }
    if (!conn->cq) {  // no wait object from this provider: a CQ without, read by spinning
      cq_attr.wait_obj = FI_WAIT_NONE;
      check(fi_cq_open(conn->domain, &cq_attr, &conn->cq, nullptr), "fi_cq_open");
    }
    check(fi_ep_bind(conn->ep, &conn->av->fid, 0), "fi_ep_bind(av)");
    check(fi_ep_bind(conn->ep, &conn->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    check(fi_enable(conn->ep), "fi_enable");
    for (const auto* region : regions_) register_in(*conn, *region);
    size_t len = kMaxAddressBytes;
    my_name.resize(len);
    check(fi_getname(&conn->ep->fid, my_name.data(), &len), "fi_getname");
    my_name.resize(len);
  }
  auto release = [&] {
    std::lock_guard lock(mutex_);
    fail(*conn, Status{Errc::connection, "setup failed"});
  };
  try {
    std::vector<std::byte> peer_name =
        side::exchange_setup_blobs(fd.get(), is_server, my_name, kMaxAddressBytes, deadline);
    if (log_->should_log(spdlog::level::debug)) {
      char mine[256] = "", theirs[256] = "";
      size_t a = sizeof mine, b = sizeof theirs;
      fi_av_straddr(conn->av, my_name.data(), mine, &a);
      fi_av_straddr(conn->av, peer_name.data(), theirs, &b);
      log_->debug("ofi: endpoint {} <-> peer {}", mine, theirs);
    }
    {
      std::lock_guard lock(mutex_);
      int inserted = fi_av_insert(conn->av, peer_name.data(), 1, &conn->peer, 0, nullptr);
      if (inserted != 1) throw Error(Errc::connection, "fi_av_insert of the peer address failed");
    }
    // READY: the client's AV holds the server, so the server may send at once.
    side::exchange_ready(fd.get(), is_server, deadline);
  } catch (...) {
    release();
    throw;
  }
  std::lock_guard lock(mutex_);
  conn->start_liveness(std::move(fd), options_);
  conns_.push_back(conn);
  wake();
  return conn;
}

}  // namespace deltacast::transport::ofi
