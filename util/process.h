#pragma once
// Child processes for the tools that run a fleet of local processes (`deltacast demo`, the
// relay-tree benchmark): started with posix_spawn, reaped with waitpid.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace deltacast {

// Starts argv (argv[0] a path, or a name looked up in PATH) with stdout written to `out` (inherited
// when empty) and stderr to `err` (the same file as stdout when empty). Throws Error(io) when the
// process cannot be started. Thread-safe (posix_spawn).
pid_t spawn_process(const std::vector<std::string>& argv, const std::filesystem::path& out,
                    const std::filesystem::path& err = {});

// Waits for `pid`; returns its exit code, or 128 + signal when it was killed.
int wait_process(pid_t pid);

// Waits at most `timeout` for `pid`: its exit code as wait_process returns it, or nullopt while it
// still runs (a stopped process counts as running; it is left as it is). Polls every 10 ms.
std::optional<int> wait_process_for(pid_t pid, std::chrono::milliseconds timeout);

// Kills (SIGKILL) and reaps every pid still running; for error paths, so no receiver outlives the
// benchmark. Never throws.
void kill_processes(const std::vector<pid_t>& pids) noexcept;

// This executable's path (/proc/self/exe).
std::string self_executable();

// The last `lines` lines of a text file, indented, for error messages.
std::string tail_of_file(const std::filesystem::path& path, size_t lines);

}  // namespace deltacast
