#include "tree/snapshot_serve.h"

#include <algorithm>
#include <cstring>

#include "codec/encoder.h"
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

namespace {

// The old bits of every unit that differs between `old_bits` and `new_bits` (units `first` on of
// tensor `tensor`, `width` bytes each), compared a block at a time so that unchanged blocks cost
// a memcmp.
void collect_changes(uint32_t tensor, unsigned width, uint64_t first, std::span<const std::byte> old_bits,
                     std::span<const std::byte> new_bits, std::vector<SnapshotPatches::Patch>& out) {
  constexpr size_t kBlock = 4096;
  for (size_t at = 0; at < old_bits.size(); at += kBlock) {
    const size_t n = std::min(kBlock, old_bits.size() - at);
    if (std::memcmp(old_bits.data() + at, new_bits.data() + at, n) == 0) continue;
    for (size_t b = at; b < at + n; b += width) {
      if (std::memcmp(old_bits.data() + b, new_bits.data() + b, width) == 0) continue;
      uint32_t unit = 0;
      std::memcpy(&unit, old_bits.data() + b, width);  // little-endian host
      out.push_back({tensor, first + b / width, unit});
    }
  }
}

unsigned unit_width(const codec::Manifest& manifest, uint32_t tensor) {
  return static_cast<unsigned>(codec::dtype_unit_size(manifest.at(tensor).dtype));
}

}  // namespace

void overwrite_with(std::vector<std::vector<std::byte>>& bits, const codec::ConstWeights& next,
                    std::vector<SnapshotPatches::Patch>* old_bits) {
  for (uint32_t t = 0; t < bits.size(); ++t) {
    if (old_bits) collect_changes(t, unit_width(*next.manifest, t), 0, bits[t], next.tensors[t], *old_bits);
    // An empty tensor may have no storage (memcpy of null is UB).
    if (!bits[t].empty()) std::memcpy(bits[t].data(), next.tensors[t].data(), bits[t].size());
  }
}

void overwrite_with(std::vector<std::vector<std::byte>>& bits, std::span<const codec::PartRange> ranges,
                    const codec::WeightsReader& next, std::vector<SnapshotPatches::Patch>* old_bits) {
  DC_ASSERT(bits.size() == ranges.size());
  thread_local std::vector<std::byte> piece;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const uint32_t t = ranges[i].tensor;
    const unsigned width = unit_width(next.manifest(), t);
    const uint64_t start = ranges[i].begin * width;  // the range's first byte in the tensor
    // Pieces of whole units: kReadPieceBytes is a multiple of every unit width.
    for (uint64_t at = 0; at < bits[i].size(); at += codec::kReadPieceBytes) {
      const auto to = std::span(bits[i]).subspan(at, std::min(codec::kReadPieceBytes, bits[i].size() - at));
      piece.resize(to.size());
      try {
        next.read(t, start + at, piece);
      } catch (const Error& e) {
        throw Error(Errc::io, "tensor '" + next.manifest().at(t).name + "' at byte " + std::to_string(start + at) +
                                  ": " + e.what());
      }
      if (old_bits) collect_changes(t, width, (start + at) / width, to, piece, *old_bits);
      std::memcpy(to.data(), piece.data(), to.size());
    }
  }
}

void overwrite_with(std::vector<std::vector<std::byte>>& bits, const codec::WeightsReader& next,
                    std::vector<SnapshotPatches::Patch>* old_bits) {
  std::vector<codec::PartRange> whole;
  for (uint32_t t = 0; t < bits.size(); ++t) whole.push_back({t, 0, next.manifest().at(t).units()});
  overwrite_with(bits, whole, next, old_bits);
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
