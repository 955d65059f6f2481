// One version attempt on the wire: posting its data to each tree's root with flow control,
// re-sending what a lost root dropped, and driving the attempt's VersionRound (the joint commit)
// to its end while events are handled.
#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tree/producer/impl.h"

namespace deltacast::tree {

using namespace std::chrono_literals;

void Producer::Impl::settle_roots() noexcept {
  for (auto& root : roots) {
    if (!root) continue;
    if (!root->flush(kRootSettleTimeout)) root->cancel_all(true);
  }
}

void Producer::Impl::flush_resends() {
  if (!in_flight) return;
  auto& f = *in_flight;
  for (size_t n = f.resends.size(); n > 0; --n) {
    auto [key, route] = f.resends.front();
    f.resends.pop_front();
    const int tree = f.tree_of(key);
    auto& root = roots[tree];
    if (!root || root->dead() || root->inflight_bytes() > options.max_inflight_bytes_per_root) {
      f.resends.emplace_back(key, route);  // later, once the tree has a root with room
      continue;
    }
    const Outgoing out = f.make(key, route);
    if (out.body.empty())
      root->post(out.message);
    else
      root->post_pair(out.message, out.body);
    if (f.report) ++f.report->resent_chunks;
    log->debug("producer: re-sent chunk {} of version {} (route {})", key, f.version, route);
  }
}

void Producer::Impl::deliver(int tree, const Outgoing& out) {
  for (;;) {
    pump(0ms);
    flush_resends();
    if (live_ranks().empty()) throw Error(Errc::state, "every receiver failed");
    auto& root = roots[tree];
    if (!root) {
      // The new root connects as soon as it reads the EPOCH; one that does not within a few
      // peer timeouts is failed too (the next repair names another). A group's part rank leaves
      // that to the coordinator, which watches the members: it waits for the next EPOCH.
      if (part_rank()) {
        if (!group->coordinator_lost.empty())
          throw Error(Errc::connection, "the coordinator was lost: " + group->coordinator_lost);
      } else if (Clock::now() - root_lost[tree] > 3 * options.peer_timeout) {
        if (auto r = membership->root(tree)) {
          fail(*r, FailureCause::unreachable, "did not join as the root of tree " + std::to_string(tree), Clock::now());
          root_lost[tree] = Clock::now();
        }
      }
      pump(50ms);
      continue;
    }
    if (root->dead()) {
      if (part_rank()) {
        // The root reports its lost parent link to the coordinator, which repairs the tree; the
        // root (or its replacement) JOINs again and RESUMEs.
        root->cancel_all(true);
        root.reset();
        root_lost[tree] = Clock::now();
        continue;
      }
      // The data link failed while its control link may still look fine: the edge is lost.
      fail(root->peer_rank(), FailureCause::link_closed, "its data link from the producer failed", Clock::now());
      continue;
    }
    if (!root->wait_below(options.max_inflight_bytes_per_root, 20ms)) {
      if (!part_rank() && root->stalled_for() > options.peer_timeout && !stall_accusations.count(root->peer_rank()))
        stall_accusations.emplace(root->peer_rank(), Clock::now());
      continue;
    }
    if (out.body.empty())
      root->post(out.message);
    else
      root->post_pair(out.message, out.body);
    return;
  }
}

// Runs one version attempt: admits members that caught up, sends everything, then the joint
// commit. `flight` carries how to (re)make each data message.
RefitReport Producer::Impl::run_version(InFlight flight, const std::function<void(InFlight&)>& send_all,
                                        const std::function<uint64_t()>& expected_digest, bool dry_run,
                                        const std::function<void()>& on_commit) {
  pump(0ms);
  admit_caught_up();
  hold_for_chasers();
  RefitReport report;
  report.version = flight.version;
  report.failed_members = std::move(failures);
  failures.clear();
  report.repair_seconds = repair_seconds;
  repair_seconds = 0;
  flight.attempt = ++attempt;
  flight.start = Clock::now();
  flight.sent.assign(flight.keys, false);
  VersionRound::Params round;
  round.version = flight.version;
  round.attempt = flight.attempt;
  round.committed_version = version;
  round.ranks = live_ranks();
  round.delegate_commit = options.delegate_commit;
  round.dry_run = dry_run;
  round.deadline = flight.start + options.version_timeout;
  round.delegate_grace = std::max(options.peer_timeout, std::chrono::milliseconds(1000));
  flight.round.emplace(std::move(round));
  flight.report = &report;
  in_flight = std::move(flight);
  // A new layout becomes the committed one with the version (an abort keeps the old one).
  const auto commit_version = [this, layout = in_flight->layout, &on_commit] {
    if (on_commit) on_commit();
    if (layout) this->layout = layout;
  };
  try {
    if (in_flight->round->members().empty()) throw Error(Errc::state, "no live receivers");
    if (in_flight->layout) {
      // Before any data of the attempt, on the control link of every member in it. Members admitted
      // later hear of it with their WELCOME or CATCHUP, once it committed.
      broadcast(LayoutUpdate{in_flight->version, in_flight->attempt, *in_flight->layout});
      for (uint32_t rank : in_flight->round->members()) control[rank].told_layout = in_flight->layout;
      log->info("version {}: the checkpoint layout changes ({} shards, {} files)", in_flight->version,
                in_flight->layout->shards.size(), in_flight->layout->files.size());
    }
    send_all(*in_flight);
    joint_commit(report, expected_digest(), commit_version);
  } catch (...) {
    // Nothing can commit now: receivers roll back what they applied of this attempt. Unless a
    // decision is out, or a delegate may have committed it: an ABORT then could cross a COMMIT.
    if (auto abort = in_flight->round->stop("the producer stopped this version"); abort && membership)
      broadcast(*abort);
    in_flight.reset();
    throw;
  }
  report.epoch = epoch();
  last_version_seconds = seconds_since(in_flight->start);
  const auto slow = report.committed ? slow_relays(*in_flight) : std::vector<SlowRelay>{};
  in_flight.reset();
  // Between versions: the next one starts on the repaired forest (the failure is in its report).
  for (const auto& relay : slow) fail(relay.rank, FailureCause::stalled, relay.why, Clock::now());
  return report;
}

void Producer::Impl::execute(const VersionRound::Actions& actions) {
  if (!in_flight) return;
  auto& f = *in_flight;
  if (f.round->committed() && !f.remembered) {
    remember_version(f.version, f.round->record_digest());
    f.remembered = true;
  }
  for (const auto& action : actions) {
    if (const auto* b = std::get_if<VersionRound::Broadcast>(&action)) {
      broadcast(b->message);
    } else if (const auto* s = std::get_if<VersionRound::SendTo>(&action)) {
      if (!send_to(s->rank, s->message))
        fail(s->rank, FailureCause::link_closed,
             std::holds_alternative<Commit>(s->message) ? "COMMIT could not be sent" : "a message could not be sent",
             Clock::now());
    } else if (const auto* m = std::get_if<VersionRound::FailMember>(&action)) {
      fail(m->rank, m->cause, m->detail, Clock::now());
    } else if (const auto* r = std::get_if<VersionRound::RecordCommit>(&action)) {
      // The host records the version as committed before any member can hold it (a producer
      // state file): a producer lost after this point is resumed at this version.
      if (options.before_commit) options.before_commit(r->version, r->digest);
    } else if (const auto* w = std::get_if<VersionRound::Warn>(&action)) {
      log->warn("producer: {}", w->text);
    }
  }
  if (f.report) f.report->commit_delegate = f.round->commit_delegate();
}

void Producer::Impl::fail_laggards(InFlight& f) {
  if (!membership || !f.round) return;
  const auto now = Clock::now();
  if (epoch() != f.epoch_seen) {  // a repair: moved members need time to get what they lack
    f.epoch_seen = epoch();
    f.epoch_changed_at = now;
  }
  const std::vector<uint32_t> attempt_members = f.round->members();
  for (uint32_t rank : attempt_members)
    if (f.round->answer(rank) == VersionRound::Answer::verified) f.verified_at.try_emplace(rank, now);
  const auto patience = options.peer_timeout + std::min<std::chrono::milliseconds>(1000ms, options.peer_timeout / 2);
  if (now - std::max(f.sealed_at, f.epoch_changed_at) <= patience) return;  // nobody can be late yet
  std::vector<uint32_t> late;
  for (uint32_t rank : attempt_members) {
    if (f.round->answer(rank) != VersionRound::Answer::none || !membership->live(rank)) continue;
    Clock::time_point fed = std::max(f.sealed_at, f.epoch_changed_at);
    bool parents_have_it = true;
    for (int t = 0; t < membership->trees() && parents_have_it; ++t) {
      const auto parent = membership->parent(rank, t);
      if (!parent) {
        parents_have_it = false;
      } else if (*parent == kProducerRank) {
        // A root has everything once the producer's sends to it finished, not once they were
        // posted: up to max_inflight_bytes_per_root may still be queued at sealing (64 MiB is
        // 5.4 s at 100 Mbit/s), and counting from the posting failed healthy roots of a
        // bootstrap on shaped links (bench/recovery/netfault.py, docs/reliability.md). A root
        // that drains nothing for timeouts.peer is counted from the sealing, as before.
        const auto link = static_cast<size_t>(t) < roots.size() ? roots[static_cast<size_t>(t)] : nullptr;
        const bool draining = link && !link->dead() && link->inflight_bytes() > 0;
        if (draining && link->stalled_for() <= options.peer_timeout) {
          f.root_drained_at.erase({t, rank});
          parents_have_it = false;
        } else if (!draining) {
          fed = std::max(fed, f.root_drained_at.try_emplace({t, rank}, now).first->second);
        }
      } else {
        const auto it = f.verified_at.find(*parent);
        if (it == f.verified_at.end())
          parents_have_it = false;
        else
          fed = std::max({fed, it->second, forwarded_by(f, rank, *parent, t)});
      }
    }
    if (parents_have_it && now - fed > patience) late.push_back(rank);
  }
  const std::string waited =
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(patience).count()) + " ms";
  // A slow relay rather than its children (a straggler: its sends queue behind a slow egress,
  // nothing is lost, so no REPORT comes): when a parent that has the version has two or more
  // children in a tree and every one of them is late, the parent is failed in their place. Its
  // children move and it rejoins as a leaf (Membership::add), where its egress holds nobody back.
  // Failing the children instead only moved the next members under it, failed in turn version
  // after version until one member was left (bench/recovery/netfault.py, docs/reliability.md).
  const std::set<uint32_t> late_set(late.begin(), late.end());
  std::set<uint32_t> slow_parents;
  const auto fleet = fleet_pace(verified_after_sealing(f));
  for (uint32_t rank : late)
    for (int t = 0; t < membership->trees(); ++t) {
      const auto parent = membership->parent(rank, t);
      if (!parent || *parent == kProducerRank || !membership->live(*parent)) continue;
      const auto& kids = membership->children(*parent, t);
      // A sibling that did verify counts with the late ones when it took over late_after(the
      // parent's own receive time) to receive the version: the parent's egress served it first and
      // the late one after (ucx sent one child's share before the other's, and the child still
      // waiting was failed in its slow parent's place, recovery_netns_straggler_ucx).
      const auto parent_receive = f.receive_ms.find(*parent);
      const auto held_back = [&](uint32_t c) {
        if (late_set.count(c)) return true;
        if (parent_receive == f.receive_ms.end()) return false;
        const auto it = f.receive_ms.find(c);
        return it != f.receive_ms.end() && it->second > late_after(parent_receive->second);
      };
      if (kids.size() >= 2 && std::all_of(kids.begin(), kids.end(), held_back)) slow_parents.insert(*parent);
      // Or the parent verified late itself, against the fleet's pace (slow_relays' test): its own
      // ACK queued behind what it forwards. One child that got its data first is not late then.
      if (fleet && f.verified_at.count(*parent) &&
          std::chrono::duration<double, std::milli>(f.verified_at.at(*parent) - f.sealed_at).count() > fleet->late)
        slow_parents.insert(*parent);
    }
  // Decided before anyone is failed: a failure moves children, and these are the ones to spare.
  std::set<uint32_t> spared(slow_parents);
  for (uint32_t parent : slow_parents)
    for (int t = 0; t < membership->trees(); ++t)
      for (uint32_t child : membership->children(parent, t)) spared.insert(child);
  for (uint32_t parent : slow_parents)
    fail(parent, FailureCause::stalled,
         "none of its children had verified version " + std::to_string(f.version) + " " + waited +
             " after it had it (a relay whose sends do not drain: a straggler); it rejoins as a leaf",
         now);
  for (uint32_t rank : late) {
    if (spared.count(rank) || !membership->live(rank)) continue;
    fail(rank, FailureCause::stalled,
         "had not verified version " + std::to_string(f.version) + " " + waited +
             " after its parents had it (a relay that stopped forwarding, or a straggler)",
         now);
  }
}

Clock::time_point Producer::Impl::forwarded_by(const InFlight& f, uint32_t rank, uint32_t parent, int tree) const {
  const auto root = membership->root(tree);
  if (!root || !f.verified_at.count(*root)) return f.start;
  // A parent forwards as it receives (cut-through), the bytes of each of its k children through
  // one egress: with links like the root's, its children have the version about k times the
  // root's own time after the start. A bootstrap of 57 MiB through a root with two children on
  // 100 Mbit/s links reaches them 4.8 s after the root has it, past the fixed patience
  // (netfault_test.py bootstrap).
  const auto& kids = membership->children(parent, tree);
  Clock::time_point by = f.start + std::chrono::duration_cast<Clock::duration>((f.verified_at.at(*root) - f.start) *
                                                                               static_cast<double>(kids.size()));
  // A sibling that has it shows how long the parent's egress took: a time taken by the CPU of a
  // loaded machine rather than by bandwidth is not multiplied (the CI run of 2026-12-07 failed a
  // stalled relay 5.3 s after its stall, past timeouts.peer + grace, because the root's 0.9 s
  // was counted three times over).
  std::optional<Clock::time_point> sibling;
  for (uint32_t kid : kids)
    if (const auto it = f.verified_at.find(kid); kid != rank && it != f.verified_at.end())
      sibling = std::max(sibling.value_or(it->second), it->second);
  return sibling ? std::min(by, *sibling) : by;
}

std::map<uint32_t, double> Producer::Impl::verified_after_sealing(const InFlight& f) {
  std::map<uint32_t, double> after;
  for (const auto& [rank, at] : f.verified_at)
    after[rank] = std::max(0.0, std::chrono::duration<double, std::milli>(at - f.sealed_at).count());
  return after;
}

std::vector<SlowRelay> Producer::Impl::slow_relays(const InFlight& f) {
  if (!membership) return {};
  return find_slow_relays(*membership, verified_after_sealing(f), f.receive_ms, f.version, slow_history);
}

void Producer::Impl::joint_commit(RefitReport& report, uint64_t expected_digest,
                                  const std::function<void()>& on_commit) {
  auto& f = *in_flight;
  VersionRound& round = *f.round;
  f.sealed_at = f.epoch_changed_at = Clock::now();
  f.epoch_seen = epoch();
  execute(round.sealed(expected_digest, membership->root(0), Clock::now(), f.state_digest));
  if (round.phase() == VersionRound::Phase::delegated)
    log->debug("version {}: rank {} decides the commit", f.version, round.commit_delegate());
  bool decided = false;
  while (!round.done()) {
    const bool deciding = round.phase() == VersionRound::Phase::deciding;
    if (deciding && !decided) {
      decided = true;
      log->debug("version {}: every answer in at {:.1f} ms", f.version, 1e3 * seconds_since(f.start));
    }
    pump(20ms);
    if (!deciding) flush_resends();
    // Laggards are failed until a decision is out: while the producer collects the answers and
    // while a commit delegate decides (its view waits for the same members, and an EPOCH takes a
    // failed one out of it, as after a silence verdict). Not only before DELEGATE: with
    // `commit: delegated` a relay that stopped forwarding held the version to timeouts.refit.
    const auto phase = round.phase();
    if (in_flight && (phase == VersionRound::Phase::collecting || phase == VersionRound::Phase::delegated))
      fail_laggards(*in_flight);
    execute(round.tick(Clock::now()));
  }
  report.receivers = round.receivers();
  report.verified_receivers = round.verified_receivers();
  report.committed = round.committed();
  report.abort_reason = round.abort_reason();
  report.commit_delegate = round.commit_delegate();
  // Once COMMIT is out the version is committed: on_commit runs even when waiting fails.
  if (round.timed_out()) {
    if (report.committed && on_commit) on_commit();
    throw Error(Errc::timeout, "receivers did not confirm version " + std::to_string(round.want_active()));
  }
  report.refit_seconds = seconds_since(f.start);
  if (report.committed && on_commit) on_commit();
}

}  // namespace deltacast::tree
