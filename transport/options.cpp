// Shared pieces of the interface: secret loading and the default (unsupported) RMA write.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "transport/transport.h"

namespace deltacast::transport {

std::string load_secret(const std::string& file) {
  std::string secret;
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error(Errc::io, "cannot read secret file '" + file + "'");
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      throw Error(Errc::config, "secret file '" + file + "' is readable by group or others (mode " + mode +
                                    "); a shared secret must be private to its owner: chmod 600 '" + file + "'");
    }
    secret.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!secret.empty() && secret.back() == '\n') secret.pop_back();
    if (!secret.empty() && secret.back() == '\r') secret.pop_back();
    if (secret.empty()) throw Error(Errc::config, "secret file '" + file + "' is empty");
    return secret;
  }
  if (const char* env = std::getenv("DELTACAST_SECRET"); env != nullptr && *env != '\0') return env;
  throw Error(Errc::config, "no shared secret: set DELTACAST_SECRET or give a secret file");
}

std::shared_ptr<Request> Connection::post_write(std::span<const std::byte>, MemoryRegion*, const RemoteBuffer&) {
  throw Error(Errc::unsupported, "this transport has no RMA (post_write)");
}

}  // namespace deltacast::transport
