#include "transport/ofi/shm_names.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <random>

namespace deltacast::transport::ofi {
namespace {

constexpr std::string_view kPrefix = "deltacast-";

uint64_t process_token() {
  static const uint64_t token = [] {
    std::random_device device;
    return (uint64_t{device()} << 32) | device();
  }();
  return token;
}

}  // namespace

std::string unique_shm_endpoint_name() {
  static std::atomic<uint64_t> counter{0};
  char name[96];
  std::snprintf(name, sizeof name, "%.*s%d-%016llx-%llu", static_cast<int>(kPrefix.size()), kPrefix.data(),
                static_cast<int>(::getpid()), static_cast<unsigned long long>(process_token()),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return name;
}

size_t remove_stale_shm_regions(const std::string& directory) {
  size_t removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!name.starts_with(kPrefix)) continue;
    std::string_view rest = std::string_view(name).substr(kPrefix.size());
    pid_t pid = 0;
    auto [end_of_pid, err] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (err != std::errc{} || end_of_pid == rest.data() || *end_of_pid != '-' || pid <= 0) continue;
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code remove_error;
    if (std::filesystem::remove(it->path(), remove_error)) ++removed;
  }
  return removed;
}

}  // namespace deltacast::transport::ofi
