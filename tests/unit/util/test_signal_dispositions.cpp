// SignalDispositionGuard: what changes inside its scope is put back, what did not change is not
// touched, and a handler that differs only by glibc's SA_RESTORER counts as unchanged.
#include "util/signal_dispositions.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>

namespace deltacast {
namespace {

void host_handler(int) {}
void library_handler(int) {}

struct sigaction read_disposition(int sig) {
  struct sigaction now {};
  EXPECT_EQ(::sigaction(sig, nullptr, &now), 0);
  return now;
}

void set_handler(int sig, void (*handler)(int), int flags = 0) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sa.sa_flags = flags;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(::sigaction(sig, &sa, nullptr), 0);
}

// Restores every disposition a test changed, whatever the test did.
class SignalDispositions : public ::testing::Test {
 protected:
  SignalDispositionGuard outer_;
};

TEST_F(SignalDispositions, WhatALibraryReplacesIsPutBackAndNothingElseIsTouched) {
  set_handler(SIGUSR1, host_handler);
  set_handler(SIGTERM, host_handler, SA_RESTART);
  set_handler(SIGUSR2, SIG_IGN);
  std::vector<int> restored;
  {
    SignalDispositionGuard guard;
    set_handler(SIGUSR1, library_handler);  // another handler
    set_handler(SIGTERM, host_handler, 0);  // the same handler, other flags
    set_handler(SIGHUP, library_handler);   // a default replaced
    restored = guard.restore_changed();
    std::sort(restored.begin(), restored.end());
  }
  EXPECT_EQ(restored, (std::vector<int>{SIGHUP, SIGUSR1, SIGTERM}));
  EXPECT_EQ(read_disposition(SIGUSR1).sa_handler, &host_handler);
  EXPECT_EQ(read_disposition(SIGTERM).sa_handler, &host_handler);
  EXPECT_TRUE(read_disposition(SIGTERM).sa_flags & SA_RESTART);
  EXPECT_EQ(read_disposition(SIGHUP).sa_handler, SIG_DFL);
  EXPECT_EQ(read_disposition(SIGUSR2).sa_handler, SIG_IGN);
}

TEST_F(SignalDispositions, TheDestructorPutsBackWhatChanged) {
  set_handler(SIGUSR1, host_handler);
  {
    SignalDispositionGuard guard;
    set_handler(SIGUSR1, library_handler);
  }
  EXPECT_EQ(read_disposition(SIGUSR1).sa_handler, &host_handler);
}

TEST_F(SignalDispositions, AMaskChangeIsAChange) {
  set_handler(SIGUSR1, host_handler);
  SignalDispositionGuard guard;
  struct sigaction sa = read_disposition(SIGUSR1);
  sigaddset(&sa.sa_mask, SIGUSR2);
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, nullptr), 0);
  EXPECT_EQ(guard.restore_changed(), std::vector<int>{SIGUSR1});
  struct sigaction back = read_disposition(SIGUSR1);
  EXPECT_FALSE(sigismember(&back.sa_mask, SIGUSR2));
}

TEST_F(SignalDispositions, SettingTheSameDispositionAgainIsNoChange) {
  // glibc adds SA_RESTORER to whatever it installs: a default set to the default again reads back
  // with it, and must not count as the library's change.
  set_handler(SIGUSR2, SIG_DFL);
  SignalDispositionGuard guard;
  set_handler(SIGUSR2, SIG_DFL);
  set_handler(SIGWINCH, SIG_DFL);
  EXPECT_TRUE(guard.restore_changed().empty());
}

}  // namespace
}  // namespace deltacast
