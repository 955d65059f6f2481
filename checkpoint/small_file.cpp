// read_small_file (checkpoint/safetensors.h): a whole small file, refused rather than waited on
// (a FIFO) or read without bound (a huge or growing file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "checkpoint/safetensors.h"
#include "util/error.h"

namespace deltacast::checkpoint {

std::string read_small_file(const std::filesystem::path& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below as not regular).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(Errc::io, "cannot open " + path.string() + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(Errc::io, "cannot stat " + path.string() + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(Errc::invalid_argument, path.string() + " is not a regular file");
  const auto too_large = [&](const std::string& size) {
    return Error(Errc::invalid_argument, path.string() + " is " + size + ", more than the " +
                                             std::to_string(max_bytes) + " bytes deltacast reads of such a file");
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) throw too_large(std::to_string(st.st_size) + " bytes");
  std::string text(static_cast<size_t>(st.st_size) + 1, '\0');  // one more: a file that grew shows
  size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() > max_bytes) throw too_large("growing");
      text.resize(std::min<uint64_t>(max_bytes + 1, 2 * text.size()));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(Errc::io, "cannot read " + path.string() + ": " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

}  // namespace deltacast::checkpoint
