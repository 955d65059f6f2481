// A live member's control thread (tree/receiver_impl.h): its edges, the producer's messages, and
// the commit links of a delegated commit (docs/protocol.md, "Delegated commit").
#include <thread>

#include "tree/receiver_impl.h"

namespace deltacast::tree {
namespace {

ControlInput::Kind kind_of_link(uint64_t generation) { return static_cast<ControlInput::Kind>(generation & 7); }

}  // namespace

void Receiver::Impl::start_edges() {
  RelayOptions relay;
  relay.rank = options.rank;
  relay.max_message_bytes = welcome.max_message_bytes;
  relay.max_inflight_bytes_per_child = options.max_inflight_bytes_per_child;
  relay.peer_timeout = options.peer_timeout;
  relay.connect_timeout = options.connect_timeout;
  relay.join_timeout = options.join_timeout;
  RelayEdges::Callbacks callbacks;
  callbacks.to_producer = [this](const Message& m) {
    // An ACK of a version whose LAYOUT has not come yet waits for it (the control thread sends it
    // then): no member acks, so nobody commits, a version it could not write as the trainer did.
    if (auto* ack = std::get_if<Ack>(&m);
        ack && !layouts.ack_may_leave(*ack, [this](uint64_t attempt) { return session->awaits_layout(attempt); })) {
      log->info("{}: version {} verified; its ACK waits for the version's LAYOUT", who(), ack->version);
      return;
    }
    if (!std::holds_alternative<Ack>(m) && !std::holds_alternative<Nack>(m)) return send_to_producer(m);
    // An ACK or NACK may be owed to a commit delegate too: the control thread decides, after the
    // producer was sent it (also when that send failed), so a delegate never commits on an answer
    // of its own that the producer was not sent first.
    ControlInput input;
    input.kind = ControlInput::Kind::own_answer;
    input.event.rank = options.rank;
    input.event.message = m;
    auto hand_over = [&] { inputs.push(std::move(input)); };
    try {
      send_to_producer(m);
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
    inputs.push(std::move(input));
  };
  auto fresh = std::make_unique<RelayEdges>(transport, *listener, *session, *store, *manifest, welcome.members, relay,
                                            std::move(callbacks));
  fresh->start(*membership);
  std::lock_guard lock(edges_mutex);
  edges = std::move(fresh);
}

void Receiver::Impl::stop_edges() {
  if (!edges) return;
  edges->stop();
  std::lock_guard lock(edges_mutex);
  relay_totals += edges->stats();
  edges.reset();
}

void Receiver::Impl::on_epoch(const EpochUpdate& update, uint64_t e) {
  {
    std::lock_guard lock(control_mutex);
    if (e <= membership->epoch()) return;  // already known (a WELCOME carried it)
    membership->apply(e, update.dead, update.joined, update.moves);
    for (const auto& m : update.joined)
      if (m.rank < welcome.members.size()) welcome.members[m.rank] = m;
  }
  for (const auto& d : update.dead)
    log->info("{}: rank {} left at epoch {} ({})", who(), d.rank, e, failure_cause_name(d.cause));
  if (edges) edges->update(*membership, update.joined, update.moves);
  if (delegation) delegation->membership_changed();
}

std::string Receiver::Impl::url_of(uint32_t rank) const {
  if (rank >= welcome.members.size()) throw Error(Errc::invalid_argument, "no member of rank " + std::to_string(rank));
  return welcome.members[rank].url;
}

uint64_t Receiver::Impl::read_link(ControlInput::Kind kind, uint32_t rank,
                                   std::shared_ptr<transport::Connection> connection, size_t max_bytes) {
  const uint64_t id = next_link++;
  readers->add(rank, (id << 3) | static_cast<uint64_t>(kind), std::move(connection), max_bytes);
  return id;
}

void Receiver::Impl::close_links() {
  if (readers) readers->stop();
  delegate_link.close();
  delegate_link = {};
  for (auto& [rank, link] : member_links) link.close();
  member_links.clear();
  connectors.join_all();
  readers.reset();
  delegation.reset();
  link_delegate = 0;
  connecting = false;
  outbox.clear();
}

Message Receiver::Impl::commit_here(const Commit& commit, const std::function<void(const Message&)>& send) {
  const uint64_t before = session->version();
  Message answer;
  // The version's frames are archived before ACTIVE goes out: once the version counts as
  // committed, a rejoining peer may ask this member to replay it.
  session->commit(commit, [&](const Message& m) {
    if (std::holds_alternative<Active>(m)) store->end_attempt(commit.attempt, true);
    answer = m;
    send(m);
  });
  if (edges) edges->prepare_next_version();
  if (session->version() == commit.version && before != commit.version) {
    layouts.adopt(commit.version);  // before the host hears of the version (on_active)
    ++versions_committed;
    active_version->store(commit.version);
    if (options.on_active) options.on_active(commit.version);
  }
  return answer;
}

DelegatedCommit::Hooks Receiver::Impl::delegation_hooks() {
  DelegatedCommit::Hooks hooks;
  hooks.live = [this](uint32_t rank) { return membership->live(rank); };
  hooks.to_delegate = [this](uint32_t delegate, const Message& m) { send_to_delegate(delegate, m); };
  hooks.to_member = [this](uint32_t rank, const Message& m) { send_to_member(rank, m); };
  hooks.to_producer = [this](const Message& m) { send_to_producer(m); };
  hooks.commit_here = [this](const Commit& c) {
    return commit_here(c, [](const Message&) {});  // the delegate's own ACTIVE goes in its DECIDED
  };
  return hooks;
}

void Receiver::Impl::send_to_delegate(uint32_t delegate, const Message& message) {
  if (delegate != link_delegate) {  // a new delegate: the old link is of no use
    delegate_link.close();
    delegate_link = {};
    outbox.clear();
    link_delegate = delegate;
  }
  if (delegate_link) {
    delegate_link.send(message, epoch());
    return;
  }
  outbox.push_back(message);
  connect_delegate();
}

void Receiver::Impl::connect_delegate() {
  if (connecting || delegate_link || outbox.empty() || link_delegate == 0) return;
  connecting = true;
  const uint32_t delegate = link_delegate;
  const std::string url = url_of(delegate);
  connectors.spawn([this, delegate, url] {
    ControlInput input;
    input.kind = ControlInput::Kind::delegate_link;
    input.event.rank = delegate;
    try {
      input.connection = transport.connect(transport::Url::parse(url), options.connect_timeout);
    } catch (const Error& e) {
      input.event.status = e.status();
    }
    inputs.push(std::move(input));
  });
}

void Receiver::Impl::send_to_member(uint32_t rank, const Message& message) {
  auto it = member_links.find(rank);
  if (it == member_links.end()) throw Error(Errc::connection, "no commit link from rank " + std::to_string(rank));
  it->second.send(message, epoch());
}

std::optional<Ending> Receiver::Impl::handle_producer(const ControlEvent& event) {
  if (!event.message) {
    if (event.status.code == Errc::corrupt_frame)
      throw Error(Errc::corrupt_frame, "the producer sent a malformed message: " + event.status.message);
    if (leaving)
      log->info("{}: leaving (link to the producer failed: {})", who(), event.status.message);
    else
      log->warn("{}: link to the producer failed: {}", who(), event.status.message);
    return Ending::producer_lost;
  }
  const Message& message = *event.message;
  if (std::holds_alternative<Bye>(message)) return Ending::bye;
  if (auto* commit = std::get_if<Commit>(&message)) {
    commit_here(*commit, [&](const Message& m) { send_to_producer(m); });
    if (delegation) delegation->ended(commit->attempt);
  } else if (auto* abort = std::get_if<Abort>(&message)) {
    Message reply = session->abort(*abort);
    store->end_attempt(abort->attempt, false);
    layouts.forget(abort->attempt);  // the committed version's layout stays
    ++versions_aborted;
    log->info("{}: version {} aborted ({}), back at version {}", who(), abort->version, abort->reason,
              session->version());
    send_to_producer(reply);
    if (delegation) delegation->ended(abort->attempt);
    if (options.on_aborted) options.on_aborted(abort->version);
  } else if (auto* update = std::get_if<EpochUpdate>(&message)) {
    on_epoch(*update, event.epoch);
  } else if (auto* d = std::get_if<Delegate>(&message)) {
    delegation->delegate(*d);
  } else if (auto* layout_update = std::get_if<LayoutUpdate>(&message)) {
    if (auto ack = layouts.take(*layout_update, manifest->size(), session->attempt_floor())) {
      log->info("{}: LAYOUT of version {} received; its ACK goes", who(), layout_update->version);
      send_to_producer(*ack);
      if (delegation) delegation->own_answer(*ack);
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
  return std::nullopt;
}

std::optional<Ending> Receiver::Impl::handle_input(ControlInput& input) {
  const ControlEvent& event = input.event;
  switch (input.kind) {
    case ControlInput::Kind::own_answer:
      delegation->own_answer(*event.message);
      return std::nullopt;
    case ControlInput::Kind::delegate_link:
      connecting = false;
      if (event.rank != link_delegate || !input.connection) {
        if (input.connection) input.connection->close();
        if (event.rank == link_delegate) {
          // The producer has this member's answer too: it decides if the delegate is gone.
          log->warn("{}: could not reach the commit delegate (rank {}): {}", who(), event.rank, event.status.message);
          outbox.clear();
        }
        connect_delegate();  // a newer delegate's answers waited for this attempt to end
        return std::nullopt;
      }
      delegate_link = CommitLink(read_link(ControlInput::Kind::from_delegate, event.rank, input.connection),
                                 input.connection, event.rank);
      try {
        for (const auto& m : outbox) delegate_link.send(m, epoch());
      } catch (const Error& e) {
        log->warn("{}: commit link to rank {} failed: {}", who(), event.rank, e.what());
      }
      outbox.clear();
      return std::nullopt;
    case ControlInput::Kind::member_link: {
      const Message& first = *event.message;
      const uint32_t rank = std::holds_alternative<Ack>(first) ? std::get<Ack>(first).rank : std::get<Nack>(first).rank;
      if (auto old = member_links.find(rank); old != member_links.end()) old->second.close();
      const uint64_t id = read_link(ControlInput::Kind::from_member, rank, input.connection);
      member_links[rank] = CommitLink(id, input.connection, rank);
      delegation->from_member(rank, first);
      return std::nullopt;
    }
    default:
      break;
  }
  // A message (or the failure) of a link read by `readers`.
  const uint64_t id = event.generation >> 3;
  switch (kind_of_link(event.generation)) {
    case ControlInput::Kind::producer:
      return handle_producer(event);
    case ControlInput::Kind::from_delegate:
      if (!delegate_link || id != delegate_link.id) return std::nullopt;  // an older link
      if (!event.message) {
        log->info("{}: commit link to rank {} closed: {}", who(), event.rank, event.status.message);
        delegate_link.close();
        delegate_link = {};
        link_delegate = 0;
        return std::nullopt;
      }
      if (auto* commit = std::get_if<Commit>(&*event.message)) {
        commit_here(*commit, [&](const Message& m) {
          try {
            delegate_link.send(m, epoch());
          } catch (const Error& e) {
            log->warn("{}: could not answer the delegate's COMMIT: {}", who(), e.what());
          }
        });
      }
      return std::nullopt;
    case ControlInput::Kind::from_member: {
      auto it = member_links.find(event.rank);
      if (it == member_links.end() || it->second.id != id) return std::nullopt;  // an older link
      if (!event.message) {
        it->second.close();
        member_links.erase(it);
        delegation->link_lost(event.rank);
      } else {
        delegation->from_member(event.rank, *event.message);
      }
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

Ending Receiver::Impl::serve() {
  if (!membership->live(options.rank)) {
    if (!catch_up()) return Ending::bye;
    // Caught up (a snapshot and/or replayed versions): the host holds a committed version now.
    const uint64_t held = session->version();
    layouts.adopt(held);
    if (held > active_version->load()) {
      active_version->store(held);
      if (options.on_active) options.on_active(held);
    }
  }
  while (auto stale = inputs.pop(0ms))  // what the last producer link left
    if (stale->connection) stale->connection->close();
  readers = std::make_unique<ControlReaders>(kControlBufferBytes, [this](ControlEvent e) {
    ControlInput input;
    input.kind = kind_of_link(e.generation);
    input.event = std::move(e);
    inputs.push(std::move(input));
  });
  delegation.emplace(options.rank, delegation_hooks());
  std::shared_ptr<transport::Connection> producer;
  {
    std::lock_guard lock(control_mutex);
    producer = control;
  }
  read_link(ControlInput::Kind::producer, 0, producer, kWelcomeBufferBytes);  // a LAYOUT may be large
  struct CloseLinks {
    Impl& d;
    ~CloseLinks() { d.close_links(); }
  } closing{*this};
  start_edges();
  auto heard = Clock::now();
  for (;;) {
    auto input = inputs.pop(1s);
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
