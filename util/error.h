#pragma once
// deltacast's one error style inside C++: functions that fail throw deltacast::Error, which carries
// an Errc (machine-readable category) and a message naming the problem. Asynchronous completions
// (transport requests) carry the same pair as a Status value instead of throwing. The C API catches
// every Error at its boundary and returns the Errc as a status code.
// Broken internal invariants are not Errors: they abort loudly (DC_ASSERT).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace deltacast {

enum class Errc : int {
  ok = 0,
  invalid_argument = 1,   // caller passed something that can never work
  corrupt_frame = 2,      // bytes fail a checksum, magic, bounds or structure check
  version_mismatch = 3,   // wrong base version / digest, manifest mismatch, format version
  replayed = 4,           // a chunk already applied in this version
  verify_failed = 5,      // bits differ from what the producer holds
  not_found = 6,          // unknown tensor, file, peer
  io = 7,                 // file system or OS call failed
  timeout = 8,            // a bound on waiting expired
  connection = 9,         // peer unreachable, closed, reset: recoverable (pick a new parent)
  auth = 10,              // peer failed authentication
  unsupported = 11,       // capability not offered by this build or backend
  cancelled = 12,         // request cancelled by its owner
  config = 13,            // bad configuration (message includes file:line)
  state = 14,             // call not valid in the object's current state
  internal = 15,          // unexpected failure of a dependency
};

// Returns a stable lowercase name for an Errc ("corrupt_frame").
std::string_view errc_name(Errc code) noexcept;

// The result of an asynchronous operation: ok, or an Errc with a message.
struct Status {
  Errc code = Errc::ok;
  std::string message;
  bool ok() const noexcept { return code == Errc::ok; }
  static Status success() { return {}; }
};

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  explicit Error(const Status& status) : Error(status.code, status.message) {}
  Errc code() const noexcept { return code_; }
  Status status() const { return Status{code_, what()}; }

 private:
  Errc code_;
};

// Throws Error(Errc::io, "<what> <subject>: <strerror(err)>"), for an OS call on a file that failed
// with errno `err` ("cannot open", "/ckpt/model.safetensors", ENOENT). A std::filesystem::path
// converts to `subject`.
[[noreturn]] void throw_os_error(std::string_view what, const std::string& subject, int err);

[[noreturn]] void assert_fail(const char* expr, const char* file, int line) noexcept;

}  // namespace deltacast

// Checks an internal invariant; on failure prints and aborts. Never used for bad input.
#define DC_ASSERT(expr) ((expr) ? (void)0 : ::deltacast::assert_fail(#expr, __FILE__, __LINE__))
