#include "capi/shim/core_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "util/signal_dispositions.h"

#ifndef DC_CORE_LIBRARY_RELATIVE
#error "DC_CORE_LIBRARY_RELATIVE (the core's path relative to this library's directory) is not set"
#endif

namespace deltacast::shim {
namespace {

std::once_flag g_open_once;
void* g_core = nullptr;
std::string g_error;  // written once under g_open_once, read after it

// The directory this shim was loaded from (with its trailing '/'), or "" when unknown.
std::string own_directory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&core_symbol), &info) == 0 || info.dli_fname == nullptr) return {};
  std::string path = info.dli_fname;
  auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

void open_core() noexcept {
  try {
    // $DELTACAST_CORE_LIB replaces the path beside the shim (a relocated core, a test).
    const char* explicit_path = std::getenv("DELTACAST_CORE_LIB");
    std::string path = explicit_path != nullptr && *explicit_path != '\0' ? std::string(explicit_path)
                                                                          : own_directory() + DC_CORE_LIBRARY_RELATIVE;
    SignalDispositionGuard keep_host_handlers;
    g_core = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (g_core == nullptr) {
      const char* why = ::dlerror();
      g_error = "libdeltacast: cannot open its core library " + path + ": " + (why ? why : "unknown dlopen error");
    }
  } catch (...) {
    g_error = "libdeltacast: out of memory while opening its core library";
  }
}

}  // namespace

void* core_symbol(const char* name) noexcept {
  std::call_once(g_open_once, open_core);
  // A core of the same build has every dc_* function; nullptr for a missing one is the caller's
  // failure value, not a crash.
  return g_core == nullptr ? nullptr : ::dlsym(g_core, name);
}

const char* core_error() noexcept { return g_error.c_str(); }

}  // namespace deltacast::shim
