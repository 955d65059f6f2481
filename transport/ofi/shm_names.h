// Names for libfabric shm endpoints.
//
// The shm provider names an endpoint's shared-memory region after the process id ("PID:UID:N" in
// /dev/shm) unless it is given a source address. A process killed by a signal never unlinks its
// regions, and with pid_max 32768 a later process soon gets the same id: its fi_enable then fails
// with "Device or resource busy". deltacast gives every shm endpoint a name of its own and removes
// the regions of its own dead processes.
#pragma once

#include <string>

namespace deltacast::transport::ofi {

// A region name unique to this endpoint: "deltacast-<pid>-<random>-<counter>" (no '/', < 64 bytes).
std::string unique_shm_endpoint_name();

// Unlinks /dev/shm/deltacast-<pid>-* regions whose process no longer exists. Regions of live
// processes and every other name are left alone. Returns how many were removed; never throws.
size_t remove_stale_shm_regions(const std::string& directory = "/dev/shm");

}  // namespace deltacast::transport::ofi
