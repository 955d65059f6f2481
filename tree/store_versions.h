#pragma once
// Versions over an object store (issue 34; docs/object-storage.md, "The producer and the receivers
// over the store"): what a producer publishes for members that cannot reach it, and how such a
// member catches up from the store alone. Under a prefix:
//   PREFIX/deltas/...     each committed delta: its codec frames (chunks, then the seal), as the tree
//                         carries them (objstore::VersionWriter's layout)
//   PREFIX/snapshots/...  whole versions for members too far behind: RAW records, each a RAW
//                         message (its header, tree/protocol.h) followed by its body
// A member replays every delta after the version it holds, each checked as over the tree (base
// version and digest, every chunk exactly once, the seal's digests); when one it needs is gone
// (pruned, or never published) it takes the newest snapshot (checked by a full-scan digest against
// the manifest's) and replays from there. A refused delta is rolled back: the weights stay at the
// last version committed here.
//
// Thread-safety: one thread at a time per object (each uses the store's parallel threads inside a
// call).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codec/applier.h"
#include "codec/digest.h"
#include "codec/manifest.h"
#include "objstore/s3_client.h"
#include "objstore/version_store.h"

namespace deltacast::tree {

struct StoreLayout {
  std::string prefix;                        // without a trailing '/'
  uint64_t part_bytes = uint64_t{16} << 20;  // multipart part size (at least 5 MiB)
  unsigned parallel = 4;                     // parts and ranges in flight
  uint32_t retain_versions = 4;              // deltas kept (and snapshots: the same count)
  // The job's secret (secret_file): manifests signed by the publisher and checked by the follower
  // (objstore::VersionStoreOptions::secret). Empty: unsigned.
  std::string secret = {};
  // Versions (deltas, snapshots) of at most this many bytes go inline, in their manifest object:
  // one GET a version (objstore::VersionStoreOptions::inline_bytes). 0: never.
  uint64_t inline_bytes = uint64_t{4} << 20;
};

// The objects beside the versions: PREFIX/model.json (the model's tensors: name, dtype, shape in
// manifest order; a member of the store learns the model from it, as a tree member does from
// WELCOME) and PREFIX/end.json (the last version of a run: members stop once they hold it).
// The readers give nullopt while the object does not exist, Error(corrupt_frame) for one that is
// not such a record, and what the client throws otherwise.
void publish_model(objstore::S3Client& client, const StoreLayout& layout, const codec::Manifest& manifest);
std::optional<codec::Manifest> read_model(objstore::S3Client& client, const StoreLayout& layout);
void publish_end(objstore::S3Client& client, const StoreLayout& layout, uint64_t version);
std::optional<uint64_t> read_end(objstore::S3Client& client, const StoreLayout& layout);
// PREFIX/acks/<member>.json: the version a gateway (job member rank `member`) holds, with its
// digest, overwritten as it advances (for a gateway with a cluster: once its cluster's tree
// committed it). A producer that reaches its members only through the store waits for these
// before its next version (tools/run/store_producer.cpp). read_ack: nullopt while there is none.
struct StoreAck {
  uint64_t version = 0;
  uint64_t digest = 0;
};
void publish_ack(objstore::S3Client& client, const StoreLayout& layout, uint32_t member, const StoreAck& ack);
std::optional<StoreAck> read_ack(objstore::S3Client& client, const StoreLayout& layout, uint32_t member);
// A fresh chain: deletes every object under PREFIX/ and aborts its multipart uploads (a producer
// starting a new run; the prefix belongs to one version chain). Returns the objects deleted.
size_t clear_store(objstore::S3Client& client, const StoreLayout& layout);

class StorePublisher {
 public:
  StorePublisher(const codec::Manifest& manifest, objstore::S3Client& client, const StoreLayout& layout);
  // A committed delta from `base_version` to `version`: its frames in order (every chunk, then the
  // seal), whose new state's combined digest is `digest`.
  objstore::VersionManifest publish_delta(uint64_t version, uint64_t base_version, uint64_t epoch, uint64_t digest,
                                          const std::vector<std::vector<std::byte>>& frames);
  // Version `version` whole (`weights`), in RAW records of at most piece_bytes each; its digest is
  // a full scan of `weights`.
  objstore::VersionManifest publish_snapshot(uint64_t version, uint64_t epoch, const codec::ConstWeights& weights,
                                             uint64_t piece_bytes = uint64_t{4} << 20);
  // Deletes deltas and snapshots beyond retain_versions of each; a dead writer's parts too.
  void prune();

 private:
  const codec::Manifest& manifest_;
  objstore::VersionWriter deltas_;
  objstore::VersionWriter snapshots_;
};

class StoreFollower {
 public:
  // `weights` (the host's, outliving this) hold `version`, whose StateDigest is `digest`.
  StoreFollower(const codec::Manifest& manifest, objstore::S3Client& client, const StoreLayout& layout,
                codec::MutableWeights weights, uint64_t version, codec::StateDigest digest);
  ~StoreFollower();
  // Brings the weights to the newest delta the store holds (or its newest snapshot when that is
  // newer): replays, or a snapshot then replays. Returns the version held. Throws Error
  // (corrupt_frame, verify_failed, version_mismatch, not_found, connection, auth, ...) when it
  // cannot; the weights then hold the last version committed here. A snapshot is downloaded and
  // checked (every record's XXH3, headers, coverage) before a byte of it lands; only one whose
  // landed bits then miss the manifest's digest (a writer of the bucket made consistent junk)
  // leaves the all-zero version 0, a true state.
  uint64_t catch_up();
  // The poll of a member that keeps up: only the deltas after the version it holds, one request
  // when there is none (their manifests; latest.json and the snapshots are not read). Returns the
  // version held. Call catch_up() now and then: a gap in the deltas (pruned while this member was
  // away, a publish the producer dropped) is crossed only by it.
  uint64_t follow_deltas();
  // A relay of the deltas this follower replays (a gateway sending them on to its cluster's tree
  // while it applies them; docs/object-storage.md, "Hybrid"): called with each delta's manifest
  // and frames as downloaded and checked, before a bit of it lands here, and with `apply`, which
  // applies, verifies and commits the delta here, or throws with the weights as they were (a
  // seal whose digests the bits miss, or whose version digest is not the manifest's). The relay
  // calls `apply` exactly once, on any thread, and returns only after it returned or threw; what
  // the relay throws stops catch_up with that error, and a relay that returns without the delta
  // applied is Error(state). Without a relay the follower applies each delta itself.
  using DeltaRelay = std::function<void(const objstore::VersionManifest&, const std::vector<std::vector<std::byte>>&,
                                        const std::function<void()>& apply)>;
  void relay_deltas(DeltaRelay relay) { relay_ = std::move(relay); }
  uint64_t version() const;
  uint64_t digest() const;  // combined StateDigest of version()
  const codec::StateDigest& state_digest() const;

  struct Stats {
    uint64_t deltas_applied = 0;
    uint64_t snapshots_taken = 0;
    uint64_t bytes_downloaded = 0;
  };
  Stats stats() const { return stats_; }

 private:
  // Applies delta `v` (base: the version held), through the relay when there is one. False when
  // the store has no manifest for it.
  bool replay(uint64_t v);
  // Applies, verifies and commits a downloaded delta; rolls back and throws when it does not verify.
  void apply_delta(const objstore::VersionManifest& m, const std::vector<std::vector<std::byte>>& frames);
  // Lands snapshot `v` and makes it the version held.
  void take_snapshot(uint64_t v);

  const codec::Manifest& manifest_;
  objstore::VersionReader deltas_;
  objstore::VersionReader snapshots_;
  codec::MutableWeights weights_;
  std::unique_ptr<codec::DeltaApplier> applier_;
  DeltaRelay relay_;
  Stats stats_;
};

}  // namespace deltacast::tree
