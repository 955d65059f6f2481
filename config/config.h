#pragma once
// Typed configuration of a deltacast cluster run. Settings come from three layers, later ones
// winning: a YAML file, then DELTACAST_* environment variables, then command-line flags. Every
// layer goes through the same typed setters, so a bad value is rejected the same way wherever it
// came from, and the message names its source ("FILE:LINE:COL", "env DELTACAST_X", "flag --set").
// All failures throw Error(Errc::config, ...). docs/config.md documents every key.
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/env.h"

namespace deltacast::config {

// One receiver. rank is its member index (0..n-1) in the relay topology.
struct MemberConfig {
  int rank = 0;
  std::string host;
  std::string cluster = "default";
  int port = 0;     // used to build url when url is empty
  std::string url;  // transport URL the member listens on, e.g. tcp://127.0.0.1:29501
  // This member's egress cap in bytes per second (0 = none); unset: egress.members applies.
  std::optional<uint64_t> egress;
};

// Shorthand for a local run: `count` members on `host`, member r listening on base_port + r.
struct LocalMembers {
  int count = 0;
  std::string host = "127.0.0.1";
  int base_port = 29501;
  std::string cluster = "local";
};

struct Timeouts {
  std::chrono::milliseconds connect{5000};
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds peer{10000};   // a peer silent this long is declared dead
  std::chrono::milliseconds refit{600000}; // bound on one whole refit
  // A receiver at start: how long it keeps trying to reach the producer (each attempt bounded by
  // `connect`) and waits for WELCOME. The producer: how long it waits for every member to join.
  std::chrono::milliseconds join{120000};
  // A receiver whose producer link failed keeps its committed version and retries reaching a
  // (restarted) producer this long before exiting non-zero.
  std::chrono::milliseconds producer_loss{60000};
};

// Where the producer's versions come from. kind "synth": the synthetic trainer, a model of
// `params` BF16 parameters updated by Adam-like steps. kind "watch": a real trainer's checkpoints,
// each a subdirectory or a .safetensors file of `dir` (tools/run/checkpoint_watch.h).
struct TrainerConfig {
  std::string kind = "synth";
  std::string dir;  // watch: the directory the trainer writes checkpoints into
  uint64_t params = 50'000'000;
  int steps = 3;    // refits after the bootstrap; 0 (watch only): until SIGTERM
  double lr = 1e-5;
  uint64_t seed = 1;
  // watch: how each new checkpoint is read for its refit. "pread": in cache-sized pieces, the same
  // speed whatever folio sizes the page cache holds a just-written file in; "map": through its
  // file mappings (for comparison; 3x slower on a just-written checkpoint: docs/performance.md).
  std::string read = "pread";
};

// Egress caps, in bytes per second (0 = none): on the producer's uplink (all its connections
// together) and on every member's (a member's own `egress` wins). Paced in the transport
// (transport/paced/paced_transport.h) with a token bucket `burst` bytes deep (0 = 10 ms at the
// rate, at least 64 KiB).
struct EgressConfig {
  uint64_t producer = 0;
  uint64_t members = 0;
  uint64_t burst = 0;
};

struct OutputConfig {
  std::string dir = "deltacast-out";  // run artefacts; the producer's state file (for --resume)
  std::string metrics_file;  // empty: no metrics file
  // Each process also logs to this file, its rank inserted before the extension
  // (run.log -> run.rank3.log: log_file_for_rank); empty: stderr only.
  std::string log_file;
  // A receiver writes every committed version it holds as <checkpoint_dir>/v<version>/ in the
  // producer's shard layout, and points <checkpoint_dir>/latest at the newest; at start it
  // rejoins from latest (tools/run/checkpoint_output.h). "{rank}" is replaced by the rank. Empty:
  // nothing written. The producer ignores it.
  std::string checkpoint_dir;
  uint32_t keep = 2;  // versions kept in checkpoint_dir (>= 1)
};

// Versions through an S3-compatible object store (docs/object-storage.md): the producer publishes
// every committed version under bucket/prefix, and members whose cluster label is in `clusters`
// take their versions from the store instead of the producer's tree. In each such cluster the
// member of lowest rank reads the store (the cluster's gateway) and roots the cluster's own relay
// tree for the others, so each version crosses the boundary once per cluster. Off while `endpoint`
// is empty. Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN) or the
// shared credentials file, never the config.
struct StoreConfig {
  std::string endpoint;  // http(s)://host[:port]; empty: no store
  std::string region = "us-east-1";
  std::string bucket;
  std::string prefix = "deltacast";          // the version chain's objects, under bucket/prefix/
  std::string addressing = "path";           // path | virtual (https://BUCKET.host/KEY)
  uint64_t part_bytes = uint64_t{16} << 20;  // multipart part size (5 MiB .. 5 GiB)
  uint32_t parallel = 4;                     // parts uploaded and ranges downloaded at a time (1..64)
  // Deltas and snapshots kept in the store (1..1024); a snapshot goes up at least this often.
  uint32_t retain_versions = 16;
  // A whole version (snapshot) every this many versions, for members further behind than
  // retain_versions; 0: version 1 only (and the version after a publish that failed).
  uint32_t snapshot_every = 0;
  // A version whose frames total at most this (0 .. 64 MiB) is stored inline, in its manifest
  // object: a gateway's poll gets it in one request. 0: never.
  uint64_t inline_bytes = uint64_t{4} << 20;
  // The pause between a gateway's polls (one GET of the next version's manifest each, so about
  // one request per RTT + poll; a found version is fetched at once).
  std::chrono::milliseconds poll{25};
  std::vector<std::string> clusters;  // member cluster labels that take versions from the store
  bool enabled() const noexcept { return !endpoint.empty(); }
};

struct Config {
  std::string producer;            // producer's transport URL (rendezvous address)
  std::string transport = "tcp";   // transport scheme, e.g. tcp, ofi+tcp, ucx, loopback
  std::string topology = "double_binary";  // binary | double_binary | chain
  // The producer's cluster label: when members carry it too, every tree is rooted in that cluster
  // (each boundary crossed once per tree, the producer's edge counted). Empty: its own cluster.
  std::string producer_cluster;
  // "manual": members' `cluster` labels as written. "auto": from the clusters a `deltacast probe`
  // found (probe_file; resolve_clusters applies them, including the producer's cluster), or, with
  // no probe_file, a quick probe `deltacast run` makes at start (O(N) measurements).
  std::string clusters = "manual";
  std::string probe_file;
  // Who takes each version's joint-commit decision: "producer"; "delegated" (a member next to the
  // receivers: one round trip per refit across a WAN instead of three; docs/protocol.md); "auto":
  // delegated when producer_cluster is named and no member carries it (the producer is across a
  // cluster boundary from every receiver), producer otherwise.
  std::string commit = "auto";
  uint64_t chunk_bytes = 4ull << 20;
  // A producer group (docs/producer-group.md): the first `producers` ranks of the job are producer
  // ranks, each sending its part of every version; rank 0 (at `producer`) coordinates, rank g >= 1
  // listens at the producer's host on its port + g. 1..1024; 1: one producer.
  uint32_t producers = 1;
  // Which part of the model each producer rank sends (docs/config.md): "balanced" (by bytes, the
  // default), "shards" (a sharded checkpoint's files in consecutive blocks, one block a rank) or a
  // JSON array with one entry per rank (tensor names, or [name, first, end] element ranges).
  std::string group_parts = "balanced";
  // Committed versions whose frames every member keeps to serve a rejoining member's replay
  // (a delta is ~1% of the checkpoint). 0..1024.
  uint32_t retain_versions = 4;
  std::vector<MemberConfig> members;          // explicit list, or empty when local_members is set
  std::optional<LocalMembers> local_members;  // count + base port shorthand
  Timeouts timeouts;
  std::string secret_file;  // shared secret for peer authentication; empty: no authentication
  // Run without a secret although an address is reachable from other machines (refused otherwise).
  bool allow_insecure = false;
  TrainerConfig trainer;
  EgressConfig egress;
  OutputConfig output;
  StoreConfig store;
  std::string log_level = "info";  // trace | debug | info | warn | error | off
};

// Environment lookups (DELTACAST_* overrides) go through deltacast::EnvLookup (util/env.h):
// process_env() for the real environment, a map in tests.

// Parses YAML text. `source` names it in messages (usually the file path). Rejects malformed
// YAML, unknown keys, wrong types and bad values with "SOURCE:LINE:COL: message". Does not read
// the environment. Throws Error(config).
Config parse_config(std::string_view yaml_text, const std::string& source);

// Reads and parses a file, applies environment overrides, and validates. Throws Error(config)
// (also when the file cannot be read).
Config load_config(const std::string& path, const EnvLookup& env = process_env());

// Sets one key given as a dotted path ("chunk_bytes", "timeouts.connect", "trainer.steps") from
// its string form, as env variables and flags supply it. `source` names the origin for messages.
// Throws Error(config) for an unknown key or a bad value.
void apply_override(Config& config, std::string_view key, std::string_view value, const std::string& source);

// Applies DELTACAST_<KEY> for every overridable key (dots become underscores, upper case):
// DELTACAST_CHUNK_BYTES, DELTACAST_TOPOLOGY, DELTACAST_TRANSPORT, DELTACAST_PRODUCER,
// DELTACAST_TIMEOUTS_CONNECT, DELTACAST_TRAINER_STEPS, ... Unset variables are skipped.
void apply_env_overrides(Config& config, const EnvLookup& env);

// Applies flag assignments "key=value" (e.g. from repeated --set). Throws Error(config).
void apply_flag_overrides(Config& config, const std::vector<std::string>& assignments);

// The dotted keys apply_override accepts, in documentation order.
const std::vector<std::string>& overridable_keys();

// Checks cross-field rules (producer set, members present, ranks 0..n-1 each once, ports in
// range). load_config calls it; call again after flag overrides. Throws Error(config).
void validate(const Config& config);

// The member list: the explicit members, or the local shorthand expanded to
// transport://host:(base_port + r). Sorted by rank.
std::vector<MemberConfig> member_list(const Config& config);
// A producer group's data URLs: [0] the producer's (`producer`), [g] its scheme and host with the
// port + g. Throws Error(config) when `producers` > 1 and the producer URL has no port, or a rank's
// port is out of range.
std::vector<std::string> producer_rank_urls(const Config& config);

// Where member `member_rank` takes its versions from (store.clusters; docs/object-storage.md).
struct VersionRoute {
  enum class Kind {
    producer,        // the producer's relay tree
    gateway,         // the store: the lowest rank of a store cluster, which roots that cluster's tree
    behind_gateway,  // its store cluster's tree, rooted at the gateway
  };
  Kind kind = Kind::producer;
  uint32_t tree_rank = 0;   // its receiver rank (1..) in the tree it joins; 0 for a gateway
  int gateway = -1;         // behind_gateway: the gateway's member rank; gateway: its own
  std::vector<int> behind;  // gateway: the member ranks behind it, tree rank i + 1 at [i]
};
// Throws Error(config) for a member rank outside the members.
VersionRoute version_route(const Config& config, int member_rank);
// The members that join the producer's own tree (no store cluster's label).
uint32_t producer_tree_members(const Config& config);

// Whether `commit` delegates each version's commit decision: `delegated`, or `auto` when
// producer_cluster is named and no member carries that label (docs/config.md).
bool commit_is_delegated(const Config& config);
// commit_is_delegated for the config `deltacast run` would use after a probe found `clusters`: with
// clusters: auto they replace the labels first (apply_probe_clusters), else the config's own count.
// Throws what apply_probe_clusters throws.
bool commit_is_delegated(Config config, const std::vector<std::vector<int>>& clusters);

// clusters: auto with a probe_file: reads it (a `deltacast probe --out` JSON) and applies its
// clusters (apply_probe_clusters). Does nothing for clusters: manual, nor without a probe_file (the
// CLI then runs a quick probe at start and applies what it finds). Throws Error(config) when the
// file cannot be read or parsed, or its rank count is not the job's (members + 1). Call after
// overrides, before member_list is used.
void resolve_clusters(Config& config);

// The clusters (lists of job ranks) of a `deltacast probe --out` report at `path`. Throws
// Error(config) naming the file when it cannot be read or is not a probe report, when its rank
// count is not job_size (0: any count), or when a cluster names a rank outside the report's.
std::vector<std::vector<int>> read_probe_clusters(const std::string& path, size_t job_size);

// The label apply_probe_clusters gives job rank `rank` (0 = the producer): "probe-K" for the
// cluster K that holds it; empty when none does (a rank the probe did not reach).
std::string probe_cluster_label(const std::vector<std::vector<int>>& clusters, int rank);

// Gives every member the label "probe-K" of the cluster K (a list of job ranks) holding its job
// rank (member r is job rank r + 1; members in no cluster keep their own label) and
// producer_cluster the label of rank 0's cluster. The local shorthand becomes an explicit list.
// Throws Error(config) naming `source` when a cluster names a rank outside 0..members.
void apply_probe_clusters(Config& config, const std::vector<std::vector<int>>& clusters, const std::string& source);

// output.checkpoint_dir for one process: every "{rank}" replaced by the rank.
std::string checkpoint_dir_for_rank(const std::string& checkpoint_dir, int rank);

// output.log_file for one process: the rank inserted before the file name's last extension
// ("logs/run.log", 3 -> "logs/run.rank3.log"; "run" -> "run.rank3"; a leading dot starts no
// extension: ".log" -> ".log.rank3"). Empty stays empty.
std::string log_file_for_rank(const std::string& log_file, int rank);

// "4MiB", "1GiB", "512KiB", "4096", "500M" (decimal: K=1e3, M=1e6, G=1e9, T=1e12; an optional
// trailing B is accepted: "4MB"), "1.5GiB". Throws Error(config) for negative, empty, unknown
// units or overflow; the message does not include a source prefix.
uint64_t parse_size(std::string_view text);
// A rate in bytes per second: bits per second with "bit/s", "Kbit/s", "Mbit/s", "Gbit/s",
// "Tbit/s" (also "Mbps"/"Gbps"-style and without "/s": "100Mbit"), or bytes per second with "B/s",
// "KB/s", "MB/s", "GB/s" (decimal) or "KiB/s", "MiB/s", "GiB/s"; fractions allowed ("2.5Gbit/s").
// A unit is required (bits or bytes?). "0" and "unlimited" give 0 (no cap). Rounded to whole
// bytes; a non-zero rate below 1 byte/s is an error. Throws Error(config).
uint64_t parse_rate(std::string_view text);
// "500ms", "5s", "2m", "1h" (a unit is required). Throws Error(config).
std::chrono::milliseconds parse_duration(std::string_view text);

}  // namespace deltacast::config
