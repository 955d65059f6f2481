#pragma once
// Egress pacing over any backend: make_transport wraps a backend in this decorator when
// TransportOptions::egress_bytes_per_second > 0. All sends and RMA writes of the transport (every
// connection, listened or connected) share one token bucket: the cap is on the process's uplink,
// as Kraken's and Dragonfly's upload limits are. Receives pass through unpaced, and so do the
// backends' own heartbeats and handshakes (they are below this layer and tiny).
//
// A send that may not start yet waits in its connection's FIFO queue (so the order of sends on a
// connection, and of writes before later sends, is kept) and a pacer thread posts it to the
// backend when the bucket allows. The connections with sends waiting take turns, one message each
// (round robin), as flows sharing one link do: a connection's small message waits for at most one
// message of each other busy connection, not for all they have queued. The returned Request follows the transport
// rules: cancel() withdraws a send that is still queued (Errc::cancelled); closing or destroying the connection
// finishes its queued sends with Errc::connection. Messages are never split: a message larger than the burst leaves at
// the backend's speed and the bucket goes into debt for it (token_bucket.h).
#include <memory>

#include "transport/transport.h"

namespace deltacast::transport {

// Wraps `inner` with egress pacing at options.egress_bytes_per_second (> 0) and a burst of
// options.egress_burst_bytes (0: default_egress_burst). Throws Errc::invalid_argument for rate 0.
std::unique_ptr<Transport> make_paced_transport(std::unique_ptr<Transport> inner, const TransportOptions& options);

}  // namespace deltacast::transport
