#include "tree/store_versions.h"

#include <algorithm>
#include <cstring>

#include "codec/dtype.h"

#include "tree/producer/raw_pieces.h"
#include "tree/protocol.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/json.h"

namespace deltacast::tree {
namespace {

objstore::VersionStoreOptions under(const StoreLayout& layout, const char* what) {
  return objstore::VersionStoreOptions{layout.prefix.empty() ? what : layout.prefix + "/" + what,
                                       layout.part_bytes,
                                       layout.parallel,
                                       layout.retain_versions,
                                       layout.secret,
                                       layout.inline_bytes};
}

std::string key_under(const StoreLayout& layout, const char* name) {
  return layout.prefix.empty() ? name : layout.prefix + "/" + name;
}

constexpr const char* kModelFormat = "deltacast-store-model-1";
constexpr const char* kEndFormat = "deltacast-store-end-1";
constexpr const char* kAckFormat = "deltacast-store-ack-1";

std::string text_of(const std::vector<std::byte>& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void put_json(objstore::S3Client& client, const std::string& key, const nlohmann::json& j) {
  const std::string text = j.dump();
  client.put(key, std::as_bytes(std::span(text.data(), text.size())));
}

// The object as JSON of `format`; nullopt when it does not exist.
std::optional<nlohmann::json> get_json(objstore::S3Client& client, const std::string& key, const char* format) {
  std::vector<std::byte> bytes;
  try {
    bytes = client.get(key);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found && std::string(e.what()).find("NoSuchKey") != std::string::npos)
      return std::nullopt;
    throw;
  }
  nlohmann::json j = util::parse_json_bounded(text_of(bytes));
  if (j.is_discarded() || !j.is_object() || !j.contains("format") || j["format"] != format)
    throw Error(Errc::corrupt_frame, "store: " + key + " is not a " + format + " record");
  return j;
}

// RAW record header size: a RAW message's header has a fixed size (the record's first bytes).
size_t raw_record_prefix() {
  static const size_t prefix = [] {
    RawChunkHeader any;
    any.chunk_count = 1;
    return encode_raw_message(any).size();
  }();
  return prefix;
}

}  // namespace

void publish_model(objstore::S3Client& client, const StoreLayout& layout, const codec::Manifest& manifest) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : manifest.tensors())
    tensors.push_back({{"name", t.name}, {"dtype", std::string(codec::dtype_name(t.dtype))}, {"shape", t.shape}});
  put_json(client, key_under(layout, "model.json"),
           {{"format", kModelFormat}, {"digest", manifest.digest()}, {"tensors", tensors}});
}

std::optional<codec::Manifest> read_model(objstore::S3Client& client, const StoreLayout& layout) {
  const std::string key = key_under(layout, "model.json");
  const auto j = get_json(client, key, kModelFormat);
  if (!j) return std::nullopt;
  try {
    std::vector<codec::TensorInfo> infos;
    for (const auto& t : j->at("tensors")) {
      const auto dtype = codec::dtype_from_name(t.at("dtype").get<std::string>());
      if (!dtype) throw Error(Errc::corrupt_frame, "a tensor with an unknown dtype");
      infos.push_back({t.at("name").get<std::string>(), *dtype, t.at("shape").get<std::vector<uint64_t>>()});
    }
    codec::Manifest manifest(std::move(infos));
    if (manifest.digest() != j->at("digest").get<uint64_t>())
      throw Error(Errc::corrupt_frame, "its tensors do not hash to its digest");
    return manifest;
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::corrupt_frame, "store: " + key + ": " + e.what());
  } catch (const Error& e) {
    throw Error(Errc::corrupt_frame, "store: " + key + ": " + e.what());
  }
}

void publish_end(objstore::S3Client& client, const StoreLayout& layout, uint64_t version) {
  put_json(client, key_under(layout, "end.json"), {{"format", kEndFormat}, {"version", version}});
}

std::optional<uint64_t> read_end(objstore::S3Client& client, const StoreLayout& layout) {
  const std::string key = key_under(layout, "end.json");
  const auto j = get_json(client, key, kEndFormat);
  if (!j) return std::nullopt;
  if (!j->contains("version") || !(*j)["version"].is_number_unsigned())
    throw Error(Errc::corrupt_frame, "store: " + key + " names no version");
  return (*j)["version"].get<uint64_t>();
}

void publish_ack(objstore::S3Client& client, const StoreLayout& layout, uint32_t member, const StoreAck& ack) {
  const std::string key = key_under(layout, "acks/") + std::to_string(member) + ".json";
  put_json(client, key, {{"format", kAckFormat}, {"version", ack.version}, {"digest", ack.digest}});
}

std::optional<StoreAck> read_ack(objstore::S3Client& client, const StoreLayout& layout, uint32_t member) {
  const std::string key = key_under(layout, "acks/") + std::to_string(member) + ".json";
  const auto j = get_json(client, key, kAckFormat);
  if (!j) return std::nullopt;
  if (!(*j)["version"].is_number_unsigned() || !(*j)["digest"].is_number_unsigned())
    throw Error(Errc::corrupt_frame, "store: " + key + " is not an ack");
  return StoreAck{(*j)["version"].get<uint64_t>(), (*j)["digest"].get<uint64_t>()};
}

size_t clear_store(objstore::S3Client& client, const StoreLayout& layout) {
  const std::string prefix = layout.prefix.empty() ? "" : layout.prefix + "/";
  for (const auto& upload : client.list_multipart(prefix)) client.abort_multipart(upload.key, upload.upload_id);
  const auto objects = client.list(prefix);
  for (const auto& o : objects) client.remove(o.key);
  return objects.size();
}

StorePublisher::StorePublisher(const codec::Manifest& manifest, objstore::S3Client& client, const StoreLayout& layout)
    : manifest_(manifest), deltas_(client, under(layout, "deltas")), snapshots_(client, under(layout, "snapshots")) {}

objstore::VersionManifest StorePublisher::publish_delta(uint64_t version, uint64_t base_version, uint64_t epoch,
                                                        uint64_t digest,
                                                        const std::vector<std::vector<std::byte>>& frames) {
  const std::vector<std::span<const std::byte>> spans(frames.begin(), frames.end());
  return deltas_.publish(version, base_version, epoch, digest, spans, "delta");
}

objstore::VersionManifest StorePublisher::publish_snapshot(uint64_t version, uint64_t epoch,
                                                           const codec::ConstWeights& weights, uint64_t piece_bytes) {
  codec::check_weights(weights);
  std::vector<codec::PartRange> whole;
  for (uint32_t t = 0; t < manifest_.size(); ++t) whole.push_back({t, 0, manifest_.at(t).units()});
  const auto pieces = raw_pieces(manifest_, whole, piece_bytes);
  std::vector<std::vector<std::byte>> records;
  records.reserve(pieces.size());
  for (uint32_t i = 0; i < pieces.size(); ++i) {
    const RawPiece& p = pieces[i];
    RawChunkHeader h;
    h.version = version;
    h.chunk_index = i;
    h.chunk_count = static_cast<uint32_t>(pieces.size());
    h.tensor = p.tensor;
    h.byte_offset = p.offset;
    h.byte_count = p.size;
    std::vector<std::byte> record = encode_raw_message(h);
    const auto body = weights.tensors[p.tensor].subspan(p.offset, p.size);
    record.insert(record.end(), body.begin(), body.end());
    records.push_back(std::move(record));
  }
  const uint64_t digest = codec::StateDigest::full_scan(weights, 1).combined();
  const std::vector<std::span<const std::byte>> spans(records.begin(), records.end());
  return snapshots_.publish(version, 0, epoch, digest, spans, "snapshot");
}

void StorePublisher::prune() {
  deltas_.prune();
  snapshots_.prune();
}

StoreFollower::StoreFollower(const codec::Manifest& manifest, objstore::S3Client& client, const StoreLayout& layout,
                             codec::MutableWeights weights, uint64_t version, codec::StateDigest digest)
    : manifest_(manifest),
      deltas_(client, under(layout, "deltas")),
      snapshots_(client, under(layout, "snapshots")),
      weights_(std::move(weights)),
      applier_(std::make_unique<codec::DeltaApplier>(manifest, weights_, version, std::move(digest))) {}

StoreFollower::~StoreFollower() = default;

uint64_t StoreFollower::version() const { return applier_->version(); }
uint64_t StoreFollower::digest() const { return applier_->version_combined(); }
const codec::StateDigest& StoreFollower::state_digest() const { return applier_->digest(); }

bool StoreFollower::replay(uint64_t v) {
  objstore::VersionManifest m;
  try {
    m = deltas_.manifest(v);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found) return false;
    throw;
  }
  if (m.base_version != applier_->version()) return false;
  const auto frames = deltas_.frames(m);
  if (relay_)
    relay_(m, frames, [&] { apply_delta(m, frames); });
  else
    apply_delta(m, frames);
  if (applier_->version() != v)
    throw Error(Errc::state, "store: the relay of delta " + std::to_string(v) + " returned without applying it");
  return true;
}

void StoreFollower::apply_delta(const objstore::VersionManifest& m, const std::vector<std::vector<std::byte>>& frames) {
  const std::string what = "store: delta " + std::to_string(m.version);
  try {
    for (const auto& frame : frames) {
      stats_.bytes_downloaded += frame.size();
      applier_->apply(frame);
    }
    if (!applier_->complete()) throw Error(Errc::corrupt_frame, what + " lacks chunks or its seal");
    applier_->verify();
    if (applier_->pending_combined() != m.digest)
      throw Error(Errc::verify_failed, what + ": its seal names digest " + hex64(applier_->pending_combined()) +
                                           ", its manifest " + hex64(m.digest));
    applier_->commit();
  } catch (const Error&) {
    if (applier_->pending_version()) applier_->rollback();
    throw;
  }
  ++stats_.deltas_applied;
}

void StoreFollower::take_snapshot(uint64_t v) {
  const objstore::VersionManifest m = snapshots_.manifest(v);
  const auto records = snapshots_.frames(m);
  const std::string what = "store: snapshot " + std::to_string(v);
  // Every record is checked before any lands: a snapshot refused here leaves the weights as they were.
  const size_t prefix = raw_record_prefix();
  std::vector<RawChunkHeader> headers;
  std::vector<bool> have;
  for (const auto& record : records) {
    stats_.bytes_downloaded += record.size();
    if (record.size() < prefix) throw Error(Errc::corrupt_frame, what + " holds a record that is not RAW");
    const RawChunkHeader h = decode_raw_message(std::span(record).first(prefix));
    if (h.version != v || h.chunk_count > max_raw_chunk_count(manifest_) || h.tensor >= manifest_.size() ||
        record.size() - prefix != h.byte_count || h.byte_offset > manifest_.at(h.tensor).nbytes() ||
        h.byte_count > manifest_.at(h.tensor).nbytes() - h.byte_offset)
      throw Error(Errc::corrupt_frame, what + ": a piece outside its tensor");
    if (have.empty()) have.assign(h.chunk_count, false);
    if (h.chunk_count != have.size() || h.chunk_index >= have.size() || have[h.chunk_index])
      throw Error(Errc::corrupt_frame, what + ": pieces disagree");
    have[h.chunk_index] = true;
    headers.push_back(h);
  }
  if (have.empty() || std::count(have.begin(), have.end(), false) != 0)
    throw Error(Errc::corrupt_frame, what + " misses pieces");
  for (size_t i = 0; i < records.size(); ++i)
    std::memcpy(weights_.tensors[headers[i].tensor].data() + headers[i].byte_offset, records[i].data() + prefix,
                headers[i].byte_count);
  auto digest = codec::StateDigest::full_scan(weights_.as_const(), 1);
  if (digest.combined() != m.digest) {
    // Consistent records of other bits (a writer of the bucket): the all-zero version 0, a true state.
    for (auto& t : weights_.tensors) std::memset(t.data(), 0, t.size());
    applier_ = std::make_unique<codec::DeltaApplier>(manifest_, weights_, 0,
                                                     codec::StateDigest::full_scan(weights_.as_const(), 1));
    throw Error(Errc::verify_failed, what + "'s bits do not match its manifest");
  }
  applier_ = std::make_unique<codec::DeltaApplier>(manifest_, weights_, v, std::move(digest));
  ++stats_.snapshots_taken;
}

uint64_t StoreFollower::follow_deltas() {
  while (replay(version() + 1)) {
  }
  return version();
}

uint64_t StoreFollower::catch_up() {
  // The common case first, one request a version: the next delta's manifest (written after its
  // frames and before latest.json, so a manifest found is a whole version).
  while (replay(version() + 1)) {
  }
  // None (yet): is anything newer there at all? A snapshot only matters at version 0 (version 1 is
  // stored whole only) or across a gap in the deltas (pruned, or a publish the producer dropped).
  const uint64_t newest_delta = deltas_.latest().value_or(0);
  if (version() > 0 && newest_delta <= version()) return version();
  const uint64_t newest_snapshot = snapshots_.latest().value_or(0);
  const uint64_t target = std::max(newest_delta, newest_snapshot);
  if (version() >= target) return version();
  if (newest_snapshot > version()) {
    take_snapshot(newest_snapshot);
    while (version() < newest_delta && replay(version() + 1)) {
    }
  }
  if (version() < target)
    throw Error(Errc::not_found, "store: version " + std::to_string(version() + 1) +
                                     " is neither a delta nor reachable from a snapshot (held " +
                                     std::to_string(version()) + ", the store's newest " + std::to_string(target) +
                                     ")");
  return version();
}

}  // namespace deltacast::tree
