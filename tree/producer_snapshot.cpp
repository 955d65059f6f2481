// The producer's baseline as the last-resort snapshot source (producer_impl.h): adopt_baseline,
// which keeps open snapshot streams consistent, and serve_fetch, which streams one.
#include <cstring>

#include "tree/producer_impl.h"

namespace deltacast::tree {

void Producer::Impl::adopt_baseline(const codec::ConstWeights& next, uint64_t v,
                                    std::optional<codec::StateDigest> digest) {
  std::unique_lock lock(baseline_mutex);
  std::vector<SnapshotPatches::Patch> changed;
  overwrite_with(baseline, next, baseline_readers.empty() ? nullptr : &changed);
  for (auto* reader : baseline_readers) reader->record(changed);
  baseline_digest =
      digest ? std::move(*digest) : codec::StateDigest::full_scan(baseline_weights(), options.encode.threads);
  baseline_version = v;
}

void Producer::Impl::adopt_baseline(const codec::WeightsReader& next, uint64_t v, codec::StateDigest digest) {
  std::unique_lock lock(baseline_mutex);
  std::vector<SnapshotPatches::Patch> changed;
  try {
    overwrite_with(baseline, next, baseline_readers.empty() ? nullptr : &changed);
  } catch (const Error& e) {
    // Open snapshot streams keep their version: they get the old bits of what was overwritten.
    for (auto* reader : baseline_readers) reader->record(changed);
    baseline_lost = "reading version " + std::to_string(v) + " (committed) into its baseline failed: " + e.what() +
                    "; a producer resumed from its state file continues the chain";
    throw Error(Errc::io, baseline_lost);
  }
  for (auto* reader : baseline_readers) reader->record(changed);
  baseline_digest = std::move(digest);
  baseline_version = v;
}

void Producer::Impl::serve_fetch(std::shared_ptr<transport::Connection> connection, const Fetch& fetch) {
  CatchupSender sender(std::move(connection), fetch.rank, options.max_inflight_bytes_per_root, options.peer_timeout,
                       stopping);
  FetchEnd end{fetch.version, 0, 0, ""};
  SnapshotPatches patches;
  {
    std::unique_lock lock(baseline_mutex);
    if (fetch.mode != CatchupMode::snapshot) {
      end.errc = static_cast<uint32_t>(Errc::not_found);
      end.message = "the producer keeps no frames of committed versions (replay them from a peer)";
    } else if (!baseline_lost.empty()) {
      end.errc = static_cast<uint32_t>(Errc::state);
      end.message = "the producer holds no committed version: " + baseline_lost;
    } else if (baseline_version == 0) {
      end.errc = static_cast<uint32_t>(Errc::state);
      end.message = "the producer has committed no version yet";
    } else {
      end.version = baseline_version;
      end.digest = baseline_digest.combined();
      baseline_readers.push_back(&patches);
    }
  }
  if (end.errc != 0) return sender.finish(end);
  struct Unregister {
    Producer::Impl& d;
    SnapshotPatches* p;
    ~Unregister() {
      std::unique_lock lock(d.baseline_mutex);
      std::erase(d.baseline_readers, p);
    }
  } unregister{*this, &patches};
  const uint32_t count = sender.send_snapshot(
      manifest, max_message_bytes, end.version, [&](uint32_t tensor, uint64_t offset, std::span<std::byte> out) {
        const unsigned width = static_cast<unsigned>(codec::dtype_unit_size(manifest.at(tensor).dtype));
        std::shared_lock lock(baseline_mutex);
        std::memcpy(out.data(), baseline[tensor].data() + offset, out.size());
        patches.restore_and_advance(tensor, offset / width, (offset + out.size()) / width, width, out);
      });
  log->info("producer: served a snapshot of version {} ({} pieces) to rank {}: no peer could", end.version, count,
            fetch.rank);
  sender.finish(end);
}

}  // namespace deltacast::tree
