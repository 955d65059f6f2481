// The coordinator's side of a producer group (docs/producer-group.md): its ranks' GROUP_HELLOs
// (admitted or refused by GroupAdmission), their links, and one version's flow around the
// unchanged VersionRound: every rank ready, GROUP_BEGIN, each rank's part sent down its own trees,
// the seal built from the parts' digests, the joint commit, GROUP_DECIDED. A rank lost before its
// part is out aborts the version on every member.
#include <utility>

#include "tree/producer/group_share.h"
#include "util/bytes.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;

// The largest message a group link carries: a GROUP_SENT's two per-tensor digest lists.
size_t group_link_bytes(const codec::Manifest& manifest) { return kControlBufferBytes + 16 * manifest.size(); }

void add_into(std::vector<uint64_t>& sum, const std::vector<uint64_t>& part) {
  if (sum.size() < part.size()) sum.resize(part.size(), 0);
  for (size_t t = 0; t < part.size(); ++t) sum[t] += part[t];
}

}  // namespace

void Producer::Impl::ensure_admission() {
  auto& g = *group;
  if (g.admission) return;
  g.links.resize(g.size);
  g.data_urls.resize(g.size);
  GroupAdmission::Params params;
  params.size = g.size;
  params.manifest_digest = manifest.digest();
  params.partition = g.partition.fingerprint();
  params.committed_version = version;
  params.committed_digest = version == 0 ? 0 : committed_digest();
  params.own_digest = baseline->digest().per_tensor();
  params.previous_version = previous ? previous->version : 0;
  g.admission.emplace(std::move(params));
  g.readers = std::make_unique<ControlReaders>(group_link_bytes(manifest), event_sink(ProducerEvent::Kind::group));
}

std::string Producer::Impl::missing_ranks() const {
  if (!coordinator() || !group->admission) return "";
  return group->admission->describe_missing();
}

void Producer::Impl::wait_for_ranks(Clock::time_point deadline) {
  auto& g = *group;
  ensure_admission();
  while (!g.admission->complete()) {
    if (Clock::now() > deadline) throw Error(Errc::timeout, missing_ranks() + " in time");
    pump(100ms);
  }
  auto refuse_every_rank = [&](Errc errc, const std::string& why) {
    for (uint32_t r = 1; r < g.size; ++r) {
      if (!g.links[r].connection) continue;
      try {
        send_control(*g.links[r].connection, Refused{static_cast<uint32_t>(errc), why}, kMemberSendTimeout, 0);
      } catch (const Error&) {
      }
      g.links[r].connection->close();
    }
    return Error(errc, "the producer group cannot start: " + why);
  };
  if (version == 0) {
    // The all-zero version's digest is the sum of the ranks' parts of it (each from its zeros).
    zero_digest = g.admission->sum().combined();
    remember_version(0, zero_digest);
  } else {
    try {
      step_back_if_undecided();
    } catch (const Error& e) {
      throw refuse_every_rank(e.code(), e.what());
    }
    if (const std::string why = g.admission->check_sum(); !why.empty())
      throw refuse_every_rank(Errc::verify_failed, why);
  }
  g.admission->settle();
  previous.reset();
  log->info("producer group: {} ranks in at version {} ({})", g.size, version, g.partition.describe(manifest));
}

void Producer::Impl::handle_group_hello(ProducerEvent& event) {
  const GroupHello& h = event.group_hello;
  auto refuse = [&](Errc code, const std::string& why) {
    log->warn("producer group: refused a GROUP_HELLO: {}", why);
    try {
      send_control(*event.connection, Refused{static_cast<uint32_t>(code), why}, kMemberSendTimeout, epoch());
    } catch (const Error&) {
    }
    event.connection->close();
  };
  if (!coordinator()) return refuse(Errc::invalid_argument, "this is not a producer group's coordinator (rank 0)");
  auto& g = *group;
  ensure_admission();
  const auto decision = g.admission->hello(h);
  if (!decision.admitted()) return refuse(decision.errc, decision.reason);
  auto& link = g.links[h.rank];
  link = ProducerGroup::RankLink{event.connection, next_generation++, h.instance, std::nullopt, std::nullopt};
  g.readers->add(h.rank, link.generation, event.connection, group_link_bytes(manifest));
  log->info("producer group: rank {} is in at version {} (its trees' roots JOIN {})", h.rank, h.held_version,
            h.data_url);
  const std::string before = std::exchange(g.data_urls[h.rank], h.data_url);
  if (!membership) return;  // start() sends every rank its WELCOME
  // A rank coming back: the session as it stands (the members' URLs for its trees' roots).
  Welcome w = make_welcome();
  w.instance = h.instance;
  tell_rank(h.rank, w);
  if (before == h.data_url) return;
  // Back at another address (another host: a rescheduled trainer rank): every member learns it,
  // and its trees' roots JOIN it there (an EPOCH whose moves are those roots, parents unchanged).
  log->info("producer group: rank {} came back at another data URL ({}; was {}): its trees' roots JOIN it there",
            h.rank, h.data_url, before);
  EpochUpdate update;
  update.producer_urls = producer_urls();
  announce(update, membership->reconnect_roots(h.rank), Clock::now());
}

void Producer::Impl::handle_group_event(const ControlEvent& e) {
  auto& g = *group;
  if (e.rank == 0 || e.rank >= g.links.size() || g.links[e.rank].generation != e.generation) return;  // an old link
  auto& link = g.links[e.rank];
  if (!e.message) return lose_rank(e.rank, "its group link failed: " + e.status.message);
  if (const auto* ready = std::get_if<GroupReady>(&*e.message)) {
    link.ready = *ready;
  } else if (const auto* sent = std::get_if<GroupSent>(&*e.message)) {
    if (in_flight && sent->attempt == in_flight->attempt) link.sent = *sent;
  } else {
    log->warn("producer group: ignoring an unexpected message from rank {}", e.rank);
  }
}

void Producer::Impl::lose_rank(uint32_t rank, const std::string& why) {
  auto& g = *group;
  auto& link = g.links[rank];
  if (link.connection) link.connection->close();
  link = ProducerGroup::RankLink{};
  g.admission->lost(rank);
  log->warn("producer group: rank {} lost: {}; its part is missing until it says GROUP_HELLO again", rank, why);
}

void Producer::Impl::tell_rank(uint32_t rank, const Message& message) {
  auto& link = group->links[rank];
  if (!link.connection) return;
  try {
    send_control(*link.connection, message, kMemberSendTimeout, epoch());
  } catch (const Error& e) {
    lose_rank(rank, std::string("a send failed: ") + e.what());
  }
}

void Producer::Impl::tell_ranks(const Message& message) {
  if (!coordinator()) return;
  for (uint32_t r = 1; r < group->links.size(); ++r) tell_rank(r, message);
}

RefitReport Producer::Impl::group_version(GroupShare& share, std::shared_ptr<const CheckpointLayout> new_layout,
                                          const RefitOptions& refit_options) {
  auto& g = *group;
  const uint64_t v = version + 1;
  const char* how = share.raw() ? "a bootstrap (RAW pieces)" : "a delta (refit)";
  // Each attempt needs every rank's own GROUP_READY: a READY of an attempt that ended must not
  // start the next (the rank may not have asked again yet, or asked another way).
  auto end_attempt = [&g] {
    for (auto& link : g.links) link.ready.reset();
  };
  // 1. Every rank's trainer asked for v, the same way (nothing is sent before: a rank that is
  // missing, late or sends it another way fails the refit here, naming it).
  const auto ready_deadline = Clock::now() + options.version_timeout;
  for (;;) {
    if (const std::string missing = missing_ranks(); !missing.empty())
      throw Error(Errc::state, "cannot send version " + std::to_string(v) + ": " + missing +
                                   " (the group waits for it: a rank comes back with its part of version " +
                                   std::to_string(version) + ", e.g. `run --resume`)");
    uint32_t waiting = 0;
    for (uint32_t r = 1; r < g.size; ++r)
      if (!g.links[r].ready || g.links[r].ready->version != v) waiting = waiting ? waiting : r;
    if (waiting == 0) break;
    if (Clock::now() > ready_deadline)
      throw Error(Errc::timeout, "producer rank " + std::to_string(waiting) + " did not ask for version " +
                                     std::to_string(v) + " within the version timeout; nothing was sent");
    pump(20ms);
  }
  for (uint32_t r = 1; r < g.size; ++r)
    if (g.links[r].ready->raw != share.raw()) {
      const std::string why = "producer rank " + std::to_string(r) + " sends version " + std::to_string(v) + " as " +
                              (g.links[r].ready->raw ? "a bootstrap (RAW pieces)" : "a delta (refit)") +
                              ", rank 0 as " + how + ": every rank must call the same; nothing was sent";
      end_attempt();
      tell_ranks(GroupDecided{v, 0, false, why});
      throw Error(Errc::invalid_argument, why);
    }
  for (uint32_t r = 1; r < g.size; ++r) g.links[r].sent.reset();

  // 2. GROUP_BEGIN, this rank's own part, then every other rank's GROUP_SENT.
  const uint64_t base_combined = committed_digest();
  const uint32_t total = share.first().back();
  const TopologyKind kind = membership->kind();
  SharedBytes seal;  // a delta's: key `total`
  Impl::InFlight flight;
  flight.version = v;
  flight.layout = std::move(new_layout);
  flight.keys = share.raw() ? total : total + 1;
  flight.rank_first = share.first();
  flight.tree_of = [total, kind](uint32_t key) { return key == total ? 0 : tree_for_chunk(kind, key); };
  flight.make = [this, &share, &seal, total](uint32_t key, uint32_t route) {
    if (key != total) return share.make(key, route);
    return Outgoing{std::make_shared<const std::vector<std::byte>>(
                        encode_frame_message(*seal, in_flight->envelope(route), epoch())),
                    {}};
  };
  codec::StateDigest new_sum;
  uint64_t raw_sum = 0;
  std::vector<std::vector<uint64_t>> new_parts(g.size);
  std::string rank_failure;     // why a rank's part did not go out: the version aborts, the refit reports it
  FleetSlices::GroupPlan plan;  // a delta's placed members' slices (empty: none)
  std::vector<codec::SliceDigest> new_slices;  // the seal's slice table: the plan's base + every part's change
  auto send_all = [&](Impl::InFlight& f) {
    RefitReport& report = *f.report;
    GroupBegin begin{v, f.attempt, base_combined, f.layout != nullptr, {}, {}, {}, {}};
    if (!share.raw()) {  // placed members: the plan of their slices (docs/placement.md)
      plan = fleet_slices.group_plan(version);
      for (const auto& s : plan.table) begin.slices.push_back(SliceRef{s.tensor, s.dim, s.start, s.stop});
      begin.set_slices = plan.set_slices;
      begin.set_ends = plan.set_ends;
      begin.scan = plan.scan;
    }
    tell_ranks(begin);
    const GroupSent own = share.send(f, begin);
    const auto deadline = f.start + options.version_timeout;
    for (;;) {
      uint32_t waiting = 0;
      for (uint32_t r = 1; r < g.size && rank_failure.empty(); ++r) {
        const auto& link = g.links[r];
        if (!link.connection) {
          rank_failure = "producer rank " + std::to_string(r) + " was lost before its part of version " +
                         std::to_string(v) + " was out";
        } else if (link.sent && link.sent->errc != 0) {
          rank_failure = "producer rank " + std::to_string(r) + " could not send its part: " + link.sent->message;
        } else if (!link.sent && waiting == 0) {
          waiting = r;
        }
      }
      if (!rank_failure.empty()) throw Error(Errc::connection, rank_failure);
      if (waiting == 0) break;
      if (Clock::now() > deadline) {
        rank_failure = "producer rank " + std::to_string(waiting) + " did not send its part of version " +
                       std::to_string(v) + " within the version timeout";
        throw Error(Errc::timeout, rank_failure);
      }
      pump(20ms);
      flush_resends();
    }
    // 3. The parts' digests: the bases add up to the committed version (else a rank holds other
    // bits: named, and nothing commits); the new parts add up to the new version's StateDigest.
    std::vector<uint64_t> base_sum = own.base_digest, next_sum = own.new_digest;
    new_parts[0] = own.new_digest;
    raw_sum = own.raw_sum;
    report.chunks = own.chunks;
    report.frames_bytes = own.frame_bytes;
    report.changes = own.changes;
    for (uint32_t r = 1; r < g.size; ++r) {
      const GroupSent& sent = *g.links[r].sent;
      if (sent.base_digest.size() != manifest.size() || sent.new_digest.size() != manifest.size()) {
        rank_failure = "producer rank " + std::to_string(r) + "'s GROUP_SENT has digests of another manifest";
        throw Error(Errc::corrupt_frame, rank_failure);
      }
      if (const auto* record = g.admission->record(r); !record || sent.base_digest != *record) {
        rank_failure = "producer rank " + std::to_string(r) + " encoded its part on other bits than version " +
                       std::to_string(version) + "'s (its base digest differs from the group's record)";
        throw Error(Errc::verify_failed, rank_failure);
      }
      add_into(base_sum, sent.base_digest);
      add_into(next_sum, sent.new_digest);
      new_parts[r] = sent.new_digest;
      raw_sum += sent.raw_sum;
      report.chunks += sent.chunks;
      report.frames_bytes += sent.frame_bytes;
      report.changes += sent.changes;
    }
    if (const uint64_t base = codec::StateDigest(base_sum).combined(); base != base_combined) {
      rank_failure = "the parts' bases add up to digest " + hex64(base) + ", not version " + std::to_string(version) +
                     "'s " + hex64(base_combined);
      throw Error(Errc::verify_failed, rank_failure);
    }
    new_sum = codec::StateDigest(std::move(next_sum));
    report.elements = manifest.total_elements();
    report.checkpoint_bytes = manifest.total_bytes();
    if (share.raw()) {
      // Members ack the pieces' hash sum; the version is recorded under its StateDigest.
      report.changes = report.elements;
      f.state_digest = new_sum.combined();
      return;
    }
    // The slice table: each slice's base (the table's, or the ranks' scans of their parts added
    // up) plus every part's change inside it.
    new_slices = plan.table;
    auto add_slices = [&](const GroupSent& sent, uint32_t r) {
      if (sent.slice_deltas.size() != new_slices.size() || sent.slice_scans.size() != plan.scan.size()) {
        rank_failure = "producer rank " + std::to_string(r) + "'s GROUP_SENT has slice digests of another plan";
        throw Error(Errc::corrupt_frame, rank_failure);
      }
      for (size_t k = 0; k < plan.scan.size(); ++k) new_slices[plan.scan[k]].digest += sent.slice_scans[k];
      for (size_t i = 0; i < new_slices.size(); ++i) new_slices[i].digest += sent.slice_deltas[i];
    };
    add_slices(own, 0);
    for (uint32_t r = 1; r < g.size; ++r) add_slices(*g.links[r].sent, r);
    seal = std::make_shared<const std::vector<std::byte>>(
        codec::seal_frame(manifest, {version, v}, base_combined, total, new_sum, new_slices));
    deliver(0, f.make(total, 0));
    f.sent[total] = true;
    report.frames_bytes += seal->size();
  };
  RefitReport report;
  try {
    report = run_version(
        std::move(flight), send_all, [&] { return share.raw() ? raw_sum : new_sum.combined(); }, refit_options.dry_run,
        [&] {
          version = v;
          fleet_slices.committed(v, new_slices);
          share.adopt(v, codec::StateDigest(new_parts[0]));
          g.admission->committed(v, new_sum.combined(), new_parts);
        });
  } catch (const Error& e) {
    end_attempt();
    tell_ranks(GroupDecided{v, attempt, false, e.what()});
    if (rank_failure.empty()) throw;
    log->warn("version {} aborted on every member: {}", v, rank_failure);
    report = RefitReport{};
    report.version = v;
    report.abort_reason = rank_failure;
    report.producer_rank_lost = true;
    report.epoch = epoch();
    return report;
  }
  end_attempt();
  tell_ranks(
      GroupDecided{v, attempt, report.committed, report.abort_reason, report.committed ? new_sum.combined() : 0});
  log->info("version {} {} in {:.3f} s ({} producer ranks, {}: {} {}, {} payload bytes, {} changes)", v,
            report.committed ? "committed" : "aborted", report.refit_seconds, g.size, how, report.chunks,
            share.raw() ? "pieces" : "chunks", report.frames_bytes, report.changes);
  return report;
}

}  // namespace deltacast::tree
