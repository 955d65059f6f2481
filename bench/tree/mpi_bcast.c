/* MPI_Bcast baseline for the relay-tree broadcast benchmark: rank 0 broadcasts S bytes to every
 * other rank. Barrier before and after; the time is rank 0's MPI_Wtime across Bcast + barrier, so
 * it spans "first byte sent" to "every rank has the whole buffer", the span dc_bench_tree times.
 * Every receiver then checks its bytes against the pattern (memcmp), and the run fails unless all
 * are exact.
 *   scripts/mpirun-local.sh -np 9 build/bench/tree/dc_bench_mpi_bcast 256MiB [repeats]
 * Prints one JSON line per repeat: {"bench":"mpi_bcast","bytes":S,"ranks":N,"seconds":T,...}. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "256MiB", "64MiB", "1GiB" or a plain byte count. Returns 0 for anything else. */
static uint64_t parse_bytes(const char* text) {
  char* end = NULL;
  double value = strtod(text, &end);
  if (end == text || value <= 0) return 0;
  if (strcmp(end, "") == 0) return (uint64_t)value;
  if (strcmp(end, "KiB") == 0) return (uint64_t)(value * 1024.0);
  if (strcmp(end, "MiB") == 0) return (uint64_t)(value * 1048576.0);
  if (strcmp(end, "GiB") == 0) return (uint64_t)(value * 1073741824.0);
  return 0;
}

/* The same pseudo-random bytes on every rank (splitmix64), so receivers can check without a copy. */
static void fill_pattern(unsigned char* buffer, uint64_t size, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (uint64_t i = 0; i + 8 <= size; i += 8) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    memcpy(buffer + i, &z, 8);
  }
  for (uint64_t i = size - size % 8; i < size; ++i) buffer[i] = (unsigned char)i;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  uint64_t bytes = argc > 1 ? parse_bytes(argv[1]) : (uint64_t)256 << 20;
  int repeats = argc > 2 ? atoi(argv[2]) : 1;
  if (bytes == 0 || bytes > (uint64_t)2147483647 || repeats < 1) {
    if (rank == 0) fprintf(stderr, "usage: dc_bench_mpi_bcast BYTES(<2GiB) [REPEATS]\n");
    MPI_Finalize();
    return 2;
  }
  unsigned char* buffer = malloc(bytes);
  unsigned char* expected = rank == 0 ? NULL : malloc(bytes);
  if (!buffer || (rank != 0 && !expected)) {
    fprintf(stderr, "rank %d: out of memory for %llu bytes\n", rank, (unsigned long long)bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int failed_total = 0;
  for (int r = 0; r < repeats; ++r) {
    if (rank == 0) fill_pattern(buffer, bytes, (uint64_t)r + 1);
    else {
      fill_pattern(expected, bytes, (uint64_t)r + 1);
      memset(buffer, 0, bytes); /* touch the pages before the clock starts */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    MPI_Bcast(buffer, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double seconds = MPI_Wtime() - start;
    int bad = rank != 0 && memcmp(buffer, expected, bytes) != 0;
    int bad_ranks = 0;
    MPI_Reduce(&bad, &bad_ranks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      printf("{\"bench\":\"mpi_bcast\",\"bytes\":%llu,\"ranks\":%d,\"repeat\":%d,\"seconds\":%.6f,"
             "\"gbit_per_s\":%.3f,\"exact_receivers\":%d}\n",
             (unsigned long long)bytes, size, r, seconds, (double)bytes * 8 / seconds / 1e9,
             size - 1 - bad_ranks);
      fflush(stdout);
      failed_total += bad_ranks;
    }
  }
  free(buffer);
  free(expected);
  MPI_Bcast(&failed_total, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed_total == 0 ? 0 : 1;
}
