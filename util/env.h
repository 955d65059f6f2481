#pragma once
// The process environment as an injectable lookup: configuration (DELTACAST_* overrides) and
// launcher detection (OMPI_*, SLURM_*) read variables through an EnvLookup, so tests give them a
// map instead of the real environment.
#include <functional>
#include <optional>
#include <string>

namespace deltacast {

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The real process environment (std::getenv). Thread-safe as long as nobody calls setenv.
EnvLookup process_env();

}  // namespace deltacast
