// fuzz_raw_header: RAW bootstrap messages (tree/protocol.h decode_raw_message) and their bodies,
// landed through tree::Session the way a member lands version 1 into its all-zero weights.
//
// Input: byte 0 picks the model (fuzz_models.h); then records, each `u8 length, length bytes of a
// RAW message`, followed, when the session claims the piece, by its body: byte_count bytes of the
// input (fewer at the end of the input: a body cut short, as a failed link leaves it).
// Oracles:
//   * decode_raw_message throws nothing but Error(corrupt_frame), and what it accepts re-encodes
//     (encode_raw_message, with the header's epoch) to exactly the message's bytes;
//   * a claimed piece is exactly byte_count bytes inside its tensor's buffer, whole elements; a
//     refused claim writes nothing; nothing outside the weights is written (guard bytes, ASan);
//   * an ACK's digest is the sum of raw_piece_hash over the pieces that landed whole, and after
//     COMMIT the weights hold exactly the bytes the bodies wrote; without an ACK, dropping the
//     version leaves the weights all zero again.
#include <cstring>
#include <optional>
#include <vector>

#include "codec/digest.h"
#include "fuzz_common.h"
#include "fuzz_models.h"
#include "tree/protocol.h"
#include "tree/session.h"
#include "util/error.h"

namespace deltacast::fuzz {
namespace {

class Member {
 public:
  explicit Member(const FuzzModel& model) : model_(model) {
    for (const auto& t : model.base) {
      buffers_.emplace_back(t.size());
      shadow_.emplace_back(t.size());
    }
    session_.emplace(model.manifest, weights(), 0, codec::StateDigest::full_scan(const_weights()), 1);
  }

  // One RAW message; `input` supplies the body when the piece is claimed.
  void receive(std::span<const std::byte> message, FuzzInput& input) {
    tree::RawChunkHeader h;
    uint64_t epoch = 0;
    try {
      h = tree::decode_raw_message(message);
      epoch = tree::message_header(message).epoch;
    } catch (const Error& e) {
      FUZZ_CHECK(e.code() == Errc::corrupt_frame, std::string("decode_raw_message threw ") + e.what());
      return;
    }
    FUZZ_CHECK(same_bytes(tree::encode_raw_message(h, epoch), message), "a RAW message does not re-encode to its bytes");
    if (!session_->admit(tree::Session::DataKind::raw, h.envelope.attempt, h.version)) return;
    std::optional<tree::Message> reply;
    const auto piece = session_->claim_piece(h.envelope.attempt, h, reply);
    check_guards();
    if (!piece) {
      FUZZ_CHECK(weights_equal_shadow(), "a refused RAW piece changed the weights");
      return;
    }
    check_claim(h, *piece);
    const auto body = input.take(h.byte_count);
    if (!body.empty()) {
      std::memcpy(piece->data(), body.data(), body.size());
      std::memcpy(shadow_[h.tensor].data() + h.byte_offset, body.data(), body.size());
    }
    const bool whole = body.size() == h.byte_count;
    const uint64_t hash = tree::raw_piece_hash(h, *piece);
    if (whole) hash_sum_ += hash;
    if (auto ack = session_->land_piece(h, whole ? std::optional(hash) : std::nullopt)) {
      FUZZ_CHECK(std::holds_alternative<tree::Ack>(*ack), "land_piece answered something else than an ACK");
      ack_ = std::get<tree::Ack>(*ack);
      ack_attempt_ = h.envelope.attempt;
    }
    check_guards();
  }

  void finish() {
    if (ack_) {
      FUZZ_CHECK(ack_->digest == hash_sum_, "the ACK's digest is not the sum of the landed pieces' hashes");
      std::optional<tree::Message> answer;
      session_->commit(tree::Commit{ack_->version, ack_attempt_, ack_->digest},
                       [&](const tree::Message& m) { answer = m; });
      FUZZ_CHECK(answer && std::holds_alternative<tree::Active>(*answer), "COMMIT of the acked bootstrap not ACTIVE");
      FUZZ_CHECK(weights_equal_shadow(), "the committed bootstrap differs from the bytes the bodies wrote");
      FUZZ_CHECK(session_->version() == ack_->version, "the session did not commit the acked version");
    } else {
      session_->drop_in_flight();
      for (auto& s : shadow_) std::fill(s.begin(), s.end(), std::byte{0});
      FUZZ_CHECK(weights_equal_shadow(), "dropping the bootstrap left bytes behind");
    }
    check_guards();
  }

 private:
  codec::MutableWeights weights() {
    codec::MutableWeights w{&model_.manifest, {}};
    for (auto& b : buffers_) w.tensors.push_back(b.bytes());
    return w;
  }
  codec::ConstWeights const_weights() { return weights().as_const(); }
  void check_guards() const {
    for (const auto& b : buffers_) FUZZ_CHECK(b.guards_intact(), "a write outside the weights");
  }
  bool weights_equal_shadow() const {
    for (size_t t = 0; t < buffers_.size(); ++t)
      if (!same_bytes(buffers_[t].bytes(), shadow_[t])) return false;
    return true;
  }
  void check_claim(const tree::RawChunkHeader& h, std::span<std::byte> piece) {
    FUZZ_CHECK(h.tensor < buffers_.size(), "a piece claimed for a tensor the manifest lacks");
    const auto tensor = buffers_[h.tensor].bytes();
    const uint64_t width = codec::dtype_size(model_.manifest.at(h.tensor).dtype);
    FUZZ_CHECK(piece.size() == h.byte_count, "the claimed span is not byte_count bytes");
    FUZZ_CHECK(piece.data() == tensor.data() + h.byte_offset && h.byte_offset + h.byte_count <= tensor.size(),
               "the claimed span is not at byte_offset inside its tensor");
    FUZZ_CHECK(h.byte_offset % width == 0 && h.byte_count % width == 0, "the claimed span splits an element");
  }

  const FuzzModel& model_;
  std::vector<GuardedBytes> buffers_;
  std::vector<std::vector<std::byte>> shadow_;  // what the bytes should be
  std::optional<tree::Session> session_;
  uint64_t hash_sum_ = 0;
  std::optional<tree::Ack> ack_;
  uint64_t ack_attempt_ = 0;
};

}  // namespace
}  // namespace deltacast::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltacast;
  fuzz::quiet_logs();
  fuzz::FuzzInput in(data, size);
  fuzz::Member member(fuzz::fuzz_model(in.get<uint8_t>()));
  while (in.remaining() > 0) {
    const size_t length = in.get<uint8_t>();
    const auto bytes = in.take(length);
    const std::vector<std::byte> message(bytes.begin(), bytes.end());  // exactly sized for ASan
    member.receive(message, in);
  }
  member.finish();
  return 0;
}
