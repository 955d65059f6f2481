#include "capi/capi_common.h"

#include <array>

#include "codec/cuda/device_apply.h"
#include "codec/cuda/device_diff.h"
#include "util/log.h"

namespace deltacast::capi {
namespace {

thread_local std::string last_error;

constexpr const char* kSubsystems[] = {"tree", "transport", "codec", "run", "cli", "capi"};

}  // namespace

int status_of(Errc code) noexcept {
  switch (code) {
    case Errc::ok: return DC_OK;
    case Errc::invalid_argument: return DC_ERR_INVALID_ARGUMENT;
    case Errc::corrupt_frame: return DC_ERR_CORRUPT;
    case Errc::version_mismatch: return DC_ERR_VERSION_MISMATCH;
    case Errc::replayed: return DC_ERR_REPLAYED;
    case Errc::verify_failed: return DC_ERR_VERIFY_FAILED;
    case Errc::not_found: return DC_ERR_NOT_FOUND;
    case Errc::io: return DC_ERR_IO;
    case Errc::timeout: return DC_ERR_TIMEOUT;
    case Errc::connection: return DC_ERR_CONNECTION;
    case Errc::auth: return DC_ERR_AUTH;
    case Errc::unsupported: return DC_ERR_UNSUPPORTED;
    case Errc::cancelled: return DC_ERR_CANCELLED;
    case Errc::config: return DC_ERR_CONFIG;
    case Errc::state: return DC_ERR_STATE;
    case Errc::internal: return DC_ERR_INTERNAL;
  }
  return DC_ERR_INTERNAL;
}

const char* last_error_cstr() noexcept { return last_error.c_str(); }

void clear_last_error() noexcept { last_error.clear(); }

int fail(int status, const std::string& message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    last_error.clear();
  }
  return status;
}

void require(const void* pointer, const char* what) {
  if (!pointer) throw Error(Errc::invalid_argument, std::string(what) + " is NULL");
}

Options::Options(const char* who, std::initializer_list<const char*> process_keys) : who_(who) {
  for (const char* key : process_keys) process_[key] = std::nullopt;
  config_.log_level = "warn";  // an embedded library says little unless asked
  // As the CLI: DELTACAST_* variables override the defaults (and a "config" file); keys set in
  // code override both.
  config::apply_env_overrides(config_, process_env());
  set_log_level(config_.log_level);
}

void Options::set(const std::string& key, const std::string& value) {
  const std::string source = who_ + "(\"" + key + "\")";
  if (auto it = process_.find(key); it != process_.end()) {
    it->second = value;
  } else if (key == "config") {
    // The file's keys (then the environment's) replace the current config; process-level keys
    // set so far stay.
    config_ = config::load_config(value, process_env());
  } else {
    config::apply_override(config_, key, value, source);
  }
  set_log_level(config_.log_level);
}

std::optional<std::string> Options::process(const std::string& key) const {
  auto it = process_.find(key);
  return it == process_.end() ? std::nullopt : it->second;
}

uint64_t parse_count(const std::string& key, const std::string& text, uint64_t minimum, uint64_t maximum) {
  try {
    size_t used = 0;
    const unsigned long long n = std::stoull(text, &used);
    if (used == text.size() && !text.empty() && text[0] != '-' && n >= minimum && n <= maximum) return n;
  } catch (const std::exception&) {
  }
  throw Error(Errc::config, key + " must be a whole number in " + std::to_string(minimum) + ".." +
                                std::to_string(maximum) + ", not '" + text + "'");
}

uint64_t parse_digest(const std::string& key, const std::string& text) {
  std::string digits = text;
  int base = 10;
  if (digits.rfind("0x", 0) == 0 || digits.rfind("0X", 0) == 0) {
    digits = digits.substr(2);
    base = 16;
  } else if (digits.size() == 16) {
    base = 16;
  }
  try {
    size_t used = 0;
    const unsigned long long value = std::stoull(digits, &used, base);
    if (used == digits.size() && !digits.empty() && digits[0] != '-' && digits[0] != '+') return value;
  } catch (const std::exception&) {
  }
  throw Error(Errc::config, key + " must be a 64-bit digest (16 hex digits, 0x..., or decimal), not '" + text + "'");
}

namespace {
void require_probe_file(const config::Config& c) {
  if (c.probe_file.empty())
    throw Error(Errc::config,
                "clusters: auto needs probe_file here: an embedded producer or receiver cannot probe at start "
                "(every rank of the job probes together). Run `deltacast probe --config FILE --out probe.json` "
                "under the job's launcher and set probe_file: probe.json");
}
}  // namespace

void resolve_producer_clusters(config::Config& c, uint64_t receivers) {
  if (c.clusters != "auto") return;
  require_probe_file(c);
  // The job's members as resolve_clusters counts them (hosts and ports do not matter here: the
  // producer learns its members' URLs and labels from their HELLOs).
  c.members.clear();
  c.local_members = config::LocalMembers{static_cast<int>(receivers), "127.0.0.1", 0, ""};
  config::resolve_clusters(c);
}

std::string receiver_cluster(const config::Config& c, uint32_t rank, const std::optional<std::string>& configured) {
  if (c.clusters != "auto") return configured.value_or("default");
  if (configured)
    throw Error(Errc::config, "set either \"cluster\" (" + *configured + ") or clusters: auto (probe_file), not both");
  require_probe_file(c);
  const std::string label =
      config::probe_cluster_label(config::read_probe_clusters(c.probe_file, 0), static_cast<int>(rank));
  return label.empty() ? "default" : label;
}

bool parse_bool(const std::string& key, const std::string& text) {
  for (const char* yes : {"true", "True", "TRUE", "yes", "on", "1"})
    if (text == yes) return true;
  for (const char* no : {"false", "False", "FALSE", "no", "off", "0"})
    if (text == no) return false;
  throw Error(Errc::config, key + " must be true or false, not '" + text + "'");
}

void set_log_level(const std::string& level) {
  for (const char* subsystem : kSubsystems) logger(subsystem)->set_level(spdlog::level::from_str(level));
}

// dc_dtype and codec::DType both spell every dtype as safetensors does: map through the name.
codec::DType codec_dtype(int dtype) {
  const char* name = dc_dtype_name(dtype);
  if (!name) throw Error(Errc::invalid_argument, "dtype " + std::to_string(dtype) + " is not a dc_dtype");
  const auto d = codec::dtype_from_name(name);
  if (!d) throw Error(Errc::unsupported, std::string("dtype ") + name + " is not handled by the codec");
  return *d;
}

int dc_dtype_of(codec::DType dtype) noexcept {
  const std::string_view name = codec::dtype_name(dtype);
  for (int d = 0; d < 15; ++d)
    if (name == dc_dtype_name(d)) return d;
  return -1;
}

void require_host(int device, int device_id) {
  if (device == DC_DEVICE_HOST) return;
  if (device == DC_DEVICE_CUDA)
    throw Error(Errc::unsupported, "CUDA memory (device " + std::to_string(device_id) +
                                       ") cannot be registered yet: deltacast has no CUDA apply path; "
                                       "register host memory");
  throw Error(Errc::invalid_argument, "device " + std::to_string(device) + " is not a dc_device");
}

void require_cuda_tensor(const codec::TensorInfo& t, const void* data, int device_id, int bound_device,
                         const char* role) {
  if (!codec::cuda::cuda_built())
    throw Error(Errc::unsupported,
                "tensor '" + t.name +
                    "': CUDA memory needs a build with CUDA "
                    "(DELTACAST_WITH_CUDA=ON and nvcc); this libdeltacast has none: register host memory");
  if (!codec::cuda::cuda_device_available())
    throw Error(Errc::unsupported, "tensor '" + t.name + "': this build has CUDA but no CUDA device is usable here "
                                   "(no GPU or no driver): register host memory");
  if (bound_device >= 0 && bound_device != device_id)
    throw Error(Errc::unsupported, "tensor '" + t.name + "' is on CUDA device " + std::to_string(device_id) + "; this " +
                                       role + "'s CUDA tensors are on device " + std::to_string(bound_device) +
                                       " (one device per " + role + ")");
  if (t.nbytes() > 0 && !codec::cuda::is_device_pointer(data))
    throw Error(Errc::invalid_argument,
                "tensor '" + t.name + "': DC_DEVICE_CUDA with a pointer that is not CUDA device memory");
}

}  // namespace deltacast::capi

// ---- the exported basics -------------------------------------------------------------------

using namespace deltacast;

static_assert(DC_VERSION_MAJOR == DC_PROJECT_VERSION_MAJOR && DC_VERSION_MINOR == DC_PROJECT_VERSION_MINOR &&
                  DC_VERSION_PATCH == DC_PROJECT_VERSION_PATCH,
              "deltacast.h's DC_VERSION_* must equal the CMake project version");

extern "C" {

unsigned dc_version_number(void) { return DC_VERSION_NUMBER; }

const char* dc_version_string(void) {
#define DC_STR2(x) #x
#define DC_STR(x) DC_STR2(x)
  return DC_STR(DC_VERSION_MAJOR) "." DC_STR(DC_VERSION_MINOR) "." DC_STR(DC_VERSION_PATCH);
}

int dc_is_error(int status) { return status < 0 ? 1 : 0; }

const char* dc_status_name(int status) {
  switch (status) {
    case DC_OK: return "DC_OK";
    case DC_PENDING: return "DC_PENDING";
    case DC_ERR_INVALID_ARGUMENT: return "DC_ERR_INVALID_ARGUMENT";
    case DC_ERR_STATE: return "DC_ERR_STATE";
    case DC_ERR_UNSUPPORTED: return "DC_ERR_UNSUPPORTED";
    case DC_ERR_CONFIG: return "DC_ERR_CONFIG";
    case DC_ERR_NOT_FOUND: return "DC_ERR_NOT_FOUND";
    case DC_ERR_CONNECTION: return "DC_ERR_CONNECTION";
    case DC_ERR_TIMEOUT: return "DC_ERR_TIMEOUT";
    case DC_ERR_AUTH: return "DC_ERR_AUTH";
    case DC_ERR_CORRUPT: return "DC_ERR_CORRUPT";
    case DC_ERR_VERSION_MISMATCH: return "DC_ERR_VERSION_MISMATCH";
    case DC_ERR_VERIFY_FAILED: return "DC_ERR_VERIFY_FAILED";
    case DC_ERR_REPLAYED: return "DC_ERR_REPLAYED";
    case DC_ERR_ABORTED: return "DC_ERR_ABORTED";
    case DC_ERR_IO: return "DC_ERR_IO";
    case DC_ERR_CANCELLED: return "DC_ERR_CANCELLED";
    case DC_ERR_NO_MEMORY: return "DC_ERR_NO_MEMORY";
    case DC_ERR_INTERNAL: return "DC_ERR_INTERNAL";
    default: return "DC_UNKNOWN_STATUS";
  }
}

const char* dc_last_error(void) { return capi::last_error_cstr(); }

const char* dc_dtype_name(int dtype) {
  static constexpr std::array<const char*, 15> kNames = {"BOOL", "U8",  "I8",  "I16", "U16",
                                                         "I32",  "U32", "I64", "U64", "F16",
                                                         "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"};
  if (dtype < 0 || dtype >= static_cast<int>(kNames.size())) return nullptr;
  return kNames[static_cast<size_t>(dtype)];
}

int dc_dtype_from_name(const char* name, int* dtype) {
  return capi::guarded([&]() -> int {
    capi::require(name, "name");
    capi::require(dtype, "dtype");
    for (int d = 0; d < 15; ++d)
      if (std::string_view(name) == dc_dtype_name(d)) {
        *dtype = d;
        return DC_OK;
      }
    throw Error(Errc::invalid_argument, std::string("unknown dtype '") + name + "' (safetensors spellings: BF16, F32, ...)");
  });
}

size_t dc_dtype_size(int dtype) {
  switch (dtype) {
    case DC_DTYPE_BOOL: case DC_DTYPE_U8: case DC_DTYPE_I8: case DC_DTYPE_F8_E4M3: case DC_DTYPE_F8_E5M2: return 1;
    case DC_DTYPE_I16: case DC_DTYPE_U16: case DC_DTYPE_F16: case DC_DTYPE_BF16: return 2;
    case DC_DTYPE_I32: case DC_DTYPE_U32: case DC_DTYPE_F32: return 4;
    case DC_DTYPE_I64: case DC_DTYPE_U64: case DC_DTYPE_F64: return 8;
    default: return 0;
  }
}

}  // extern "C"
