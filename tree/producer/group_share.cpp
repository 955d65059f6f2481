// The two kinds of a group rank's share (group_share.h): a delta of its part, or version 1's RAW
// pieces of its part.
#include "tree/producer/group_share.h"

namespace deltacast::tree {

class Producer::Impl::DeltaShare final : public GroupShare {
 public:
  DeltaShare(Producer::Impl& d, const codec::WeightsReader& next, const RefitOptions& refit_options)
      : d_(d), next_(next), encode_(d.refit_encode_options(refit_options)) {}
  bool raw() const noexcept override { return false; }
  const std::vector<uint32_t>& first() const noexcept override { return d_.group->chunks.first; }

  GroupSent send(Producer::Impl::InFlight& f, const GroupBegin& begin) override {
    auto& g = *d_.group;
    codec::EncodePart part = g.chunks.part(g.partition, g.rank, begin.base_digest);
    part.base_digest = d_.baseline->digest().per_tensor();
    // Placed members (docs/placement.md): cut for their slices; the part's change inside each
    // slice goes to the coordinator, which keeps the table (base digests 0 here).
    std::vector<codec::SliceDigest> table;
    for (const auto& s : begin.slices) table.push_back(codec::SliceDigest{s.tensor, s.dim, s.start, s.stop, 0});
    if (!table.empty()) {
      encode_.held_slices = FleetSlices::held_of(d_.manifest, table, begin.set_slices, begin.set_ends);
      encode_.base_slice_digests = table;
    }
    encoder_.emplace(d_.baseline->reader(), next_, part, codec::VersionIds{d_.version, f.version}, encode_);
    const auto chunks = d_.send_chunks(f, *encoder_, g.chunks.first[g.rank]);
    const auto digests = encoder_->part_digests();
    GroupSent sent;
    sent.slice_deltas = digests.slice_deltas;
    for (const uint32_t i : begin.scan) {
      if (i >= table.size()) throw Error(Errc::corrupt_frame, "group begin: a slice to scan outside the table");
      sent.slice_scans.push_back(codec::part_slice_digest(d_.baseline->reader(), table[i], g.partition.part(g.rank)));
    }
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
        pieces_(raw_pieces(d.manifest, d.group->partition.part(d.group->rank), d.options.encode.chunk_bytes)),
        first_(raw_group_first(d.manifest, d.group->partition, d.options.encode.chunk_bytes)),
        raw_{&pieces_, first_[d.group->rank], first_.back(), full} {}
  bool raw() const noexcept override { return true; }
  const std::vector<uint32_t>& first() const noexcept override { return first_; }

  GroupSent send(Producer::Impl::InFlight& f, const GroupBegin&) override {
    const auto& ranges = d_.group->partition.part(d_.group->rank);
    SentPieces pieces = d_.send_pieces(f, raw_, ranges);
    GroupSent sent;
    sent.chunks = static_cast<uint32_t>(pieces_.size());
    sent.frame_bytes = pieces.bytes;
    sent.raw_sum = pieces.hash_sum;
    sent.base_digest = d_.baseline->digest().per_tensor();
    sent.new_digest = pieces.digest.per_tensor();
    if (f.report) {
      for (const auto& r : ranges)
        f.report->elements += r.units() / codec::dtype_units_per_element(d_.manifest.at(r.tensor).dtype);
      f.report->checkpoint_bytes = pieces.bytes;
    }
    return sent;
  }
  Outgoing make(uint32_t key, uint32_t route) override { return d_.raw_piece(raw_, key, route); }
  void adopt(uint64_t v, codec::StateDigest own) override {
    d_.baseline->adopt(codec::SpanReader(raw_.full), v, std::move(own));
  }

 private:
  Producer::Impl& d_;
  std::vector<RawPiece> pieces_;
  std::vector<uint32_t> first_;
  RawSend raw_;
};

std::unique_ptr<Producer::Impl::GroupShare> Producer::Impl::delta_share(const codec::WeightsReader& next,
                                                                        const RefitOptions& refit_options) {
  return std::make_unique<DeltaShare>(*this, next, refit_options);
}

std::unique_ptr<Producer::Impl::GroupShare> Producer::Impl::raw_share(const codec::ConstWeights& full) {
  return std::make_unique<RawShare>(*this, full);
}

}  // namespace deltacast::tree
