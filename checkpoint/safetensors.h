#pragma once
// Safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// optional "__metadata__": {string: string}}), then the data region. Offsets are relative to the
// data region and must tile it exactly: no gaps, no overlaps, nothing left over (as the reference
// implementation requires). Tensor order is the order of data offsets, which is checkpoint order
// and therefore the order of the canonical coordinate space (codec/manifest.h).
//
// Reading maps the file and hands out spans into the mapping, so opening a 100 GB checkpoint costs
// only the header parse; bytes are paged in when touched. Writing always goes to a temporary file
// in the destination directory followed by fsync + rename, so readers never see a partial file.
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "codec/manifest.h"

namespace deltacast::checkpoint {

using Metadata = std::map<std::string, std::string>;

// Refuse headers above this size before parsing (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// One mapped safetensors file. Movable, not copyable; the spans returned by weights() and
// mutable_weights() stay valid until the object is destroyed (moving keeps them valid).
// Not thread-safe for concurrent mutation; concurrent reads of the returned spans are fine.
class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the header completely.
  // Throws Error(io) when the file cannot be opened, stat'ed or mapped; Error(invalid_argument)
  // "not a safetensors file: <path>: <problem>" for any structural problem, including a dtype the
  // codec does not handle (the message names the tensor and the dtype).
  static SafetensorsFile open(const std::filesystem::path& path);
  // Same validation, but maps the file MAP_SHARED with write access, so writes through
  // mutable_weights() land in the file (call flush() to force them to disk).
  static SafetensorsFile open_for_update(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const noexcept;
  const codec::Manifest& manifest() const noexcept;
  const Metadata& metadata() const noexcept;
  // Spans into the mapping, in manifest order.
  codec::ConstWeights weights() const;
  // Writable spans; throws Error(state) when the file was opened read-only.
  codec::MutableWeights mutable_weights();
  // msync()s the mapping (no-op for read-only files). Throws Error(io) on failure.
  void flush();
  // Size of the whole file in bytes.
  uint64_t file_size() const noexcept;
  // pread of bytes [offset, offset + out.size()) of tensor `tensor` (manifest order) from the file
  // the mapping shows. Requires the range to lie within the tensor. Thread-safe. Throws Error(io)
  // naming the file when the read fails or ends early (the file was truncated after it was opened).
  void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const;

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes `weights` (with their manifest, in manifest order) and `metadata` as a safetensors file at
// `path`, replacing any existing file atomically: data goes to a temporary file in the same
// directory, which is fsync'ed and renamed over `path`, then the directory is fsync'ed. The JSON
// header is padded with spaces to a multiple of 8 bytes, as the reference writer does.
// Throws Error(invalid_argument) when the weights do not match their manifest, Error(io) when a
// file operation fails (the temporary file is removed; `path` is untouched). Thread-safe for
// distinct paths.
void write_safetensors(const std::filesystem::path& path, const codec::ConstWeights& weights,
                       const Metadata& metadata = {});

// Writes `bytes` as the file `path` the same way: a temporary file beside it, fsync, rename, then
// the directory fsync'ed. Throws Error(io); on failure `path` is untouched and the temporary removed.
void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes);
// The whole content of the small file `path` (an index, a record, a config file beside the shards).
// Throws Error(invalid_argument) when it is not a regular file (a FIFO is refused, not waited on)
// or holds more than `max_bytes` (also when it grows past them while read), Error(io) when it
// cannot be opened or read.
std::string read_small_file(const std::filesystem::path& path, uint64_t max_bytes);
// fsync of a directory (after renames into it). Best effort: a directory that cannot be opened is
// skipped.
void sync_directory(const std::filesystem::path& dir);

// The header bytes (8-byte length + padded JSON) write_safetensors would produce. Exposed so that
// tests and tools can build files and deliberately broken variants.
std::string safetensors_header(const codec::Manifest& manifest, const Metadata& metadata = {});

}  // namespace deltacast::checkpoint
