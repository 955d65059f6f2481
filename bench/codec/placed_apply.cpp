// Apply time of a tensor-parallel receiver that holds 1/T of the model (codec::PlacedWeights,
// docs/placement.md) against a receiver that holds it whole, on the same frames, in the same run
// (issue 33's goal: <= 1/T + 15% of the whole receiver's time at T = 2, 4, 8). The frames are one
// simulator step, encoded for a fleet of vLLM-style TP workers (codec::llama_tp_placement), with
// the seal's slice table. Each round times, interleaved: the whole receiver, TP rank 0 and TP rank
// T-1, a receiver holding only the final norm, and a whole receiver of a fleet without slices (on
// that fleet's frames: what the sliced members cost the others), each applying every frame and
// verifying (one thread), then rolling back (not timed). Prints per receiver the median and range
// over rounds, and the ratio to the whole receiver's time of the same round (range over rounds).
// Usage: dc_bench_placed_apply [--params 100M] [--lr 1.3e-6] [--rounds 5]
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "codec/applier.h"
#include "codec/encoder.h"
#include "tp_fleet.h"

using namespace deltacast;
using bench::Clock;
using bench::Range;

namespace {

// A receiver's buffers for `placement`, filled from the whole version `w`.
std::vector<std::vector<std::byte>> placed_buffers(const codec::Placement& p, const codec::ConstWeights& w) {
  std::vector<std::vector<std::byte>> out;
  out.reserve(p.buffers().size());
  for (uint32_t b = 0; b < p.buffers().size(); ++b)
    out.emplace_back(p.buffer_units(b) * codec::dtype_unit_size(p.dtype(b)));
  const std::vector<std::span<std::byte>> spans(out.begin(), out.end());
  codec::gather_placed(p, w, spans);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::StepArgs args(argc, argv, "100M");
  const bench::SimStep step(args.params, args.lr);
  const codec::OwnedWeights &a = *step.a, &b = *step.b;
  const auto& m = step.manifest();
  const auto& base_digest = step.base_digest;
  const int rounds = args.rounds;
  codec::OwnedWeights whole(a.view()), whole_alone(a.view());
  codec::EncodeOptions plain_options;
  plain_options.threads = 2;
  const auto plain = codec::encode_delta(a.view(), b.view(), base_digest, {0, 1}, plain_options);

  std::printf("%s params, one step at lr %g; %d interleaved rounds; apply + verify on one thread\n\n",
              args.params.c_str(), args.lr, rounds);
  std::printf("| T | receiver | changes written | ms: median (range) | vs whole: median (range) | goal |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (const uint32_t t : {2u, 4u, 8u}) {
    const auto placements = bench::tp_placements(m, t);
    const auto held = bench::held_by(placements);
    codec::EncodeOptions o;
    o.threads = 2;
    o.held_slices = held;
    o.base_slice_digests = codec::slice_digests(a.view(), held->slices());
    const auto delta = codec::encode_delta(a.view(), b.view(), base_digest, {0, 1}, o);
    // The receivers: whole, TP rank 0, TP rank t-1.
    struct Receiver {
      std::string name;
      std::vector<std::vector<std::byte>> buffers;
      std::unique_ptr<codec::DeltaApplier> applier;
      Range ms, ratio;
      uint64_t written = 0;
      const std::vector<std::vector<std::byte>>* frames = nullptr;  // null: the fleet's frames
    };
    std::vector<Receiver> receivers;
    receivers.push_back(
        {"whole", {}, std::make_unique<codec::DeltaApplier>(m, whole.mutable_view(), 0, base_digest), {}, {}});
    // A whole receiver of a fleet without slices (no cuts, no index): what slicing costs others.
    receivers.push_back({"whole, frames of a whole fleet",
                         {},
                         std::make_unique<codec::DeltaApplier>(m, whole_alone.mutable_view(), 0, base_digest),
                         {},
                         {},
                         0,
                         &plain.frames});
    // And the floor: a receiver that holds only the final norm decodes the chunks holding it.
    const auto norm_only = std::make_shared<const codec::Placement>(codec::Placement::compile(
        m, {{"norm",
             {{"model.norm.weight", 0, 0, m.at(*m.find("model.norm.weight")).shape[0], std::nullopt}},
             false,
             {},
             0}}));
    for (uint32_t r : {0u, t - 1, t}) {
      const auto& p = r < t ? placements[r] : norm_only;
      Receiver x{r < t ? "rank " + std::to_string(r) + " of " + std::to_string(t) : "final norm only",
                 placed_buffers(*p, a.view()),
                 {},
                 {},
                 {}};
      std::vector<std::span<std::byte>> spans;
      for (auto& buf : x.buffers) spans.emplace_back(buf.data(), buf.size());
      auto digests = codec::placed_part_digests(m, *p, spans);
      x.applier = std::make_unique<codec::DeltaApplier>(m, codec::PlacedWeights{p, spans}, 0, base_digest.combined(),
                                                        std::move(digests));
      receivers.push_back(std::move(x));
    }
    for (int round = 0; round < rounds; ++round) {
      double whole_ms = 0;
      for (auto& x : receivers) {
        uint64_t written = 0;
        const auto t0 = Clock::now();
        for (const auto& f : x.frames ? *x.frames : delta.frames) written += x.applier->apply(f).changes;
        x.applier->verify();
        const double ms = bench::ms_since(t0);
        x.applier->rollback();
        x.written = written;
        x.ms.v.push_back(ms);
        if (x.name == "whole") whole_ms = ms;
        x.ratio.v.push_back(ms / whole_ms);
      }
    }
    for (auto& x : receivers) {
      const double med = x.ms.median();
      const double ratio = x.ratio.median();
      std::printf("| %u | %s | %llu | %.1f (%.1f-%.1f) | %.3f (%.3f-%.3f) | %s |\n", t, x.name.c_str(),
                  static_cast<unsigned long long>(x.written), med, x.ms.lo(), x.ms.hi(), ratio, x.ratio.lo(),
                  x.ratio.hi(),
                  x.name.starts_with("rank") ? ("<= " + std::to_string(1.0 / t + 0.15).substr(0, 5)).c_str() : "");
    }
    std::fflush(stdout);
  }
  return 0;
}
