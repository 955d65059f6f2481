// Writing side of checkpoint/safetensors.h: header serialisation and the atomic replace.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::checkpoint {

namespace {

using Json = nlohmann::ordered_json;

// Closes the descriptor and unlinks the temporary file unless released after the rename.
class TempFile {
 public:
  explicit TempFile(const std::filesystem::path& target) {
    static std::atomic<uint64_t> counter{0};
    const uint64_t nonce = std::random_device{}() ^ (counter.fetch_add(1) << 32);
    path_ = target;
    path_ += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(nonce);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_os_error("cannot create", path_, errno);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }

  void write_all(const void* data, size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_os_error("cannot write", path_, errno);
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
  }

  void commit_to(const std::filesystem::path& target) {
    if (::fsync(fd_) != 0) throw_os_error("cannot fsync", path_, errno);
    if (::close(fd_) != 0) {
      fd_ = -1;
      throw_os_error("cannot close", path_, errno);
    }
    fd_ = -1;
    if (::rename(path_.c_str(), target.c_str()) != 0) throw_os_error("cannot rename onto", target, errno);
    renamed_ = true;
    // Make the rename itself durable.
    const auto dir = target.parent_path();
    sync_directory(dir.empty() ? std::filesystem::path(".") : dir);
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool renamed_ = false;
};

}  // namespace

std::string safetensors_header(const codec::Manifest& manifest, const Metadata& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& t : manifest.tensors()) {
    Json shape = Json::array();
    for (uint64_t d : t.shape) shape.push_back(d);
    const uint64_t end = offset + t.nbytes();
    header[t.name] = Json{{"dtype", std::string(codec::dtype_name(t.dtype))},
                          {"shape", std::move(shape)},
                          {"data_offsets", Json::array({offset, end})}};
    offset = end;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  store_le<uint64_t>(reinterpret_cast<std::byte*>(out.data()), json.size());
  return out + json;
}

void write_safetensors(const std::filesystem::path& path, const codec::ConstWeights& weights,
                       const Metadata& metadata) {
  if (weights.manifest == nullptr) throw Error(Errc::invalid_argument, "write_safetensors: weights have no manifest");
  codec::check_weights(weights);
  const std::string header = safetensors_header(*weights.manifest, metadata);
  TempFile tmp(path);
  tmp.write_all(header.data(), header.size());
  for (const auto& span : weights.tensors) tmp.write_all(span.data(), span.size());
  tmp.commit_to(path);
}

void sync_directory(const std::filesystem::path& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  TempFile tmp(path);
  tmp.write_all(bytes.data(), bytes.size());
  tmp.commit_to(path);
}

}  // namespace deltacast::checkpoint
