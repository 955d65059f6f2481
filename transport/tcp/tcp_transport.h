#pragma once
// The TCP backend (tcp://HOST:PORT) over Boost.Asio: one io_context thread per Transport drives
// every connection's coroutines (transport/tcp/tcp_connection.h); the auth handshake of
// transport/auth.h runs on the socket itself, and heartbeats share it with the data, so a peer's
// last message always arrives before its close.
#include <memory>

#include "transport/transport.h"

namespace deltacast::transport {

// The backend's factory (registered as "tcp" by transport/backends/). Never throws.
std::unique_ptr<Transport> make_tcp_transport(const TransportOptions& options);

}  // namespace deltacast::transport
