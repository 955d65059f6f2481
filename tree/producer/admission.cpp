// Who may hold which version, and how a member gets into the live set (docs/protocol.md, "Rejoin"):
// the initial placement at start(), HELLO after start (a restarted or fenced member), a root's
// JOIN, CATCHUP plans, READY, and admission at a version boundary. The producer keeps the
// committed versions' digests (history) to check what a member says it holds.
#include <algorithm>
#include <cstdio>

#include "tree/producer/impl.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
// How many times a version waits for one member that chases the producer (hold_for_chasers).
constexpr int kMaxAdmissionHolds = 3;

}  // namespace

void Producer::Impl::remember_version(uint64_t v, uint64_t digest) {
  history[v] = digest;
  while (history.size() > options.retain_versions + 1) history.erase(history.begin());
}

uint64_t Producer::Impl::committed_digest() const {
  const auto known = history.find(version);
  return known != history.end() ? known->second : zero_digest;
}

std::pair<Errc, std::string> Producer::Impl::refusal_for(uint64_t held_version, uint64_t held_digest) const {
  if (held_version > version)
    return {Errc::version_mismatch,
            "holds version " + std::to_string(held_version) + ", newer than the producer's committed version " +
                std::to_string(version) +
                (version == 0 ? " (a fresh producer; continue the chain with `deltacast run --resume`)"
                              : " (the producer's state is older than what this member committed)")};
  // Version 0 is the all-zero state by definition; a version the producer no longer remembers is
  // reached by a snapshot from a live peer, whatever it held.
  const auto known = history.find(held_version);
  if (held_version == 0 || known == history.end() || known->second == held_digest) return {Errc::ok, ""};
  char text[160];
  std::snprintf(text, sizeof text,
                "holds version %llu with digest %016llx; the producer's digest of that version is %016llx",
                static_cast<unsigned long long>(held_version), static_cast<unsigned long long>(held_digest),
                static_cast<unsigned long long>(known->second));
  return {Errc::verify_failed, std::string(text) + "; nothing was written"};
}

// Members holding the committed version are live at epoch 0; the others leave the live set at
// once (epoch 1; the WELCOME carries the result, so nobody needs an EPOCH for it) and catch up
// from live peers, as a rejoin does.
StartReport Producer::Impl::place_members_at_start() {
  const uint32_t n = options.receivers;
  StartReport report;
  report.version = version;
  for (uint32_t r = 1; r <= n; ++r) {
    const StartHello& said = start_hellos[r];
    MemberAtStart m{r, said.held_version, MemberAtStart::Role::live, {}};
    if (said.refused) {
      m.role = MemberAtStart::Role::refused;
      m.detail = said.why;
    } else if (said.held_version != version) {  // held digests were checked at HELLO
      m.role = MemberAtStart::Role::catching_up;
    }
    report.members.push_back(std::move(m));
  }
  // Nobody holds the committed version (a producer resumed from a state written just before a
  // COMMIT that never went out): the members catch up by a snapshot of the producer's baseline
  // (its last resort as a source) and start() waits for the first of them. Only when nobody can
  // even do that does the start fail.
  if (report.count(MemberAtStart::Role::live) == 0 &&
      (version == 0 || report.count(MemberAtStart::Role::catching_up) == 0)) {
    std::string held;
    for (const auto& m : report.members) {
      held += held.empty() ? "" : ", ";
      held += "rank " + std::to_string(m.rank) +
              (m.role == MemberAtStart::Role::refused ? " was refused (" + m.detail + ")"
                                                      : " holds version " + std::to_string(m.held_version));
    }
    const std::string why = "no receiver holds the producer's committed version " + std::to_string(version) +
                            " or can catch up to it (" + held + ")";
    for (uint32_t r = 1; r <= n; ++r) {
      if (!control[r].connection) continue;
      try {
        send_control(*control[r].connection, Refused{static_cast<uint32_t>(Errc::state), why}, kMemberSendTimeout, 0);
      } catch (const Error&) {
      }
      close_control(r);
    }
    throw Error(Errc::state, why);
  }
  std::vector<std::string> labels;
  for (uint32_t r = 1; r <= n; ++r) labels.push_back(members[r].cluster);
  membership.emplace(options.topology, std::move(labels), options.cluster, group ? static_cast<int>(group->size) : 1);
  std::vector<uint32_t> out;
  for (const auto& m : report.members) {
    members[m.rank].live = m.role == MemberAtStart::Role::live;
    if (m.role != MemberAtStart::Role::live) out.push_back(m.rank);
    // Every attempt id from here on is above every one a member saw end (its floor drops older data).
    if (m.role != MemberAtStart::Role::refused) attempt = std::max(attempt, start_hellos[m.rank].attempt_floor);
  }
  if (!out.empty()) membership->remove(out);
  return report;
}

std::string Producer::Impl::record_slices(uint32_t rank, const std::vector<HeldSlice>& slices) {
  try {
    fleet_slices.state(rank, slices);
  } catch (const Error& e) {
    return std::string("placement: ") + e.what();
  }
  return {};
}

void Producer::Impl::handle_placed(uint32_t rank, const Placed& placed, Clock::time_point at) {
  const std::string why = record_slices(rank, placed.slices);
  if (why.empty()) {
    log->info("producer: rank {} holds {} slices (a placement); the next version is cut for them", rank,
              placed.slices.size());
    return;
  }
  log->warn("producer: refused rank {}'s PLACED: {}", rank, why);
  if (membership && membership->live(rank))
    fail(rank, FailureCause::refused, why, at);
  else
    close_control(rank);
}

// A HELLO after start: a restarted member (same rank), a member that was fenced and kept its
// memory, or a member that lost and found the producer again. The digest it holds is checked
// against the producer's record of that version before anything else happens.
void Producer::Impl::handle_hello(ProducerEvent& event) {
  const Hello& h = event.hello;
  auto refuse = [&](Errc code, const std::string& why) {
    log->warn("producer: refused HELLO from rank {}: {}", h.rank, why);
    try {
      send_control(*event.connection, Refused{static_cast<uint32_t>(code), why}, kMemberSendTimeout, epoch());
    } catch (const Error&) {
    }
    event.connection->close();
  };
  if (part_rank())
    return refuse(Errc::invalid_argument, "this is producer rank " + std::to_string(group->rank) +
                                              " of a group: members say HELLO to rank 0, the coordinator");
  if (h.rank < 1 || h.rank >= control.size())
    return refuse(Errc::invalid_argument,
                  "rank " + std::to_string(h.rank) + " is not in 1.." + std::to_string(control.size() - 1));
  if (replaced[h.rank].count(h.instance))
    return refuse(Errc::state, "this instance of rank " + std::to_string(h.rank) + " was replaced by a newer one");
  // A placed member's slices (docs/placement.md): checked against the manifest before anything
  // else; the next version is cut for them. Refused at start, it counts as answered.
  auto& link = control[h.rank];
  if (const std::string why = record_slices(h.rank, h.slices); !why.empty()) {
    if (!membership && !link.connection) {
      members[h.rank] = Member{h.rank, h.data_url, h.cluster, false};
      start_hellos[h.rank] = StartHello{h.held_version, h.held_digest, h.attempt_floor, true, why};
    }
    return refuse(Errc::invalid_argument, "rank " + std::to_string(h.rank) + " " + why);
  }
  if (!membership) {  // start: every rank once
    if (link.connection) return refuse(Errc::invalid_argument, "rank " + std::to_string(h.rank) + " said HELLO twice");
    // What it holds decides its place once every rank said HELLO (place_members_at_start); what
    // this producer cannot take at all is refused now, and does not hold up the start.
    auto& said = start_hellos[h.rank];
    said = StartHello{h.held_version, h.held_digest, h.attempt_floor, false, {}};
    if (auto [code, why] = refusal_for(h.held_version, h.held_digest); !why.empty()) {
      members[h.rank] = Member{h.rank, h.data_url, h.cluster, false};  // its cluster, for the tree's shape
      said.refused = true;
      said.why = why;
      return refuse(code, "rank " + std::to_string(h.rank) + " " + why);
    }
    link = ControlLink{event.connection, next_generation++, h.instance, false, false, 0, std::nullopt, nullptr};
    members[h.rank] = Member{h.rank, h.data_url, h.cluster, true};
    readers->add(h.rank, link.generation, event.connection);
    return;
  }
  if (link.connection && link.instance == h.instance)
    return refuse(Errc::state, "rank " + std::to_string(h.rank) + " said HELLO twice on two links");
  if (membership->live(h.rank)) {
    replaced[h.rank].insert(link.instance);
    fail(h.rank, FailureCause::replaced, "a new instance said HELLO", event.at);
  } else if (link.connection) {
    close_control(h.rank);  // an earlier attempt to catch up
  }
  // Attempt ids stay above every attempt any member saw end (a member may have outlived an
  // earlier producer).
  attempt = std::max(attempt, h.attempt_floor);
  if (h.held_version > version)
    return refuse(Errc::version_mismatch, "rank " + std::to_string(h.rank) + " holds version " +
                                              std::to_string(h.held_version) + ", newer than the producer's " +
                                              std::to_string(version));
  // Version 0 is the all-zero state by definition; any other version must carry its digest.
  const auto known = history.find(h.held_version);
  const uint64_t want = known != history.end() ? known->second : 0;
  if (h.held_version > 0 && known != history.end() && h.held_digest != want) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "holds version %llu with digest %016llx; the producer's digest of that version is %016llx",
                  static_cast<unsigned long long>(h.held_version), static_cast<unsigned long long>(h.held_digest),
                  static_cast<unsigned long long>(want));
    return refuse(Errc::verify_failed, "rank " + std::to_string(h.rank) + " " + text + "; nothing was written");
  }
  members[h.rank] = Member{h.rank, h.data_url, h.cluster, false};
  link = ControlLink{event.connection, next_generation++, h.instance, true, false, 0, std::nullopt, nullptr};
  readers->add(h.rank, link.generation, event.connection);

  log->info("producer: rank {} rejoins holding version {}; the committed version is {}", h.rank, h.held_version,
            version);
  Welcome w = make_welcome();
  w.instance = h.instance;
  link.told_layout = layout;
  if (!send_to(h.rank, w) || !send_catchup(h.rank, h.held_version)) close_control(h.rank);
}

Welcome Producer::Impl::make_welcome() const {
  Welcome w;
  w.session = static_cast<uint64_t>(session_start.time_since_epoch().count());
  w.topology = std::string(topology_kind_name(membership->kind()));
  w.max_message_bytes = max_message_bytes;
  w.members = members;
  for (auto& m : w.members) m.live = m.rank != 0 && membership->live(m.rank);
  w.members[0].live = true;
  w.forest = membership->forest();
  w.tensors = manifest.tensors();
  w.committed_version = version;
  w.committed_digest = committed_digest();
  w.layout = *layout;
  if (group) w.producer_urls = producer_urls();
  return w;
}

std::vector<std::string> Producer::Impl::producer_urls() const {
  std::vector<std::string> urls{members[0].url};
  for (uint32_t r = 1; r < group->size; ++r) urls.push_back(group->data_urls[r]);
  return urls;
}

void Producer::Impl::handle_root_join(ProducerEvent& event) {
  const int tree = static_cast<int>(event.join.tree);
  const uint32_t rank = event.join.rank;
  const bool valid = membership && tree >= 0 && tree < membership->trees() && feeds(tree) && membership->live(rank) &&
                     membership->root(tree) == rank;
  if (!valid) {
    log->warn("producer: refused a JOIN from rank {} for tree {}: not its root at epoch {}", rank, tree, epoch());
    try {
      send_control(*event.connection,
                   Refused{static_cast<uint32_t>(Errc::state), "not the root of tree " + std::to_string(tree)},
                   kMemberSendTimeout, epoch());
    } catch (const Error&) {
    }
    event.connection->close();
    return;
  }
  if (roots[tree]) roots[tree]->cancel_all();
  roots[tree] = std::make_shared<OutboundLink>(std::make_unique<SharedConnection>(event.connection), rank, tree);
  // What the new root lacks of what went out already goes again (the producer keeps no copies:
  // it encodes again); what was not sent yet follows in order.
  if (in_flight) {
    const bool same = event.resume.attempt == in_flight->attempt;
    for (uint32_t key = 0; key < in_flight->keys; ++key) {
      if (!in_flight->sent[key] || in_flight->tree_of(key) != tree) continue;
      if (same && key < event.resume.have.size() && event.resume.have[key]) continue;
      in_flight->resends.emplace_back(key, 0);
    }
  }
}

bool Producer::Impl::send_catchup(uint32_t rank, uint64_t held) {
  Catchup plan{version, history.count(version) ? history.at(version) : 0, CatchupMode::none, {}};
  // Replay needs every version after `held` retained by peers (deltas only: version 1 is raw);
  // when a replay did not get the member there, the next plan is a snapshot.
  auto& link = control[rank];
  const bool replayable = held > 0 && history.count(held) && link.last_catchup_from != held;
  if (held < version) plan.mode = replayable ? CatchupMode::replay : CatchupMode::snapshot;
  link.last_catchup_from = held;
  link.plan_target = version;
  // Sources: live members of its own cluster first, then the others, and the producer last (its
  // uplink only when no peer could serve: a snapshot of its baseline).
  const std::string& cluster = members[rank].cluster;
  for (int pass = 0; pass < 2; ++pass)
    for (uint32_t r : live_ranks())
      if ((membership->cluster(r) == cluster) == (pass == 0)) plan.sources.push_back(members[r]);
  if (plan.mode == CatchupMode::snapshot) plan.sources.push_back(members[0]);
  log->info("producer: rank {} catches up from version {} to {} by {}", rank, held, version,
            plan.mode == CatchupMode::none     ? "nothing"
            : plan.mode == CatchupMode::replay ? "replay"
                                               : "snapshot");
  return send_to(rank, plan);
}

bool Producer::Impl::tell_committed_layout(uint32_t rank) {
  auto& link = control[rank];
  if (link.told_layout == layout) return true;
  if (!send_to(rank, LayoutUpdate{version, 0, *layout})) return false;
  link.told_layout = layout;
  return true;
}

void Producer::Impl::handle_ready(uint32_t rank, const Ready& ready, uint64_t epoch) {
  auto& link = control[rank];
  if (link.catching_up) {
    const auto known = history.find(ready.version);
    const bool current =
        ready.version == version &&
        (ready.version == 0 ? ready.digest == zero_digest : known != history.end() && known->second == ready.digest);
    if (current) {
      // Versions that changed the layout may have committed since this member's WELCOME, and a
      // snapshot source serves what it holds, newer than any plan said: the layout of the version
      // the member reached goes now, ahead of the EPOCH that admits it (on the same ordered link).
      if (!tell_committed_layout(rank)) return close_control(rank);
      link.caught_up = true;
      link.caught_up_version = ready.version;
      log->info("producer: rank {} caught up to version {}; it joins at the next version", rank, version);
    } else if (ready.version > version) {
      log->info(
          "producer: rank {} says READY at version {}, which the producer has not decided yet (it is at "
          "{}): answered once it has",
          rank, ready.version, version);
      link.ahead = ready;
    } else {
      // It got where its plan said, but a newer version committed meanwhile.
      if (ready.version == link.plan_target && known != history.end() && known->second == ready.digest)
        link.chasing = true;
      log->info("producer: rank {} says READY at version {}; the producer is at {}: catching up again", rank,
                ready.version, version);
      if (!send_catchup(rank, ready.version)) close_control(rank);
    }
    return;
  }
  const auto now = Clock::now();
  for (auto it = repairs.begin(); it != repairs.end();) {
    if (epoch >= it->epoch) it->waiting.erase(rank);
    if (it->waiting.empty()) {
      const double seconds = std::chrono::duration<double>(now - it->detected).count();
      if (in_flight && in_flight->report)
        in_flight->report->repair_seconds += seconds;
      else
        repair_seconds += seconds;
      it = repairs.erase(it);
    } else {
      ++it;
    }
  }
}

// Members that caught up join the live set at a version boundary (here, before a version starts):
// each becomes a leaf in every tree, and the EPOCH that says so is their signal to connect.
void Producer::Impl::admit_caught_up() {
  for (uint32_t r = 1; r < control.size(); ++r) {
    auto& link = control[r];
    if (link.catching_up && link.ahead) {  // the version it is at is decided now (or it is still ahead)
      const Ready ready = *std::exchange(link.ahead, std::nullopt);
      handle_ready(r, ready, 0);
    }
    if (!link.catching_up || !link.caught_up) continue;
    if (link.caught_up_version != version) {  // a version committed meanwhile
      link.caught_up = false;
      link.chasing = true;
      if (!send_catchup(r, link.caught_up_version)) close_control(r);
      continue;
    }
    link.catching_up = link.caught_up = false;
    members[r].live = true;
    auto moves = membership->add(r);
    EpochUpdate update;
    update.joined.push_back(members[r]);
    log->info("producer: rank {} is back in the tree at epoch {}", r, epoch());
    announce(update, std::move(moves), Clock::now());
  }
}

std::chrono::milliseconds Producer::Impl::admission_hold() const {
  const auto twice = std::chrono::milliseconds(static_cast<int64_t>(2e3 * last_version_seconds));
  return std::min<std::chrono::milliseconds>(std::max<std::chrono::milliseconds>(twice, 1s), options.peer_timeout);
}

void Producer::Impl::hold_for_chasers() {
  std::vector<uint32_t> held;
  for (uint32_t r = 1; r < control.size(); ++r) {
    auto& link = control[r];
    if (link.connection && link.catching_up && link.chasing && link.holds < kMaxAdmissionHolds) {
      ++link.holds;
      held.push_back(r);
    }
  }
  if (held.empty()) return;
  const auto behind = [&] {
    std::erase_if(held, [this](uint32_t r) {
      const auto& link = control[r];
      return !link.connection || !link.catching_up || (link.caught_up && link.caught_up_version == version);
    });
    return !held.empty();
  };
  const auto bound = admission_hold();
  const auto started = Clock::now();
  const auto deadline = started + bound;
  while (behind() && Clock::now() < deadline) pump(10ms);
  for (const uint32_t r : held)
    log->info(
        "producer: rank {} is still catching up to version {} after a hold of {} ms; version {} starts without it", r,
        version, bound.count(), version + 1);
  log->debug("producer: held version {} for {:.1f} ms for members catching up", version + 1,
             1e3 * seconds_since(started));
  admit_caught_up();
}

}  // namespace deltacast::tree
