#include "tools/run/receiver_process.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "codec/digest.h"
#include "codec/placement.h"
#include "config/placement_file.h"
#include "tools/run/checkpoint_output.h"
#include "tools/run/fault.h"
#include "transport/transport.h"
#include "tree/config_options.h"
#include "tree/receiver.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

// A receiver's buffers and what they hold at start: version 0 (all zeros), or the version that
// <output.checkpoint_dir>/latest holds (a restarted receiver rejoins from it by replaying deltas).
struct Held {
  uint64_t version = 0;
  uint64_t digest = 0;
  bool shard = false;                       // a placed receiver's buffers (--placement)
  std::optional<codec::Manifest> manifest;  // the order the buffers were recorded in
  std::vector<std::vector<std::byte>> buffers;
};

Held held_at_start(const std::string& checkpoint_dir, int rank) {
  if (checkpoint_dir.empty()) return {};
  try {
    auto latest = load_latest(checkpoint_dir, std::max(1u, std::thread::hardware_concurrency()));
    if (!latest) return {};
    logger("run")->info("rank {}: {} holds version {} (digest {:016x}, verified); rejoining with it", rank,
                        latest->path.string(), latest->version, latest->digest);
    return Held{latest->version, latest->digest, latest->shard, std::move(latest->manifest),
                std::move(latest->buffers)};
  } catch (const Error& e) {
    logger("run")->warn("rank {}: cannot rejoin from {}/latest ({}); starting from version 0", rank, checkpoint_dir,
                        e.what());
    return {};
  }
}

// Buffers for `manifest`: the held bits when they are that model (matched by name), else zeros.
std::vector<std::vector<std::byte>> buffers_for(const codec::Manifest& manifest, Held& held) {
  std::vector<std::vector<std::byte>> out;
  for (size_t i = 0; i < manifest.size(); ++i) {
    const auto& t = manifest.tensors()[i];
    const auto j = held.manifest ? held.manifest->find(t.name) : std::nullopt;
    if (j && held.manifest->at(*j).dtype == t.dtype && held.manifest->at(*j).shape == t.shape)
      out.push_back(std::move(held.buffers[*j]));
    else
      out.emplace_back(t.nbytes());
  }
  return out;
}

// The receiver's options from the config and the launcher; the --fault, if any, installed.
tree::ReceiverOptions receiver_options(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o,
                                       bool gated) {
  const auto members = config::member_list(c);
  const auto& me = members.at(static_cast<size_t>(env.member_rank()));
  tree::ReceiverOptions options = tree::receiver_options_from(c);
  // Its rank in the tree it joins: the producer's, or its store cluster's gateway's (store.clusters).
  const config::VersionRoute route = config::version_route(c, env.member_rank());
  options.rank = route.tree_rank;
  options.producer_url = route.kind == config::VersionRoute::Kind::behind_gateway
                             ? members.at(static_cast<size_t>(route.gateway)).url
                             : env.require_rendezvous();
  options.listen_url = me.url;
  options.cluster = me.cluster;
  options.gated = gated;
  if (!o.fault.empty()) {
    const Fault f = parse_fault(o.fault);
    if (f.at_commit) throw Error(Errc::invalid_argument, "--fault " + o.fault + ": ':commit' is a producer fault");
    install_fault(options, f, env.receiver_rank());
  }
  return options;
}

// The buffers of a placement as a model of their own (names, dtypes, shapes): what its shard is.
codec::Manifest shard_manifest(const codec::Placement& placement) {
  std::vector<codec::TensorInfo> infos;
  for (uint32_t b = 0; b < placement.buffers().size(); ++b)
    infos.push_back({placement.buffers()[b].name, placement.dtype(b), placement.shape(b)});
  return codec::Manifest(std::move(infos));
}

// Joins with what `held` holds. When the producer does not continue from it (another run, another
// model), starts over from version 0 as a new member (`held` is reset; latest is replaced once the
// bootstrap is written). Returns the producer's manifest, owned by `receiver`.
const codec::Manifest& join_with(std::unique_ptr<tree::Receiver>& receiver, transport::Transport& transport,
                                 const tree::ReceiverOptions& options, Held& held, const std::string& checkpoint_dir) {
  receiver = std::make_unique<tree::Receiver>(transport, options);
  try {
    const codec::Manifest& manifest = receiver->join(held.version, held.digest);
    if (held.manifest && held.manifest->digest() != manifest.digest())
      throw Error(Errc::version_mismatch, "it holds another model than the producer's (or in another order)");
    return manifest;
  } catch (const Error& e) {
    if (held.version == 0 || (e.code() != Errc::verify_failed && e.code() != Errc::version_mismatch)) throw;
    logger("run")->warn("rank {}: the producer refused version {} from {}/latest: {}; rejoining from version 0",
                        options.rank, held.version, checkpoint_dir, e.what());
    held = Held{};
    receiver.reset();
    receiver = std::make_unique<tree::Receiver>(transport, options);
    return receiver->join();
  }
}

// A placed receiver joins with the shard DIR/latest holds when it is this placement's buffers
// (same names, dtypes and shapes) and the producer continues from its version; otherwise it starts
// over from version 0 (`held` reset). Returns the compiled placement.
codec::Placement join_placed(std::unique_ptr<tree::Receiver>& receiver, transport::Transport& transport,
                             const tree::ReceiverOptions& options, Held& held, const std::string& checkpoint_dir) {
  auto log = logger("run");
  if (held.version > 0 && !held.shard) {
    log->warn("rank {}: {}/latest holds the whole model, not this placement's buffers; starting from version 0",
              options.rank, checkpoint_dir);
    held = Held{};
  }
  for (;;) {
    receiver = std::make_unique<tree::Receiver>(transport, options);
    try {
      const codec::Manifest& manifest = receiver->join(held.version, held.digest);
      auto placement = codec::Placement::compile(manifest, options.placement);
      if (held.version == 0 || held.manifest->digest() == shard_manifest(placement).digest()) return placement;
      log->warn("rank {}: {}/latest holds other buffers than this placement's; rejoining from version 0", options.rank,
                checkpoint_dir);
    } catch (const Error& e) {
      if (held.version == 0 || (e.code() != Errc::verify_failed && e.code() != Errc::version_mismatch)) throw;
      log->warn("rank {}: the producer refused version {} from {}/latest: {}; rejoining from version 0", options.rank,
                held.version, checkpoint_dir, e.what());
    }
    held = Held{};
    receiver.reset();
  }
}

// The committed deltas this member kept for replay (retain_versions), now and at the most.
nlohmann::json retained_json(const tree::ReceiverStats& s) {
  return {{"versions", s.retained_versions},
          {"bytes", s.retained_bytes},
          {"peak_versions", s.retained_versions_peak},
          {"peak_bytes", s.retained_bytes_peak},
          {"largest_version_bytes", s.retained_largest_version_bytes}};
}

// --summary: what the tests and the chaos harness compare across ranks.
void write_summary(const std::string& path, int rank, const tree::RunSummary& summary,
                   const codec::ConstWeights& weights, uint64_t started_at, const CheckpointDirWriter* writer,
                   const std::map<uint64_t, double>& committed_at) {
  nlohmann::json s = {{"rank", rank},
                      {"version", summary.version},
                      {"sha256", weights_sha256(weights)},
                      // Taken again from the bits (not the session's running record): what a
                      // producer group's report names (no process of the group holds every bit).
                      {"digest", hex64(codec::StateDigest::full_scan(weights).combined())},
                      {"started_at_version", started_at},
                      {"frames_received", summary.stats.frames_received},
                      {"frames_forwarded", summary.stats.frames_forwarded},
                      {"versions_committed", summary.stats.versions_committed},
                      {"versions_aborted", summary.stats.versions_aborted},
                      {"snapshots_taken", summary.stats.snapshots_taken},
                      {"last_snapshot_source", summary.stats.last_snapshot_source},  // 0: the producer
                      {"peak_rss_bytes", peak_rss_bytes()},
                      {"retained", retained_json(summary.stats)}};
  nlohmann::json at = nlohmann::json::object();  // when each version became active here (unix seconds)
  for (const auto& [v, t] : committed_at) at[std::to_string(v)] = t;
  s["committed_at_unix"] = at;
  if (writer) {
    const auto w = writer->stats();
    s["checkpoint_dir"] = {{"latest", w.latest}, {"written", w.written}, {"skipped", w.skipped}, {"failed", w.failed}};
  }
  write_json(path, s);
}

// A receiver with a placement (--placement): it holds only its slices, in buffers of its own
// (docs/placement.md). With output.checkpoint_dir it writes its buffers (its shard) as each version's
// checkpoint, and a restart rejoins from the shard DIR/latest holds.
void run_placed_receiver(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o,
                         const std::string& placement_path, const std::string& checkpoint_dir) {
  auto log = logger("run");
  const int rank = env.receiver_rank();
  auto transport = transport::make_transport(c.transport, tree::member_transport_options(c, env.member_rank()));
  tree::ReceiverOptions options = receiver_options(c, env, o, /*gated=*/!checkpoint_dir.empty());
  // Behind a gateway it is placed in the cluster's tree as in the producer's (the gateway encodes
  // each version again for its placed members); a gateway, or a store-only member, applies whole
  // versions from the store.
  if (config::version_route(c, env.member_rank()).kind == config::VersionRoute::Kind::gateway)
    throw Error(Errc::config, "rank " + std::to_string(rank) +
                                  ": a placed receiver (--placement) cannot be its store cluster's gateway (the member "
                                  "of lowest rank of a cluster in store.clusters reads whole versions from the store)");
  options.placement = config::load_placement_file(placement_path);
  std::unique_ptr<tree::Receiver> receiver;  // declared first: the writer (which reads it) goes first
  std::unique_ptr<CheckpointDirWriter> writer;
  auto announce = std::make_shared<std::atomic<CheckpointDirWriter*>>(nullptr);
  options.on_active = [announce, &receiver](uint64_t version) {
    if (auto* w = announce->load()) w->committed(version, receiver->layout());
  };
  Held held = held_at_start(checkpoint_dir, rank);
  const codec::Placement placement = join_placed(receiver, *transport, options, held, checkpoint_dir);
  const codec::Manifest shard = shard_manifest(placement);
  std::vector<std::vector<std::byte>> buffers;
  if (held.version > 0) {
    buffers = std::move(held.buffers);
  } else {
    for (const auto& t : shard.tensors()) buffers.emplace_back(t.nbytes());
  }
  std::vector<std::span<std::byte>> spans;
  spans.reserve(buffers.size());
  for (auto& b : buffers) spans.emplace_back(b.data(), b.size());
  receiver->attach_placed(options.placement, spans, held.version, held.digest);
  codec::ConstWeights weights{&shard, {}};
  for (const auto& b : buffers) weights.tensors.emplace_back(b.data(), b.size());
  log->info("rank {}: holds {} buffers ({} bytes) of its placement {}", rank, shard.size(), shard.total_bytes(),
            placement_path);
  if (!checkpoint_dir.empty())
    writer = std::make_unique<CheckpointDirWriter>(
        CheckpointDirWriter::Options{checkpoint_dir, c.output.keep, o.slow_disk_bytes_per_second,
                                     std::max(1u, std::thread::hardware_concurrency()), /*shard=*/true},
        *receiver, weights, held.version);
  announce->store(writer.get());
  const tree::RunSummary summary = receiver->run();
  announce->store(nullptr);
  const uint64_t written = writer ? writer->finish() : 0;
  receiver->apply_pending();
  log->info("rank {}: active version {} (digest {:016x}), {} frames received, {} forwarded, {} committed, {} aborted{}",
            rank, summary.version, summary.digest, summary.stats.frames_received, summary.stats.frames_forwarded,
            summary.stats.versions_committed, summary.stats.versions_aborted,
            writer ? ", " + checkpoint_dir + "/latest = version " + std::to_string(written) : "");
  if (!o.summary_path.empty()) {
    nlohmann::json s{{"rank", rank},
                     {"version", summary.version},
                     {"placement", placement_path},
                     {"buffers", shard.size()},
                     {"sha256", weights_sha256(weights)},  // of its buffers, in placement order
                     {"digest", hex64(summary.digest)},    // the whole version's name
                     {"started_at_version", held.version},
                     {"frames_received", summary.stats.frames_received},
                     {"frames_forwarded", summary.stats.frames_forwarded},
                     {"versions_committed", summary.stats.versions_committed},
                     {"versions_aborted", summary.stats.versions_aborted},
                     {"snapshots_taken", summary.stats.snapshots_taken},
                     {"last_snapshot_source", summary.stats.last_snapshot_source},
                     {"peak_rss_bytes", peak_rss_bytes()},
                     {"retained", retained_json(summary.stats)}};
    if (writer) {
      const auto w = writer->stats();
      s["checkpoint_dir"] = {
          {"latest", w.latest}, {"written", w.written}, {"skipped", w.skipped}, {"failed", w.failed}};
    }
    write_json(o.summary_path, s);
  }
  if (summary.stats.versions_aborted > 0 || (summary.stats.versions_committed == 0 && held.version == 0))
    throw Error(Errc::verify_failed, "rank " + std::to_string(rank) + ": " +
                                         std::to_string(summary.stats.versions_aborted) + " versions aborted");
}

}  // namespace

void run_receiver(const config::Config& c, const tree::LaunchEnv& env, const RunOptions& o) {
  auto log = logger("run");
  if (!o.placement_path.empty())
    return run_placed_receiver(c, env, o, config::checkpoint_dir_for_rank(o.placement_path, env.receiver_rank()),
                               config::checkpoint_dir_for_rank(c.output.checkpoint_dir, env.receiver_rank()));
  auto transport = transport::make_transport(c.transport, tree::member_transport_options(c, env.member_rank()));
  const std::string checkpoint_dir = config::checkpoint_dir_for_rank(c.output.checkpoint_dir, env.receiver_rank());
  // Writing checkpoints: refits queue behind the apply gate, the writer thread applies them
  // between writes (tools/run/checkpoint_output.h), so the tree never waits for the disk.
  tree::ReceiverOptions options = receiver_options(c, env, o, /*gated=*/!checkpoint_dir.empty());
  std::unique_ptr<tree::Receiver> receiver;  // declared first: the writer (which reads it) goes first
  std::unique_ptr<CheckpointDirWriter> writer;
  // Set once the writer exists (on_active runs only inside run(), on the receiver's control thread,
  // where layout() is the version's own).
  auto announce = std::make_shared<std::atomic<CheckpointDirWriter*>>(nullptr);
  std::map<uint64_t, double> committed_at;  // written on the control thread, read after run()
  options.on_active = [announce, &receiver, &committed_at](uint64_t version) {
    committed_at[version] = unix_now();
    if (auto* w = announce->load()) w->committed(version, receiver->layout());
  };
  Held held = held_at_start(checkpoint_dir, env.receiver_rank());
  const codec::Manifest* manifest = &join_with(receiver, *transport, options, held, checkpoint_dir);
  std::vector<std::vector<std::byte>> buffers = buffers_for(*manifest, held);
  codec::MutableWeights weights{manifest, {}};
  for (auto& b : buffers) weights.tensors.emplace_back(b.data(), b.size());
  receiver->attach(weights, held.version);
  if (!checkpoint_dir.empty())
    writer = std::make_unique<CheckpointDirWriter>(
        CheckpointDirWriter::Options{checkpoint_dir, c.output.keep, o.slow_disk_bytes_per_second,
                                     std::max(1u, std::thread::hardware_concurrency())},
        *receiver, weights.as_const(), held.version);
  announce->store(writer.get());
  tree::RunSummary summary = receiver->run();
  // Everything committed reaches the buffers (and, with a checkpoint_dir, the disk) before the
  // summary reads them.
  announce->store(nullptr);
  const uint64_t written = writer ? writer->finish() : 0;
  receiver->apply_pending();
  log->info("rank {}: active version {} (digest {:016x}), {} frames received, {} forwarded, {} committed, {} aborted{}",
            env.receiver_rank(), summary.version, summary.digest, summary.stats.frames_received,
            summary.stats.frames_forwarded, summary.stats.versions_committed, summary.stats.versions_aborted,
            writer ? ", " + checkpoint_dir + "/latest = version " + std::to_string(written) : "");
  if (!o.summary_path.empty())
    write_summary(o.summary_path, env.receiver_rank(), summary, weights.as_const(), held.version, writer.get(),
                  committed_at);
  if (summary.stats.versions_aborted > 0 || (summary.stats.versions_committed == 0 && held.version == 0))
    throw Error(Errc::verify_failed, "rank " + std::to_string(env.receiver_rank()) + ": " +
                                         std::to_string(summary.stats.versions_aborted) + " versions aborted");
}

}  // namespace deltacast::tools
