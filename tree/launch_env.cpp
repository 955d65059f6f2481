#include "tree/launch_env.h"

#include <charconv>
#include <cstdlib>

#include "config/config.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

int env_int(const std::string& name, const std::string& value) {
  int out = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
    throw Error(Errc::invalid_argument, "launcher variable " + name + "='" + value + "' is not an integer");
  }
  return out;
}

std::optional<int> read_int(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  if (!v) return std::nullopt;
  return env_int(name, *v);
}

// Fills rank/size/local_rank from one launcher's variables; false when its rank variable is unset.
bool from_launcher(const EnvLookup& env, LaunchEnv& out, Launcher launcher, const char* rank_var,
                   const char* size_var, const char* local_var) {
  auto rank = read_int(env, rank_var);
  if (!rank) return false;
  auto size = read_int(env, size_var);
  if (!size) {
    throw Error(Errc::invalid_argument,
                std::string(rank_var) + " is set but " + size_var + " is not; pass --size to give the job size");
  }
  out.launcher = launcher;
  out.rank = *rank;
  out.size = *size;
  out.local_rank = read_int(env, local_var).value_or(0);
  return true;
}

}  // namespace

std::string_view launcher_name(Launcher launcher) noexcept {
  switch (launcher) {
    case Launcher::flags: return "flags";
    case Launcher::mpi: return "mpi";
    case Launcher::pmix: return "pmix";
    case Launcher::slurm: return "slurm";
  }
  return "unknown";
}

int LaunchEnv::member_rank() const {
  if (is_producer()) throw Error(Errc::state, "rank " + std::to_string(rank) + " is a producer, not a receiver member");
  return rank - producers;
}

const std::string& LaunchEnv::require_rendezvous() const {
  if (rendezvous.empty()) {
    throw Error(Errc::config, "no producer address: set 'producer' in the config, DELTACAST_PRODUCER, or --producer");
  }
  return rendezvous;
}

LaunchEnv detect_launch_env(const EnvLookup& env, const LaunchFlags& flags, const std::string& config_producer) {
  LaunchEnv out;
  if (flags.rank && flags.size) {
    out.launcher = Launcher::flags;
    out.rank = *flags.rank;
    out.size = *flags.size;
  } else if (from_launcher(env, out, Launcher::mpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK")) {
  } else if (auto pmix_rank = read_int(env, "PMIX_RANK")) {
    // Plain PMIx (not Open MPI) exports no size variable of its own; accept PMIX_SIZE or --size.
    auto size = flags.size ? flags.size : read_int(env, "PMIX_SIZE");
    if (!size) throw Error(Errc::invalid_argument, "PMIX_RANK is set but the job size is unknown; pass --size");
    out.launcher = Launcher::pmix;
    out.rank = *pmix_rank;
    out.size = *size;
  } else if (from_launcher(env, out, Launcher::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")) {
    out.nodelist = env("SLURM_STEP_NODELIST").value_or(env("SLURM_NODELIST").value_or(""));
  } else {
    throw Error(Errc::invalid_argument,
                "no launcher found: run under mpirun or srun, or pass both --rank and --size");
  }
  // A flag given alone overrides that one value from the launcher; the checks below catch an
  // inconsistent result.
  if (flags.rank) out.rank = *flags.rank;
  if (flags.size) out.size = *flags.size;
  if (out.size < 2) {
    throw Error(Errc::invalid_argument, "job size " + std::to_string(out.size) +
                                            " (" + std::string(launcher_name(out.launcher)) +
                                            ") leaves no receiver: need a producer (rank 0) and at least one receiver");
  }
  if (out.rank < 0 || out.rank >= out.size) {
    throw Error(Errc::invalid_argument, "rank " + std::to_string(out.rank) + " is outside 0.." +
                                            std::to_string(out.size - 1) + " (" +
                                            std::string(launcher_name(out.launcher)) + ")");
  }
  if (flags.producer) {
    out.rendezvous = *flags.producer;
  } else if (auto p = env("DELTACAST_PRODUCER")) {
    out.rendezvous = *p;
  } else {
    out.rendezvous = config_producer;
  }
  return out;
}

LaunchEnv detect_job_env(const EnvLookup& env, const LaunchFlags& flags, const config::Config& config,
                         const std::string& source) {
  LaunchEnv out = detect_launch_env(env, flags, config.producer);
  out.producers = static_cast<int>(config.producers);
  const size_t members = config::member_list(config).size();
  if (static_cast<size_t>(out.size) != members + config.producers)
    throw Error(Errc::config, "the job has " + std::to_string(out.size) + " processes but " + source + " lists " +
                                  std::to_string(members) + " receivers (+" + std::to_string(config.producers) +
                                  (config.producers == 1 ? " producer)" : " producer ranks)"));
  return out;
}

}  // namespace deltacast::tree
