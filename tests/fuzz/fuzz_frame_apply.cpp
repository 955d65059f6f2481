// fuzz_frame_apply: codec frames (codec/frame.h) applied by codec::DeltaApplier to a small model
// (fuzz_models.h), the way a receiver applies what reaches it.
//
// Input: byte 0 = flags, then frames back to back (a .dcx file; a frame whose header does not
// parse, or that runs past the end, is the rest of the input).
//   bit 0  model: 0 the golden files' model (tests/golden), 1 every dtype
//   bit 1  recompute each frame's checksum, so mutations reach the checks behind it
//   bit 2  set each frame's manifest digest, base version and base digest to the receiver's
//   bit 3  staged mode (the apply gate) instead of in place
// Oracles:
//   * apply() throws nothing but deltacast::Error, with a code its contract names (corrupt_frame,
//     version_mismatch, replayed, not_found);
//   * in place, a refused frame leaves the weights byte-identical; an applied one changes at most
//     as many units as it reports written; staged, apply() never writes the buffers;
//   * nothing outside the weights is written (guard bytes; ASan for reads);
//   * whenever the version is complete: verify() either passes (then commit, and a full-scan
//     audit equals the maintained digest) or throws verify_failed (then rollback restores the
//     committed bytes exactly); at the end a version still in flight rolls back exactly.
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "codec/applier.h"
#include "codec/frame.h"
#include "fuzz_common.h"
#include "fuzz_models.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::fuzz {
namespace {

class Receiver {
 public:
  Receiver(const FuzzModel& model, bool staged) : model_(model) {
    for (const auto& t : model.base) {
      auto& buffer = buffers_.emplace_back(t.size());
      if (!t.empty()) std::memcpy(buffer.bytes().data(), t.data(), t.size());
    }
    committed_ = snapshot();
    committed_digest_ = codec::StateDigest::full_scan(model.view()).combined();
    applier_.emplace(model.manifest, weights(), kBaseVersion, codec::StateDigest::full_scan(model.view()),
                     staged ? codec::DeltaApplier::Mode::staged : codec::DeltaApplier::Mode::in_place);
  }

  void apply(std::vector<std::byte>& frame, unsigned flags) {
    if (flags & 4) patch_identity(frame);
    if ((flags & 2) && frame.size() >= codec::kFrameHeaderSize + codec::kFrameTrailerSize)
      store_le<uint64_t>(frame.data() + frame.size() - 8, XXH3_64bits(frame.data(), frame.size() - 8));
    const auto before = snapshot();
    const bool staged = applier_->mode() == codec::DeltaApplier::Mode::staged;
    try {
      const auto result = applier_->apply(frame);
      check_guards();
      FUZZ_CHECK(staged ? before == snapshot() : changed_units(before) <= result.changes,
                 staged ? "a staged apply wrote the buffers" : "more units changed than the frame reports written");
    } catch (const Error& e) {
      check_guards();
      FUZZ_CHECK(e.code() == Errc::corrupt_frame || e.code() == Errc::version_mismatch || e.code() == Errc::replayed ||
                     e.code() == Errc::not_found,
                 std::string("apply threw ") + std::string(errc_name(e.code())) + ": " + e.what());
      FUZZ_CHECK(before == snapshot(), std::string("a refused frame changed the weights: ") + e.what());
      return;
    }
    if (applier_->complete()) finish_version();
  }

  // The end of the input: a version still in flight is rolled back.
  void finish() {
    if (applier_->pending_version()) {
      applier_->rollback();
      FUZZ_CHECK(snapshot() == committed_, "rollback did not restore the committed bytes");
    }
    applier_->audit();
    check_guards();
  }

 private:
  using Snapshot = std::vector<std::vector<std::byte>>;

  codec::MutableWeights weights() {
    codec::MutableWeights w{&model_.manifest, {}};
    for (auto& b : buffers_) w.tensors.push_back(b.bytes());
    return w;
  }
  Snapshot snapshot() const {
    Snapshot s;
    for (const auto& b : buffers_) s.emplace_back(b.bytes().begin(), b.bytes().end());
    return s;
  }
  void check_guards() const {
    for (const auto& b : buffers_) FUZZ_CHECK(b.guards_intact(), "a write outside the weights");
  }
  // Units (code units: elements, or 4-byte halves of 8-byte elements) that differ from `before`.
  uint64_t changed_units(const Snapshot& before) const {
    uint64_t n = 0;
    for (size_t t = 0; t < buffers_.size(); ++t) {
      const size_t unit = codec::dtype_unit_size(model_.manifest.at(static_cast<uint32_t>(t)).dtype);
      const auto now = buffers_[t].bytes();
      for (size_t at = 0; at < now.size(); at += unit) n += std::memcmp(now.data() + at, before[t].data() + at, unit) != 0;
    }
    return n;
  }
  // The receiver's identity: what a frame must name to be for it.
  void patch_identity(std::vector<std::byte>& frame) const {
    if (frame.size() < codec::kFrameHeaderSize) return;
    store_le<uint64_t>(frame.data() + 16, model_.manifest.digest());
    store_le<uint64_t>(frame.data() + 24, applier_->version());
    store_le<uint64_t>(frame.data() + 32, committed_digest_);
  }
  void finish_version() {
    try {
      applier_->verify();
    } catch (const Error& e) {
      FUZZ_CHECK(e.code() == Errc::verify_failed, std::string("verify threw ") + e.what());
      applier_->rollback();
      FUZZ_CHECK(snapshot() == committed_, "rollback after a failed verify did not restore the committed bytes");
      return;
    }
    applier_->commit();
    while (applier_->apply_next_staged()) {
    }
    applier_->audit();  // throws verify_failed (a crash here) if the maintained digest is wrong
    committed_ = snapshot();
    committed_digest_ = applier_->digest().combined();
  }

  const FuzzModel& model_;
  std::vector<GuardedBytes> buffers_;
  Snapshot committed_;
  uint64_t committed_digest_ = 0;
  std::optional<codec::DeltaApplier> applier_;
};

}  // namespace
}  // namespace deltacast::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltacast;
  fuzz::quiet_logs();
  if (size == 0) return 0;
  fuzz::FuzzInput in(data, size);
  const unsigned flags = std::to_integer<unsigned>(in.take(1)[0]);
  fuzz::Receiver receiver(fuzz::fuzz_model(flags & 1), (flags & 8) != 0);
  while (in.remaining() > 0) {
    size_t frame_size = in.remaining();
    if (in.remaining() >= codec::kFrameHeaderSize) {
      fuzz::FuzzInput peek = in;
      try {
        const uint64_t announced = codec::frame_size_from_header(peek.take(codec::kFrameHeaderSize));
        frame_size = static_cast<size_t>(std::clamp<uint64_t>(announced, 1, in.remaining()));
      } catch (const Error&) {
      }
    }
    const auto bytes = in.take(frame_size);
    std::vector<std::byte> frame(bytes.begin(), bytes.end());  // exactly sized: ASan sees any overread
    receiver.apply(frame, flags);
  }
  receiver.finish();
  return 0;
}
