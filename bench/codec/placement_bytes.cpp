// What tensor-parallel receivers cost the payload (docs/placement.md, "Partly held segments"): a
// segment some member holds only partly cannot be coded by class, so the producer codes it by
// positions. This encodes the same simulator step for receivers that hold every tensor whole
// (the baseline, in the same run) and for a fleet of vLLM-style TP workers at T = 2, 4, 8 (q/k/v,
// gate/up, the embedding and lm_head split by rows; o_proj and down_proj by columns; norms whole),
// and prints bytes per change and the ratio to the baseline. Frame bytes are deterministic for
// the data: no timing, nothing to repeat.
// Usage: dc_bench_placement_bytes [--params 200M] [--lr 1.3e-6] [--lr-high 5e-6]
#include <cstdio>
#include <string>

#include "codec/encoder.h"
#include "tp_fleet.h"

using namespace deltacast;

int main(int argc, char** argv) {
  const bench::StepArgs args(argc, argv, "200M");
  std::printf("| changed %% | receivers | B/change | vs whole | classed segments |\n| --- | --- | --- | --- | --- |\n");
  for (const double lr : {args.lr, args.lr_high}) {
    const bench::SimStep step(args.params, lr);
    const codec::OwnedWeights &a = *step.a, &b = *step.b;
    const auto& m = step.manifest();
    const auto& base_digest = step.base_digest;
    double whole = 0;
    for (const uint32_t t : {1u, 2u, 4u, 8u}) {
      codec::EncodeOptions o;
      o.threads = 2;
      if (t > 1) o.held_slices = bench::held_by(bench::tp_placements(m, t));
      const auto stats = codec::encode_delta(a.view(), b.view(), base_digest, {0, 1}, o).stats;
      const double per_change = static_cast<double>(stats.frame_bytes) / static_cast<double>(stats.changes);
      if (t == 1) whole = per_change;
      uint64_t segments = 0;
      for (const uint64_t s : stats.segments_by_coding) segments += s;
      std::printf("| %.2f | %s | %.3f | %.3f | %llu of %llu |\n",
                  100.0 * static_cast<double>(stats.changes) / static_cast<double>(stats.elements),
                  t == 1 ? "whole" : ("TP=" + std::to_string(t)).c_str(), per_change, per_change / whole,
                  static_cast<unsigned long long>(
                      stats.segments_by_coding[static_cast<int>(codec::LocationCoding::classed_gaps)]),
                  static_cast<unsigned long long>(segments));
      std::fflush(stdout);
    }
  }
  return 0;
}
