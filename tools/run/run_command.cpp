// `deltacast run --config FILE [--rank R --size N]`: one process of a relay-tree job. The rank
// comes from the launcher (mpirun, srun) or the flags (tree/launch_env.h). Rank 0 is the producer
// (with `producers: M`, ranks 0..M-1 are a producer group, docs/producer-group.md):
// it takes versions from the synthetic trainer or from a real trainer's checkpoint directory
// (trainer.kind synth | watch, tools/run/version_source.h), sends the first as the full checkpoint
// (bootstrap) and then one delta per version through the tree, and writes a JSON report. Ranks 1..N are receivers
// holding the weights in buffers this process owns. Members that fail are repaired around by the tree; the producer
// exits 0 only when every version was verified and committed by every member live at its end,
// a receiver only when it committed every version it saw (none aborted).
//
// After every committed version (the bootstrap included) the producer writes its state file,
// <output.dir>/producer-state.json (docs/config.md). `--resume` (rank 0) restarts a producer from
// it: the trainer is re-simulated to the state's step (watch: the state's checkpoint is opened),
// its bits are checked against the state's digest, and the version chain goes on where it stopped, with the members
// that kept the committed version (docs/protocol.md, "Producer loss").
//
// --fault ACTION@VERSION[:N] is a testing aid (tools/run/fault.h).
//
// This file is the command (options, the checks before a role starts, the log file); the roles
// are tools/run/producer_process.h and tools/run/receiver_process.h.
#include <cstdio>
#include <string>

#include "config/config.h"
#include "tools/cli.h"
#include "tools/probe/job.h"
#include "tools/run/fault.h"
#include "tools/run/producer_process.h"
#include "tools/run/receiver_process.h"
#include "tools/run/run_support.h"
#include "tools/run/store_processes.h"
#include "tree/launch_env.h"
#include "util/env.h"
#include "util/error.h"

namespace deltacast::tools::run_command {  // its own namespace: unity builds batch the commands together
namespace {

void run(const RunOptions& o) {
  config::Config c = config::load_config(o.config_path);
  config::apply_flag_overrides(c, o.sets);
  config::validate(c);
  config::resolve_clusters(c);
  set_log_level(c.log_level);
  if (c.transport == "loop" || c.transport == "loopback")
    throw Error(Errc::config, "transport '" + c.transport + "' only works inside one process");
  const tree::LaunchEnv env = tree::detect_job_env(process_env(), {o.rank, o.size, o.producer}, c, o.config_path);
  if (c.clusters == "auto" && c.probe_file.empty()) {
    // No probe file: every rank measures a quick probe (O(N) flows) before the tree starts, and
    // takes the clusters rank 0 found.
    tools::quick_probe_clusters(c, env);
  } else if (c.clusters == "auto" && env.rank == 0) {
    std::string text;
    for (const auto& m : config::member_list(c)) text += " " + std::to_string(m.rank + 1) + ":" + m.cluster;
    std::printf("producer: clusters from %s: producer in %s; members%s\n", c.probe_file.c_str(),
                c.producer_cluster.empty() ? "its own cluster" : c.producer_cluster.c_str(), text.c_str());
  }
  if (!o.fault.empty()) parse_fault(o.fault);  // a bad spec fails before the job starts
  if (o.resume && !env.is_producer())
    throw Error(Errc::invalid_argument,
                "--resume applies to a producer (rank 0, or a producer group's ranks), not to rank " +
                    std::to_string(env.rank) +
                    ": a receiver keeps its committed version and rejoins a restarted producer by itself "
                    "(within timeouts.producer_loss)");
  auto log_file = open_log_file(c, env.rank);
  try {
    if (env.is_producer() && c.store.enabled() && config::producer_tree_members(c) == 0)
      run_store_producer(c, env, o);
    else if (env.is_producer())
      run_producer(c, env, o);
    else if (const auto route = config::version_route(c, env.member_rank());
             route.kind == config::VersionRoute::Kind::gateway)
      run_store_gateway(c, env, o, route);
    else
      run_receiver(c, env, o);
  } catch (const std::exception& e) {
    // main() prints the error to stderr; the log file gets it too.
    if (log_file) {
      log_file->error("rank {}: {}", env.rank, e.what());
      log_file->flush();
    }
    throw;
  }
}

void setup(CLI::App& parent) {
  auto options = std::make_shared<RunOptions>();
  auto* cmd = parent.add_subcommand("run", "Run one process of a relay-tree job (rank 0 = producer)");
  cmd->add_option("--config", options->config_path, "Cluster YAML (see docs/config.md)")->required();
  cmd->add_option("--rank", options->rank, "This process's rank (default: from mpirun/srun)");
  cmd->add_option("--size", options->size, "Processes in the job (default: from mpirun/srun)");
  cmd->add_option("--producer", options->producer, "Rendezvous URL (default: DELTACAST_PRODUCER, then the config)");
  cmd->add_option("--set", options->sets, "Override a config key: key=value (repeatable)");
  cmd->add_option("--report", options->report_path,
                  "Producer: write the JSON report here (default: output.metrics_file)");
  cmd->add_option("--summary", options->summary_path,
                  "Receiver: write {rank, version, sha256 of the weights} as JSON here");
  cmd->add_flag("--resume", options->resume,
                "Producer (rank 0): continue the version chain from <output.dir>/producer-state.json "
                "after the producer process was lost; receivers rejoin by themselves");
  cmd->add_option("--placement", options->placement_path,
                  "A receiver's placement file (YAML or JSON, docs/placement.md; \"{rank}\" becomes the "
                  "receiver's rank): it holds only those slices of the model, in buffers of its own");
  cmd->add_option("--fault", options->fault,
                  "TESTING AID: ACTION@VERSION[:N] with ACTION kill (SIGKILL) or stop (SIGSTOP): this "
                  "process kills or freezes itself once it has handled (a receiver) or sent (the "
                  "producer) N (default 1) data messages of VERSION (version 1 = the full checkpoint, "
                  "step s = version s+1); stall (a receiver): the relay thread that handled the N-th "
                  "stops draining for good while the process and its heartbeats go on")
      ->group("Testing aids");
  cmd->add_option_function<std::string>(
         "--slow-disk",
         [options](const std::string& rate) {
           options->slow_disk_bytes_per_second = static_cast<double>(config::parse_size(rate));
         },
         "TESTING AID: a receiver's output.checkpoint_dir writes take at least the model's bytes / RATE "
         "(bytes per second, e.g. 1MiB), as on a slow disk")
      ->group("Testing aids");
  cmd->callback([options] { run(*options); });
}

const CommandRegistrar registrar{"run", &setup};

}  // namespace
}  // namespace deltacast::tools::run_command
