// The kernel's first write into pages a process wrote itself, against later writes: pread of a
// file in the page cache straight into a buffer (three passes), and through a 256 KiB buffer
// copied out with memcpy (three passes on a fresh buffer). Why overwrite_with (tree/snapshot_serve.h)
// reads a checkpoint into the producer's baseline through a small buffer.
//
//   gcc -O2 -o /tmp/first_write bench/codec/first_write.c
//   head -c 400000000 /dev/urandom > /tmp/f.bin && cp /tmp/f.bin /tmp/g.bin && /tmp/first_write /tmp/g.bin
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kPiece = 262144 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// A buffer of n bytes, every page written by this process first (as a baseline is).
static char* written_buffer(off_t n) {
  char* b = malloc((size_t)n);
  if (!b) exit(1);
  memset(b, 1, (size_t)n);
  return b;
}

static void read_all(int fd, off_t n, char* into, char* piece) {
  for (off_t at = 0; at < n; at += kPiece) {
    const size_t len = (size_t)(n - at < kPiece ? n - at : kPiece);
    char* to = piece ? piece : into + at;
    if (pread(fd, to, len, at) != (ssize_t)len) {
      perror("pread");
      exit(1);
    }
    if (piece) memcpy(into + at, piece, len);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  const int fd = open(argv[1], O_RDONLY);
  if (fd < 0) {
    perror(argv[1]);
    return 1;
  }
  const off_t n = lseek(fd, 0, SEEK_END);
  char* piece = written_buffer(kPiece);
  read_all(fd, n, written_buffer(n), piece);  // the file into the page cache
  for (int via_piece = 0; via_piece < 2; ++via_piece) {
    char* buffer = written_buffer(n);
    for (int pass = 0; pass < 3; ++pass) {
      const double t = now();
      read_all(fd, n, buffer, via_piece ? piece : NULL);
      printf("%s, pass %d: %.3f s\n", via_piece ? "through a 256 KiB buffer" : "pread straight in", pass, now() - t);
    }
    free(buffer);
  }
  return 0;
}
