// A producer group's part rank (rank >= 1; docs/producer-group.md): its group link to the
// coordinator (GROUP_HELLO, then WELCOME or REFUSED; forwarded EPOCHs, GAPs and BYE), the roots of
// its own trees (their JOINs and RESUMEs on its listener, as at the coordinator), and its refit:
// GROUP_READY, GROUP_BEGIN, its part encoded and sent down its trees, GROUP_SENT, GROUP_DECIDED,
// then (committed) its part's baseline adopts the new bits.
#include <thread>

#include "tree/connect_retry.h"
#include "tree/producer/group_share.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;

// As large as a WELCOME (receivers allow the same).
constexpr size_t kGroupWelcomeBytes = size_t{64} << 20;

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  return std::max(1ms, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

}  // namespace

StartReport Producer::Impl::rank_start(Clock::time_point deadline) {
  auto& g = *group;
  const std::string who = "producer rank " + std::to_string(g.rank);
  session_start = Clock::now();
  readers = std::make_unique<ControlReaders>(kControlBufferBytes, event_sink(ProducerEvent::Kind::group));
  start_acceptor();  // the roots of its trees JOIN here once the members read their WELCOME
  GroupHello hello;
  hello.rank = g.rank;
  hello.size = g.size;
  hello.manifest_digest = manifest.digest();
  hello.partition = g.partition.fingerprint();
  hello.held_version = version;
  hello.held_digest = baseline->digest().per_tensor();
  hello.data_url = listener->local_url().str();
  std::vector<std::byte> bytes;
  for (;;) {
    ConnectRetry retry;
    retry.give_up_after = left_until(deadline);
    retry.attempt_timeout = std::min(retry.attempt_timeout, retry.give_up_after);
    retry.who = who;
    retry.what = "the producer group's coordinator";
    g.coordinator = connect_with_retry(transport, transport::Url::parse(options.group.coordinator_url), retry);
    hello.instance = random_instance();
    try {
      send_control(*g.coordinator, hello, kMemberSendTimeout);
      // The coordinator answers once every receiver and every rank is in (its start).
      bytes = recv_message(*g.coordinator, kGroupWelcomeBytes, left_until(deadline));
      break;
    } catch (const Error& e) {
      // Something else answered on the coordinator's address and hung up: rank 0's quick probe
      // (`clusters: auto`) listens there before its producer does, and a previous session's
      // producer may be closing. Tried again until the deadline.
      if (e.code() != Errc::connection || Clock::now() >= deadline) throw;
      log->info("{}: the coordinator's address closed the connection before answering ({}); trying again", who,
                e.what());
      g.coordinator->close();
      std::this_thread::sleep_for(200ms);
    }
  }
  const uint64_t welcome_epoch = message_header(bytes).epoch;
  auto message = decode_message(bytes);
  if (const auto* refused = std::get_if<Refused>(&message))
    throw Error(static_cast<Errc>(refused->errc),
                "the producer group's coordinator refused " + who + ": " + refused->message);
  auto* w = std::get_if<Welcome>(&message);
  if (!w) throw Error(Errc::corrupt_frame, who + ": the coordinator's first answer is neither WELCOME nor REFUSED");
  if (codec::Manifest(w->tensors).digest() != manifest.digest())
    throw Error(Errc::version_mismatch, who + ": the coordinator's manifest differs from this rank's");
  if (w->producer_urls.size() != g.size)
    throw Error(Errc::corrupt_frame, who + ": the WELCOME lists " + std::to_string(w->producer_urls.size()) +
                                         " producer ranks; the group has " + std::to_string(g.size));
  if (w->committed_version != version)
    throw Error(Errc::version_mismatch, who + " holds version " + std::to_string(version) +
                                            "; the group's committed version is " +
                                            std::to_string(w->committed_version));
  remember_version(version, w->committed_digest);
  membership = Membership::from_welcome(parse_topology_kind(w->topology), welcome_epoch, w->members, w->forest,
                                        static_cast<int>(g.size));
  members = w->members;
  max_message_bytes = w->max_message_bytes;
  layout = std::make_shared<const CheckpointLayout>(w->layout);
  roots.assign(membership->trees(), nullptr);
  root_lost.assign(membership->trees(), Clock::now());
  readers->add(0, next_generation++, g.coordinator, kControlBufferBytes);
  log->info("{} is in: {} receivers, its trees {}..{}, version {}", who, membership->size(),
            g.first_tree(tree_count(membership->kind())),
            g.first_tree(tree_count(membership->kind())) + tree_count(membership->kind()) - 1, version);
  idle = std::thread([this] { idle_loop(); });
  StartReport report;
  report.version = version;
  return report;
}

void Producer::Impl::handle_coordinator(const ControlEvent& e) {
  auto& g = *group;
  if (!e.message) {
    if (g.coordinator_lost.empty()) g.coordinator_lost = e.status.message;
    log->warn("producer rank {}: the link to the coordinator failed: {}", g.rank, e.status.message);
    return;
  }
  const Message& m = *e.message;
  if (const auto* update = std::get_if<EpochUpdate>(&m)) {
    if (e.epoch <= epoch()) return;
    membership->apply(e.epoch, update->dead, update->joined, update->moves);
    // A root that left, or is no longer its tree's root: the new one JOINs (and RESUMEs).
    for (int t = 0; t < static_cast<int>(roots.size()); ++t) {
      auto& root = roots[t];
      if (!root) continue;
      if (!membership->live(root->peer_rank()) || membership->root(t) != root->peer_rank()) {
        root->cancel_all(!membership->live(root->peer_rank()));
        root.reset();
        root_lost[t] = Clock::now();
      }
    }
  } else if (const auto* begin = std::get_if<GroupBegin>(&m)) {
    g.begin = *begin;
  } else if (const auto* decided = std::get_if<GroupDecided>(&m)) {
    g.decided = *decided;
  } else if (const auto* gap = std::get_if<Gap>(&m)) {
    if (in_flight && gap->attempt == in_flight->attempt && membership->live(gap->child))
      for (const uint32_t key : gap->chunks)
        if (key < in_flight->keys && in_flight->sent[key]) in_flight->resends.emplace_back(key, gap->child);
  } else if (std::holds_alternative<Bye>(m)) {
    g.bye = true;
  } else if (const auto* refused = std::get_if<Refused>(&m)) {
    g.coordinator_lost = "the coordinator refused this rank: " + refused->message;
  } else {
    log->warn("producer rank {}: ignoring an unexpected message from the coordinator", g.rank);
  }
}

RefitReport Producer::Impl::rank_version(GroupShare& share) {
  auto& g = *group;
  const uint64_t v = version + 1;
  const std::string who = "producer rank " + std::to_string(g.rank);
  auto lost = [&](const std::string& why) {
    return Error(Errc::connection, who + " lost the coordinator: " + why +
                                       " (members keep the committed version; a restarted coordinator resumes)");
  };
  auto check_link = [&] {
    if (!g.coordinator_lost.empty()) throw lost(g.coordinator_lost);
    if (g.bye) throw Error(Errc::state, who + ": the coordinator ended the session");
  };
  // The coordinator's loss is the same whether its link's reader or a send finds it first.
  auto tell_coordinator = [&](const Message& message) {
    try {
      send_control(*g.coordinator, message, kMemberSendTimeout, epoch());
    } catch (const Error& e) {
      if (e.code() == Errc::connection) throw lost(e.what());
      throw;
    }
  };
  check_link();
  g.begin.reset();
  g.decided.reset();
  tell_coordinator(GroupReady{g.rank, v, share.raw()});
  RefitReport report;
  report.version = v;
  const auto start = Clock::now();
  // GROUP_BEGIN once every rank asked (or GROUP_DECIDED: the coordinator gave the version up).
  while (!(g.begin && g.begin->version == v)) {
    check_link();
    if (g.decided && g.decided->version == v) {
      report.abort_reason = g.decided->reason;
      return report;
    }
    if (Clock::now() - start > options.version_timeout)
      throw Error(Errc::timeout, who + ": the coordinator did not begin version " + std::to_string(v) + " in time");
    pump(20ms);
  }
  const GroupBegin begin = *g.begin;
  const TopologyKind kind = membership->kind();
  const int first_tree = static_cast<int>(g.first_tree(tree_count(kind)));
  InFlight flight;
  flight.version = v;
  flight.attempt = begin.attempt;
  flight.start = start;
  // The envelopes say whether the version changes the layout (the coordinator sent the LAYOUT).
  if (begin.new_layout) flight.layout = layout;
  flight.keys = share.first().back();
  flight.rank_first = share.first();
  flight.sent.assign(flight.keys, false);
  flight.tree_of = [first_tree, kind](uint32_t key) { return first_tree + tree_for_chunk(kind, key); };
  flight.make = [&share](uint32_t key, uint32_t route) { return share.make(key, route); };
  flight.report = &report;
  in_flight = std::move(flight);
  struct EndFlight {
    Impl& d;
    ~EndFlight() {
      d.settle_roots();
      d.in_flight.reset();
    }
  } end_flight{*this};

  GroupSent sent;
  try {
    sent = share.send(*in_flight, begin);
  } catch (const Error& e) {
    // Its part cannot go out (a read failed, every receiver failed): the coordinator aborts the
    // version everywhere.
    GroupSent failed;
    failed.rank = g.rank;
    failed.version = v;
    failed.attempt = begin.attempt;
    failed.errc = static_cast<uint32_t>(e.code());
    failed.message = e.what();
    check_link();
    tell_coordinator(failed);
    throw;
  }
  sent.rank = g.rank;
  sent.version = v;
  sent.attempt = begin.attempt;
  report.chunks = sent.chunks;
  report.frames_bytes = sent.frame_bytes;
  report.changes = sent.changes;
  tell_coordinator(sent);
  // Until the coordinator's word: new roots JOIN and get what they lack, GAPs are answered.
  while (!(g.decided && g.decided->attempt == begin.attempt)) {
    check_link();
    pump(20ms);
    flush_resends();
  }
  report.committed = g.decided->committed;
  report.abort_reason = g.decided->reason;
  report.epoch = epoch();
  report.refit_seconds = seconds_since(start);
  if (report.committed) {
    version = v;
    remember_version(v, g.decided->digest);
    share.adopt(v, codec::StateDigest(sent.new_digest));
  }
  log->info("{}: version {} {} in {:.3f} s ({} {} of its part, {} payload bytes)", who, v,
            report.committed ? "committed" : "aborted", report.refit_seconds, report.chunks,
            share.raw() ? "RAW pieces" : "chunks", report.frames_bytes);
  return report;
}

void Producer::Impl::rank_finish() {
  settle_roots();
  if (group->coordinator) group->coordinator->close();
}

}  // namespace deltacast::tree
