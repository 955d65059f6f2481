// The producer's control plane: the acceptor and idle threads, each member's control link (send,
// broadcast, close), and the event pump that hands what members say to admission.cpp, repair.cpp
// and the in-flight VersionRound.
#include <map>

#include "tree/producer/impl.h"

namespace deltacast::tree {

using namespace std::chrono_literals;

void Producer::Impl::start_acceptor() {
  acceptor = std::thread([this] {
    while (!stopping) {
      std::unique_ptr<transport::Connection> connection;
      try {
        connection = listener->accept(200ms);
      } catch (const Error& e) {
        if (!stopping) log->error("producer: listener failed: {}", e.what());
        return;
      }
      if (!connection) continue;
      std::shared_ptr<transport::Connection> shared(std::move(connection));
      greeters.spawn([this, shared] { greet(shared); });
    }
  });
}

void Producer::Impl::idle_loop() {
  while (!stopping) {
    const bool queued = events.wait(200ms);
    std::lock_guard lock(drive);
    if (stopping) return;
    if (queued) pump(0ms);
    if (part_rank()) continue;  // the coordinator watches the members
    review_stalls();
    review_edge_reports();
    admit_caught_up();
  }
}

void Producer::Impl::stop_threads() {
  stopping = true;
  if (idle.joinable()) idle.join();
  if (acceptor.joinable()) acceptor.join();
  greeters.join_all();
  if (readers) readers->stop();
  if (group && group->readers) group->readers->stop();
}

// Reads a new connection's first message: HELLO (a member's control link), JOIN + RESUME (a
// tree root's data edge) or FETCH (a rejoining member no peer could serve). Anything else, or
// silence, drops the connection.
void Producer::Impl::greet(const std::shared_ptr<transport::Connection>& connection) {
  try {
    auto bytes = recv_message(*connection, kControlBufferBytes, kMemberSendTimeout);
    ProducerEvent event;
    event.connection = connection;
    event.epoch = message_header(bytes).epoch;
    auto message = decode_message(bytes);
    if (auto* hello = std::get_if<Hello>(&message)) {
      event.kind = ProducerEvent::Kind::hello;
      event.hello = *hello;
    } else if (auto* group_hello = std::get_if<GroupHello>(&message)) {
      event.kind = ProducerEvent::Kind::group_hello;
      event.group_hello = std::move(*group_hello);
    } else if (auto* fetch = std::get_if<Fetch>(&message)) {
      serve_fetch(connection, *fetch);  // on this greeter thread: no event for the driver
      return;
    } else if (auto* join = std::get_if<Join>(&message)) {
      auto next = decode_message(recv_message(*connection, kControlBufferBytes, kMemberSendTimeout));
      auto* resume = std::get_if<Resume>(&next);
      if (!resume) throw Error(Errc::corrupt_frame, "a root's JOIN was not followed by RESUME");
      event.kind = ProducerEvent::Kind::root_join;
      event.join = *join;
      event.resume = std::move(*resume);
    } else {
      throw Error(Errc::corrupt_frame, "a connection's first message is neither HELLO, GROUP_HELLO nor JOIN");
    }
    event.at = Clock::now();
    events.push(std::move(event));
  } catch (const Error& e) {
    if (!stopping) log->warn("producer: dropping a connection from {}: {}", connection->peer(), e.what());
    connection->close();
  }
}

void Producer::Impl::pump(std::chrono::milliseconds wait) {
  auto first = events.pop(wait);
  while (first) {
    handle(*first);
    first = events.pop(0ms);
  }
  if (part_rank()) return;
  review_stalls();
  review_edge_reports();
}

void Producer::Impl::wait_for_catch_ups() {
  const auto behind = [this] {
    std::vector<uint32_t> ranks;
    for (uint32_t r = 1; r < control.size(); ++r) {
      const auto& link = control[r];
      if (link.connection && link.catching_up && !(link.caught_up && link.caught_up_version == version))
        ranks.push_back(r);
    }
    return ranks;
  };
  auto waiting = behind();
  if (waiting.empty()) return;
  log->info("producer: finishing: waiting up to {} ms for {} member(s) catching up to version {}",
            options.join_timeout.count(), waiting.size(), version);
  const auto deadline = Clock::now() + options.join_timeout;
  while (!waiting.empty() && Clock::now() < deadline) {
    pump(50ms);
    waiting = behind();
  }
  for (const uint32_t r : waiting)
    log->warn("producer: rank {} is still catching up at finish: it ends short of version {}", r, version);
}

std::function<void(ControlEvent)> Producer::Impl::event_sink(ProducerEvent::Kind kind) {
  return [this, kind](ControlEvent e) {
    ProducerEvent event;
    event.kind = kind;
    event.at = e.at;
    event.control = std::move(e);
    events.push(std::move(event));
  };
}

void Producer::Impl::handle(ProducerEvent& event) {
  switch (event.kind) {
    case ProducerEvent::Kind::control:
      handle_control(event.control);
      break;
    case ProducerEvent::Kind::hello:
      handle_hello(event);
      break;
    case ProducerEvent::Kind::root_join:
      handle_root_join(event);
      break;
    case ProducerEvent::Kind::group:
      if (part_rank())
        handle_coordinator(event.control);
      else if (coordinator())
        handle_group_event(event.control);
      break;
    case ProducerEvent::Kind::group_hello:
      handle_group_hello(event);
      break;
  }
}

void Producer::Impl::handle_control(const ControlEvent& e) {
  if (e.rank >= control.size() || control[e.rank].generation != e.generation) return;  // an old link
  if (!e.message) {
    if (!membership)
      throw Error(Errc::connection,
                  "rank " + std::to_string(e.rank) + "'s link failed during start: " + e.status.message);
    if (control[e.rank].catching_up) {
      log->warn("producer: rank {} left while catching up: {}", e.rank, e.status.message);
      close_control(e.rank);
      return;
    }
    fail(e.rank, e.status.code == Errc::corrupt_frame ? FailureCause::refused : failure_cause_of(e.status),
         e.status.message, e.at);
    return;
  }
  const Message& m = *e.message;
  auto& f = in_flight;
  if (auto* ack = std::get_if<Ack>(&m)) {
    if (f && ack->version == f->version && ack->attempt == f->attempt)
      f->receive_ms.insert_or_assign(e.rank, static_cast<double>(ack->receive_us) / 1e3);
    if (f) execute(f->round->ack(e.rank, *ack));
  } else if (auto* nack = std::get_if<Nack>(&m)) {
    if (f) execute(f->round->nack(e.rank, *nack));
  } else if (auto* active = std::get_if<Active>(&m)) {
    if (f) execute(f->round->active(e.rank, *active));
  } else if (auto* decided = std::get_if<Decided>(&m)) {
    if (f) {
      execute(f->round->decided(e.rank, *decided));
      log->debug("version {}: DECIDED by rank {} at {:.1f} ms, {} members active there", f->version, e.rank,
                 1e3 * seconds_since(f->start), decided->active.size());
    }
  } else if (auto* ready = std::get_if<Ready>(&m)) {
    handle_ready(e.rank, *ready, e.epoch);
  } else if (auto* report = std::get_if<Report>(&m)) {
    handle_report(e.rank, *report, e.at);
  } else if (auto* placed = std::get_if<Placed>(&m)) {
    handle_placed(e.rank, *placed, e.at);
  } else if (auto* gap = std::get_if<Gap>(&m)) {
    if (f && gap->attempt == f->attempt && membership->live(gap->child)) {
      // In a group, each rank re-sends its own chunks (the coordinator's: its own and the seal).
      std::map<uint32_t, Gap> others;
      for (uint32_t key : gap->chunks) {
        if (key >= f->keys) continue;
        const uint32_t owner = coordinator() ? f->owner(key) : 0;
        if (owner == 0) {
          f->resends.emplace_back(key, gap->child);
          continue;
        }
        auto [it, fresh] = others.try_emplace(owner, *gap);
        if (fresh) it->second.chunks.clear();
        it->second.chunks.push_back(key);
      }
      for (const auto& [owner, forward] : others) tell_rank(owner, forward);
    }
  } else {
    log->warn("producer: ignoring an unexpected message from rank {}", e.rank);
  }
}

bool Producer::Impl::send_to(uint32_t rank, const Message& message) {
  auto& link = control[rank];
  if (!link.connection) return false;
  try {
    send_control(*link.connection, message, kMemberSendTimeout, epoch());
    return true;
  } catch (const Error& e) {
    log->warn("producer: rank {} unreachable: {}", rank, e.what());
    return false;
  }
}

void Producer::Impl::broadcast(const Message& message, bool include_catching_up) {
  // A group's ranks follow the forest: their trees' roots change with it.
  if (coordinator() && std::holds_alternative<EpochUpdate>(message)) tell_ranks(message);
  const auto bytes = encode_message(message, epoch());
  std::vector<std::shared_ptr<transport::Request>> sends;
  for (uint32_t r = 1; r < control.size(); ++r) {
    const auto& link = control[r];
    if (!link.connection) continue;
    if (!membership->live(r) && !(include_catching_up && link.catching_up)) continue;
    sends.push_back(link.connection->post_send(bytes));
  }
  // Post to everyone first, then wait: one frozen member delays nobody's copy.
  for (auto& s : sends) s->wait(kMemberSendTimeout);
}

void Producer::Impl::close_control(uint32_t rank) {
  auto& link = control[rank];
  if (link.connection) link.connection->close();
  link = ControlLink{};
}

}  // namespace deltacast::tree
