// `deltacast demo`: refit a SIMULATED trainer's steps end to end. --offline runs in one process
// (tools/demo/offline_demo.h); otherwise the relay-tree demo (tools/demo/tree_demo.h).
#include <memory>

#include "tools/cli.h"
#include "tools/demo/offline_demo.h"
#include "tools/demo/tree_demo.h"

namespace deltacast::tools::demo_command {  // its own namespace: unity builds batch the commands together
namespace {

void setup(CLI::App& parent) {
  auto o = std::make_shared<DemoOptions>();
  auto* cmd = parent.add_subcommand("demo", "refit a simulated trainer's steps and check every receiver is bit-exact");
  cmd->add_flag("--offline", o->offline, "in one process, without a transport");
  cmd->add_option("--receivers", o->receivers, "receivers in the relay tree")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--steps", o->steps, "optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--params", o->params, "simulated model size, e.g. 500M")->capture_default_str();
  cmd->add_option("--topology", o->topology, "relay tree shape")->capture_default_str();
  cmd->add_option("--uplink", o->uplink,
                  "cap on each producer rank's egress, a rate (100Mbit/s, 1Gbit/s; 0 = none): the cross-cluster link")
      ->capture_default_str();
  cmd->add_option("--producers", o->producers,
                  "producer ranks (a producer group: each sends its part of every version on its own uplink)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--lr", o->lr, "simulator learning rate")->capture_default_str();
  cmd->add_option("--transport", o->transport, "transport backend")->capture_default_str();
  cmd->add_option("--json", o->json_path, "write per-step results as JSON to this file");
  cmd->add_option("--seed", o->seed, "simulator seed")->capture_default_str();
  cmd->add_option("--threads", o->threads, "encoder/applier threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kill", o->kill,
                  "RANK@STEP[:N]: receiver RANK (1..receivers) kills itself (SIGKILL) at its N-th (default 1st) "
                  "data message of STEP (0 = the full checkpoint); the tree repairs around it and only the "
                  "survivors are checked (repeatable)");
  cmd->add_option("--freeze", o->freeze,
                  "RANK@STEP[:N]: like --kill, but the receiver stops (SIGSTOP) and is found silent after the "
                  "peer timeout (10 s in the demo when freezing); the demo SIGKILLs it at the end (repeatable)");
  cmd->add_option("--timeout", o->timeout, "kill every process and fail after this long (e.g. 90s, 30m)")
      ->capture_default_str();
  cmd->callback([o] {
    if (o->offline) {
      run_offline_demo(*o);
    } else {
      run_tree_demo(*o);
    }
  });
}

const CommandRegistrar registrar{"demo", &setup};

}  // namespace
}  // namespace deltacast::tools::demo_command
