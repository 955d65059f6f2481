#pragma once
// A producer's uplink to the object store (docs/object-storage.md, "The producer"): every version
// the producer committed is published under the store's prefix on a thread of its own, in order,
// so the next refit never waits for the store. Deltas go as their frames; version 1, every
// store.snapshot_every-th version and the version after a publish that failed go whole
// (snapshots), so a member of the store further behind than what is retained, or one that met a
// gap in the chain, still has a way to the newest version. A publish that fails (the S3 client
// retried it already) is tried again, in order, every few seconds for up to `give_up`, so an
// outage of the store delays the chain but leaves no gap in it; after that the version is dropped
// (logged and counted), and the next committed version goes whole. The run goes on meanwhile.
//
// Thread-safety: one producer thread calls it; the uplink's own thread does the publishing.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "codec/manifest.h"
#include "codec/owned_weights.h"
#include "objstore/s3_client.h"
#include "tree/store_versions.h"

namespace deltacast::tree {

class StoreUplink {
 public:
  struct Options {
    StoreLayout layout;
    uint32_t snapshot_every = 0;                // 0: version 1 only (and after a failure)
    bool fresh = true;                          // a new chain: clear the prefix first (false: a resumed producer)
    std::chrono::milliseconds give_up{60'000};  // how long a failing publish is tried again
    std::chrono::milliseconds retry_every{2'000};
  };
  // Writes the model record (and, fresh, clears the prefix first), synchronously: members of the
  // store wait for it. Throws what the client throws (an unreachable store, a missing bucket, bad
  // credentials fail the producer's start, not a later version).
  StoreUplink(const codec::Manifest& manifest, std::unique_ptr<objstore::S3Client> client, Options options);
  ~StoreUplink();  // waits for what is queued
  StoreUplink(const StoreUplink&) = delete;
  StoreUplink& operator=(const StoreUplink&) = delete;

  // Queues committed delta `version` (base `base_version`, combined digest `digest`): its frames.
  void delta(uint64_t version, uint64_t base_version, uint64_t digest, std::vector<std::vector<std::byte>> frames);
  // Whether committed version `version` should also go whole: version 1, every snapshot_every-th,
  // a publish failed since the last snapshot, or the last snapshot is retain_versions old (else a
  // member at version 0 would find neither it nor every delta after it: each version stays
  // reachable from version 0 by a snapshot and retained deltas).
  bool wants_snapshot(uint64_t version) const;
  // Queues version `version` whole (the uplink keeps `bits` until it is written).
  void snapshot(uint64_t version, std::shared_ptr<const codec::OwnedWeights> bits);
  struct Stats {
    uint64_t deltas = 0;
    uint64_t snapshots = 0;
    uint64_t failed = 0;          // versions dropped after give_up
    uint64_t retried = 0;         // publishes tried again
    uint64_t bytes_uploaded = 0;  // request bodies (the S3 client's count: retries included)
    double seconds = 0;           // publishing, summed
    std::string last_error;
  };
  // Waits until everything queued was published (or dropped).
  void wait_idle();
  // Waits for everything queued, writes end.json naming `last_version` (members of the store stop
  // once they hold it) and returns what was done.
  Stats finish(uint64_t last_version);
  Stats stats() const;

 private:
  struct Job {
    uint64_t version = 0;
    uint64_t base_version = 0;
    uint64_t digest = 0;
    std::vector<std::vector<std::byte>> frames;       // a delta
    std::shared_ptr<const codec::OwnedWeights> bits;  // a snapshot
  };
  void loop();
  // One attempt; false (the error logged) when it failed.
  bool publish(Job& job);

  const codec::Manifest& manifest_;
  std::unique_ptr<objstore::S3Client> client_;
  Options options_;
  StorePublisher publisher_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool broken_ = false;  // a publish failed since the last snapshot
  uint64_t last_snapshot_ = 0;
  Stats stats_;
  std::thread thread_;
};

}  // namespace deltacast::tree
