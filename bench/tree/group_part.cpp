// One producer rank of a group, for its memory and work (issue 32, "Memory and work per rank";
// docs/producer-group.md): the rank keeps the baseline of its part only (BaselineStore over its
// ranges, filled from the base checkpoint with pread) and diffs and encodes only its part against
// the new checkpoint (EncodePart, both read in pieces). Prints one JSON line:
//   part_bytes      the part's checkpoint bytes
//   rss_fixed       peak RSS before the baseline is allocated (the process, the opened checkpoints)
//   rss_peak        peak RSS at the end (getrusage)
//   encode_s, frame_bytes, changes, chunks
//   dc_bench_group_part BASE NEW RANKS RANK [THREADS]
// Frames are counted and dropped as they are made (a real rank sends them; its in-flight bytes
// are bounded by max_inflight_bytes_per_root and are not part of this figure).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "codec/encoder.h"
#include "codec/partition.h"
#include "tree/producer/baseline_store.h"
#include "util/error.h"

namespace {

uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
}

}  // namespace

int main(int argc, char** argv) {
  using namespace deltacast;
  if (argc < 5) {
    std::fprintf(stderr, "usage: dc_bench_group_part BASE NEW RANKS RANK [THREADS]\n");
    return 2;
  }
  try {
    const auto base = checkpoint::Checkpoint::open(argv[1]);
    const auto next = checkpoint::Checkpoint::open(argv[2]);
    const auto ranks = static_cast<uint32_t>(std::stoul(argv[3]));
    const auto rank = static_cast<uint32_t>(std::stoul(argv[4]));
    const unsigned threads = argc > 5 ? static_cast<unsigned>(std::stoul(argv[5])) : 2;
    const codec::Manifest& manifest = base.manifest();
    const auto partition = codec::Partition::balanced(manifest, ranks);
    if (rank >= ranks) throw Error(Errc::invalid_argument, "no rank " + std::to_string(rank));
    const uint64_t rss_fixed = peak_rss_bytes();

    // The rank's baseline: its part of the base version, read with pread, and its part's digest
    // (what a rank keeps from the commit that made the version; here taken once from the bytes).
    tree::BaselineStore store(manifest, partition.part(rank), threads);
    std::vector<uint64_t> part_digest(manifest.size(), 0);
    store.adopt(base.reader(), 1, codec::StateDigest(part_digest));
    std::vector<std::byte> piece(codec::kReadPieceBytes);  // pieces: no second copy of the part in memory
    for (const auto& r : store.ranges()) {
      const auto& info = manifest.at(r.tensor);
      const uint64_t width = codec::dtype_unit_size(info.dtype), per = codec::kReadPieceBytes / width;
      for (uint64_t at = r.begin; at < r.end; at += per) {
        const auto span = std::span(piece).first(std::min(per, r.end - at) * width);
        store.reader().read(r.tensor, at * width, span);
        part_digest[r.tensor] += codec::slice_digest(r.tensor, info.dtype, at, span);
      }
    }

    codec::EncodeOptions options;
    options.threads = threads;
    const auto numbering = codec::group_chunks(manifest, partition, options.chunk_bytes);
    codec::EncodePart part = numbering.part(partition, rank, 0);
    part.base_digest = part_digest;  // known: the scan does not take it again
    codec::DeltaEncoder encoder(store.reader(), next.reader(), part, {1, 2}, options);
    const auto start = std::chrono::steady_clock::now();
    std::atomic<uint32_t> next_chunk{0};
    std::atomic<uint64_t> frame_bytes{0};
    std::vector<codec::DeltaStats> stats(threads);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (uint32_t i; (i = next_chunk.fetch_add(1)) < encoder.chunk_count();)
          frame_bytes += encoder.encode_chunk(i, &stats[t]).size();
      });
    for (auto& t : pool) t.join();
    const auto digests = encoder.part_digests();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    uint64_t changes = 0;
    for (const auto& s : stats) changes += s.changes;
    std::printf(
        "{\"ranks\": %u, \"rank\": %u, \"part_bytes\": %llu, \"held_bytes\": %llu, \"rss_fixed\": %llu, "
        "\"rss_peak\": %llu, \"encode_s\": %.4f, \"frame_bytes\": %llu, \"changes\": %llu, \"chunks\": %u, "
        "\"digest_tensors\": %zu}\n",
        ranks, rank, static_cast<unsigned long long>(partition.part_bytes(rank)),
        static_cast<unsigned long long>(store.bytes()), static_cast<unsigned long long>(rss_fixed),
        static_cast<unsigned long long>(peak_rss_bytes()), seconds, static_cast<unsigned long long>(frame_bytes.load()),
        static_cast<unsigned long long>(changes), encoder.chunk_count(), digests.next.per_tensor().size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dc_bench_group_part: %s\n", e.what());
    return 1;
  }
  return 0;
}
