#pragma once
// What the producer keeps of the last committed version: its bits, their StateDigest and version,
// and the snapshots being read from it (a rejoining member's FETCH when no peer could serve it).
// A rank of a producer group keeps only its part (codec/partition.h): the bits of its ranges, and
// per tensor the digest sums over them (docs/producer-group.md).
//
// Threads: one driving thread writes (adopt) and reads (weights, digest, version) without a lock;
// snapshots are read on serving threads, under the store's lock. A snapshot keeps reading the
// version it opened at: each adopt hands every open snapshot the old bits of what it overwrites
// (SnapshotPatches). Unit tests: tests/unit/tree/test_baseline_store.cpp.
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "codec/digest.h"
#include "codec/manifest.h"
#include "codec/partition.h"
#include "tree/snapshot_serve.h"

namespace deltacast::tree {

class BaselineStore {
 public:
  // Version 0: every tensor of `manifest` (which must outlive the store) all zeros. Full digest
  // scans use `digest_threads`.
  BaselineStore(const codec::Manifest& manifest, unsigned digest_threads);
  // A part: the ranges of `part` only (any order), version 0's zeros; digest() holds, per tensor,
  // the digest sums over the part's ranges. Throws Error(invalid_argument) for a range outside the
  // manifest or ranges that overlap.
  BaselineStore(const codec::Manifest& manifest, std::vector<codec::PartRange> part, unsigned digest_threads);
  BaselineStore(const BaselineStore&) = delete;
  BaselineStore& operator=(const BaselineStore&) = delete;

  // ---- the driving thread ----
  bool whole() const noexcept { return whole_; }
  // The ranges held, in (tensor, begin) order (a whole store: every tensor).
  const std::vector<codec::PartRange>& ranges() const noexcept { return ranges_; }
  uint64_t bytes() const noexcept;  // the bits held
  // The whole model's weights. Throws Error(state) for a part.
  codec::ConstWeights weights() const;
  // The bits held, as a reader (an encoder's base): reads outside the ranges throw
  // Error(invalid_argument).
  const codec::WeightsReader& reader() const noexcept { return reader_; }
  const codec::StateDigest& digest() const noexcept { return digest_; }
  uint64_t version() const noexcept { return version_; }
  // Why the store holds no committed version (empty: it holds version()).
  const std::string& lost() const noexcept { return lost_; }
  // `next` (version `v`) becomes the baseline, with StateDigest `digest` (a full scan when absent).
  // A whole store only (Error(state) for a part).
  void adopt(const codec::ConstWeights& next, uint64_t v, std::optional<codec::StateDigest> digest);
  // The same with `next` read (pread of a checkpoint, or a trainer rank's memory) in pieces into
  // the baseline, only within the ranges held, each piece first compared with the old bits when
  // snapshots are open; `digest` is the part's (per tensor sums over its ranges) or the whole
  // version's. A read that fails leaves the store neither
  // version: lost() says why from then on (open snapshots still read the old bits of what was
  // overwritten), and it throws Error(io).
  // Absent `digest`: the part's, taken from the bits held once they are read (a resumed rank).
  void adopt(const codec::WeightsReader& next, uint64_t v, std::optional<codec::StateDigest> digest);

  // ---- serving threads ----
  // A consistent read of the version the store held when it was opened, while adopts go on.
  class Snapshot {
   public:
    ~Snapshot();
    Snapshot(const Snapshot&) = delete;
    Snapshot& operator=(const Snapshot&) = delete;
    uint64_t version() const noexcept { return version_; }
    uint64_t digest() const noexcept { return digest_; }  // the combined digest of version()
    // Copies bytes [offset, offset + out.size()) of `tensor`, as of version(), into `out`. Reads go
    // forward in (tensor, offset) order, cover whole elements and lie inside one held range.
    void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out);

   private:
    friend class BaselineStore;
    Snapshot(BaselineStore& store, uint64_t version, uint64_t digest);
    BaselineStore& store_;
    uint64_t version_;
    uint64_t digest_;
    SnapshotPatches patches_;
  };
  // Opens a snapshot of the committed version. Throws Error(state) when there is none: nothing
  // committed yet (version 0) or lost().
  std::unique_ptr<Snapshot> open_snapshot();

 private:
  void record(const std::vector<SnapshotPatches::Patch>& changed);  // under mutex_, unique
  // The held bytes [offset, offset + size) of `tensor`: throws Error(invalid_argument) unless they
  // lie inside one range.
  std::span<const std::byte> held(uint32_t tensor, uint64_t offset, uint64_t size) const;

  // The store's bits as a WeightsReader (reader()).
  class Reader final : public codec::WeightsReader {
   public:
    explicit Reader(const BaselineStore& store) : store_(store) {}
    const codec::Manifest& manifest() const noexcept override { return store_.manifest_; }
    void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const override;

   private:
    const BaselineStore& store_;
  };

  // The digest of the bits held (a whole store: a full scan; a part: per tensor, its ranges' sums).
  codec::StateDigest held_digest() const;

  const codec::Manifest& manifest_;
  unsigned digest_threads_;
  bool whole_ = true;
  std::vector<codec::PartRange> ranges_;  // sorted by (tensor, begin); bits_[i] holds ranges_[i]
  Reader reader_{*this};
  mutable std::shared_mutex mutex_;           // bits_, digest_, version_, lost_, readers_ vs serving threads
  std::vector<std::vector<std::byte>> bits_;  // [range]
  codec::StateDigest digest_;
  uint64_t version_ = 0;
  std::string lost_;
  std::vector<SnapshotPatches*> readers_;  // the open snapshots
};

}  // namespace deltacast::tree
