// What keeping a seal's slice table costs the producer (codec/slice_digest_delta.h,
// docs/placement.md): per round, interleaved, one simulator step encoded (2 threads) for a fleet of
// vLLM-style TP workers (codec::llama_tp_placement) without a slice table, then with the table
// kept from the changes (EncodeOptions::base_slice_digests), then a scan of those slices of the
// new version (codec::slice_digests: what the producer would do instead; one thread). Prints per
// T the median and range over rounds of each, and the ratio of the table's cost (with - without)
// and of the scan to the encode without a table.
// Usage: dc_bench_slice_digests [--params 200M] [--lr 1.3e-6] [--rounds 5]
#include <cstdio>
#include <vector>

#include "codec/encoder.h"
#include "tp_fleet.h"

using namespace deltacast;
using bench::Clock;
using bench::ms_since;
using bench::Range;

int main(int argc, char** argv) {
  const bench::StepArgs args(argc, argv, "200M");
  const bench::SimStep step(args.params, args.lr);
  const codec::OwnedWeights &a = *step.a, &b = *step.b;
  const auto& m = step.manifest();
  const auto& base_digest = step.base_digest;
  const int rounds = args.rounds;

  std::printf("%s params, one step at lr %g; %d interleaved rounds; encode on 2 threads, the scan on one\n\n",
              args.params.c_str(), args.lr, rounds);
  std::printf(
      "| T | slices | encode, no table: ms | encode, table kept: ms | the table's cost vs encode | "
      "scan of the slices: ms | scan vs encode |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const uint32_t t : {2u, 8u}) {
    const auto held = bench::held_by(bench::tp_placements(m, t));
    const auto slices = held->slices();
    codec::EncodeOptions plain;
    plain.threads = 2;
    plain.held_slices = held;
    codec::EncodeOptions kept = plain;
    kept.base_slice_digests = codec::slice_digests(a.view(), slices);
    const auto want = codec::slice_digests(b.view(), slices);
    Range without, with, scan, cost, scan_ratio;
    for (int round = 0; round < rounds; ++round) {
      auto t0 = Clock::now();
      const auto d0 = codec::encode_delta(a.view(), b.view(), base_digest, {0, 1}, plain);
      without.v.push_back(ms_since(t0));
      t0 = Clock::now();
      const auto d1 = codec::encode_delta(a.view(), b.view(), base_digest, {0, 1}, kept);
      with.v.push_back(ms_since(t0));
      t0 = Clock::now();
      const auto scanned = codec::slice_digests(b.view(), slices);
      scan.v.push_back(ms_since(t0));
      if (codec::parse_frame(d1.frames.back()).slice_digests != want || scanned != want) {
        std::fprintf(stderr, "the slice table kept from the changes differs from the scan\n");
        return 1;
      }
      cost.v.push_back((with.v.back() - without.v.back()) / without.v.back());
      scan_ratio.v.push_back(scan.v.back() / without.v.back());
    }
    std::printf(
        "| %u | %zu | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %+.3f (%+.3f to %+.3f) | %.1f (%.1f-%.1f) | %.3f "
        "(%.3f-%.3f) |\n",
        t, slices.size(), without.median(), without.lo(), without.hi(), with.median(), with.lo(), with.hi(),
        cost.median(), cost.lo(), cost.hi(), scan.median(), scan.lo(), scan.hi(), scan_ratio.median(), scan_ratio.lo(),
        scan_ratio.hi());
  }
  return 0;
}
