// A live member's control thread (tree/receiver_impl.h): its edges, the producer's messages, and
// the commit links of a delegated commit (docs/protocol.md, "Delegated commit").
#include "tree/receiver_impl.h"

#include <algorithm>

namespace deltacast::tree {

void Receiver::Impl::start_edges() {
  RelayOptions relay_options;
  relay_options.rank = options.rank;
  relay_options.max_message_bytes = producer.welcome().max_message_bytes;
  relay_options.max_inflight_bytes_per_child = options.max_inflight_bytes_per_child;
  relay_options.peer_timeout = options.peer_timeout;
  relay_options.connect_timeout = options.connect_timeout;
  relay_options.join_timeout = options.join_timeout;
  relay_options.producer_urls = producer.welcome().producer_urls;
  RelayEdges::Callbacks callbacks;
  callbacks.to_producer = [this, session = held.session()](const Message& m) {
    // An ACK of a version whose LAYOUT has not come yet waits for it (the control thread sends it
    // then): no member acks, so nobody commits, a version it could not write as the trainer did.
    const auto awaits_layout = [session](uint64_t attempt) { return session->awaits_layout(attempt); };
    if (auto* ack = std::get_if<Ack>(&m); ack && !layouts.ack_may_leave(*ack, awaits_layout)) {
      log->info("{}: version {} verified; its ACK waits for the version's LAYOUT", who(), ack->version);
      return;
    }
    if (!std::holds_alternative<Ack>(m) && !std::holds_alternative<Nack>(m)) return producer.send(m);
    // An ACK or NACK may be owed to a commit delegate too: the control thread decides, after the
    // producer was sent it (also when that send failed), so a delegate never commits on an answer
    // of its own that the producer was not sent first.
    ControlInput input;
    input.kind = ControlInput::Kind::own_answer;
    input.event.rank = options.rank;
    input.event.message = m;
    auto hand_over = [&] { inbox.push(std::move(input)); };
    try {
      producer.send(m);
    } catch (...) {
      hand_over();
      throw;
    }
    hand_over();
  };
  callbacks.on_data = options.on_data;
  callbacks.on_commit_link = [this](std::shared_ptr<transport::Connection> connection, Message first) {
    ControlInput input;
    input.kind = ControlInput::Kind::member_link;
    input.event.message = std::move(first);
    input.connection = std::move(connection);
    inbox.push(std::move(input));
  };
  auto edges =
      std::make_unique<RelayEdges>(transport, relay.listener(), *held.session(), *held.store(), *held.manifest(),
                                   producer.welcome().members, relay_options, std::move(callbacks));
  edges->start(producer.membership());
  relay.install(std::move(edges));
}

void Receiver::Impl::on_epoch(const EpochUpdate& update, uint64_t e) {
  if (!producer.apply_epoch(update, e)) return;  // already known (a WELCOME carried it)
  for (const auto& d : update.dead)
    log->info("{}: rank {} left at epoch {} ({})", who(), d.rank, e, failure_cause_name(d.cause));
  if (RelayEdges* edges = relay.current())
    edges->update(producer.membership(), update.joined, update.moves, producer.welcome().producer_urls);
  if (commit_links) commit_links->membership_changed();
}

Message Receiver::Impl::commit_here(const Commit& commit, const std::function<void(const Message&)>& send) {
  Session& session = *held.session();
  const uint64_t before = session.version();
  Message answer;
  // The version's frames are archived before ACTIVE goes out: once the version counts as
  // committed, a rejoining peer may ask this member to replay it.
  session.commit(commit, [&](const Message& m) {
    if (std::holds_alternative<Active>(m)) held.store()->end_attempt(commit.attempt, true);
    answer = m;
    send(m);
  });
  if (RelayEdges* edges = relay.current()) edges->prepare_next_version();
  if (session.version() == commit.version && before != commit.version) {
    layouts.adopt(commit.version);  // before the host hears of the version (on_active)
    versions.committed(commit.version);
  }
  return answer;
}

std::optional<Ending> Receiver::Impl::handle_producer(const ControlEvent& event) {
  if (!event.message) {
    if (event.status.code == Errc::corrupt_frame)
      throw Error(Errc::corrupt_frame, "the producer sent a malformed message: " + event.status.message);
    if (producer.leaving())
      log->info("{}: leaving (link to the producer failed: {})", who(), event.status.message);
    else
      log->warn("{}: link to the producer failed: {}", who(), event.status.message);
    return Ending::producer_lost;
  }
  const Message& message = *event.message;
  Session& session = *held.session();
  // An answer the producer's link cannot carry (the producer died after its message came, e.g.
  // right after a COMMIT): the producer is lost, as when the link's reader finds it, and what this
  // member holds stays as the message left it.
  std::string lost;
  auto answer = [&](const Message& m) {
    try {
      producer.send(m);
    } catch (const Error& e) {
      if (e.code() != Errc::connection && e.code() != Errc::timeout) throw;
      if (lost.empty()) lost = e.what();
    }
  };
  if (std::holds_alternative<Bye>(message)) return Ending::bye;
  if (auto* commit = std::get_if<Commit>(&message)) {
    commit_here(*commit, answer);
    commit_links->ended(commit->attempt);
  } else if (auto* abort = std::get_if<Abort>(&message)) {
    Message reply = session.abort(*abort);
    held.store()->end_attempt(abort->attempt, false);
    layouts.forget(abort->attempt);  // the committed version's layout stays
    versions.aborted(abort->version, [&] {
      log->info("{}: version {} aborted ({}), back at version {}", who(), abort->version, abort->reason,
                session.version());
      answer(reply);
      commit_links->ended(abort->attempt);
    });
  } else if (auto* update = std::get_if<EpochUpdate>(&message)) {
    on_epoch(*update, event.epoch);
  } else if (auto* d = std::get_if<Delegate>(&message)) {
    commit_links->delegate(*d);
  } else if (auto* layout_update = std::get_if<LayoutUpdate>(&message)) {
    if (auto ack = layouts.take(*layout_update, held.manifest()->size(), session.attempt_floor())) {
      log->info("{}: LAYOUT of version {} received; its ACK goes", who(), layout_update->version);
      answer(*ack);
      commit_links->own_answer(*ack);
    }
  } else if (auto* fenced = std::get_if<Fenced>(&message)) {
    log->warn("{}: fenced by the producer: {}", who(), fenced->reason);
    if (fenced->replaced)
      throw Error(Errc::state, who() + " was replaced by a newer instance of the same rank (" + fenced->reason +
                                   "); this instance stops");
    return Ending::fenced;
  } else {
    log->warn("{}: ignoring an unexpected control message", who());
  }
  if (lost.empty()) return std::nullopt;
  log->warn("{}: link to the producer failed: {} (answering it, at version {})", who(), lost, session.version());
  return Ending::producer_lost;
}

std::optional<Ending> Receiver::Impl::handle_input(ControlInput& input) {
  if (input.kind == ControlInput::Kind::producer) return handle_producer(input.event);
  commit_links->handle(input);  // the other inputs are a delegated commit's
  return std::nullopt;
}

Ending Receiver::Impl::serve() {
  // A placement attached after join(): the producer learns its slices before any READY.
  if (const auto& placement = held.placed().placement; placement && !slices_stated) {
    Placed placed;
    for (uint32_t p = 0; p < placement->part_count(); ++p) {
      const auto& s = placement->slice(p);
      HeldSlice slice{held.manifest()->at(s.tensor).name, s.dim, s.start, s.stop};
      if (std::find(placed.slices.begin(), placed.slices.end(), slice) == placed.slices.end())
        placed.slices.push_back(std::move(slice));
    }
    producer.send(placed);
    slices_stated = true;
  }
  if (!producer.membership().live(options.rank)) {
    if (!catch_up()) return Ending::bye;
    // Caught up (a snapshot and/or replayed versions): the host holds a committed version now.
    const uint64_t version = held.session()->version();
    layouts.adopt(version);
    versions.reached(version);
  }
  inbox.open();  // dropping what the last producer link left
  commit_links.emplace(
      transport, options, inbox, producer,
      [this](const Commit& c, const std::function<void(const Message&)>& send) { return commit_here(c, send); }, log);
  inbox.read(ControlInput::Kind::producer, 0, producer.connection(), kWelcomeBufferBytes);  // a LAYOUT may be large
  struct CloseLinks {
    Impl& d;
    ~CloseLinks() {
      d.inbox.close();
      d.commit_links.reset();
    }
  } closing{*this};
  start_edges();
  auto heard = Clock::now();
  for (;;) {
    auto input = inbox.pop(1s);
    if (!input) {
      if (Clock::now() - heard > options.idle_timeout)
        throw Error(Errc::timeout,
                    "no word from the producer for " + std::to_string(options.idle_timeout.count()) + " ms");
      continue;
    }
    if (input->kind == ControlInput::Kind::producer) heard = Clock::now();
    if (auto ending = handle_input(*input)) return *ending;
  }
}

}  // namespace deltacast::tree
