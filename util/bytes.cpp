#include "util/bytes.h"

#include <cstdio>
#include <string>

namespace deltacast {

void throw_truncated(const char* what, uint64_t needed, size_t at, size_t has) {
  throw Error(Errc::corrupt_frame, std::string(what) + ": truncated (needs " + std::to_string(needed) +
                                       " more bytes at offset " + std::to_string(at) + ", has " + std::to_string(has) +
                                       ")");
}

void throw_overlong(const char* what) {
  throw Error(Errc::corrupt_frame, std::string(what) + ": varint longer than 64 bits");
}

std::string hex64(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace deltacast
