#include "tree/config_options.h"

#include <algorithm>

namespace deltacast::tree {

transport::TransportOptions transport_options_from(const config::Config& c) {
  transport::TransportOptions options;
  if (!c.secret_file.empty()) options.secret = transport::load_secret(c.secret_file);
  options.connect_timeout = c.timeouts.connect;
  options.heartbeat_interval = c.timeouts.heartbeat;
  options.peer_timeout = c.timeouts.peer;
  options.egress_burst_bytes = c.egress.burst;
  return options;
}

transport::TransportOptions producer_transport_options(const config::Config& c) {
  auto options = transport_options_from(c);
  options.egress_bytes_per_second = c.egress.producer;
  return options;
}

transport::TransportOptions member_transport_options(const config::Config& c, int member_rank) {
  auto options = transport_options_from(c);
  options.egress_bytes_per_second = c.egress.members;
  for (const auto& member : config::member_list(c)) {
    if (member.rank == member_rank && member.egress) options.egress_bytes_per_second = *member.egress;
  }
  return options;
}

ReceiverOptions receiver_options_from(const config::Config& c) {
  ReceiverOptions options;
  options.retain_versions = c.retain_versions;
  options.connect_timeout = c.timeouts.connect;
  options.join_timeout = c.timeouts.join;
  options.peer_timeout = c.timeouts.peer;
  options.producer_loss_timeout = c.timeouts.producer_loss;
  options.idle_timeout = c.timeouts.refit * 4;
  options.allow_insecure = c.allow_insecure;
  return options;
}

ProducerOptions producer_options_from(const config::Config& c) {
  ProducerOptions options;
  options.topology = parse_topology_kind(c.topology);
  options.cluster = c.producer_cluster;
  options.encode.chunk_bytes = c.chunk_bytes;
  options.version_timeout = c.timeouts.refit;
  // Every member's HELLO + READY: timeouts.join, but never less than the refit bound this always
  // allowed (launchers may start receivers long after the producer on a busy machine).
  options.join_timeout = std::max(c.timeouts.join, c.timeouts.refit);
  options.peer_timeout = c.timeouts.peer;
  options.retain_versions = c.retain_versions;
  options.allow_insecure = c.allow_insecure;
  options.delegate_commit = config::commit_is_delegated(c);
  return options;
}

objstore::S3Options store_s3_options(const config::Config& c) {
  objstore::S3Options options;
  options.endpoint = c.store.endpoint;
  options.region = c.store.region;
  options.bucket = c.store.bucket;
  options.path_style = c.store.addressing == "path";
  options.connect_timeout = c.timeouts.connect;
  return options;
}

StoreLayout store_layout(const config::Config& c) {
  // With a secret_file the store's versions are signed and checked with it, as the tree's links are.
  return StoreLayout{c.store.prefix,
                     c.store.part_bytes,
                     c.store.parallel,
                     c.store.retain_versions,
                     c.secret_file.empty() ? std::string() : transport::load_secret(c.secret_file),
                     c.store.inline_bytes};
}

}  // namespace deltacast::tree
