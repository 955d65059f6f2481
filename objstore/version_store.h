#pragma once
// Versions in a bucket (issue 34; docs/object-storage.md, "Layout in the bucket"): what a producer
// that cannot reach its receivers writes, and what they read. Under a prefix:
//
//   PREFIX/v<20-digit version>/frames     every frame of the version, concatenated (one object;
//                                         a multipart upload of part_bytes parts, `parallel` at a
//                                         time, when it is larger than one part)
//   PREFIX/v<20-digit version>/manifest.json   {format, version, base_version, epoch, digest, kind,
//                                         object, object_size, frames: [{offset, size, xxh3}]} on
//                                         one line; a version of at most inline_bytes carries its
//                                         frames in it after that line ('\n', then the bytes;
//                                         `object` names the manifest itself): one GET a version
//   PREFIX/latest.json                    {format, version}: the newest complete version
//
// Order makes a version atomic: the frames object (when there is one) is complete (a multipart upload completed)
// before its manifest is written, and the manifest before latest.json names it. A reader goes
// latest -> manifest -> frames, so it never sees a version without a manifest or a manifest whose
// object is not whole; a frame whose bytes do not hash to the manifest's xxh3 (truncated,
// overwritten, a wrong object) is an Error(corrupt_frame) naming it, never data. The store holds
// no secret: frames are verified end to end by the receivers as over the tree.
//
// Thread-safety: a writer or a reader is used by one thread at a time (each uses `parallel`
// threads inside a call).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "objstore/s3_client.h"

namespace deltacast::objstore {

struct StoredFrame {
  uint64_t offset = 0;  // in the frames object
  uint64_t size = 0;
  uint64_t xxh3 = 0;   // XXH3-64 of its bytes
  std::string sha256;  // hex SHA-256 of its bytes, in a signed manifest (empty otherwise)
};

struct VersionManifest {
  uint64_t version = 0;
  uint64_t base_version = 0;
  uint64_t epoch = 0;
  uint64_t digest = 0;         // the version's combined StateDigest (what receivers verify and ack)
  std::string kind = "delta";  // "delta" (frames on base_version) or "snapshot" (RAW pieces of the whole version)
  std::string object;          // the frames object's key; the manifest's own when inline
  uint64_t object_size = 0;    // the frames' bytes (inline: after the manifest's line)
  std::vector<StoredFrame> frames;
  // Hex HMAC-SHA256, with the job's secret, of to_json() of this manifest without its signature;
  // empty: unsigned (docs/object-storage.md, "What someone who can write the bucket can do").
  std::string signature;
  // The frames, when the manifest object carries them (not part of to_json(); filled by
  // VersionReader::manifest, checked frame by frame by VersionReader::frames).
  std::vector<std::byte> inline_frames = {};

  std::string to_json() const;
  // Sets every frame's sha256 from `frame_bytes` (in order) and signs the manifest with `secret`.
  void sign(const std::string& secret, const std::vector<std::span<const std::byte>>& frame_bytes);
  // Throws Error(auth) "SOURCE: ..." unless the manifest carries a signature that `secret` made.
  void check_signature(const std::string& secret, const std::string& source) const;
  // Throws Error(corrupt_frame) "SOURCE: ..." for anything that is not a consistent manifest
  // (frames outside the object or overlapping, a missing field, another format).
  static VersionManifest parse(std::string_view json, const std::string& source);
};

struct VersionStoreOptions {
  std::string prefix;                        // without a trailing '/'; may be empty
  uint64_t part_bytes = uint64_t{16} << 20;  // multipart part size (S3: at least 5 MiB)
  unsigned parallel = 4;                     // parts uploaded, ranges downloaded at a time
  uint32_t retain_versions = 4;              // prune() keeps this many newest versions
  // The job's shared secret (secret_file): a writer signs every manifest with it and gives each
  // frame a SHA-256; a reader then refuses a manifest it did not sign (Error(auth)) and a frame
  // whose SHA-256 differs. Empty: unsigned manifests, XXH3 only (accidents, not forgers).
  std::string secret = {};
  // A version whose frames total at most this many bytes is written inline, in its manifest
  // object: a reader gets it with one request (a poll across a WAN saves a round trip). 0: never.
  uint64_t inline_bytes = uint64_t{4} << 20;
};

// The key of version `v`'s manifest / frames object, and of latest.json, under `prefix`.
std::string manifest_key(const std::string& prefix, uint64_t version);
std::string frames_key(const std::string& prefix, uint64_t version);
std::string latest_key(const std::string& prefix);

class VersionWriter {
 public:
  VersionWriter(S3Client& client, VersionStoreOptions options);
  // Writes version `version` (frames in order) and makes it the latest. Returns its manifest.
  // On any failure nothing names the version: a multipart upload it began is aborted (best
  // effort; abort_orphans() finds what a dead writer left) and latest.json is unchanged.
  VersionManifest publish(uint64_t version, uint64_t base_version, uint64_t epoch, uint64_t digest,
                          const std::vector<std::span<const std::byte>>& frames, const std::string& kind = "delta");
  // Deletes every version older than the newest retain_versions (manifest first, then frames):
  // a reader that got such a manifest meanwhile fails with Error(not_found) and starts again from
  // latest. Then abort_orphans(): the parts of a publish that failed while the store was away (its
  // abort failed too) or of a writer that died; so, like it, call it when no publish is in flight.
  // Returns the versions deleted.
  std::vector<uint64_t> prune();
  // Aborts every multipart upload under the prefix (call it when no publish is in flight: a
  // producer at start, cleaning after one that died). Returns how many.
  size_t abort_orphans();

 private:
  S3Client& client_;
  VersionStoreOptions options_;
};

class VersionReader {
 public:
  VersionReader(S3Client& client, VersionStoreOptions options);
  // The version latest.json names; nullopt when there is none yet.
  std::optional<uint64_t> latest();
  // Version `version`'s manifest (and its frames, when inline: one GET). Error(not_found) when it
  // does not exist (never written, or pruned), Error(corrupt_frame) when it is not a consistent
  // manifest of that version (inline: its bytes after the manifest's line are not object_size).
  VersionManifest manifest(uint64_t version);
  // Every frame of `m`, in order: inline, split from m.inline_frames (no request); else ranged GETs of consecutive
  // frames (about object / parallel bytes each, 4 to 16 MiB), `parallel` at a time, each frame checked against its XXH3
  // (and, signed, its SHA-256: Error(auth)). Error(corrupt_frame) naming the frame and the version when its bytes
  // differ or the object does not hold it (truncated, replaced by a shorter one).
  std::vector<std::vector<std::byte>> frames(const VersionManifest& m);

 private:
  S3Client& client_;
  VersionStoreOptions options_;
};

}  // namespace deltacast::objstore
