#include "checkpoint/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "util/error.h"

namespace deltacast::checkpoint {

namespace {

// The mappings the SIGBUS handler can name. A slot is published by storing `end` last (release)
// and retired by clearing `end` first; the handler reads `end` (acquire), then begin and path.
struct MappingSlot {
  std::atomic<uintptr_t> end{0};
  uintptr_t begin = 0;
  char path[256] = {};
};
MappingSlot g_slots[kTrackedMappings];
std::mutex g_slots_mutex;  // writers only; the handler takes no lock
struct sigaction g_previous_sigbus {};

// Async-signal-safe: write(2) of fixed text and the slot's path.
void write_all(const char* text, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}
void write_text(const char* text) { write_all(text, std::strlen(text)); }

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto at = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
  for (auto& slot : g_slots) {
    const uintptr_t end = slot.end.load(std::memory_order_acquire);
    if (end != 0 && at >= slot.begin && at < end) {
      write_text("deltacast: fatal: ");
      write_text(slot.path);
      write_text(
          " could not be read while deltacast had it mapped (SIGBUS): it shrank (another process "
          "truncated or rewrote it in place), or its storage failed to read it. A file deltacast reads "
          "must not change once complete: write each checkpoint under a new name (or as NAME.tmp, then "
          "rename it).\n");
      break;
    }
  }
  // Hand the signal on: the handler this one replaced, else the default action (the faulting
  // access repeats on return and kills the process with SIGBUS).
  // (sa_handler and sa_sigaction share storage: SIG_DFL and SIG_IGN are told apart first, whatever
  // the flags say.) An ignored SIGBUS from a fault cannot be ignored: the default action then.
  const auto previous = g_previous_sigbus.sa_handler;
  if (previous != SIG_DFL && previous != SIG_IGN) {
    if (g_previous_sigbus.sa_flags & SA_SIGINFO) return g_previous_sigbus.sa_sigaction(sig, info, context);
    return previous(sig);
  }
  signal(SIGBUS, SIG_DFL);
  if (info == nullptr || info->si_code <= 0) raise(sig);  // sent, not a fault: it would not repeat
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

// Returns the slot now naming [data, data + size) as `path`, or -1 when every slot is taken.
int track_mapping(const std::byte* data, size_t size, const std::filesystem::path& path) {
  install_sigbus_handler();
  std::lock_guard lock(g_slots_mutex);
  for (size_t i = 0; i < kTrackedMappings; ++i) {
    auto& slot = g_slots[i];
    if (slot.end.load(std::memory_order_relaxed) != 0) continue;
    slot.begin = reinterpret_cast<uintptr_t>(data);
    const std::string& p = path.native();
    const size_t n = std::min(p.size(), sizeof slot.path - 1);
    std::memcpy(slot.path, p.data(), n);
    slot.path[n] = '\0';
    slot.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

void untrack_mapping(int slot) {
  if (slot < 0) return;
  std::lock_guard lock(g_slots_mutex);
  g_slots[slot].end.store(0, std::memory_order_release);
}

}  // namespace

MappedFile::MappedFile(const std::filesystem::path& path, bool writable) : writable_(writable) {
  // O_NONBLOCK: a FIFO must be refused (below), not waited on for a writer; no effect on a file.
  const int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw_os_error("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw_os_error("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(Errc::io, "cannot map " + path.string() + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                     writable ? MAP_SHARED : MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw_os_error("cannot mmap", path, err);
    }
    data_ = static_cast<std::byte*>(p);
    if (!writable) (void)::madvise(p, size_, MADV_HUGEPAGE);  // advice (see the header): failure changes nothing
    slot_ = track_mapping(data_, size_, path);
  }
  fd_ = fd;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      writable_(other.writable_),
      fd_(std::exchange(other.fd_, -1)),
      slot_(std::exchange(other.slot_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    writable_ = other.writable_;
    fd_ = std::exchange(other.fd_, -1);
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() noexcept {
  untrack_mapping(std::exchange(slot_, -1));  // before munmap: the range may be reused at once
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  data_ = nullptr;
  size_ = 0;
}

void MappedFile::sync(const std::filesystem::path& path_for_errors) const {
  if (!writable_ || data_ == nullptr) return;
  if (::msync(data_, size_, MS_SYNC) != 0) throw_os_error("cannot msync", path_for_errors, errno);
}

}  // namespace deltacast::checkpoint
