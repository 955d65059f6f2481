#pragma once
// Secure by default (docs/security.md): a member whose addresses can be reached from other
// machines must authenticate its peers. Called by tree::Producer and tree::Receiver before they
// open any socket, so the CLI, the C API and Python all get it.
#include <string>
#include <vector>

#include "transport/transport.h"

namespace deltacast::tree {

// Throws Error(config) when any of `urls` is not local (Url::is_local: numeric 127/8, ::1,
// localhost, the in-process loopback or shm) while `transport` has no shared secret, unless
// `allow_insecure`. The message says how to make a secret and names allow_insecure. `who`:
// "the producer", "rank 3". Error(invalid_argument) for a URL that does not parse.
void require_authenticated(const transport::Transport& transport, const std::vector<std::string>& urls,
                           bool allow_insecure, const std::string& who);

}  // namespace deltacast::tree
