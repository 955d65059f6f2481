#pragma once
// Shared by the C API's entry points (capi/*.cpp): the status mapping, the thread-local last
// error, the exception guard every entry point runs in, options by key, and dtype mapping.
// Nothing here is exported: the library exports only the dc_* functions of deltacast.h.
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "codec/dtype.h"
#include "codec/manifest.h"
#include "config/config.h"
#include "deltacast/deltacast.h"
#include "util/error.h"

namespace deltacast::capi {

// The dc_status for an Errc.
int status_of(Errc code) noexcept;
// The calling thread's last error message, and clearing it.
const char* last_error_cstr() noexcept;
void clear_last_error() noexcept;
// Records `message` as the calling thread's last error and returns `status`.
int fail(int status, const std::string& message) noexcept;

// Runs `body` (returning an int status, usually DC_OK) and turns every exception into a status
// plus the thread's last error: Error by its code, std::bad_alloc as DC_ERR_NO_MEMORY, anything
// else as DC_ERR_INTERNAL. No exception leaves.
template <class Body>
int guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const Error& e) {
    return fail(status_of(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(DC_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(DC_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(DC_ERR_INTERNAL, "unknown exception");
  }
}

// A NULL handle or output pointer: DC_ERR_INVALID_ARGUMENT naming it (throws Error).
void require(const void* pointer, const char* what);

// Options by key, as dc_receiver_set / dc_producer_set take them: the YAML keys of docs/config.md
// go to a config::Config through config::apply_override (so a bad value is refused exactly as in
// a file); the DELTACAST_* environment is applied at creation, as the CLI applies it; "config"
// loads a YAML file's keys (and the environment over them); `process_keys` (e.g. rank, listen)
// are kept as strings for the caller. log_level takes effect at once for every subsystem.
class Options {
 public:
  Options(const char* who, std::initializer_list<const char*> process_keys);
  void set(const std::string& key, const std::string& value);
  const config::Config& config() const noexcept { return config_; }
  std::optional<std::string> process(const std::string& key) const;

 private:
  std::string who_;
  std::map<std::string, std::optional<std::string>> process_;
  config::Config config_;
};

// A process-level option that is a whole number in [minimum, maximum] ("rank", "receivers",
// "threads"); Error(config) naming `key` otherwise.
uint64_t parse_count(const std::string& key, const std::string& text, uint64_t minimum, uint64_t maximum);

// A 64-bit digest as dc_receiver_version prints it: 16 hex digits (optionally 0x-prefixed) or a
// decimal number; Error(config) naming `key` otherwise.
uint64_t parse_digest(const std::string& key, const std::string& text);

// A process-level yes/no option ("gated"): true/false, yes/no, on/off, 1/0 as YAML spells them;
// Error(config) naming `key` otherwise.
bool parse_bool(const std::string& key, const std::string& text);

// clusters: auto in the C API, which has no member list and cannot probe at start (every rank of
// the job probes together; run `deltacast probe --out FILE` and set probe_file). Both throw
// Error(config) for clusters: auto without probe_file, and what config::read_probe_clusters throws.
// The producer: `c` as for a job of `receivers` members (the report must have receivers + 1 ranks):
// producer_cluster becomes rank 0's probe cluster, so commit: auto delegates when no receiver
// shares it. Does nothing for clusters: manual.
void resolve_producer_clusters(config::Config& c, uint64_t receivers);
// A receiver of job rank `rank`: the label of its probe cluster (`configured` stays when the probe
// did not reach it). `configured`: the "cluster" key, which clusters: auto excludes.
std::string receiver_cluster(const config::Config& c, uint32_t rank, const std::optional<std::string>& configured);

// log_level for every subsystem that logs.
void set_log_level(const std::string& level);

// The codec's dtype for a dc_dtype. DC_ERR_INVALID_ARGUMENT for a value outside the enum,
// DC_ERR_UNSUPPORTED for the safetensors dtypes the codec does not handle yet (throws Error).
codec::DType codec_dtype(int dtype);
// The dc_dtype of a codec dtype.
int dc_dtype_of(codec::DType dtype) noexcept;
// Refuses a device other than host (CUDA: DC_ERR_UNSUPPORTED until the CUDA apply path exists).
void require_host(int device, int device_id);

// Accepts CUDA memory for tensor `t` of a producer or receiver (`role`) whose CUDA tensors are on
// `bound_device` (-1: none yet): it needs a build with CUDA, a usable device, a device pointer,
// and one device for all of them. Throws Error(unsupported) naming what is missing, or
// Error(invalid_argument) for a pointer that is not device memory.
void require_cuda_tensor(const codec::TensorInfo& t, const void* data, int device_id, int bound_device,
                         const char* role);

}  // namespace deltacast::capi
