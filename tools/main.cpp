#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include "tools/cli.h"
#include "util/error.h"

namespace deltacast::tools {

std::vector<std::pair<std::string, CommandSetup>>& command_registry() {
  static std::vector<std::pair<std::string, CommandSetup>> registry;
  return registry;
}

CommandRegistrar::CommandRegistrar(std::string name, CommandSetup setup) {
  command_registry().emplace_back(std::move(name), std::move(setup));
}

}  // namespace deltacast::tools

namespace {
// Every open checkpoint file holds a descriptor while it is open (checkpoint/mapped_file.h): two
// checkpoints of a few hundred shards each, with the sockets of a run, come near the usual soft
// limit of 1024. The soft limit is raised to the hard one, as far as the system allows.
void raise_open_file_limit() noexcept {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  (void)::setrlimit(RLIMIT_NOFILE, &limit);  // a refusal leaves the old limit: nothing to report
}
}  // namespace

int main(int argc, char** argv) {
  using namespace deltacast;
  raise_open_file_limit();
  CLI::App app{"deltacast: bit-exact delta refit of model weights through a relay tree"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deltacast 0.2.0");
  auto& registry = tools::command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [name, setup] : registry) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::fprintf(stderr, "deltacast: %s: %s\n", std::string(errc_name(e.code())).c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deltacast: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
