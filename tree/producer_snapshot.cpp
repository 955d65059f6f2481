// The producer's baseline as the last-resort snapshot source (producer_impl.h): adopt_baseline,
// which keeps open snapshot streams consistent, and serve_fetch, which streams one.
#include <cstring>

#include "tree/producer_impl.h"

namespace deltacast::tree {
namespace {

// The old bits of every element that differs between `old_bits` and `new_bits` (one tensor of
// `width`-byte elements), compared a block at a time so that unchanged blocks cost a memcmp.
void collect_changes(uint32_t tensor, unsigned width, std::span<const std::byte> old_bits,
                     std::span<const std::byte> new_bits, std::vector<SnapshotPatches::Patch>& out) {
  constexpr size_t kBlock = 4096;
  for (size_t at = 0; at < old_bits.size(); at += kBlock) {
    const size_t n = std::min(kBlock, old_bits.size() - at);
    if (std::memcmp(old_bits.data() + at, new_bits.data() + at, n) == 0) continue;
    for (size_t b = at; b < at + n; b += width) {
      if (std::memcmp(old_bits.data() + b, new_bits.data() + b, width) == 0) continue;
      uint32_t bits = 0;
      std::memcpy(&bits, old_bits.data() + b, width);  // little-endian host
      out.push_back({tensor, b / width, bits});
    }
  }
}

}  // namespace

void Producer::Impl::adopt_baseline(const codec::ConstWeights& next, uint64_t v,
                                    std::optional<codec::StateDigest> digest) {
  std::unique_lock lock(baseline_mutex);
  if (!baseline_readers.empty()) {
    std::vector<SnapshotPatches::Patch> changed;
    for (uint32_t t = 0; t < baseline.size(); ++t)
      collect_changes(t, static_cast<unsigned>(codec::dtype_unit_size(manifest.at(t).dtype)), baseline[t], next.tensors[t],
                      changed);
    for (auto* reader : baseline_readers) reader->record(changed);
  }
  for (size_t t = 0; t < baseline.size(); ++t)  // an empty tensor may have no storage (memcpy of null is UB)
    if (!baseline[t].empty()) std::memcpy(baseline[t].data(), next.tensors[t].data(), baseline[t].size());
  baseline_digest = digest ? std::move(*digest) : codec::StateDigest::full_scan(baseline_weights(), options.encode.threads);
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
