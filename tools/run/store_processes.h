#pragma once
// The processes of `deltacast run` that meet at an object store (store.endpoint; docs/object-
// storage.md): a producer with no member in its own tree, and a store cluster's gateway. The
// producer with members in its tree publishes to the store from producer_process.cpp; the members
// behind a gateway are ordinary receivers of the gateway's tree (receiver_process.cpp).
#include "config/config.h"
#include "tools/run/run_support.h"
#include "tree/launch_env.h"

namespace deltacast::tools {

// Rank 0 when every member is in a store cluster: reads the trainer's versions and publishes them
// to the store only (version 1 whole, then deltas; store.snapshot_every), then end.json. Writes
// the JSON report (--report, else output.metrics_file). Throws what the store, the codec or the
// version source throw, and Error(io) when a version could not be published.
void run_store_producer(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o);

// A store cluster's gateway (config::VersionRoute::Kind::gateway): takes every version from the
// store (replaying deltas, or the newest snapshot when it is further behind) and, when members are
// behind it, roots their relay tree: it forwards each delta's frames as stored, so the boundary is
// crossed once per cluster. Ends when it holds the version end.json names. Writes --summary as a
// receiver does, plus what it downloaded. Throws Error(timeout) when the store stays unreadable
// for timeouts.producer_loss (or shows no model within timeouts.join), Error(state) when a
// gateway with members fell further behind than the store retains.
void run_store_gateway(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o,
                       const config::VersionRoute& route);

}  // namespace deltacast::tools
