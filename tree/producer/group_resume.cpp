// A resumed coordinator whose part ranks are one version behind it (docs/producer-group.md,
// "Failure"): it was lost after deciding version v (its state file says v: before_commit) and
// before any COMMIT or GROUP_DECIDED went out. Every member rolled v back and every rank's state
// says v - 1, so nobody but the coordinator's state file holds v: the group steps back to v - 1 and
// sends v again. Where somebody did hear v (a receiver that got its COMMIT, a rank that got its
// GROUP_DECIDED), stepping back would undo a version a user may have seen: the start fails, naming
// who holds what.
#include <algorithm>

#include "tree/producer/impl.h"

namespace deltacast::tree {
void Producer::Impl::step_back_if_undecided() {
  auto& g = *group;
  const std::vector<uint32_t> behind = g.admission->at_previous();
  if (behind.empty()) return;
  const uint64_t v = version, back = previous->version;
  const std::string v_text = std::to_string(v), back_text = std::to_string(back);
  if (behind.size() + 1 != g.size) {
    std::vector<uint32_t> at_v;
    for (uint32_t r = 1; r < g.size; ++r)
      if (std::find(behind.begin(), behind.end(), r) == behind.end()) at_v.push_back(r);
    throw Error(Errc::version_mismatch,
                "producer " + rank_list(behind) + " hold" + (behind.size() == 1 ? "s" : "") + " version " + back_text +
                    ", producer " + rank_list(at_v) + " and the coordinator version " + v_text +
                    ": the coordinator was lost after some ranks heard version " + v_text +
                    " committed (rolling ranks forward is not built: start every rank from a state of the same "
                    "version)");
  }
  std::vector<uint32_t> ahead;
  for (uint32_t r = 1; r < start_hellos.size(); ++r)
    if (control[r].connection && !start_hellos[r].refused && start_hellos[r].held_version >= v) ahead.push_back(r);
  if (!ahead.empty())
    throw Error(Errc::version_mismatch,
                "every producer rank holds version " + back_text + " but receiver " + rank_list(ahead) + " hold" +
                    (ahead.size() == 1 ? "s" : "") + " version " + v_text +
                    " (its COMMIT reached them before the coordinator was lost): the group cannot step back, and "
                    "rolling ranks forward is not built");
  // Nobody holds v: the coordinator's part of v - 1, checked with the ranks' by the sum.
  auto [part, back_layout] = previous->load();
  part.manifest = &manifest;
  baseline->adopt(codec::SpanReader(part), back, std::nullopt);
  layout = std::make_shared<const CheckpointLayout>(std::move(back_layout));
  version = back;
  history.erase(history.upper_bound(back), history.end());
  g.admission->step_back(history.at(back), baseline->digest().per_tensor());
  log->warn(
      "producer group: stepped back to version {}: this coordinator's state says version {} was decided, but "
      "every producer rank holds version {} and no receiver holds {} (the coordinator was lost before its COMMIT "
      "went out); version {} is sent again",
      back, v, back, v, v);
}

}  // namespace deltacast::tree
