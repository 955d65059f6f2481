#pragma once
// Logging through spdlog, one named logger per subsystem ("codec", "transport", "tree", ...).
// Level from DELTACAST_LOG_LEVEL (trace|debug|info|warn|error|off), default info; logs go to stderr.
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace deltacast {

// Returns the shared logger for a subsystem, creating it on first use. Thread-safe.
std::shared_ptr<spdlog::logger> logger(const std::string& subsystem);

}  // namespace deltacast
