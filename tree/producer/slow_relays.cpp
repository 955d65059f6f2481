#include "tree/producer/slow_relays.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "tree/protocol.h"
#include "util/log.h"

namespace deltacast::tree {

double late_after(double reference_ms, const SlowRelayRules& rules) {
  return std::max(rules.factor * reference_ms, reference_ms + rules.floor_ms);
}

std::optional<Pace> fleet_pace(const std::map<uint32_t, double>& after_ms, const SlowRelayRules& rules) {
  if (after_ms.size() < 4) return std::nullopt;
  std::vector<double> all;
  all.reserve(after_ms.size());
  for (const auto& [rank, ms] : after_ms) all.push_back(std::max(0.0, ms));
  std::sort(all.begin(), all.end());
  const double quick = all[all.size() / 4];  // the first quartile: the fleet's pace
  return Pace{quick, late_after(quick, rules)};
}

std::vector<SlowRelay> find_slow_relays(const Membership& membership, const std::map<uint32_t, double>& after_ms,
                                        const std::map<uint32_t, double>& receive_ms, uint64_t version,
                                        std::map<uint32_t, uint32_t>& history, const SlowRelayRules& rules) {
  std::vector<SlowRelay> out;
  const auto fleet = fleet_pace(after_ms, rules);
  if (!fleet) return out;
  const auto later_than = [&](uint32_t rank, double bar) {
    const auto it = after_ms.find(rank);
    return it == after_ms.end() || it->second > bar;  // not verified at all: later still
  };
  const auto slower_than = [&](uint32_t rank, double bar) {
    if (!after_ms.count(rank)) return true;  // not verified at all
    const auto it = receive_ms.find(rank);
    return it != receive_ms.end() && it->second > bar;
  };
  const uint32_t window = (1u << rules.window) - 1;
  std::map<uint32_t, uint32_t> windows;
  for (const auto& [relay, bits] : history)
    if (membership.live(relay) && ((bits << 1) & window)) windows[relay] = (bits << 1) & window;
  for (const auto& [relay, ms] : after_ms) {
    if (!membership.live(relay)) continue;
    const auto own = receive_ms.find(relay);
    const bool own_known = own != receive_ms.end();
    const double own_bar = own_known ? late_after(own->second, rules) : 0;
    bool against_fleet = false, against_itself = false, parent_on_time = true;
    for (int t = 0; t < membership.trees(); ++t) {
      const auto& kids = membership.children(relay, t);
      if (!kids.empty() && (kids.size() >= 2 || ms > fleet->late) &&
          std::all_of(kids.begin(), kids.end(), [&](uint32_t c) { return later_than(c, fleet->late); }))
        against_fleet = true;
      if (own_known && kids.size() >= 2 &&
          std::all_of(kids.begin(), kids.end(), [&](uint32_t c) { return slower_than(c, own_bar); }))
        against_itself = true;
      const auto parent = membership.parent(relay, t);
      if (parent && *parent != kProducerRank && later_than(*parent, fleet->late)) parent_on_time = false;
    }
    if (!(against_fleet || against_itself) || !parent_on_time) continue;  // the top of a late subtree only
    const uint32_t bits = windows[relay] |= 1u;
    const int n = std::popcount(bits);
    const double bar = against_fleet ? fleet->late : own_bar;
    logger("tree")->debug(
        "producer: version {}: rank {} is a slow relay (its children late, over {:.0f} ms {}; {} of the last {} "
        "versions)",
        version, relay, bar, against_fleet ? "after the sealing" : "to receive it", n, rules.window);
    if (n < rules.versions) continue;
    windows.erase(relay);
    char why[320];
    if (against_fleet) {
      std::snprintf(why, sizeof why,
                    "a straggler: on %d of the last %d versions every child of it in a tree verified late (over %.0f "
                    "ms after the sealing, the fleet's first quartile %.0f ms; it %.0f ms); it rejoins as a leaf",
                    n, rules.window, bar, fleet->quick, ms);
    } else {
      std::snprintf(why, sizeof why,
                    "a straggler: on %d of the last %d versions every child of it in a tree took over %.0f ms to "
                    "receive the version (it took %.0f ms): its egress holds them back; it rejoins as a leaf",
                    n, rules.window, bar, own->second);
    }
    out.push_back(SlowRelay{relay, why});
  }
  history.swap(windows);
  return out;
}

}  // namespace deltacast::tree
