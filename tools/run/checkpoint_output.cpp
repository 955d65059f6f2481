#include "tools/run/checkpoint_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "codec/digest.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/json.h"
#include "util/log.h"

namespace deltacast::tools {
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr const char* kHeldFileName = "deltacast.json";
constexpr const char* kSingleFileName = "model.safetensors";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A file beside the shards that travels with the layout: not a tensor file, not an index, not ours.
bool is_side_file_name(const std::string& name) {
  return !name.empty() && name[0] != '.' && !ends_with(name, ".safetensors") && name != checkpoint::kIndexFileName &&
         name != kHeldFileName;
}

// `checkpoint`'s tensors as spans in `manifest`'s order (matched by name). Throws
// Error(invalid_argument) naming a tensor that is missing or differs.
codec::ConstWeights weights_in_order(const checkpoint::Checkpoint& checkpoint, const codec::Manifest& manifest) {
  const codec::ConstWeights found = checkpoint.weights();
  codec::ConstWeights out{&manifest, {}};
  for (const auto& t : manifest.tensors()) {
    const auto i = checkpoint.manifest().find(t.name);
    if (!i || checkpoint.manifest().at(*i).dtype != t.dtype || checkpoint.manifest().at(*i).shape != t.shape)
      throw Error(Errc::invalid_argument,
                  checkpoint.path().string() + ": tensor '" + t.name + "' is missing or has another dtype or shape");
    out.tensors.push_back(found.tensors[*i]);
  }
  return out;
}

// The version directories of `dir` (v<number>), oldest first.
std::vector<std::pair<uint64_t, fs::path>> version_dirs(const fs::path& dir) {
  static const std::regex name("v([0-9]{1,19})");
  std::vector<std::pair<uint64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string n = entry.path().filename().string();
    if (std::regex_match(n, m, name) && entry.is_directory()) out.emplace_back(std::stoull(m[1]), entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

tree::CheckpointLayout welcome_layout(const checkpoint::Checkpoint& checkpoint, const codec::Manifest& manifest) {
  const checkpoint::Layout& disk = checkpoint.layout();
  tree::CheckpointLayout out;
  out.sharded = disk.sharded;
  if (disk.sharded) out.index_metadata_json = disk.index_metadata_json;
  for (const auto& shard : disk.shards) {
    tree::ShardLayout s;
    s.file = shard.file;
    for (const auto& name : shard.tensors) {
      const auto i = manifest.find(name);
      if (!i) throw Error(Errc::invalid_argument, "checkpoint layout names tensor '" + name + "', not in the manifest");
      s.tensors.push_back(*i);
    }
    for (const auto& [key, value] : shard.metadata) s.metadata.push_back({key, value});
    out.shards.push_back(std::move(s));
  }
  const fs::path dir = checkpoint.path();
  if (!fs::is_directory(dir)) return out;
  std::vector<fs::path> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && is_side_file_name(entry.path().filename().string())) names.push_back(entry.path());
  std::sort(names.begin(), names.end());
  uint64_t total = 0;
  auto log = logger("run");
  for (const auto& path : names) {
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) continue;  // gone since it was listed
    if (size > kMaxSideFileBytes || total + size > kMaxSideFilesBytes) {
      log->warn(
          "producer: {} ({} bytes) is not sent to the receivers: files beside the shards are capped at {} "
          "bytes each and {} in all",
          path.string(), size, kMaxSideFileBytes, kMaxSideFilesBytes);
      continue;
    }
    std::string bytes;
    try {
      bytes = checkpoint::read_small_file(path, std::min(kMaxSideFileBytes, kMaxSideFilesBytes - total));
    } catch (const Error& e) {  // it changed since it was listed (grew, went away)
      log->warn("producer: {} is not sent to the receivers: {}", path.string(), e.what());
      continue;
    }
    total += bytes.size();
    out.files.push_back({path.filename().string(), std::move(bytes)});
  }
  return out;
}

checkpoint::Layout disk_layout(const tree::CheckpointLayout& layout, const codec::Manifest& manifest) {
  checkpoint::Layout out;
  if (layout.shards.empty()) {
    checkpoint::Layout::Shard all{kSingleFileName, {}, {}};
    for (const auto& t : manifest.tensors()) all.tensors.push_back(t.name);
    out.shards.push_back(std::move(all));
    return out;
  }
  tree::check_layout(layout, manifest.size());
  out.sharded = layout.sharded;
  if (layout.sharded) {
    const Json metadata =
        util::parse_json_bounded(layout.index_metadata_json.empty() ? "{}" : layout.index_metadata_json);
    if (!metadata.is_object())
      throw Error(Errc::corrupt_frame, "checkpoint layout: the index metadata is not a JSON object");
    out.index_metadata_json = metadata.dump();
  }
  for (const auto& shard : layout.shards) {
    checkpoint::Layout::Shard s{shard.file, {}, {}};
    for (uint32_t t : shard.tensors) s.tensors.push_back(manifest.at(t).name);
    for (const auto& entry : shard.metadata) s.metadata[entry.name] = entry.bytes;
    out.shards.push_back(std::move(s));
  }
  return out;
}

std::optional<HeldCheckpoint> load_latest(const fs::path& dir, unsigned threads) {
  const fs::path latest = dir / "latest";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(latest, ec))) return std::nullopt;
  const fs::path target = fs::canonical(latest, ec);
  if (ec) throw Error(Errc::io, latest.string() + " names nothing readable: " + ec.message());
  const Json held =
      util::parse_json_bounded(checkpoint::read_small_file(target / kHeldFileName, checkpoint::kMaxHeaderBytes));
  if (!held.is_object() || !held.contains("version") || !held["version"].is_number_unsigned() ||
      !held.contains("digest") || !held["digest"].is_string() || !held.contains("manifest") ||
      !held["manifest"].is_array())
    throw Error(Errc::invalid_argument, (target / kHeldFileName).string() + " is not a deltacast version record");
  HeldCheckpoint out;
  out.version = held["version"].get<uint64_t>();
  out.digest = std::stoull(held["digest"].get<std::string>(), nullptr, 16);
  out.shard = held.contains("files_digest") && held["files_digest"].is_string();
  const uint64_t files_digest =
      out.shard ? std::stoull(held["files_digest"].get<std::string>(), nullptr, 16) : out.digest;
  out.path = target;
  const checkpoint::Checkpoint on_disk = checkpoint::Checkpoint::open(target);
  std::vector<codec::TensorInfo> infos;
  for (const auto& name : held["manifest"]) {
    if (!name.is_string()) throw Error(Errc::invalid_argument, (target / kHeldFileName).string() + ": bad manifest");
    const auto i = on_disk.manifest().find(name.get<std::string>());
    if (!i) throw Error(Errc::invalid_argument, target.string() + " lacks tensor '" + name.get<std::string>() + "'");
    infos.push_back(on_disk.manifest().at(*i));
  }
  if (infos.size() != on_disk.manifest().size())
    throw Error(Errc::invalid_argument, target.string() + " holds tensors its version record does not list");
  out.manifest = codec::Manifest(std::move(infos));
  const codec::ConstWeights bits = weights_in_order(on_disk, out.manifest);
  codec::ConstWeights owned{&out.manifest, {}};
  for (const auto& t : bits.tensors) {
    out.buffers.emplace_back(t.begin(), t.end());
    owned.tensors.emplace_back(out.buffers.back().data(), out.buffers.back().size());
  }
  const uint64_t digest = codec::StateDigest::full_scan(owned, threads).combined();
  if (digest != files_digest)
    throw Error(Errc::verify_failed, target.string() + " holds bits with digest " + hex64(digest) + ", not version " +
                                         std::to_string(out.version) + "'s " + hex64(files_digest));
  return out;
}

CheckpointDirWriter::CheckpointDirWriter(Options options, tree::Receiver& receiver, codec::ConstWeights weights,
                                         uint64_t already_written)
    : options_(std::move(options)), receiver_(receiver), weights_(std::move(weights)) {
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) throw Error(Errc::io, "output.checkpoint_dir: cannot create " + options_.dir.string() + ": " + ec.message());
  const fs::path lock = options_.dir / ".lock";
  lock_fd_ = ::open(lock.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) throw Error(Errc::io, "cannot open " + lock.string() + ": " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    throw Error(Errc::state, "output.checkpoint_dir " + options_.dir.string() +
                                 " is being written by another process (it holds " + lock.string() +
                                 "); give each receiver its own directory, e.g. with {rank} in the path");
  }
  // What a process killed in the middle of a write left behind: .v<version>.partial and the
  // staging directory of its shards (checkpoint::write_checkpoint: ..v<version>.partial.partial-*).
  for (const auto& entry : fs::directory_iterator(options_.dir, ec)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind(".v", 0) == 0 && ends_with(n, ".partial")) fs::remove_all(entry.path(), ec);
    if (n.rfind("..v", 0) == 0 && n.find(".partial.partial-") != std::string::npos) fs::remove_all(entry.path(), ec);
  }
  stats_.latest = already_written;
  committed_ = already_written;
  thread_ = std::thread([this] { loop(); });
}

CheckpointDirWriter::~CheckpointDirWriter() {
  try {
    if (thread_.joinable()) finish();  // else finish() ran, and its caller has its error
  } catch (const std::exception& e) {
    logger("run")->error("{}", e.what());
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void CheckpointDirWriter::committed(uint64_t version, std::shared_ptr<const tree::CheckpointLayout> layout) {
  if (!layout)
    throw Error(Errc::invalid_argument,
                "output.checkpoint_dir: version " + std::to_string(version) + " announced without a layout");
  std::lock_guard lock(mutex_);
  if (version > stats_.latest) layouts_[version] = std::move(layout);
  committed_ = std::max(committed_, version);
  wake_.notify_all();
}

uint64_t CheckpointDirWriter::finish() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  if (error_) throw Error(Errc::io, "output.checkpoint_dir: " + *error_);
  return stats_.latest;
}

CheckpointDirWriter::Stats CheckpointDirWriter::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CheckpointDirWriter::loop() {
  using Clock = std::chrono::steady_clock;
  auto log = logger("run");
  uint64_t failed_in_a_row = 0;  // attempts that wrote nothing since the last version written
  uint64_t writes_in_a_row = 0;  // of which writes that failed (the space check passed): backoff
  std::string last_logged;       // the failure last logged, and when
  Clock::time_point logged_at{};
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || committed_ > stats_.latest; });
    if (committed_ <= stats_.latest) return;  // stopping, everything written
    const uint64_t announced = committed_;
    const bool final_attempt = stopping_;
    lock.unlock();
    uint64_t version = 0;
    bool writing = false;
    std::optional<std::string> failure;
    try {
      receiver_.apply_pending();  // this thread is the buffers' only reader: its safe point
      version = receiver_.applied_version();
      std::shared_ptr<const tree::CheckpointLayout> layout;
      {
        std::lock_guard hold(mutex_);
        if (const auto it = layouts_.find(version); it != layouts_.end()) layout = it->second;
        if (!layout && stopping_ && version > stats_.latest && version > committed_) {
          // Reached but never announced (run() ended in between): its layout is unknown.
          log->warn("output.checkpoint_dir: version {} was never announced; latest stays at {}", version,
                    stats_.latest);
          return;
        }
      }
      // Without its layout the version is not announced yet (its on_active is on its way): wait.
      if (layout && version > stats().latest) {
        check_free_space(*layout);
        writing = true;
        write_version(version, receiver_.applied_digest(), *layout);
        if (failed_in_a_row > 0)
          log->info("output.checkpoint_dir: version {} written after {} failed attempts", version, failed_in_a_row);
        failed_in_a_row = writes_in_a_row = 0;
        last_logged.clear();
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
    std::chrono::milliseconds pause{50};
    if (failure) {
      ++failed_in_a_row;
      if (writing) ++writes_in_a_row;
      // After a failed write 1, 2, 4 ... 30 s; after a failed space check (nothing written) 1 s.
      pause = writing ? std::chrono::milliseconds(
                            1000 * std::min<uint64_t>(30, uint64_t{1} << std::min<uint64_t>(writes_in_a_row - 1, 5)))
                      : std::chrono::milliseconds(1000);
      const auto now = Clock::now();
      if (*failure != last_logged || now - logged_at >= std::chrono::minutes(1)) {
        log->error(
            "output.checkpoint_dir: version {} not written (failed attempts in a row: {}; latest stays at "
            "version {}; next attempt in {} s): {}",
            version, failed_in_a_row, stats().latest, pause.count() / 1000, *failure);
        last_logged = *failure;
        logged_at = now;
      }
    }
    lock.lock();
    error_ = failure;
    if (failure) {
      ++stats_.failed;
      if (final_attempt) return;                               // stopping: finish() reports the error
      wake_.wait_for(lock, pause, [&] { return stopping_; });  // new versions do not cut it short
    } else if (stats_.latest < announced) {
      // A version announced before it reached the buffers: look again shortly.
      wake_.wait_for(lock, pause);
    }
  }
}

void CheckpointDirWriter::check_free_space(const tree::CheckpointLayout& layout) const {
  uint64_t need = weights_.manifest->total_bytes();
  for (const auto& file : layout.files)
    if (is_side_file_name(file.name)) need += file.bytes.size();
  struct statvfs st {};
  if (::statvfs(options_.dir.c_str(), &st) != 0) return;  // unknown: the write itself will tell
  const uint64_t free = uint64_t{st.f_bavail} * st.f_frsize;
  if (free < need) {
    auto mib = [](uint64_t bytes) {
      char text[32];
      std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
      return std::string(text);
    };
    throw Error(Errc::io, options_.dir.string() + " has " + mib(free) + " free, less than the " + mib(need) +
                              " the version's files need at least (budget output.keep + 1 versions)");
  }
}

void CheckpointDirWriter::write_version(uint64_t version, uint64_t digest, const tree::CheckpointLayout& from) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const checkpoint::Layout layout = disk_layout(options_.shard ? tree::CheckpointLayout{} : from, *weights_.manifest);
  // A shard is checked against its buffers' own digest (this thread applied every queued version:
  // nothing else writes them now).
  const uint64_t files_digest =
      options_.shard ? codec::StateDigest::full_scan(weights_, options_.threads).combined() : digest;
  const std::string v = "v" + std::to_string(version);
  const fs::path partial = options_.dir / ("." + v + ".partial");
  const fs::path final_dir = options_.dir / v;
  const fs::path link_tmp = options_.dir / ".latest.tmp";
  try {
    fs::remove_all(partial);
    // 1. The shards and the index (a sharded directory is written whole, then renamed to
    // `partial`), the side files, the version record.
    if (layout.sharded) {
      checkpoint::write_checkpoint(partial, weights_, layout);
    } else {
      fs::create_directories(partial);
      checkpoint::write_checkpoint(partial / layout.shards.front().file, weights_, layout);
    }
    for (const auto& file : from.files)
      if (is_side_file_name(file.name))
        checkpoint::write_file_atomically(partial / file.name, std::as_bytes(std::span(file.bytes)));
    Json names = Json::array();
    for (const auto& t : weights_.manifest->tensors()) names.push_back(t.name);
    Json held{
        {"format", "deltacast.held_version"}, {"version", version}, {"digest", hex64(digest)}, {"manifest", names}};
    if (options_.shard) held["files_digest"] = hex64(files_digest);
    const std::string record = held.dump(2) + "\n";
    checkpoint::write_file_atomically(partial / kHeldFileName, std::as_bytes(std::span(record)));
    // 2. Read back: the files must be the version (a snapshot that replaced the buffers meanwhile,
    // or a disk that lost a write, is caught here and nothing is exposed).
    {
      const checkpoint::Checkpoint back = checkpoint::Checkpoint::open(partial);
      const uint64_t found =
          codec::StateDigest::full_scan(weights_in_order(back, *weights_.manifest), options_.threads).combined();
      if (found != files_digest)
        throw Error(Errc::verify_failed, "the files written for version " + std::to_string(version) + " have digest " +
                                             hex64(found) + ", not " + hex64(files_digest));
    }
    if (options_.slow_disk_bytes_per_second > 0) {
      const double seconds =
          static_cast<double>(weights_.manifest->total_bytes()) / options_.slow_disk_bytes_per_second;
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
    }
    // 3. Expose it: rename, then switch latest (a symlink renamed over the old one).
    checkpoint::sync_directory(partial);
    fs::remove_all(final_dir);
    fs::rename(partial, final_dir);
    fs::remove(link_tmp);
    fs::create_symlink(v, link_tmp);
    fs::rename(link_tmp, options_.dir / "latest");
    checkpoint::sync_directory(options_.dir);
  } catch (...) {
    // A full or failing disk: free what this attempt took (a v<version> already renamed is whole
    // and verified, and stays). latest still names the last version written.
    std::error_code ec;
    fs::remove_all(partial, ec);
    fs::remove(link_tmp, ec);
    throw;
  }
  // 4. Keep the newest `keep` versions (best effort: the version is exposed whatever happens here).
  auto dirs = version_dirs(options_.dir);
  for (size_t i = 0; i + options_.keep < dirs.size(); ++i) {
    std::error_code ec;
    if (dirs[i].first != version) fs::remove_all(dirs[i].second, ec);
    if (ec) logger("run")->warn("output.checkpoint_dir: cannot remove {}: {}", dirs[i].second.string(), ec.message());
  }

  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t skipped = 0;
  {
    std::lock_guard lock(mutex_);
    if (stats_.latest > 0 && version > stats_.latest + 1) skipped = version - stats_.latest - 1;
    stats_.skipped += skipped;
    stats_.written += 1;
    stats_.latest = version;
    layouts_.erase(layouts_.begin(), layouts_.upper_bound(version));
    stats_.last_write_seconds = seconds;
  }
  logger("run")->info("output.checkpoint_dir: wrote version {} as {} in {:.3f} s{}", version, final_dir.string(),
                      seconds,
                      skipped ? " (skipped " + std::to_string(skipped) + " versions committed meanwhile)" : "");
}

}  // namespace deltacast::tools
