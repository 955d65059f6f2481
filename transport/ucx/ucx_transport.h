#pragma once
// The UCX backend (ucx://HOST:PORT; UCX chooses its transports from UCX_TLS). Design in
// docs/transport-ofi-ucx.md: one UCP worker per Transport progressed by one thread, tagged
// messages, rkeys for RMA; addresses are exchanged and the peer authenticated over the TCP side
// channel (transport/side_channel.h), which then carries heartbeats.
#include <memory>

#include "transport/transport.h"

namespace deltacast::transport {

// The backend's factory (registered as "ucx" by transport/backends/). Throws Errc::unsupported
// when UCX cannot open a context or worker here.
std::unique_ptr<Transport> make_ucx_transport(const TransportOptions& options);

}  // namespace deltacast::transport
