#pragma once
// Receivers that write what they hold (`output.checkpoint_dir`, docs/config.md):
//
//   DIR/v<version>/   every committed version the receiver held, in the shard layout of that
//                     version's trainer checkpoint (the same shard files, tensors per shard,
//                     __metadata__ and index), the small files the trainer kept beside those
//                     shards (config.json, tokenizer files), and deltacast.json {version, digest,
//                     manifest}: a directory vLLM or SGLang can load. The layout comes with each
//                     version (committed()): a trainer checkpoint that changed its config.json or
//                     __metadata__ is written as it was (docs/protocol.md, "Checkpoint layouts");
//   DIR/latest        a symlink to the newest v<version>, switched atomically (rename);
//   DIR/.lock         held (flock) while a receiver writes DIR: two receivers never share one.
//
// A version directory is written as DIR/.v<version>.partial, verified (its files are read back
// and their StateDigest must be the version's), then renamed: whatever a reader finds under a
// v<version> name, or through latest, is whole, committed and verified. The oldest directories
// beyond `keep` are removed (never the one latest names).
//
// The policy against the next refit (the choice of three): the receiver runs gated
// (docs/embedding.md). Refits are verified, acked and committed into a queue without touching
// the buffers, so forwarding and commits never wait for a disk. The writer thread is the host's
// only reader of the buffers: it applies every queued version (apply_pending), writes the newest
// one, and repeats. Versions committed while a write is in flight are not written on their own:
// the next write is of the latest (the skipped ones are logged). Memory while a write is in flight:
// the queue, 8 bytes per element changed by the versions committed meanwhile.
//
// A disk that fills up (or fails) never stops the refits: the weights in memory go on committing.
// Before each write the free space of DIR is checked against the version's tensor and side-file
// bytes; short of it, nothing is written. A write that fails anyway (ENOSPC, EIO, a quota) removes
// its partial directory, so a failure leaves no garbage that would keep the disk full. latest
// keeps naming the last version written. The writer retries: after a space check that failed,
// every second; after a failed write, after 1, 2, 4 ... 30 s (consecutive failures), so a broken
// disk is not rewritten every second. Errors are logged when they first appear and then once a
// minute; the write that succeeds again says how many attempts failed. At peak DIR holds `keep`
// versions plus the one being written: budget (keep + 1) x the checkpoint.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "codec/manifest.h"
#include "tree/protocol.h"
#include "tree/receiver.h"

namespace deltacast::tools {

// Files beside the shards larger than this are not sent to the receivers (nor are any once the
// total reaches kMaxSideFilesBytes); the producer logs each one left out.
inline constexpr uint64_t kMaxSideFileBytes = uint64_t{16} << 20;
inline constexpr uint64_t kMaxSideFilesBytes = uint64_t{32} << 20;

// The producer's side: how `checkpoint` lies on disk, as WELCOME carries it: its shards (tensors
// as indexes of `manifest`), __metadata__, the index metadata, and the small regular files beside
// the shards (a directory checkpoint only; hidden files, *.safetensors and the index excluded).
tree::CheckpointLayout welcome_layout(const checkpoint::Checkpoint& checkpoint, const codec::Manifest& manifest);

// The receiver's side: the layout to write `manifest` in. An empty WELCOME layout (a synthetic
// trainer) gives one file, model.safetensors. Throws Error(corrupt_frame) when the index metadata
// is not a JSON object.
checkpoint::Layout disk_layout(const tree::CheckpointLayout& layout, const codec::Manifest& manifest);

// What DIR/latest holds, for a receiver that restarts: the version, its combined digest, and its
// bits in buffers laid out as the manifest recorded in deltacast.json (the receiver's manifest
// order when it wrote it).
struct HeldCheckpoint {
  uint64_t version = 0;
  uint64_t digest = 0;  // the whole version's (what HELLO names)
  bool shard = false;   // a placed receiver's buffers (their own digest was checked)
  std::filesystem::path path;
  codec::Manifest manifest;
  std::vector<std::vector<std::byte>> buffers;  // manifest order
};
// nullopt when DIR/latest does not exist. Reads the checkpoint and checks its bits against the
// recorded digest (a full scan; a placed receiver's shard: against the shard's own digest). Throws Error(io |
// invalid_argument | verify_failed) naming what is wrong: the caller then starts from scratch.
std::optional<HeldCheckpoint> load_latest(const std::filesystem::path& dir, unsigned threads);

class CheckpointDirWriter {
 public:
  struct Options {
    std::filesystem::path dir;
    uint32_t keep = 2;
    // TESTING AID (`deltacast run --slow-disk`): each version's write takes at least its bytes /
    // this rate, as on a slow disk. 0: as fast as the disk goes.
    double slow_disk_bytes_per_second = 0;
    unsigned threads = 1;  // for the read-back digest
    // The weights are a placed receiver's buffers (docs/placement.md): each version is written as
    // one model.safetensors of its buffers (the trainer's layout names the canonical tensors, not
    // these), plus the side files; the read-back is checked against the buffers' own digest,
    // which deltacast.json records as `files_digest` beside the version's.
    bool shard = false;
  };
  // Takes DIR (created; Error(io) when it cannot be, Error(state) when another process holds its
  // lock) and starts the writer thread. `receiver` must be gated and attached to `weights`.
  // already_written: the version DIR/latest holds (0: none).
  CheckpointDirWriter(Options options, tree::Receiver& receiver, codec::ConstWeights weights,
                      uint64_t already_written = 0);
  ~CheckpointDirWriter();  // finish() if not called
  CheckpointDirWriter(const CheckpointDirWriter&) = delete;
  CheckpointDirWriter& operator=(const CheckpointDirWriter&) = delete;

  // A version became active (the receiver's on_active), laid out as `layout` (the receiver's
  // layout() then): wakes the writer. A version is written only once its layout came this way:
  // one the buffers reach before its announcement waits for it. Any thread, cheap. Throws
  // Error(invalid_argument) for a null layout.
  void committed(uint64_t version, std::shared_ptr<const tree::CheckpointLayout> layout);
  // Applies and writes what is committed and not written yet, then stops the thread. Returns the
  // version latest names (0: none). Throws the writer's last error, if its last attempt failed.
  uint64_t finish();

  struct Stats {
    uint64_t written = 0;  // version directories written
    uint64_t skipped = 0;  // committed versions superseded while a write was in flight
    uint64_t latest = 0;   // the version latest names
    uint64_t failed = 0;   // attempts that wrote nothing (space check or write failed)
    double last_write_seconds = 0;
  };
  Stats stats() const;

 private:
  void loop();
  // Throws Error(io) when DIR has less free space than the files of a version laid out as
  // `layout` need at least (its tensors and side files).
  void check_free_space(const tree::CheckpointLayout& layout) const;
  // Writes, verifies and exposes `version`. On any failure removes what it wrote and rethrows.
  void write_version(uint64_t version, uint64_t digest, const tree::CheckpointLayout& layout);

  const Options options_;
  tree::Receiver& receiver_;
  codec::ConstWeights weights_;
  int lock_fd_ = -1;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  uint64_t committed_ = 0;  // newest version announced
  // The layouts of the versions announced and not written yet (one object shared by the versions
  // of an unchanged layout).
  std::map<uint64_t, std::shared_ptr<const tree::CheckpointLayout>> layouts_;
  bool stopping_ = false;
  std::optional<std::string> error_;  // the last attempt's failure, cleared by a success
  Stats stats_;
  std::thread thread_;
};

}  // namespace deltacast::tools
