#include "tools/checkpoint/files.h"

#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "util/error.h"

namespace deltacast::tools {

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_os_error("cannot open", path, errno);
  std::vector<std::byte> out;
  std::byte buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw_os_error("cannot read", path, err);
    }
    if (n == 0) break;
    out.insert(out.end(), buffer, buffer + n);
  }
  ::close(fd);
  return out;
}

void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  checkpoint::write_file_atomically(path, bytes);
}

}  // namespace deltacast::tools
