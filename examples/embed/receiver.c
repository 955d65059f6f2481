/* A server embedding a deltacast receiver through the C API: it joins the producer, allocates its
 * own buffers from the manifest (as a server allocates its weights), registers them, starts
 * serving, and waits for each committed version while it "serves" in between. With gated=true
 * (the apply gate) the buffers change only at its safe points: after each wait it calls
 * dc_receiver_apply, which writes the versions committed since (without the gate, refits are
 * written while they flow and dc_receiver_apply has nothing to do).
 *
 *   embed_receiver PRODUCER_URL RANK LAST_VERSION [KEY=VALUE ...]
 *
 * KEY=VALUE pairs are receiver options (docs/config.md keys, e.g. timeouts.peer=5s, or gated=true).
 * On success it prints one line per committed version, then
 *   done version=V digest=D model_bytes=M rss_before_kib=A rss_peak_kib=P
 * where rss_before is the resident size with the buffers allocated and touched (before joining
 * the tree's traffic) and rss_peak the high-water mark (VmHWM) at the end: their difference is
 * what deltacast itself held at most. Exit status 0 when LAST_VERSION was committed. */
#include <deltacast/deltacast.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long status_kib(const char* field) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  long value = -1;
  size_t n = strlen(field);
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0 && line[n] == ':') value = strtol(line + n + 1, NULL, 10);
  fclose(f);
  return value;
}

static int check(int status, const char* what) {
  if (status != DC_OK) fprintf(stderr, "embed_receiver: %s: %s: %s\n", what, dc_status_name(status), dc_last_error());
  return status == DC_OK;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s PRODUCER_URL RANK LAST_VERSION [KEY=VALUE ...]\n", argv[0]);
    return 2;
  }
  if (dc_version_number() / 100 != DC_VERSION_NUMBER / 100) {
    fprintf(stderr, "embed_receiver: built against deltacast %d, running with %s\n", DC_VERSION_NUMBER,
            dc_version_string());
    return 2;
  }
  const unsigned long long last = strtoull(argv[3], NULL, 10);
  dc_receiver* r = NULL;
  int ok = check(dc_receiver_create(&r), "create") && check(dc_receiver_set(r, "producer", argv[1]), "producer") &&
           check(dc_receiver_set(r, "rank", argv[2]), "rank");
  for (int i = 4; ok && i < argc; ++i) {
    char* eq = strchr(argv[i], '=');
    if (!eq) {
      fprintf(stderr, "embed_receiver: expected KEY=VALUE, got %s\n", argv[i]);
      ok = 0;
      break;
    }
    *eq = '\0';
    ok = check(dc_receiver_set(r, argv[i], eq + 1), argv[i]);
  }
  ok = ok && check(dc_receiver_join(r, 120000), "join");
  size_t count = 0;
  ok = ok && check(dc_receiver_tensor_count(r, &count), "tensor_count");
  void** buffers = calloc(count ? count : 1, sizeof(void*));
  unsigned long long model_bytes = 0;
  for (size_t i = 0; ok && i < count; ++i) {
    const char* name;
    int dtype, ndim;
    int64_t shape[16];
    ok = check(dc_receiver_tensor(r, i, &name, &dtype, &ndim, shape, 16), "tensor");
    if (!ok || ndim > 16) break;
    size_t bytes = dc_dtype_size(dtype);
    for (int d = 0; d < ndim; ++d) bytes *= (size_t)shape[d];
    /* The server's own weights: version 0 is all zeros, touched now so they count as resident. */
    buffers[i] = malloc(bytes ? bytes : 1);
    if (!buffers[i]) return 3;
    memset(buffers[i], 0, bytes);
    model_bytes += bytes;
    ok = check(dc_receiver_attach(r, name, dtype, ndim, shape, buffers[i], bytes, DC_DEVICE_HOST, 0), name);
  }
  const long rss_before = status_kib("VmRSS");
  ok = ok && check(dc_receiver_start(r), "start");
  for (unsigned long long v = 1; ok && v <= last; ++v) {
    /* A real server would generate here; at a safe point it checks for the next version and
     * (gated) writes what committed since into its buffers. */
    ok = check(dc_receiver_wait_version(r, v, 300000), "wait_version");
    uint64_t applied = 0;
    ok = ok && check(dc_receiver_apply(r, &applied), "apply");
    if (ok) printf("committed version %llu, buffers hold version %llu\n", v, (unsigned long long)applied);
  }
  uint64_t version = 0, digest = 0, applied = 0;
  if (ok) ok = check(dc_receiver_version(r, &version, &digest), "version");
  if (ok) ok = check(dc_receiver_apply(r, &applied), "apply");
  if (ok && applied != version) {
    fprintf(stderr, "embed_receiver: the buffers hold version %llu after apply, not %llu\n",
            (unsigned long long)applied, (unsigned long long)version);
    ok = 0;
  }
  if (ok)
    printf("done version=%llu digest=%016llx model_bytes=%llu rss_before_kib=%ld rss_peak_kib=%ld\n",
           (unsigned long long)version, (unsigned long long)digest, model_bytes, rss_before, status_kib("VmHWM"));
  fflush(stdout);
  dc_receiver_free(r);
  for (size_t i = 0; i < count; ++i) free(buffers[i]);
  free(buffers);
  return ok ? 0 : 1;
}
