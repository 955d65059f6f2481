#pragma once
// Straggler relays (docs/protocol.md, "Detection"): which relays the producer demotes after a
// committed version, from its members' verification times. Pure functions over a Membership; the
// producer (delivery.cpp) feeds them each committed version, tests/unit/tree/test_slow_relays.cpp
// drives them directly.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tree/membership.h"

namespace deltacast::tree {

struct SlowRelayRules {
  double factor = 4;      // late: over factor x the reference time ...
  double floor_ms = 200;  // ... and over the reference + floor_ms
  int versions = 3;       // slow on this many ...
  int window = 5;         // ... of the last `window` committed versions
};

// The time above which a member is late against a reference time (ms): max(factor x reference,
// reference + floor_ms).
double late_after(double reference_ms, const SlowRelayRules& rules = {});

// The fleet's pace in a version, from its members' verifications after the sealing (ms): the first
// quartile, and late_after() of it. nullopt with fewer than 4 members verified.
struct Pace {
  double quick = 0, late = 0;
};
std::optional<Pace> fleet_pace(const std::map<uint32_t, double>& after_ms, const SlowRelayRules& rules = {});

struct SlowRelay {
  uint32_t rank = 0;
  std::string why;
};

// After committed version `version`, whose members verified `after_ms` after the sealing (a member
// missing from it did not verify: later still) and took `receive_ms` each to receive it (ACK's
// receive_us: from its first data message to its verification, on its own clock), the relays to
// demote. A live relay is slow in a version when, in some tree, the top of a late subtree (its
// parents verified on time against the fleet's pace):
//  * its children all verified late against the fleet's pace: two or more of them (its egress: it
//    may have verified on time itself), or one when it is late too (its ingress); or
//  * two or more children all took late_after(the relay's own receive time) or more to receive
//    it: a slow egress at the top of a tree that holds most of the fleet, such as the root of a
//    single tree, whose lateness is the fleet's pace. Receive times, not verification times: a
//    relay's ACK queues behind what it forwards when its egress is slow, so its verification
//    looks as late as its children's. Through a healthy relay with k children sharing its egress
//    they take about k times its own time: the factor leaves room for that.
// One that is slow on rules.versions of the last rules.window versions is returned, with the
// reason, and forgotten. `history` holds each relay's window (bit 0: the newest version; a relay
// whose window empties is dropped); one quick version does not reset it. A version with fewer than
// 4 members verified says nothing: history is left as it was.
std::vector<SlowRelay> find_slow_relays(const Membership& membership, const std::map<uint32_t, double>& after_ms,
                                        const std::map<uint32_t, double>& receive_ms, uint64_t version,
                                        std::map<uint32_t, uint32_t>& history, const SlowRelayRules& rules = {});

}  // namespace deltacast::tree
