/* A host with its own signal handlers that embeds deltacast. Linking libdeltacast.so must install
 * no handler before main() (a process starts with SIG_DFL or SIG_IGN everywhere; a sanitizer
 * runtime's own handlers excepted). Then the host sets a handler on every signal it may catch, then opens a producer on
 * each transport named on its command line (the core library and, through it, libfabric's and UCX's providers load
 * then). Afterwards every disposition must be the host's: same handler, same flags, same mask. Exits 0 when they all
 * are, 1 naming each signal that was replaced. Built and run by install_test.sh against the installed library. Usage:
 * signal_host TRANSPORT... (tcp, ucx, ofi+tcp) */
#define _GNU_SOURCE /* NSIG, sigaction and strsignal under -std=c11 */
#include <deltacast/deltacast.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

static void host_handler(int sig) { (void)sig; }

static int open_producer(const char* transport) {
  char url[64];
  snprintf(url, sizeof url, "%s://127.0.0.1:0", transport);
  float weights[4] = {0};
  const int64_t shape[1] = {4};
  dc_producer* p = NULL;
  int rc = dc_producer_create(&p);
  if (rc == DC_OK) rc = dc_producer_set(p, "transport", transport);
  if (rc == DC_OK) rc = dc_producer_set(p, "receivers", "1");
  if (rc == DC_OK) rc = dc_producer_set(p, "listen", url);
  if (rc == DC_OK)
    rc = dc_producer_add_tensor(p, "w", DC_DTYPE_F32, 1, shape, weights, sizeof weights, DC_DEVICE_HOST, 0);
  if (rc == DC_OK) rc = dc_producer_listen(p);
  if (rc != DC_OK)
    fprintf(stderr, "signal_host: %s producer: %s: %s\n", transport, dc_status_name(rc), dc_last_error());
  dc_producer_free(p);
  return rc;
}

/* Signals that already have a handler at main(), other than a sanitizer runtime's. */
static int handlers_at_start(void) {
  int found = 0;
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction now;
    memset(&now, 0, sizeof now);
    if (sigaction(sig, NULL, &now) != 0 || now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN) continue;
    Dl_info info;
    memset(&info, 0, sizeof info);
    const char* from = dladdr((void*)now.sa_handler, &info) && info.dli_fname ? info.dli_fname : "?";
    if (strstr(from, "libasan") || strstr(from, "libubsan") || strstr(from, "libtsan")) continue;
    fprintf(stderr, "signal_host: signal %d (%s) has a handler from %s before main()\n", sig, strsignal(sig), from);
    ++found;
  }
  return found;
}

int main(int argc, char** argv) {
  if (handlers_at_start() != 0) return 1;
  int set[NSIG] = {0};
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    set[sig] = sigaction(sig, &sa, NULL) == 0; /* glibc keeps 32 and 33 for itself */
  }
  for (int i = 1; i < argc; ++i) {
    if (open_producer(argv[i]) != DC_OK) return 2;
  }
  int replaced = 0, kept = 0;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (!set[sig]) continue;
    struct sigaction now;
    memset(&now, 0, sizeof now);
    sigaction(sig, NULL, &now);
    if (now.sa_handler != host_handler || !(now.sa_flags & SA_RESTART) || !sigismember(&now.sa_mask, SIGUSR2) ||
        sigismember(&now.sa_mask, SIGUSR1)) {
      fprintf(stderr, "signal_host: signal %d (%s) is no longer the host's\n", sig, strsignal(sig));
      ++replaced;
    } else {
      ++kept;
    }
  }
  printf("signal_host: %d of %d handlers kept through %d transports\n", kept, kept + replaced, argc - 1);
  return replaced == 0 ? 0 : 1;
}
