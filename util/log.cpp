#include "util/log.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace deltacast {

std::shared_ptr<spdlog::logger> logger(const std::string& subsystem) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  if (auto existing = spdlog::get(subsystem)) return existing;
  auto made = spdlog::stderr_color_mt(subsystem);
  const char* level = std::getenv("DELTACAST_LOG_LEVEL");
  made->set_level(level ? spdlog::level::from_str(level) : spdlog::level::info);
  made->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  return made;
}

}  // namespace deltacast
