#include "util/bytes.h"

#include <string>

namespace deltacast {

void throw_truncated(const char* what, uint64_t needed, size_t at, size_t has) {
  throw Error(Errc::corrupt_frame, std::string(what) + ": truncated (needs " + std::to_string(needed) +
                                       " more bytes at offset " + std::to_string(at) + ", has " + std::to_string(has) +
                                       ")");
}

}  // namespace deltacast
