#include "util/error.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace deltacast {

std::string_view errc_name(Errc code) noexcept {
  switch (code) {
    case Errc::ok: return "ok";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::corrupt_frame: return "corrupt_frame";
    case Errc::version_mismatch: return "version_mismatch";
    case Errc::replayed: return "replayed";
    case Errc::verify_failed: return "verify_failed";
    case Errc::not_found: return "not_found";
    case Errc::io: return "io";
    case Errc::timeout: return "timeout";
    case Errc::connection: return "connection";
    case Errc::auth: return "auth";
    case Errc::unsupported: return "unsupported";
    case Errc::cancelled: return "cancelled";
    case Errc::config: return "config";
    case Errc::state: return "state";
    case Errc::internal: return "internal";
  }
  return "unknown";
}

void throw_os_error(std::string_view what, const std::string& subject, int err) {
  throw Error(Errc::io, std::string(what) + " " + subject + ": " + std::strerror(err));
}

void assert_fail(const char* expr, const char* file, int line) noexcept {
  std::fprintf(stderr, "deltacast: internal invariant broken: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace deltacast
