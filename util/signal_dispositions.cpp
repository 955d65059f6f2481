#include "util/signal_dispositions.h"

namespace deltacast {
namespace {

// glibc sets SA_RESTORER (its return trampoline) on every sigaction it installs, so a disposition
// set back to SIG_DFL reads back with it while the process's initial SIG_DFL does not: the flag
// says nothing about the host's handler and is not compared.
// <signal.h> does not name it; 0x04000000 is the kernel's value on x86, arm and the
// asm-generic architectures (aarch64, riscv).
#ifdef SA_RESTORER
constexpr int kLibcFlags = SA_RESTORER;
#else
constexpr int kLibcFlags = 0x04000000;
#endif

// The masks compared signal by signal: glibc fills only the kernel's part of a read sa_mask (64
// signals) and leaves the rest of the 1024-bit sigset_t as its stack held it.
bool same_mask(const sigset_t& a, const sigset_t& b) {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sigismember(&a, sig) != sigismember(&b, sig)) return false;
  }
  return true;
}

bool same_disposition(const struct sigaction& a, const struct sigaction& b) {
  // sa_handler and sa_sigaction share storage: comparing the handler compares either.
  return a.sa_handler == b.sa_handler && (a.sa_flags & ~kLibcFlags) == (b.sa_flags & ~kLibcFlags) &&
         same_mask(a.sa_mask, b.sa_mask);
}

}  // namespace

SignalDispositionGuard::SignalDispositionGuard() noexcept {
  for (int sig = 1; sig < NSIG; ++sig) readable_[sig] = ::sigaction(sig, nullptr, &recorded_[sig]) == 0;
}

SignalDispositionGuard::~SignalDispositionGuard() { restore_changed(); }

std::vector<int> SignalDispositionGuard::restore_changed() noexcept {
  std::vector<int> restored;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (!readable_[sig] || sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) != 0 || same_disposition(now, recorded_[sig])) continue;
    if (::sigaction(sig, &recorded_[sig], nullptr) == 0) {
      try {
        restored.push_back(sig);
      } catch (...) {  // out of memory: the disposition is back, only the list is short
      }
    }
  }
  return restored;
}

}  // namespace deltacast
