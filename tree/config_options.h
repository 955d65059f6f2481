#pragma once
// The tree's and the transports' options from a run config (docs/config.md): one mapping for the
// CLI (`deltacast run`) and the C API, so a key means the same wherever it is set.
#include "config/config.h"
#include "objstore/s3_client.h"
#include "transport/transport.h"
#include "tree/producer.h"
#include "tree/receiver.h"
#include "tree/store_versions.h"

namespace deltacast::tree {

// secret_file (loaded now: throws what transport::load_secret throws), timeouts.connect,
// timeouts.heartbeat, timeouts.peer, egress.burst; no egress cap.
transport::TransportOptions transport_options_from(const config::Config& c);
// transport_options_from plus the producer's egress cap (egress.producer).
transport::TransportOptions producer_transport_options(const config::Config& c);
// transport_options_from plus the egress cap of member `member_rank` (0-based, the config's
// members[].rank): its own `egress`, else egress.members (also for a rank the list lacks).
transport::TransportOptions member_transport_options(const config::Config& c, int member_rank);
// retain_versions and the receiver's timeouts (connect, join, peer, producer_loss; the producer's
// silence ends run() after 4 x timeouts.refit). Rank, URLs and cluster are the caller's.
ReceiverOptions receiver_options_from(const config::Config& c);
// topology, chunk_bytes, retain_versions and the producer's timeouts (refit bounds one version;
// start waits max(join, refit) for every member). Listen URL, receivers and encoder threads are
// the caller's.
ProducerOptions producer_options_from(const config::Config& c);

// The object store's client options (store.endpoint, region, bucket, addressing; timeouts.connect
// bounds a connection) and its layout (store.prefix, part_bytes, parallel, retain_versions).
objstore::S3Options store_s3_options(const config::Config& c);
StoreLayout store_layout(const config::Config& c);

}  // namespace deltacast::tree
