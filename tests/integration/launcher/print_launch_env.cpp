// Prints what detect_launch_env sees in this process, one line, for the launcher tests:
//   launcher=slurm rank=3 size=9 local_rank=3 role=receiver member=2
// Exits 1 with the error message when detection fails.
#include <cstdio>

#include "tree/launch_env.h"
#include "util/error.h"

int main() {
  using namespace deltacast;
  try {
    const tree::LaunchEnv env = tree::detect_launch_env(process_env());
    std::printf("launcher=%s rank=%d size=%d local_rank=%d role=%s member=%d\n",
                std::string(tree::launcher_name(env.launcher)).c_str(), env.rank, env.size, env.local_rank,
                env.is_producer() ? "producer" : "receiver", env.is_producer() ? -1 : env.member_rank());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "print_launch_env: %s: %s\n", std::string(errc_name(e.code())).c_str(), e.what());
    return 1;
  }
}
