// The producer's baseline as the last-resort snapshot source: serve_fetch streams a snapshot of
// it to a rejoining member no peer could serve (BaselineStore keeps it consistent while refits go on).
#include "tree/producer/impl.h"

namespace deltacast::tree {

void Producer::Impl::serve_fetch(std::shared_ptr<transport::Connection> connection, const Fetch& fetch) {
  CatchupSender sender(std::move(connection), fetch.rank, options.max_inflight_bytes_per_root, options.peer_timeout,
                       stopping);
  FetchEnd end{fetch.version, 0, 0, ""};
  std::unique_ptr<BaselineStore::Snapshot> snapshot;
  if (group) {
    end.errc = static_cast<uint32_t>(Errc::state);
    end.message = "a producer group's rank holds its part only (take a snapshot from a peer)";
  } else if (fetch.mode != CatchupMode::snapshot) {
    end.errc = static_cast<uint32_t>(Errc::not_found);
    end.message = "the producer keeps no frames of committed versions (replay them from a peer)";
  } else {
    try {
      snapshot = baseline->open_snapshot();
      end.version = snapshot->version();
      end.digest = snapshot->digest();
    } catch (const Error& e) {
      end.errc = static_cast<uint32_t>(e.code());
      end.message = e.what();
    }
  }
  if (end.errc != 0) return sender.finish(end);
  const uint32_t count = sender.send_snapshot(
      manifest, max_message_bytes, end.version,
      [&](uint32_t tensor, uint64_t offset, std::span<std::byte> out) { snapshot->read(tensor, offset, out); });
  log->info("producer: served a snapshot of version {} ({} pieces) to rank {}: no peer could", end.version, count,
            fetch.rank);
  sender.finish(end);
}

}  // namespace deltacast::tree
