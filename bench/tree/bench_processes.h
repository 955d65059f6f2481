#pragma once
// Child processes for the relay-tree benchmark: receivers run as separate processes (optionally
// inside a network namespace made by scripts/netns.sh), started with posix_spawn and reaped with
// waitpid. Kept apart from the benchmark logic so the timing code reads straight.
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace deltacast::bench {

// Starts argv (argv[0] a path) with stdout and stderr appended to `log`. Throws Error(io) when the
// process cannot be started. Thread-safe (posix_spawn).
pid_t spawn_process(const std::vector<std::string>& argv, const std::filesystem::path& log);

// Waits for `pid`; returns its exit code, or 128 + signal when it was killed.
int wait_process(pid_t pid);

// Kills (SIGKILL) and reaps every pid still running; for error paths, so no receiver outlives the
// benchmark. Never throws.
void kill_processes(const std::vector<pid_t>& pids) noexcept;

// This executable's path (/proc/self/exe).
std::string self_executable();

// The last `lines` lines of a text file, indented, for error messages.
std::string tail_of_file(const std::filesystem::path& path, size_t lines);

}  // namespace deltacast::bench
