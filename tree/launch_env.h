#pragma once
// Where this process sits in a job: its rank, the job size and the producer's address, read from
// whatever started it. Supported launchers: Open MPI / PMIx (mpirun), Slurm (srun), or explicit
// flags. By convention rank 0 is the producer and ranks 1..size-1 are receivers (member index
// rank - 1 in the relay topology); with a producer group of M ranks, ranks 0..M-1 are producers
// and ranks M..size-1 receivers (member index rank - M).
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "util/env.h"

namespace deltacast::config {
struct Config;
}

namespace deltacast::tree {

enum class Launcher { flags, mpi, pmix, slurm };

// "flags" | "mpi" | "pmix" | "slurm".
std::string_view launcher_name(Launcher launcher) noexcept;

struct LaunchEnv {
  Launcher launcher = Launcher::flags;
  int rank = 0;        // 0 = producer (with a producer group: 0..producers-1)
  int size = 0;        // producers + receivers
  int producers = 1;   // the job's first ranks that are producers (config `producers`; detect_job_env)
  int local_rank = 0;  // index among this job's processes on this host (port offsets)
  std::string nodelist;    // SLURM_STEP_NODELIST, when Slurm started us
  std::string rendezvous;  // producer address; empty when no source supplied one

  bool is_producer() const noexcept { return rank < producers; }
  // A producer group's part rank (1..producers-1): not the coordinator, not a receiver.
  bool is_part_rank() const noexcept { return rank > 0 && rank < producers; }
  // This receiver's member index (rank - producers). Throws Error(state) on a producer.
  int member_rank() const;
  // This receiver's rank in the tree protocol (1..N: member_rank() + 1).
  int receiver_rank() const { return member_rank() + 1; }
  // The rendezvous address. Throws Error(config) when no source supplied one.
  const std::string& require_rendezvous() const;
};

// Explicit values (command-line flags); each one present wins over the environment.
struct LaunchFlags {
  std::optional<int> rank;
  std::optional<int> size;
  std::optional<std::string> producer;
};

// Detects rank and size (`env`: process_env() from util/env.h, or a map in tests): flags first (both --rank and --size), then Open MPI
// (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), then PMIx (PMIX_RANK with PMIX_SIZE or a size flag),
// then Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST). Open MPI is checked
// before Slurm because mpirun inside a Slurm allocation inherits the allocation's SLURM_PROCID.
// The rendezvous address is flags.producer, else DELTACAST_PRODUCER, else config_producer.
// Throws Error(invalid_argument) when no launcher is found, a variable is not an integer, or
// rank/size are inconsistent (size < 2, rank outside 0..size-1). Thread-safe if `env` is.
LaunchEnv detect_launch_env(const EnvLookup& env, const LaunchFlags& flags = {},
                            const std::string& config_producer = "");

// detect_launch_env for a job of `config` (run, probe, bench tree): its `producer` as the
// rendezvous default and its `producers` set, and the job's size checked against the config's
// producers + members: Error(config) "the job has N processes but SOURCE lists R receivers (+M
// producer ranks)" otherwise (`source`: the config's name, e.g. its path).
LaunchEnv detect_job_env(const EnvLookup& env, const LaunchFlags& flags, const config::Config& config,
                         const std::string& source);

}  // namespace deltacast::tree
