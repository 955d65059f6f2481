#pragma once
// The libfabric backend (ofi+PROVIDER://host:port). Design, in short (docs/transport-ofi-ucx.md):
//  * FI_EP_RDM endpoints, one per Connection, each in its own domain (providers share receive
//    queues across a domain's endpoints); memory is registered in every connection's domain under
//    one key we choose, so one remote key serves every connection. RDM rather than FI_EP_MSG
//    because shm and efa offer only RDM, and tcp/verbs give RDM through ofi_rxm.
//  * Addresses are exchanged, and the peer authenticated, over a TCP side channel
//    (transport/side_channel.h) that then carries heartbeats: EOF or silence fails the link.
//  * A message starts with one untagged FI_MSG send whose remote CQ data carries its length, so
//    a receive posted for "the next message" learns how many continuation fragments (tagged,
//    exact match on sequence and index) follow. Messages larger than the provider's max_msg_size
//    (capped at 64 MiB to pipeline) are fragmented.
//  * One progress thread per Transport reads every connection's CQ (FI_PROGRESS_MANUAL providers
//    move data only then). All libfabric calls are serialised by one mutex per Transport, so user
//    threads may post concurrently; posts beyond a small in-flight bound wait in an ordered backlog.
#include <memory>
#include <string_view>

#include "transport/transport.h"

namespace deltacast::transport {

// The backend's factory (registered as "ofi" by transport/backends/). Throws Errc::unsupported when the
// provider is not available (fi_getinfo finds no RDM endpoint with tagged messages).
std::unique_ptr<Transport> make_ofi_transport(std::string_view provider, const TransportOptions& options);

}  // namespace deltacast::transport
