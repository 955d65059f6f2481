// Failures (docs/protocol.md, "Failures"): what happens when a member dies, freezes, stalls or
// loses an edge. The producer alone decides: it fails the member or moves a child, repairs the
// forest (Membership) and tells every member the new epoch.
#include "tree/producer/impl.h"

namespace deltacast::tree {

using namespace std::chrono_literals;

// A member says one of its links failed. The producer, which has every control link, decides:
// a stalled child is failed (after a grace period, unless that child is itself waiting on a
// troubled child of its own); a failed edge moves the child away from that parent.
void Producer::Impl::handle_report(uint32_t from, const Report& report, Clock::time_point at) {
  if (!membership->live(from)) return;
  const int tree = static_cast<int>(report.tree);
  if (tree < 0 || tree >= membership->trees()) return;
  log->info("producer: rank {} reports its link to rank {} in tree {}: {} ({})", from, report.peer, tree,
            failure_cause_name(report.cause), report.detail);
  if (report.peer == kProducerRank) {
    // A root lost (or never got) its link to the producer while its control link works: it
    // joins again in a new epoch (a root's only place is under the producer).
    if (membership->root(tree) == from) edge_reports.push_back({from, report, at});
    return;
  }
  if (!membership->live(report.peer)) return;
  const bool peer_is_parent = membership->parent(from, tree) == report.peer;
  const bool peer_is_child = membership->parent(report.peer, tree) == from;
  if (!peer_is_parent && !peer_is_child) return;  // an edge that is gone already
  if (peer_is_child) child_trouble[from] = at;
  if (report.cause == FailureCause::stalled && peer_is_child) {
    stall_accusations.emplace(report.peer, at);
    return;
  }
  edge_reports.push_back({from, report, at});
}

void Producer::Impl::review_edge_reports() {
  // A closed link is usually a death the control link shows within moments; a silent one a
  // freeze the control link shows within a heartbeat interval or so of the child's timer.
  const auto closed_grace = std::min<std::chrono::milliseconds>(250ms, options.peer_timeout / 4);
  const auto silent_grace = std::clamp<std::chrono::milliseconds>(options.peer_timeout / 2, closed_grace, 2500ms);
  const auto now = Clock::now();
  for (auto it = edge_reports.begin(); it != edge_reports.end();) {
    const auto grace = it->report.cause == FailureCause::silent ? silent_grace : closed_grace;
    if (now - it->at < grace) {
      ++it;
      continue;
    }
    const EdgeReport r = *it;
    it = edge_reports.erase(it);
    const int tree = static_cast<int>(r.report.tree);
    const uint32_t peer = r.report.peer;
    if (peer == kProducerRank) {
      if (membership->live(r.from) && membership->root(tree) == r.from) {
        reparent(r.from, tree, "its link to the producer failed", r.at);
        it = edge_reports.begin();
      }
      continue;
    }
    if (!membership->live(r.from) || !membership->live(peer)) continue;  // a death settled it
    if (membership->parent(r.from, tree) == peer)
      reparent(r.from, tree, "its link to parent rank " + std::to_string(peer) + " failed", r.at);
    else if (membership->parent(peer, tree) == r.from)
      reparent(peer, tree, "its parent rank " + std::to_string(r.from) + " lost the link", r.at);
    it = edge_reports.begin();  // the epoch changed: look at the rest afresh
  }
}

void Producer::Impl::review_stalls() {
  if (!membership) return;
  const auto now = Clock::now();
  const auto grace = std::min<std::chrono::milliseconds>(1000ms, options.peer_timeout / 2);
  for (auto it = stall_accusations.begin(); it != stall_accusations.end();) {
    const uint32_t rank = it->first;
    if (now - it->second < grace) {
      ++it;
      continue;
    }
    // A member that is itself blocked by a troubled child of its own is not the culprit.
    auto trouble = child_trouble.find(rank);
    const bool excused = trouble != child_trouble.end() && now - trouble->second < 2 * options.peer_timeout + grace;
    const auto accused_at = it->second;
    it = stall_accusations.erase(it);
    if (!excused && membership->live(rank))
      fail(rank, FailureCause::stalled, "drained nothing for " + std::to_string(options.peer_timeout.count()) + " ms",
           accused_at);
  }
}

void Producer::Impl::fail(uint32_t rank, FailureCause cause, const std::string& detail, Clock::time_point at) {
  if (!membership || !membership->live(rank)) return;
  const double since_start = std::chrono::duration<double>(at - session_start).count();
  const double detection = cause == FailureCause::silent || cause == FailureCause::stalled
                               ? std::chrono::duration<double>(options.peer_timeout).count()
                               : 0.0;
  const double unix_at =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch() - (Clock::now() - at)).count();
  FailedMember failed{rank, failure_cause_name(cause), since_start, detection, unix_at};
  if (in_flight && in_flight->report)
    in_flight->report->failed_members.push_back(failed);
  else
    failures.push_back(failed);
  log->warn("producer: rank {} failed ({}: {}); repairing the tree", rank, failure_cause_name(cause), detail);
  // Fence it: a frozen instance that wakes up must learn it is out before it does anything.
  if (control[rank].connection) {
    auto bytes = encode_message(
        Fenced{cause == FailureCause::replaced, std::string(failure_cause_name(cause)) + ": " + detail}, epoch());
    auto request = control[rank].connection->post_send(bytes);
    request->wait(100ms);
  }
  close_control(rank);
  for (int t = 0; t < static_cast<int>(roots.size()); ++t) {
    if (roots[t] && roots[t]->peer_rank() == rank) {
      roots[t]->cancel_all(true);
      roots[t].reset();
      root_lost[t] = Clock::now();
    }
  }
  if (in_flight) execute(in_flight->round->member_lost(rank));
  for (auto& repair : repairs) repair.waiting.erase(rank);
  const uint32_t dead[] = {rank};
  auto moves = membership->remove(dead);
  EpochUpdate update;
  update.dead.push_back({rank, cause});
  announce(update, std::move(moves), at);
}

void Producer::Impl::reparent(uint32_t rank, int tree, const std::string& why, Clock::time_point at) {
  log->warn("producer: moving rank {} in tree {}: {}", rank, tree, why);
  auto moves = membership->reparent(rank, tree);
  announce(EpochUpdate{}, std::move(moves), at);
}

// Tells every member (and members catching up, so their copy stays current) the new epoch, and
// waits for READY from each member that moved.
void Producer::Impl::announce(const EpochUpdate& base, std::vector<TreeEdge> moves, Clock::time_point detected) {
  EpochUpdate update = base;
  update.moves = std::move(moves);
  Repair repair{detected, epoch(), {}};
  for (const auto& m : update.moves) {
    repair.waiting.insert(m.rank);
    // A new root joins the producer: the old root link goes.
    if (m.parent == kProducerRank && roots[m.tree] && roots[m.tree]->peer_rank() != m.rank) {
      roots[m.tree]->cancel_all();
      roots[m.tree].reset();
      root_lost[m.tree] = Clock::now();
    }
  }
  broadcast(update, true);
  if (!repair.waiting.empty()) repairs.push_back(std::move(repair));
}

}  // namespace deltacast::tree
