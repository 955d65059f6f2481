#pragma once
// The loader half of libdeltacast.so. The library an embedder links (or Python's ctypes opens) is a
// small shim that depends on nothing but libc: its dc_* functions forward to the same functions of
// libdeltacast_core (the real library, with libfabric, UCX and the rest as its dependencies), which
// it opens on the first call with every signal disposition recorded before and put back after
// (util/signal_dispositions.h). The libraries that libfabric and UCX pull in install signal
// handlers from their constructors; through the shim, a host's handlers are the same after
// `import deltacast` or dlopen as before (docs/embedding.md "Signals").
namespace deltacast::shim {

// The core's function `name` (a dc_* symbol), or nullptr when the core could not be opened or
// lacks it (core_error() then says why). The first call opens the core; thread-safe.
void* core_symbol(const char* name) noexcept;

// Why the core is not usable: the dlopen/dlsym message with the path tried; "" when it is.
const char* core_error() noexcept;

}  // namespace deltacast::shim
