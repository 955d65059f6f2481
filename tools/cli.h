#pragma once
// The `deltacast` CLI: one file per subcommand (tools/*/*_command.cpp), each in a namespace of its own, registering
// itself with
//   static const deltacast::tools::CommandRegistrar reg{"name", &setup_fn};
// where setup_fn(CLI::App& parent) adds the subcommand, its options and its callback. A callback
// signals failure by throwing deltacast::Error (main prints "deltacast: <errc>: <message>" and
// exits 1) or by throwing CLI::RuntimeError(code) for a plain non-zero exit.
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace deltacast::tools {

using CommandSetup = std::function<void(CLI::App& parent)>;

struct CommandRegistrar {
  CommandRegistrar(std::string name, CommandSetup setup);
};

// All registered commands, sorted by name.
std::vector<std::pair<std::string, CommandSetup>>& command_registry();

}  // namespace deltacast::tools
