#pragma once
// Keeping a host's signal handlers through code that replaces them behind its back.
//
// Libraries that deltacast loads install handlers as they load: libinfinipath (pulled in by
// libfabric's psm provider) takes SIGINT, SIGTERM, SIGABRT, SIGSEGV, SIGBUS and SIGILL, and libucs
// takes SIGHUP, SIGILL, SIGBUS, SIGFPE and SIGSEGV, from their ELF constructors. In a host that set
// its own (Python's SIGINT -> KeyboardInterrupt, a server's SIGTERM drain, a crash reporter's
// SIGSEGV), that silently replaces the host's behaviour. A SignalDispositionGuard records every
// signal's disposition and, when asked or when it ends, puts back each one that changed.
#include <csignal>
#include <vector>

namespace deltacast {

class SignalDispositionGuard {
 public:
  // Records the disposition (handler, flags, mask) of every signal 1..NSIG-1 that sigaction can
  // read. Never throws.
  SignalDispositionGuard() noexcept;
  // Puts back what changed since construction (restore_changed()).
  ~SignalDispositionGuard();
  SignalDispositionGuard(const SignalDispositionGuard&) = delete;
  SignalDispositionGuard& operator=(const SignalDispositionGuard&) = delete;

  // Sets every signal whose disposition differs from the recorded one back to the recorded one;
  // returns the signals it set back. A change the host itself made on another thread meanwhile is
  // undone too: guard only calls during which the host does not change its handlers. Never throws.
  std::vector<int> restore_changed() noexcept;

 private:
  struct sigaction recorded_[NSIG] {};
  bool readable_[NSIG]{};
};

}  // namespace deltacast
