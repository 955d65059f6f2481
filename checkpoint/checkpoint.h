#pragma once
// A model checkpoint as users keep it: one .safetensors file, or a Hugging Face sharded directory
// (model.safetensors.index.json, whose "weight_map" names each tensor's shard file, plus those
// shards; "metadata" is kept as it is). A directory without an index holding exactly one
// .safetensors file is that file.
//
// Canonical coordinates (docs/frame-format.md): a tensor is its name, an element its flat index.
// The manifest of a Checkpoint lists the tensors sorted by name (bytewise), whatever file holds
// them and wherever: the same model stored as one file or as any shards has the same manifest, so
// a delta made from one layout applies to the other. (SafetensorsFile keeps its own file order;
// this class is what the CLI reads and writes.)
//
// Opening maps every file and validates everything before returning: each shard's header, and
// the index against the shards (a missing shard, a tensor in two places, a tensor the index and
// the shards disagree on). Errors name the file and the tensor.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "codec/manifest.h"

namespace deltacast::checkpoint {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

// Where the tensors live: the files (relative names) and, per file, its tensors in file order and
// its __metadata__; for a sharded directory, the index's "metadata" object (raw JSON text).
struct Layout {
  struct Shard {
    std::string file;                  // "model-00001-of-00003.safetensors" (a single file: its name)
    std::vector<std::string> tensors;  // in the file's data order
    Metadata metadata;
  };
  bool sharded = false;
  std::vector<Shard> shards;
  std::string index_metadata_json = "{}";  // sharded only
};

class Checkpoint {
 public:
  // Opens a file or a directory (see the top). Throws Error(io) for a path that cannot be read,
  // Error(not_found) for a missing shard, Error(invalid_argument) for anything malformed.
  static Checkpoint open(const std::filesystem::path& path);
  // The same, mapping every file writable (MAP_SHARED): writes through mutable_weights() land in
  // the files; flush() forces them to disk.
  static Checkpoint open_for_update(const std::filesystem::path& path);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  const std::filesystem::path& path() const noexcept;
  const codec::Manifest& manifest() const noexcept;  // sorted by name
  const Layout& layout() const noexcept;
  codec::ConstWeights weights() const;  // manifest order, spans into the mappings
  // The same bytes read with pread from the files the mappings show (codec::WeightsReader), for
  // an encoder that reads slices piece by piece. Valid as long as this Checkpoint (moves included).
  const codec::WeightsReader& reader() const noexcept;
  codec::MutableWeights mutable_weights();
  void flush();
  // The shard file holding tensor `index` of the manifest (for messages).
  const std::string& file_of(uint32_t index) const;

 private:
  struct Impl;
  explicit Checkpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes `weights` (a manifest with the layout's tensors, any order) at `path` in `layout`: a
// single file at `path` when the layout is not sharded (temporary file, fsync, rename), else the
// directory `path` with every shard under its file name and the index. A directory is written
// whole beside `path` (.NAME.partial-PID-N in its parent, every file fsynced) and then swapped in
// with one renameat2(RENAME_EXCHANGE), or renamed in when `path` does not exist: a reader finds
// the old directory or the new one, never shards of both, and a failed write leaves `path` as it
// was and removes what it wrote. What an existing `path` held besides its checkpoint (files and
// subdirectories other than its *.safetensors and the index: config.json, tokenizer files) is
// carried into the new directory (hard links); its shards that the new layout does not name are
// gone. A subdirectory that is another file system's mount point is refused (Error(io), nothing
// changed): the old directory is removed after the swap. A `path` that is a symlink to a
// directory is followed: the directory it names is replaced. A `path` that cannot be swapped (the
// root of a mounted volume, or in a parent that is not writable) is written in place instead,
// each file atomically and the index last, with a warning: there a reader may see shards of two
// versions while it is written. A process killed mid-write leaves its staging directory behind.
// Throws Error(invalid_argument) when the layout and the weights name different tensors, Error(io)
// when writing fails or `path` exists and is not a directory.
void write_checkpoint(const std::filesystem::path& path, const codec::ConstWeights& weights, const Layout& layout);

// A layout for `manifest` in `shards` files of about equal size, named as Hugging Face names them
// (model-0000K-of-0000N.safetensors), tensors in manifest order; shards = 1 and sharded = false: a
// single file. For tests and tools.
Layout even_layout(const codec::Manifest& manifest, size_t shards, bool sharded = true);

}  // namespace deltacast::checkpoint
