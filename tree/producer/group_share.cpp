// The two kinds of a group rank's share (group_share.h): a delta of its part, or version 1's RAW
// pieces of its part.
#include "tree/producer/group_share.h"

#include <future>

namespace deltacast::tree {

class Producer::Impl::DeltaShare final : public GroupShare {
 public:
  DeltaShare(Producer::Impl& d, const codec::WeightsReader& next, const RefitOptions& refit_options)
      : d_(d), next_(next), encode_(d.refit_encode_options(refit_options)) {}
  bool raw() const noexcept override { return false; }
  const std::vector<uint32_t>& first() const noexcept override { return d_.group->chunks.first; }

  GroupSent send(Producer::Impl::InFlight& f, uint64_t base_combined) override {
    auto& g = *d_.group;
    codec::EncodePart part = g.chunks.part(g.partition, g.rank, base_combined);
    part.base_digest = d_.baseline->digest().per_tensor();
    encoder_.emplace(d_.baseline->reader(), next_, part, codec::VersionIds{d_.version, f.version}, encode_);
    const auto chunks = d_.send_chunks(f, *encoder_, g.chunks.first[g.rank]);
    const auto digests = encoder_->part_digests();
    GroupSent sent;
    sent.chunks = chunks.chunks;
    sent.base_digest = digests.base.per_tensor();
    sent.new_digest = digests.next.per_tensor();
    sent.frame_bytes = chunks.frame_bytes;
    sent.changes = chunks.stats.changes;
    if (f.report) {
      f.report->elements = chunks.stats.elements;
      f.report->checkpoint_bytes = chunks.stats.checkpoint_bytes;
      f.report->encode_seconds = chunks.encode_seconds;
    }
    return sent;
  }
  Outgoing make(uint32_t key, uint32_t route) override {
    if (!encoder_) throw Error(Errc::internal, "a re-send before the part was encoded");
    return d_.part_chunk(*encoder_, key, route);
  }
  void adopt(uint64_t v, codec::StateDigest own) override { d_.baseline->adopt(next_, v, std::move(own)); }

 private:
  Producer::Impl& d_;
  const codec::WeightsReader& next_;
  codec::EncodeOptions encode_;
  std::optional<codec::DeltaEncoder> encoder_;
};

class Producer::Impl::RawShare final : public GroupShare {
 public:
  RawShare(Producer::Impl& d, const codec::ConstWeights& full)
      : d_(d),
        full_(full),
        pieces_(raw_pieces(d.manifest, d.group->partition.part(d.group->rank), d.options.encode.chunk_bytes)),
        first_(raw_group_first(d.manifest, d.group->partition, d.options.encode.chunk_bytes)) {}
  bool raw() const noexcept override { return true; }
  const std::vector<uint32_t>& first() const noexcept override { return first_; }

  GroupSent send(Producer::Impl::InFlight& f, uint64_t) override {
    // The part's StateDigest is taken while its pieces go out (the wire, not this scan, is the
    // bound); the coordinator records version 1 under the sum of the parts' digests.
    const auto& ranges = d_.group->partition.part(d_.group->rank);
    auto digest =
        std::async(std::launch::async, [this, &ranges] { return codec::StateDigest::part_scan(full_, ranges, 1); });
    GroupSent sent;
    const uint32_t own_first = first_[d_.group->rank];
    try {
      for (uint32_t i = 0; i < pieces_.size(); ++i) {
        const uint32_t key = own_first + i;
        const Outgoing out = make(key, 0);
        sent.raw_sum += raw_piece_hash(header(key, 0), out.body);
        d_.deliver(f.tree_of(key), out);
        f.sent[key] = true;
        sent.frame_bytes += out.body.size();
        if (d_.options.on_progress) d_.options.on_progress(i + 1, static_cast<uint32_t>(pieces_.size()));
      }
    } catch (...) {
      digest.wait();
      throw;
    }
    sent.chunks = static_cast<uint32_t>(pieces_.size());
    sent.changes = 0;
    if (f.report) {
      for (const auto& r : d_.group->partition.part(d_.group->rank)) {
        const auto dtype = d_.manifest.at(r.tensor).dtype;
        f.report->elements += r.units() * codec::dtype_unit_size(dtype) / codec::dtype_size(dtype);
      }
      f.report->checkpoint_bytes = sent.frame_bytes;
    }
    sent.base_digest = d_.baseline->digest().per_tensor();
    sent.new_digest = digest.get().per_tensor();
    return sent;
  }
  Outgoing make(uint32_t key, uint32_t route) override {
    const RawChunkHeader h = header(key, route);
    return Outgoing{std::make_shared<const std::vector<std::byte>>(encode_raw_message(h, d_.epoch())),
                    full_.tensors[h.tensor].subspan(h.byte_offset, h.byte_count)};
  }
  void adopt(uint64_t v, codec::StateDigest own) override {
    d_.baseline->adopt(codec::SpanReader(full_), v, std::move(own));
  }

 private:
  RawChunkHeader header(uint32_t key, uint32_t route) const {
    const uint32_t own_first = first_[d_.group->rank];
    if (key < own_first || key - own_first >= pieces_.size())
      throw Error(Errc::internal, "raw piece " + std::to_string(key) + " is another rank's");
    const RawPiece& p = pieces_[key - own_first];
    return RawChunkHeader{{d_.in_flight->attempt, route}, 1, key, first_.back(), p.tensor, p.offset, p.size};
  }

  Producer::Impl& d_;
  codec::ConstWeights full_;
  std::vector<RawPiece> pieces_;
  std::vector<uint32_t> first_;
};

std::unique_ptr<Producer::Impl::GroupShare> Producer::Impl::delta_share(const codec::WeightsReader& next,
                                                                        const RefitOptions& refit_options) {
  return std::make_unique<DeltaShare>(*this, next, refit_options);
}

std::unique_ptr<Producer::Impl::GroupShare> Producer::Impl::raw_share(const codec::ConstWeights& full) {
  return std::make_unique<RawShare>(*this, full);
}

}  // namespace deltacast::tree
