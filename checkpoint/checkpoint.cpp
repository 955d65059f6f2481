// checkpoint/checkpoint.h: single files and Hugging Face sharded directories behind one manifest.
#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/json.h"
#include "util/log.h"

namespace deltacast::checkpoint {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// The directory holding `path` ("." for a bare name).
fs::path parent_of(const fs::path& path) { return path.parent_path().empty() ? fs::path(".") : path.parent_path(); }

// Why `target` cannot be replaced by a directory written beside it, if it cannot: it is the root
// of a mounted file system (renames cannot cross it), or its parent is not writable.
std::optional<std::string> cannot_swap(const fs::path& target) {
  const fs::path parent = parent_of(target);
  struct stat t {};
  struct stat p {};
  if (::stat(target.c_str(), &t) == 0 && ::stat(parent.c_str(), &p) == 0 && t.st_dev != p.st_dev)
    return std::string("it is a mount point, so it cannot be swapped whole");
  if (fs::exists(parent) && ::access(parent.c_str(), W_OK) != 0)
    return "its parent " + parent.string() + " is not writable (" + std::strerror(errno) + ")";
  return std::nullopt;
}

// A directory written beside `target` (.NAME.partial-PID-N in its parent) and then swapped in
// for it: replace() carries over what `target` holds besides its checkpoint (config.json,
// tokenizer files, hidden files, subdirectories; hard links, else copies) and exchanges the two
// directories in one renameat2(RENAME_EXCHANGE) (where the file system lacks it: target moved
// aside, then the new one renamed in: never a mix, briefly nothing). The destructor removes the staging directory:
// what a failure left, or the old contents after the swap.
class StagingDir {
 public:
  explicit StagingDir(const fs::path& target) {
    static std::atomic<uint64_t> counter{0};
    const fs::path parent = parent_of(target);
    path_ = parent / ("." + target.filename().string() + ".partial-" + std::to_string(::getpid()) + "-" +
                      std::to_string(counter++));
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (!ec) fs::create_directory(path_, ec);
    if (ec) throw Error(Errc::io, "cannot create directory " + path_.string() + ": " + ec.message());
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  ~StagingDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

  void replace(const fs::path& target) const {
    std::error_code ec;
    if (!fs::exists(target, ec)) {
      sync_directory(path_);
      if (::rename(path_.c_str(), target.c_str()) != 0) throw_os_error("cannot rename into", target, errno);
      sync_directory(parent_of(target));
      return;
    }
    carry_over(target, path_);
    sync_directory(path_);
    if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS) throw_os_error("cannot swap in the new", target, errno);
      const fs::path aside = path_.string() + ".old";
      if (::rename(target.c_str(), aside.c_str()) != 0) throw_os_error("cannot move aside", target, errno);
      if (::rename(path_.c_str(), target.c_str()) != 0) {
        const int err = errno;
        ::rename(aside.c_str(), target.c_str());
        throw_os_error("cannot rename into", target, err);
      }
      fs::rename(aside, path_, ec);  // the destructor removes it
    }
    sync_directory(parent_of(target));
  }

 private:
  // Everything in `from` but its checkpoint files (its *.safetensors and the index), into `to`.
  // Throws Error(io), also when a directory inside `from` is the mount point of another file
  // system: the old directory is removed after the swap, and that must not reach into it.
  static void carry_over(const fs::path& from, const fs::path& to) {
    struct stat root {};
    if (::stat(from.c_str(), &root) != 0) throw_os_error("cannot stat", from, errno);
    try {
      for (const auto& entry : fs::directory_iterator(from)) {
        const std::string name = entry.path().filename().string();
        if (name == kIndexFileName || name.ends_with(".safetensors")) continue;
        link_tree(entry.path(), to / name, root.st_dev);
      }
    } catch (const fs::filesystem_error& e) {
      throw Error(Errc::io, std::string("cannot carry over the files beside the shards: ") + e.what());
    }
  }
  static void link_tree(const fs::path& from, const fs::path& to, dev_t device) {
    struct stat st {};
    if (::lstat(from.c_str(), &st) != 0) throw_os_error("cannot stat", from, errno);
    if (S_ISLNK(st.st_mode)) {
      fs::copy_symlink(from, to);
    } else if (S_ISDIR(st.st_mode)) {
      if (st.st_dev != device)
        throw Error(Errc::io, from.string() + " is another file system's mount point: write the checkpoint elsewhere");
      fs::create_directory(to);
      for (const auto& entry : fs::directory_iterator(from))
        link_tree(entry.path(), to / entry.path().filename(), device);
    } else if (S_ISREG(st.st_mode)) {
      std::error_code ec;
      fs::create_hard_link(from, to, ec);
      if (ec) fs::copy_file(from, to);
    }  // sockets, FIFOs, devices: not carried
  }

  fs::path path_;
};

// Runs f, turning the standard library's filesystem errors (a symlink loop, a directory that
// cannot be listed, a vanished entry) into Error(io), the error style of this API's contract.
template <class F>
auto filesystem_errors_as_io(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const fs::filesystem_error& e) {
    throw Error(Errc::io, e.what());
  }
}

[[noreturn]] void malformed(const fs::path& path, const std::string& problem) {
  throw Error(Errc::invalid_argument, "not a usable checkpoint: " + path.string() + ": " + problem);
}

// The index: weight_map (tensor -> shard file, in the index's order) and the metadata object.
struct Index {
  std::vector<std::pair<std::string, std::string>> weight_map;
  std::string metadata_json = "{}";
};

Index read_index(const fs::path& path) {
  // A tensor named twice in weight_map is ambiguous (nlohmann keeps the last): refuse it.
  std::string top_key;
  std::set<std::string> seen;
  std::optional<std::string> duplicate;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1) top_key = parsed.get<std::string>();
    if (event == Json::parse_event_t::key && depth == 2 && top_key == "weight_map" &&
        !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  std::string why;
  const Json j = util::parse_json_bounded<Json>(read_small_file(path, kMaxHeaderBytes), &why, callback);
  if (j.is_discarded()) malformed(path, "not valid JSON: " + why);
  if (duplicate) malformed(path, "weight_map lists tensor '" + *duplicate + "' twice");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    malformed(path, "no \"weight_map\" object");
  Index index;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) malformed(path, "weight_map entry of '" + name + "' is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      malformed(path, "weight_map entry of '" + name + "' names '" + f + "', not a file in this directory");
    index.weight_map.emplace_back(name, f);
  }
  if (j.contains("metadata")) {
    if (!j["metadata"].is_object()) malformed(path, "\"metadata\" is not an object");
    index.metadata_json = j["metadata"].dump();
  }
  return index;
}

}  // namespace

struct Checkpoint::Impl {
  // Checkpoint::reader(): pread from the shard holding each tensor.
  struct FileReader final : codec::WeightsReader {
    const Impl* impl;
    explicit FileReader(const Impl* owner) : impl(owner) {}
    const codec::Manifest& manifest() const noexcept override { return impl->manifest; }
    void read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const override {
      const auto& [file, position] = impl->where.at(tensor);
      impl->files[file].read(position, offset, out);
    }
  };

  fs::path path;
  std::vector<SafetensorsFile> files;
  Layout layout;
  codec::Manifest manifest;
  // [manifest index] -> (file, index in that file's manifest)
  std::vector<std::pair<uint32_t, uint32_t>> where;
  FileReader reader{this};  // points at this Impl, which therefore never moves
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Impl(const fs::path& p, bool writable) : path(p) {
    std::error_code ec;
    const auto status = fs::status(p, ec);
    if (ec || !fs::exists(status)) throw Error(Errc::io, "cannot open " + p.string() + ": no such file or directory");
    auto open_file = [&](const fs::path& f) {
      return writable ? SafetensorsFile::open_for_update(f) : SafetensorsFile::open(f);
    };
    if (fs::is_regular_file(status)) {
      files.push_back(open_file(p));
      layout.shards.push_back({p.filename().string(), {}, files.back().metadata()});
    } else if (fs::is_directory(status) && fs::exists(p / kIndexFileName)) {
      open_sharded(p, writable);
    } else if (fs::is_directory(status)) {
      std::vector<fs::path> candidates;
      for (const auto& entry : fs::directory_iterator(p))
        if (entry.is_regular_file() && entry.path().extension() == ".safetensors") candidates.push_back(entry.path());
      if (candidates.size() != 1)
        malformed(p, "a directory needs " + std::string(kIndexFileName) + " or exactly one .safetensors file; it has " +
                         std::to_string(candidates.size()) + " .safetensors files and no index");
      path = candidates.front();
      files.push_back(open_file(path));
      layout.shards.push_back({path.filename().string(), {}, files.back().metadata()});
    } else {
      malformed(p, "neither a file nor a directory");
    }
    build_manifest();
  }

  void open_sharded(const fs::path& dir, bool writable) {
    const fs::path index_path = dir / kIndexFileName;
    const Index index = read_index(index_path);
    layout.sharded = true;
    layout.index_metadata_json = index.metadata_json;
    std::vector<std::string> names;  // shard files, sorted (Hugging Face numbers them)
    for (const auto& [tensor, file] : index.weight_map) names.push_back(file);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    std::map<std::string, std::string> shard_of(index.weight_map.begin(), index.weight_map.end());
    std::map<std::string, std::string> found;  // tensor -> the shard it was found in
    for (const auto& name : names) {
      const fs::path file = dir / name;
      if (!fs::exists(file))
        throw Error(Errc::not_found, "checkpoint " + dir.string() + ": " + kIndexFileName + " names shard '" + name +
                                         "', which does not exist");
      files.push_back(writable ? SafetensorsFile::open_for_update(file) : SafetensorsFile::open(file));
      layout.shards.push_back({name, {}, files.back().metadata()});
      for (const auto& t : files.back().manifest().tensors()) {
        const auto listed = shard_of.find(t.name);
        if (listed == shard_of.end())
          malformed(index_path, "shard '" + name + "' holds tensor '" + t.name + "', which the index does not list");
        if (auto [at, fresh] = found.emplace(t.name, name); !fresh)
          malformed(dir, "tensor '" + t.name + "' is in two shards: '" + at->second + "' and '" + name + "'");
        if (listed->second != name)
          malformed(index_path, "the index puts tensor '" + t.name + "' in '" + listed->second + "', but shard '" + name +
                                    "' holds it");
      }
    }
    for (const auto& [tensor, file] : index.weight_map)
      if (!found.count(tensor))
        malformed(index_path, "the index puts tensor '" + tensor + "' in '" + file + "', which does not hold it");
  }

  void build_manifest() {
    struct Entry {
      const codec::TensorInfo* info;
      uint32_t file, position;
    };
    std::vector<Entry> entries;
    for (uint32_t f = 0; f < files.size(); ++f) {
      const auto& m = files[f].manifest();
      for (uint32_t i = 0; i < m.size(); ++i) {
        entries.push_back({&m.at(i), f, i});
        layout.shards[f].tensors.push_back(m.at(i).name);
      }
    }
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.info->name < b.info->name; });
    std::vector<codec::TensorInfo> infos;
    for (const auto& e : entries) {
      infos.push_back(*e.info);
      where.emplace_back(e.file, e.position);
    }
    try {
      manifest = codec::Manifest(std::move(infos));  // refuses a name twice (within one file, the reader did)
    } catch (const Error& e) {
      malformed(path, e.what());
    }
  }
};

Checkpoint::Checkpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Checkpoint Checkpoint::open(const fs::path& path) {
  return filesystem_errors_as_io([&] { return Checkpoint(std::make_unique<Impl>(path, false)); });
}
Checkpoint Checkpoint::open_for_update(const fs::path& path) {
  return filesystem_errors_as_io([&] { return Checkpoint(std::make_unique<Impl>(path, true)); });
}

const fs::path& Checkpoint::path() const noexcept { return impl_->path; }
const codec::Manifest& Checkpoint::manifest() const noexcept { return impl_->manifest; }
const Layout& Checkpoint::layout() const noexcept { return impl_->layout; }
const std::string& Checkpoint::file_of(uint32_t index) const {
  return impl_->layout.shards[impl_->where.at(index).first].file;
}

const codec::WeightsReader& Checkpoint::reader() const noexcept { return impl_->reader; }

codec::ConstWeights Checkpoint::weights() const {
  std::vector<codec::ConstWeights> per_file;
  for (const auto& f : impl_->files) per_file.push_back(f.weights());
  codec::ConstWeights w{&impl_->manifest, {}};
  for (const auto& [file, position] : impl_->where) w.tensors.push_back(per_file[file].tensors[position]);
  return w;
}

codec::MutableWeights Checkpoint::mutable_weights() {
  std::vector<codec::MutableWeights> per_file;
  for (auto& f : impl_->files) per_file.push_back(f.mutable_weights());
  codec::MutableWeights w{&impl_->manifest, {}};
  for (const auto& [file, position] : impl_->where) w.tensors.push_back(per_file[file].tensors[position]);
  return w;
}

void Checkpoint::flush() {
  for (auto& f : impl_->files) f.flush();
}

namespace {
// write_checkpoint, which may let a std::filesystem error through.
void write_checkpoint_unchecked(const fs::path& path, const codec::ConstWeights& weights, const Layout& layout) {
  if (weights.manifest == nullptr) throw Error(Errc::invalid_argument, "write_checkpoint: weights have no manifest");
  codec::check_weights(weights);
  const codec::Manifest& m = *weights.manifest;
  size_t listed = 0;
  std::set<std::string> seen;
  for (const auto& shard : layout.shards)
    for (const auto& name : shard.tensors) {
      if (!m.find(name)) throw Error(Errc::invalid_argument, "write_checkpoint: the layout names tensor '" + name + "', which the weights lack");
      if (!seen.insert(name).second) throw Error(Errc::invalid_argument, "write_checkpoint: the layout names '" + name + "' twice");
      ++listed;
    }
  if (listed != m.size())
    throw Error(Errc::invalid_argument, "write_checkpoint: the layout places " + std::to_string(listed) + " of the " +
                                            std::to_string(m.size()) + " tensors");
  if (!layout.sharded && layout.shards.size() != 1)
    throw Error(Errc::invalid_argument, "write_checkpoint: a single-file layout needs exactly one file");
  // One shard's weights, in its file order.
  auto shard_weights = [&](const Layout::Shard& shard, std::vector<codec::TensorInfo>& infos) {
    std::vector<std::span<const std::byte>> spans;
    for (const auto& name : shard.tensors) {
      const uint32_t i = *m.find(name);
      infos.push_back(m.at(i));
      spans.push_back(weights.tensors[i]);
    }
    return spans;
  };
  if (!layout.sharded) {
    std::vector<codec::TensorInfo> infos;
    auto spans = shard_weights(layout.shards.front(), infos);
    const codec::Manifest file_manifest(std::move(infos));
    write_safetensors(path, codec::ConstWeights{&file_manifest, std::move(spans)}, layout.shards.front().metadata);
    return;
  }
  std::string bad_metadata;
  const Json metadata = util::parse_json_bounded<Json>(layout.index_metadata_json, &bad_metadata);
  if (metadata.is_discarded() || !metadata.is_object())
    throw Error(Errc::invalid_argument, "cannot write a sharded checkpoint at " + path.string() +
                                            ": its index metadata is not a JSON object" +
                                            (bad_metadata.empty() ? "" : ": " + bad_metadata));
  // The whole directory is written beside `path` and swapped in: a reader, or a failure, never
  // sees shards of two versions side by side.
  if (fs::exists(path) && !fs::is_directory(path))
    throw Error(Errc::io,
                "cannot write a sharded checkpoint at " + path.string() + ": it exists and is not a directory");
  // A symlink to a directory (a `latest` link) is followed: the directory it names is replaced.
  std::error_code link_ec;
  const fs::path target = fs::is_symlink(path, link_ec) ? fs::canonical(path) : path;
  auto write_into = [&](const fs::path& dir) {
    Json weight_map = Json::object();
    uint64_t total = 0;
    for (const auto& shard : layout.shards) {
      std::vector<codec::TensorInfo> infos;
      auto spans = shard_weights(shard, infos);
      const codec::Manifest file_manifest(std::move(infos));
      write_safetensors(dir / shard.file, codec::ConstWeights{&file_manifest, std::move(spans)}, shard.metadata);
      for (const auto& name : shard.tensors) weight_map[name] = shard.file;
      total += file_manifest.total_bytes();
    }
    Json index = Json::object();
    index["metadata"] = metadata;
    if (!index["metadata"].contains("total_size")) index["metadata"]["total_size"] = total;
    index["weight_map"] = std::move(weight_map);
    const std::string text = index.dump(2) + "\n";
    write_file_atomically(dir / kIndexFileName, std::as_bytes(std::span(text)));
  };
  if (const auto why = cannot_swap(target)) {
    // A volume's root (a container's model mount) or a directory in a parent deltacast cannot
    // write: written in place, each file atomically and the index last.
    logger("checkpoint")
        ->warn("{}: {}; writing its files in place (each atomically, the index last)", target.string(), *why);
    std::error_code ec;
    fs::create_directories(target, ec);
    if (ec) throw Error(Errc::io, "cannot create directory " + target.string() + ": " + ec.message());
    write_into(target);
    return;
  }
  const StagingDir staging(target);
  write_into(staging.path());
  staging.replace(target);
}
}  // namespace

void write_checkpoint(const fs::path& path, const codec::ConstWeights& weights, const Layout& layout) {
  filesystem_errors_as_io([&] { write_checkpoint_unchecked(path, weights, layout); });
}

Layout even_layout(const codec::Manifest& manifest, size_t shards, bool sharded) {
  Layout layout;
  layout.sharded = sharded;
  shards = std::max<size_t>(1, std::min(shards, std::max<size_t>(1, manifest.size())));
  if (!sharded) shards = 1;
  const uint64_t per = (manifest.total_bytes() + shards - 1) / shards;
  for (size_t k = 0; k < shards; ++k) {
    char name[64] = "model.safetensors";
    if (sharded) std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards);
    layout.shards.push_back({name, {}, {}});
  }
  uint64_t used = 0;
  size_t k = 0;
  for (const auto& t : manifest.tensors()) {
    // Move on once this shard is full, keeping at least one tensor for every remaining shard.
    const size_t left = manifest.size() - static_cast<size_t>(&t - manifest.tensors().data());
    if (k + 1 < shards && !layout.shards[k].tensors.empty() && (used >= per * (k + 1) || left <= shards - k - 1)) ++k;
    layout.shards[k].tensors.push_back(t.name);
    used += t.nbytes();
  }
  return layout;
}

}  // namespace deltacast::checkpoint
