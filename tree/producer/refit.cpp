// Refits: a new version from weights in memory or read from a checkpoint (encoded as a delta
// against the baseline), a bootstrap (full weights) or frames encoded elsewhere (publish). Each
// sends its version through delivery.cpp's run_version; the commit rule is version_round.cpp's.
#include <algorithm>
#include <cstring>
#include <future>
#include <optional>

#include "tree/producer/group_share.h"
#include "util/bytes.h"

namespace deltacast::tree {

std::shared_ptr<const CheckpointLayout> Producer::Impl::changed_layout(
    const std::optional<CheckpointLayout>& wanted) const {
  if (!wanted || *wanted == *layout) return nullptr;
  try {
    check_layout(*wanted, manifest.size());
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, std::string("the refit's ") + e.what());
  }
  return std::make_shared<const CheckpointLayout>(*wanted);
}

codec::EncodeOptions Producer::Impl::refit_encode_options(const RefitOptions& refit_options) {
  codec::EncodeOptions encode = options.encode;
  if (!group) fleet_slices.prepare(encode, version, baseline->weights());
  // From the all-zero state an XOR mask is the value itself; ulp distances would be huge.
  if (version == 0) encode.xor_safe_mode = codec::ValueMode::xor_bits;
  if (refit_options.value_mode) encode.xor_safe_mode = *refit_options.value_mode;
  return encode;
}

void Producer::Impl::check_can_refit() const {
  if (!membership) throw Error(Errc::state, "Producer::refit before start()");
  if (!baseline->lost().empty())
    throw Error(Errc::state, "the producer cannot send another version: " + baseline->lost());
}

void Producer::Impl::check_part_weights(const codec::ConstWeights& weights) const {
  if (weights.tensors.size() != manifest.size())
    throw Error(Errc::invalid_argument, "weights: " + std::to_string(weights.tensors.size()) +
                                            " buffers for a manifest of " + std::to_string(manifest.size()) +
                                            " tensors");
  for (const auto& r : group->partition.part(group->rank))
    if (weights.tensors[r.tensor].size() != manifest.at(r.tensor).nbytes())
      throw Error(Errc::invalid_argument, "weights: tensor '" + manifest.at(r.tensor).name + "' (part of rank " +
                                              std::to_string(group->rank) + ") buffer holds " +
                                              std::to_string(weights.tensors[r.tensor].size()) + " bytes, expected " +
                                              std::to_string(manifest.at(r.tensor).nbytes()));
}

RefitReport Producer::refit(const codec::ConstWeights& next, const RefitOptions& refit_options) {
  auto& d = *impl_;
  codec::ConstWeights checked = next;
  checked.manifest = &d.manifest;
  if (d.group) {
    // A rank's trainer holds its part: the spans of the tensors it sends must be whole.
    d.check_part_weights(checked);
    return refit(codec::SpanReader(checked), refit_options);
  }
  std::lock_guard drive(d.drive);
  return d.refit_bits(checked, refit_options);
}

RefitReport Producer::Impl::refit_bits(const codec::ConstWeights& next, const RefitOptions& refit_options) {
  check_can_refit();
  codec::check_weights(next);
  auto new_layout = changed_layout(refit_options.layout);
  const codec::EncodeOptions encode = refit_encode_options(refit_options);
  codec::DeltaEncoder encoder(baseline->weights(), next, baseline->digest(), {version, version + 1}, encode);
  return refit_with(encoder, std::move(new_layout), refit_options,
                    [&](uint64_t v, codec::StateDigest digest) { baseline->adopt(next, v, std::move(digest)); });
}

RefitReport Producer::refit(const codec::WeightsReader& next, const RefitOptions& refit_options) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  d.check_can_refit();
  if (next.manifest().digest() != d.manifest.digest())
    throw Error(Errc::invalid_argument,
                "refit: the new version's tensors (names, dtypes, shapes) are not the manifest's");
  if (d.part_rank()) return d.rank_version(*d.delta_share(next, refit_options));
  auto layout = d.changed_layout(refit_options.layout);
  if (d.coordinator()) return d.group_version(*d.delta_share(next, refit_options), std::move(layout), refit_options);
  const codec::EncodeOptions encode = d.refit_encode_options(refit_options);
  codec::DeltaEncoder encoder(d.baseline->weights(), next, d.baseline->digest(), {d.version, d.version + 1}, encode);
  return d.refit_with(encoder, std::move(layout), refit_options,
                      [&](uint64_t v, codec::StateDigest digest) { d.baseline->adopt(next, v, std::move(digest)); });
}

Producer::Impl::SentChunks Producer::Impl::send_chunks(InFlight& f, codec::DeltaEncoder& encoder, uint32_t first_key) {
  const uint32_t count = encoder.chunk_count();
  SentChunks out;
  out.chunks = count;
  const bool keep_frames = options.on_committed_delta && !group;
  if (keep_frames) out.frames.resize(count);
  // Workers encode chunks in index order (an atomic cursor); this thread sends each one as soon as
  // it and every earlier chunk are ready, so encoding overlaps sending.
  std::vector<SharedBytes> slots(count);
  std::mutex mutex;
  std::condition_variable ready;
  std::atomic<uint32_t> cursor{0};
  std::atomic<bool> cancel{false};
  Status worker_status;
  const Envelope envelope = f.envelope(0);
  const uint64_t message_epoch = epoch();
  auto work = [&] {
    codec::DeltaStats stats;
    double seconds = 0;
    try {
      for (uint32_t i; !cancel && (i = cursor.fetch_add(1)) < count;) {
        auto t0 = Clock::now();
        std::vector<std::byte> frame = encoder.encode_chunk(i, &stats);
        auto message =
            std::make_shared<const std::vector<std::byte>>(encode_frame_message(frame, envelope, message_epoch));
        seconds += seconds_since(t0);
        std::lock_guard lock(mutex);
        if (keep_frames) out.frames[i] = std::move(frame);
        slots[i] = std::move(message);
        ready.notify_all();
      }
    } catch (const Error& e) {
      std::lock_guard lock(mutex);
      if (worker_status.ok()) worker_status = e.status();
      cancel = true;
      ready.notify_all();
    }
    std::lock_guard lock(mutex);
    out.stats.add(stats);
    out.encode_seconds += seconds;
  };
  if (!encoders) encoders = std::make_unique<WorkerThreads>(std::max(1u, options.encode.threads));
  encoders->start(work);
  try {
    for (uint32_t i = 0; i < count; ++i) {
      SharedBytes message;
      {
        std::unique_lock lock(mutex);
        ready.wait(lock, [&] { return slots[i] != nullptr || !worker_status.ok(); });
        if (!worker_status.ok()) throw Error(worker_status);
        message = std::move(slots[i]);
      }
      if (message->size() > max_message_bytes)
        throw Error(Errc::internal,
                    "chunk frame of " + std::to_string(message->size()) + " bytes exceeds the announced message limit");
      const uint32_t key = first_key + i;
      deliver(f.tree_of(key), Outgoing{message, {}});
      f.sent[key] = true;
      if (i == 0) log->debug("version {}: first chunk posted at {:.1f} ms", f.version, 1e3 * seconds_since(f.start));
      out.frame_bytes += message->size() - kMessageHeaderSize - kEnvelopeSize;
      if (options.on_progress) options.on_progress(i + 1, count);
    }
  } catch (...) {
    cancel = true;
    encoders->wait();
    throw;
  }
  encoders->wait();
  return out;
}

Outgoing Producer::Impl::part_chunk(codec::DeltaEncoder& encoder, uint32_t key, uint32_t route) {
  const uint32_t first = group->chunks.first[group->rank];
  if (key < first || key >= group->chunks.first[group->rank + 1])
    throw Error(Errc::internal, "chunk " + std::to_string(key) + " is another rank's");
  return Outgoing{std::make_shared<const std::vector<std::byte>>(
                      encode_frame_message(encoder.encode_chunk(key - first), in_flight->envelope(route), epoch())),
                  {}};
}

RefitReport Producer::Impl::refit_with(codec::DeltaEncoder& encoder, std::shared_ptr<const CheckpointLayout> new_layout,
                                       const RefitOptions& refit_options,
                                       const std::function<void(uint64_t, codec::StateDigest)>& adopt) {
  auto& d = *this;
  const uint64_t new_version = d.version + 1;
  const uint32_t count = encoder.chunk_count();
  const TopologyKind kind = d.membership->kind();
  SharedBytes seal_frame;
  std::vector<std::vector<std::byte>> kept;  // for options.on_committed_delta

  Impl::InFlight flight;
  flight.version = new_version;
  flight.layout = std::move(new_layout);
  flight.keys = count + 1;  // the seal is key `count`
  flight.tree_of = [count, kind](uint32_t key) { return key == count ? 0 : tree_for_chunk(kind, key); };
  flight.make = [&d, &encoder, &seal_frame, count](uint32_t key, uint32_t route) {
    const Envelope envelope = d.in_flight->envelope(route);
    if (key == count)
      return Outgoing{
          std::make_shared<const std::vector<std::byte>>(encode_frame_message(*seal_frame, envelope, d.epoch())), {}};
    return Outgoing{std::make_shared<const std::vector<std::byte>>(
                        encode_frame_message(encoder.encode_chunk(key), envelope, d.epoch())),
                    {}};
  };

  auto send_all = [&](Impl::InFlight& f) {
    RefitReport& report = *f.report;
    SentChunks sent = d.send_chunks(f, encoder, 0);
    kept = std::move(sent.frames);
    report.chunks = count;
    report.frames_bytes = sent.frame_bytes;
    seal_frame = std::make_shared<const std::vector<std::byte>>(encoder.seal());
    const Outgoing seal = f.make(count, 0);
    d.deliver(0, seal);
    f.sent[count] = true;
    d.log->debug("version {}: seal posted at {:.1f} ms", f.version, 1e3 * seconds_since(f.start));
    report.frames_bytes += seal_frame->size();
    report.changes = sent.stats.changes;
    report.elements = sent.stats.elements;
    report.checkpoint_bytes = sent.stats.checkpoint_bytes;
    report.encode_seconds = sent.encode_seconds;
  };
  codec::StateDigest new_digest;
  RefitReport report = d.run_version(
      std::move(flight), send_all,
      [&] {
        new_digest = encoder.new_digest();
        return new_digest.combined();
      },
      refit_options.dry_run,
      [&] {
        d.version = new_version;  // what the members hold, even if the baseline cannot follow
        d.fleet_slices.committed(new_version, encoder.new_slice_digests());
        const auto adopt_start = Clock::now();
        adopt(new_version, new_digest);
        d.log->debug("version {}: the baseline took it in {:.3f} s", new_version, seconds_since(adopt_start));
        if (!kept.empty() && d.options.on_committed_delta) {
          kept.push_back(*seal_frame);
          d.options.on_committed_delta(new_version, new_version - 1, new_digest.combined(), std::move(kept));
        }
      });
  d.log->info("version {} {} in {:.3f} s ({} chunks, {} payload bytes, {} changes)", report.version,
              report.committed ? "committed" : "aborted", report.refit_seconds, report.chunks, report.frames_bytes,
              report.changes);
  return report;
}

RefitReport Producer::bootstrap(const codec::ConstWeights& full) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  if (!d.membership) throw Error(Errc::state, "Producer::bootstrap before start()");
  if (d.version != 0) throw Error(Errc::state, "bootstrap needs receivers at version 0");
  codec::ConstWeights checked = full;
  checked.manifest = &d.manifest;
  if (d.group) {
    // Each rank sends its part's RAW pieces from its own memory (group_share.h).
    d.check_part_weights(checked);
    if (d.part_rank()) return d.rank_version(*d.raw_share(checked));
    return d.group_version(*d.raw_share(checked), nullptr, {});
  }
  codec::check_weights(checked);
  const std::vector<RawPiece> pieces = raw_pieces(d.manifest, whole_tensors(d.manifest), d.options.encode.chunk_bytes);
  if (pieces.empty()) throw Error(Errc::invalid_argument, "the checkpoint holds no bytes");
  const uint32_t count = static_cast<uint32_t>(pieces.size());
  const TopologyKind kind = d.membership->kind();

  const Impl::RawSend raw{&pieces, 0, count, checked};
  Impl::InFlight flight;
  flight.version = 1;
  flight.keys = count;
  flight.tree_of = [kind](uint32_t key) { return tree_for_chunk(kind, key); };
  flight.make = [&](uint32_t key, uint32_t route) { return d.raw_piece(raw, key, route); };
  // Each piece goes out as a RAW header and a bare body sent straight from `full` (no copy):
  // every send must have finished before this returns, errors included.
  struct SettleRoots {
    Impl& d;
    ~SettleRoots() { d.settle_roots(); }
  } settle{d};
  uint64_t expected = 0;  // the sum of the pieces' hashes (raw_piece_hash) the receivers ack
  std::optional<codec::StateDigest> digest;
  auto send_all = [&](Impl::InFlight& f) {
    RefitReport& report = *f.report;
    report.chunks = count;
    report.elements = d.manifest.total_elements();
    report.changes = report.elements;
    report.checkpoint_bytes = d.manifest.total_bytes();
    // The StateDigest is the next delta's base, and what version 1 is recorded under (a member
    // holding it says that digest at HELLO).
    Impl::SentPieces sent = d.send_pieces(f, raw, whole_tensors(d.manifest));
    expected = sent.hash_sum;
    report.frames_bytes = sent.bytes;
    f.state_digest = sent.digest.combined();
    digest = std::move(sent.digest);
  };
  RefitReport report = d.run_version(
      std::move(flight), send_all, [&] { return expected; }, false,
      [&] {
        d.baseline->adopt(checked, 1, std::move(digest));
        d.version = 1;
      });
  d.log->info("full checkpoint (version 1) {} in {:.3f} s ({} raw chunks, {} bytes)",
              report.committed ? "committed" : "aborted", report.refit_seconds, report.chunks, report.frames_bytes);
  return report;
}

Outgoing Producer::Impl::raw_piece(const RawSend& raw, uint32_t key, uint32_t route) const {
  if (key < raw.first_key || key - raw.first_key >= raw.pieces->size())
    throw Error(Errc::internal, "raw piece " + std::to_string(key) + " is another rank's");
  const RawPiece& p = (*raw.pieces)[key - raw.first_key];
  const RawChunkHeader h{{in_flight->attempt, route}, 1, key, raw.total, p.tensor, p.offset, p.size};
  return Outgoing{std::make_shared<const std::vector<std::byte>>(encode_raw_message(h, epoch())),
                  raw.full.tensors[p.tensor].subspan(p.offset, p.size)};
}

Producer::Impl::SentPieces Producer::Impl::send_pieces(InFlight& f, const RawSend& raw,
                                                       const std::vector<codec::PartRange>& ranges) {
  auto scan = std::async(std::launch::async, [&] { return codec::StateDigest::part_scan(raw.full, ranges, 1); });
  SentPieces sent;
  const auto count = static_cast<uint32_t>(raw.pieces->size());
  try {
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t key = raw.first_key + i;
      const RawPiece& p = (*raw.pieces)[i];
      const Outgoing out = raw_piece(raw, key, 0);
      sent.hash_sum += raw_piece_hash(RawChunkHeader{{}, 1, key, raw.total, p.tensor, p.offset, p.size}, out.body);
      deliver(f.tree_of(key), out);
      f.sent[key] = true;
      sent.bytes += out.body.size();
      if (options.on_progress) options.on_progress(i + 1, count);
    }
  } catch (...) {
    scan.wait();
    throw;
  }
  sent.digest = scan.get();
  return sent;
}

RefitReport Producer::publish(const std::vector<std::vector<std::byte>>& frames, uint64_t new_version,
                              uint64_t expected_digest, const RefitOptions& refit_options) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  return d.publish_frames(frames, new_version, expected_digest, refit_options, {},
                          [&d, new_version] { d.version = new_version; });
}

RefitReport Producer::forward(const std::vector<std::vector<std::byte>>& frames, uint64_t new_version,
                              uint64_t expected_digest, const std::shared_future<RelayCopy>& own_copy) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  // The relay's own copy, once ready: waited for (handling the members' messages meanwhile) and
  // checked once.
  std::optional<RelayCopy> copy;
  const auto hold_copy = [&] {
    while (own_copy.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready)
      d.pump(std::chrono::milliseconds(5));
    copy = own_copy.get();  // rethrows the copy's error
    copy->bits.manifest = &d.manifest;
    codec::check_weights(copy->bits);
    if (copy->digest.combined() != expected_digest)
      throw Error(Errc::verify_failed, "the relay's own copy of version " + std::to_string(new_version) +
                                           " has digest " + hex64(copy->digest.combined()) + ", not " +
                                           hex64(expected_digest));
  };
  if (!d.fleet_slices.empty()) {
    // Placed members: the frames are not cut for their placements, and their seal has no slice
    // table for them: the version is encoded again here, from the relay's own copy.
    if (d.group) throw Error(Errc::state, "a producer group encodes its versions itself (refit), rank by rank");
    if (new_version != d.version + 1)
      throw Error(Errc::invalid_argument,
                  "forward: version " + std::to_string(new_version) + " after version " + std::to_string(d.version));
    hold_copy();
    return d.refit_bits(copy->bits, {});
  }
  // The copy is ready before any member can hear COMMIT: `sent` runs before the joint commit.
  return d.publish_frames(frames, new_version, expected_digest, {}, hold_copy, [&] {
    d.version = new_version;
    d.baseline->adopt(copy->bits, new_version, copy->digest);
  });
}

RefitReport Producer::Impl::publish_frames(const std::vector<std::vector<std::byte>>& frames, uint64_t new_version,
                                           uint64_t expected_digest, const RefitOptions& refit_options,
                                           const std::function<void()>& sent, const std::function<void()>& committed) {
  auto& d = *this;
  if (!d.membership) throw Error(Errc::state, "Producer::publish before start()");
  if (d.group) throw Error(Errc::state, "a producer group encodes its versions itself (refit), rank by rank");
  auto new_layout = d.changed_layout(refit_options.layout);
  // Keys are codec chunk keys (the seal is chunk_count); duplicates in `frames` are sent as given.
  std::map<uint32_t, size_t> first_of_key;
  std::vector<uint32_t> key_of(frames.size());
  uint32_t keys = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto h = codec::parse_frame(frames[i]).header;
    key_of[i] = h.kind == codec::FrameKind::seal ? h.chunk_count : h.chunk_index;
    first_of_key.emplace(key_of[i], i);
    keys = std::max(keys, key_of[i] + 1);
  }
  const TopologyKind kind = d.membership->kind();
  std::vector<bool> is_seal(keys, false);
  for (size_t i = 0; i < frames.size(); ++i)
    if (codec::parse_frame(frames[i]).header.kind == codec::FrameKind::seal) is_seal[key_of[i]] = true;
  Impl::InFlight flight;
  flight.version = new_version;
  flight.layout = std::move(new_layout);
  flight.keys = keys;
  flight.tree_of = [kind, is_seal](uint32_t key) { return is_seal[key] ? 0 : tree_for_chunk(kind, key); };
  flight.make = [&](uint32_t key, uint32_t route) {
    auto it = first_of_key.find(key);
    if (it == first_of_key.end()) throw Error(Errc::not_found, "publish: no frame for chunk " + std::to_string(key));
    return Outgoing{std::make_shared<const std::vector<std::byte>>(
                        encode_frame_message(frames[it->second], d.in_flight->envelope(route), d.epoch())),
                    {}};
  };
  auto send_frames = [&](Impl::InFlight& f) {
    for (size_t i = 0; i < frames.size(); ++i) {
      const uint32_t key = key_of[i];
      d.deliver(f.tree_of(key), Outgoing{std::make_shared<const std::vector<std::byte>>(
                                             encode_frame_message(frames[i], f.envelope(0), d.epoch())),
                                         {}});
      f.sent[key] = true;
      f.report->frames_bytes += frames[i].size();
      if (!is_seal[key]) ++f.report->chunks;
    }
  };
  auto send_all = [&](Impl::InFlight& f) {
    send_frames(f);
    if (sent) sent();
  };
  RefitReport report = d.run_version(
      std::move(flight), send_all, [&] { return expected_digest; }, refit_options.dry_run, committed);
  return report;
}

}  // namespace deltacast::tree
