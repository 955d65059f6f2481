#include "tree/snapshot_serve.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace deltacast::tree {

using namespace std::chrono_literals;

void SnapshotPatches::record(std::vector<Patch> written) {
  std::erase_if(written, [&](const Patch& p) {
    return p.tensor < cursor_tensor_ || (p.tensor == cursor_tensor_ && p.element < cursor_element_);
  });
  std::sort(written.begin(), written.end());
  layers_.push_back(std::move(written));
}

void SnapshotPatches::restore_and_advance(uint32_t tensor, uint64_t first, uint64_t end, unsigned width,
                                          std::span<std::byte> out) {
  for (auto layer = layers_.rbegin(); layer != layers_.rend(); ++layer) {
    auto it = std::lower_bound(layer->begin(), layer->end(), Patch{tensor, first, 0});
    for (; it != layer->end() && it->tensor == tensor && it->element < end; ++it)
      std::memcpy(out.data() + (it->element - first) * width, &it->bits, width);  // little-endian host
  }
  cursor_tensor_ = tensor;
  cursor_element_ = end;
  for (auto& layer : layers_)
    layer.erase(layer.begin(), std::lower_bound(layer.begin(), layer.end(), Patch{tensor, end, 0}));
}

CatchupSender::CatchupSender(std::shared_ptr<transport::Connection> connection, uint32_t fetcher,
                             size_t max_inflight_bytes, std::chrono::milliseconds peer_timeout,
                             const std::atomic<bool>& stopping)
    : link_(std::make_unique<SharedConnection>(std::move(connection)), fetcher, 0),
      fetcher_(fetcher),
      max_inflight_bytes_(max_inflight_bytes),
      peer_timeout_(peer_timeout),
      stopping_(stopping) {}

void CatchupSender::send(const SharedBytes& message, SharedBytes body) {
  if (body)
    link_.post_pair(message, *body, body);
  else
    link_.post(message);
  while (!link_.wait_below(max_inflight_bytes_, 100ms))
    if (link_.stalled_for() > peer_timeout_ || stopping_)
      throw Error(Errc::connection, "rank " + std::to_string(fetcher_) + " stopped fetching");
  if (link_.dead()) throw Error(Errc::connection, "rank " + std::to_string(fetcher_) + " stopped fetching");
}

uint32_t CatchupSender::send_snapshot(const codec::Manifest& manifest, uint64_t max_message_bytes, uint64_t version,
                                      const Read& read) {
  const uint64_t piece_bytes = std::max<uint64_t>(max_message_bytes / 4, 4096);
  struct Piece {
    uint32_t tensor;
    uint64_t offset, size;
  };
  std::vector<Piece> pieces;
  for (uint32_t t = 0; t < manifest.size(); ++t) {
    const uint64_t w = codec::dtype_size(manifest.at(t).dtype);
    const uint64_t size = manifest.at(t).nbytes();
    const uint64_t step = std::max(w, piece_bytes / w * w);
    for (uint64_t off = 0; off < size; off += step) pieces.push_back({t, off, std::min(step, size - off)});
  }
  const uint32_t count = static_cast<uint32_t>(pieces.size());
  for (uint32_t i = 0; i < count; ++i) {
    const auto& p = pieces[i];
    auto body = std::make_shared<std::vector<std::byte>>(p.size);
    read(p.tensor, p.offset, *body);
    const RawChunkHeader h{{0, 0}, version, i, count, p.tensor, p.offset, p.size};
    send(std::make_shared<const std::vector<std::byte>>(encode_raw_message(h)), std::move(body));
  }
  return count;
}

void CatchupSender::finish(const FetchEnd& end) {
  link_.post(std::make_shared<const std::vector<std::byte>>(encode_message(end)));
  link_.flush(peer_timeout_);
}

}  // namespace deltacast::tree
