#pragma once
// The arithmetic of `deltacast bench tree` (docs/benchmarks.md), apart from its processes so that
// it is unit-tested: the size sweep, the memory cap, medians, the bottleneck bandwidth read from a
// `deltacast probe` report, nccl-tests' bandwidth columns, and the table's text. Pure functions
// (mem_available_bytes reads nothing: it parses the text it is given), all thread-safe.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tree/topology.h"
#include "util/env.h"

namespace deltacast::tools {

// Host memory a broadcast of S bytes needs per process, in units of S: the producer holds the
// payload and tree::Producer's baseline (its constructor allocates a zeroed copy of the
// checkpoint), 2 S; a receiver holds its buffers (S) plus at most retain_bytes (64 MiB) of
// retained pieces and 64 MiB unsent per child, at most 2 S from 128 MiB up. 2 per process covers
// both; the bench applies it to every process of the job on the host.
inline constexpr double kBroadcastBytesFactor = 2.0;
// Refit mode, in units of the checkpoint: the producer holds the base weights, the mutated
// working copy and tree::Producer's baseline (3); a receiver its buffers plus the applier's undo
// records and retained frames of a few percent-deltas (< 3).
inline constexpr double kRefitBytesFactor = 3.0;
// The part of MemAvailable the job's processes on one host may use together.
inline constexpr double kMemoryFraction = 0.6;

// MemAvailable from the text of /proc/meminfo, in bytes; nullopt when the line is missing or
// malformed.
std::optional<uint64_t> mem_available_bytes(std::string_view meminfo);

// The largest payload S such that local_processes x factor x S <= fraction x mem_available
// (rounded down to an even byte count: BF16 elements). 0 when local_processes < 1 or factor <= 0.
uint64_t memory_size_cap(uint64_t mem_available, int local_processes, double factor, double fraction = kMemoryFraction);

// How many of the job's processes share this host, and where the figure came from.
struct LocalProcesses {
  int count = 1;
  std::string source;  // "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", ..., "job size"
};
// Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE; else Slurm's SLURM_NTASKS_PER_NODE, then
// SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE (the largest count of their "2(x3),1" form:
// conservative on uneven nodes); else the whole job (explicit --rank/--size launches: the bench
// cannot know how they are spread, so it assumes one host). Values that do not parse are skipped.
LocalProcesses local_process_count(const EnvLookup& env, int job_size);

// min, 4 min, 16 min, ... up to max included. Throws Error(invalid_argument) when min is 0 or
// odd, or max < min.
std::vector<uint64_t> sweep_sizes(uint64_t min_bytes, uint64_t max_bytes);

// Median (the mean of the middle two for an even count), smallest and largest. Throws
// Error(invalid_argument) for an empty list.
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread_of(std::vector<double> values);

// nccl-tests' columns for broadcast: algbw = bytes / seconds in GB/s (10^9 bytes); busbw = algbw
// (a broadcast moves each byte once over every rank's incoming link: the bus factor is 1).
double algbw_gbyte_s(uint64_t bytes, double seconds);
inline double busbw_gbyte_s_broadcast(double algbw) { return algbw; }
// seconds / (bytes / B) with B in Gbit/s (10^9 bit/s): how far a time is above what the bottleneck
// link needs for the bytes. nullopt when B is unknown or not positive.
std::optional<double> over_lower_bound(double seconds, uint64_t bytes, std::optional<double> bottleneck_gbit);

// The bottleneck of a topology from a `deltacast probe` report (docs/probe.md): the smallest
// bandwidth_gbit figure over the edges the relay trees use (the producer's edge to each root and
// every parent -> child edge, job ranks: producer 0, member m = rank m + 1), built over
// `cluster_labels` (one per member, as the members report them at HELLO). Edges the probe did not
// measure are skipped; when it measured none of them (a sampled probe), the smallest figure of
// the whole matrix. nullopt when the matrix holds no figure. Throws Error(invalid_argument) when
// the report has no bandwidth_gbit matrix or its size is not members + 1.
std::optional<double> probe_bottleneck_gbit(const nlohmann::json& probe, tree::TopologyKind kind,
                                            const std::vector<std::string>& cluster_labels);

// "1 MiB", "4 GiB", "1.5 KiB", "512 B": binary units, as sizes are given on the command line.
std::string size_text(uint64_t bytes);

}  // namespace deltacast::tools
