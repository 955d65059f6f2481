#include "tree/secure_start.h"

#include "util/error.h"

namespace deltacast::tree {

void require_authenticated(const transport::Transport& transport, const std::vector<std::string>& urls,
                           bool allow_insecure, const std::string& who) {
  if (allow_insecure || transport.capabilities().authenticated) return;
  for (const auto& text : urls) {
    if (text.empty() || transport::Url::parse(text).is_local()) continue;
    throw Error(Errc::config,
                who + " refuses to start unauthenticated on " + text +
                    ", an address other machines can reach (outside 127.0.0.0/8 and ::1): anyone who can "
                    "reach it could join as a member. Give every member the same secret file: "
                    "`head -c 32 /dev/urandom | base64 > deltacast.secret && chmod 600 deltacast.secret`, "
                    "then secret_file: deltacast.secret (or DELTACAST_SECRET_FILE); or set allow_insecure: true "
                    "to run without authentication on purpose (docs/security.md)");
  }
}

}  // namespace deltacast::tree
