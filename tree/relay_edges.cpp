#include "tree/relay_edges.h"

#include <algorithm>

#include "codec/frame.h"
#include "tree/connect_retry.h"
#include "tree/snapshot_serve.h"
#include "util/log.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;

}  // namespace

// The link to this member's parent in one tree. All fields under RelayEdges::mutex_.
struct RelayEdges::ParentSlot {
  uint32_t parent = 0;
  uint64_t epoch = 0;                 // epoch of the current assignment
  uint64_t generation = 0;            // bumps with every assignment
  uint64_t connected_generation = 0;  // the assignment whose JOIN and RESUME went out
  std::shared_ptr<transport::Connection> connection;
};

RelayEdges::RelayEdges(transport::Transport& transport, transport::Listener& listener, Session& session,
                       FrameStore& store, const codec::Manifest& manifest, std::vector<Member> members,
                       RelayOptions options, Callbacks callbacks)
    : transport_(transport),
      listener_(listener),
      session_(session),
      store_(store),
      manifest_(manifest),
      options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      members_(std::move(members)) {
  producer_urls_ = options_.producer_urls;
}

RelayEdges::~RelayEdges() { stop(); }

std::string RelayEdges::url_of(uint32_t rank, int tree) const {
  return parent_url(members_, producer_urls_, *membership_, tree, rank);
}

void RelayEdges::count(uint64_t RelayStats::*field, uint64_t by) {
  std::lock_guard lock(stats_mutex_);
  stats_.*field += by;
}

RelayStats RelayEdges::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void RelayEdges::prepare_next_version() {
  std::vector<size_t> sizes;
  {
    std::lock_guard lock(sizes_mutex_);
    sizes.swap(frame_sizes_);
  }
  copies_.prewarm(sizes);
}

void RelayEdges::report(const Message& message) {
  try {
    callbacks_.to_producer(message);
  } catch (const Error& e) {
    logger("tree")->warn("rank {}: could not tell the producer: {}", options_.rank, e.what());
  }
}

void RelayEdges::start(const Membership& membership) {
  std::lock_guard lock(mutex_);
  membership_ = membership;
  const int trees = membership.trees();
  children_.assign(trees, {});
  for (int t = 0; t < trees; ++t) {
    auto slot = std::make_unique<ParentSlot>();
    slot->parent = membership.parent(options_.rank, t).value_or(kProducerRank);
    slot->epoch = membership.epoch();
    slot->generation = 1;
    parents_.push_back(std::move(slot));
  }
  for (int t = 0; t < trees; ++t) readers_.emplace_back([this, t] { read_loop(t); });
  acceptor_ = std::thread([this] { accept_loop(); });
}

void RelayEdges::update(const Membership& membership, const std::vector<Member>& joined,
                        const std::vector<TreeEdge>& moves, const std::vector<std::string>& producer_urls) {
  std::vector<std::pair<std::shared_ptr<OutboundLink>, bool>> dropped;  // (link, its peer left)
  {
    std::lock_guard lock(mutex_);
    if (!membership_) return;
    if (!producer_urls.empty()) producer_urls_ = producer_urls;
    for (const auto& m : joined) {
      auto it = std::find_if(members_.begin(), members_.end(), [&](const Member& x) { return x.rank == m.rank; });
      if (it != members_.end()) *it = m; else members_.push_back(m);
    }
    const Membership old = *membership_;
    membership_ = membership;
    for (int t = 0; t < membership.trees(); ++t) {
      auto& slot = *parents_[t];
      const auto parent = membership.parent(options_.rank, t);
      // Reconnect when the producer moved this member (possibly back under the same parent, when
      // their edge failed).
      const bool moved = parent != old.parent(options_.rank, t) ||
                         std::any_of(moves.begin(), moves.end(), [&](const TreeEdge& e) {
                           return e.rank == options_.rank && static_cast<int>(e.tree) == t;
                         });
      if (parent && moved) {
        slot.parent = *parent;
        slot.epoch = membership.epoch();
        ++slot.generation;
        // (A parent that left is not waited for: an orderly close to a frozen one lingers.)
        const auto was = old.parent(options_.rank, t);
        if (slot.connection && was && *was != kProducerRank && !membership.live(*was))
          slot.connection->abort();
        else if (slot.connection)
          slot.connection->close();
      }
      auto& kids = children_[t];
      for (auto it = kids.begin(); it != kids.end();) {
        const uint32_t c = (*it)->peer_rank();
        if (!membership.live(c) || membership.parent(c, t) != options_.rank) {
          dropped.emplace_back(*it, !membership.live(c));
          it = kids.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  changed_.notify_all();
  for (auto& [link, left] : dropped) link->cancel_all(left);
}

void RelayEdges::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    for (auto& slot : parents_)
      if (slot->connection) slot->connection->close();
  }
  changed_.notify_all();
  for (auto& reader : readers_)
    if (reader.joinable()) reader.join();
  abandoned_.wait();
  if (acceptor_.joinable()) acceptor_.join();
  servers_.join_all();
  std::vector<std::shared_ptr<OutboundLink>> links;
  {
    std::lock_guard lock(mutex_);
    for (auto& kids : children_)
      for (auto& link : kids) links.push_back(link);
    children_.clear();
  }
  // What was posted to children still goes out (the last version's frames), within bounds.
  for (auto& link : links) link->cancel_all(!link->flush(options_.peer_timeout));
}

// ---- children -------------------------------------------------------------------------------

void RelayEdges::accept_loop() {
  while (!stopping_) {
    std::unique_ptr<transport::Connection> connection;
    try {
      connection = listener_.accept(200ms);
    } catch (const Error& e) {
      if (!stopping_) logger("tree")->error("rank {}: listener failed: {}", options_.rank, e.what());
      return;
    }
    if (!connection) continue;
    std::shared_ptr<transport::Connection> shared(std::move(connection));
    servers_.spawn([this, shared] { serve_connection(shared); });
  }
}

void RelayEdges::serve_connection(std::shared_ptr<transport::Connection> connection) {
  try {
    auto bytes = recv_message(*connection, kControlBufferBytes, options_.connect_timeout);
    const uint64_t epoch = message_header(bytes).epoch;
    auto message = decode_message(bytes);
    if (auto* join = std::get_if<Join>(&message)) return serve_join(connection, *join, epoch);
    if (auto* fetch = std::get_if<Fetch>(&message)) return serve_fetch(connection, *fetch);
    if ((std::holds_alternative<Ack>(message) || std::holds_alternative<Nack>(message)) && callbacks_.on_commit_link)
      return callbacks_.on_commit_link(std::move(connection), std::move(message));
    throw Error(Errc::corrupt_frame, std::string("first message is ") + message_type_name(message_header(bytes).type) +
                                         ", not JOIN, FETCH, ACK or NACK");
  } catch (const Error& e) {
    if (!stopping_)
      logger("tree")->warn("rank {}: dropped a connection from {}: {}", options_.rank, connection->peer(), e.what());
    connection->close();
  }
}

void RelayEdges::serve_join(std::shared_ptr<transport::Connection> connection, const Join& join, uint64_t epoch) {
  const int tree = static_cast<int>(join.tree);
  auto is_child = [&] {
    return membership_ && tree >= 0 && tree < membership_->trees() && membership_->live(join.rank) &&
           membership_->parent(join.rank, tree) == options_.rank;
  };
  bool mine;
  {
    std::unique_lock lock(mutex_);
    // The child may have heard of its move before us: wait for that epoch's update.
    changed_.wait_for(lock, options_.join_timeout,
                      [&] { return stopping_ || (membership_ && membership_->epoch() >= epoch); });
    if (stopping_) return;
    mine = is_child();
  }
  if (!mine) {
    const std::string why = "rank " + std::to_string(join.rank) + " is not a child of rank " +
                            std::to_string(options_.rank) + " in tree " + std::to_string(tree) +
                            " at epoch " + std::to_string(epoch);
    logger("tree")->warn("rank {}: refused a JOIN: {}", options_.rank, why);
    try {
      send_control(*connection, Refused{static_cast<uint32_t>(Errc::state), why}, options_.connect_timeout);
    } catch (const Error&) {
    }
    connection->close();
    return;
  }
  auto bytes = recv_message(*connection, kControlBufferBytes, options_.connect_timeout);
  auto message = decode_message(bytes);
  auto* resume = std::get_if<Resume>(&message);
  if (!resume || resume->rank != join.rank || resume->tree != join.tree)
    throw Error(Errc::corrupt_frame, "a JOIN was not followed by its RESUME");
  auto link = std::make_shared<OutboundLink>(std::make_unique<SharedConnection>(connection), join.rank, tree);
  std::shared_ptr<OutboundLink> replaced;
  FrameStore::ResumePlan plan;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || !is_child()) {
      link->cancel_all();
      return;
    }
    auto& kids = children_[tree];
    for (auto it = kids.begin(); it != kids.end(); ++it) {
      if ((*it)->peer_rank() == join.rank) {
        replaced = *it;
        kids.erase(it);
        break;
      }
    }
    // Under the lock no first sight can slip between the plan and the new child's first forward.
    plan = store_.plan_resume(tree, resume->attempt, resume->have);
    for (const auto& stored : plan.send) {
      if (stored.body.empty())
        link->post(stored.message);
      else
        link->post_pair(stored.message, stored.body, stored.body_owner);
    }
    kids.push_back(link);
  }
  if (replaced) replaced->cancel_all();
  count(&RelayStats::frames_resumed, plan.send.size());
  logger("tree")->debug("rank {}: rank {} joined tree {} (epoch {}), {} retained frames sent, {} gaps",
                        options_.rank, join.rank, tree, epoch, plan.send.size(), plan.gaps.size());
  if (!plan.gaps.empty())
    report(Gap{options_.rank, join.rank, join.tree, plan.version, plan.attempt, plan.gaps});
}

// A rejoining peer's catch-up: the frames of committed versions it lacks (replay), or a snapshot
// of this member's committed version (RAW pieces read through a Session::SnapshotReader, so they
// are that version's bits although refits keep being applied here meanwhile), then FETCH_END.
void RelayEdges::serve_fetch(std::shared_ptr<transport::Connection> connection, const Fetch& fetch) {
  CatchupSender sender(std::move(connection), fetch.rank, options_.max_inflight_bytes_per_child, options_.peer_timeout,
                       stopping_);
  FetchEnd end{fetch.version, 0, 0, ""};
  if (fetch.mode == CatchupMode::replay) {
    auto messages = store_.archived(fetch.from_version, fetch.version);
    if (!messages) {
      end.errc = static_cast<uint32_t>(Errc::not_found);
      end.message = "rank " + std::to_string(options_.rank) + " does not hold the frames of versions " +
                    std::to_string(fetch.from_version + 1) + ".." + std::to_string(fetch.version);
    } else {
      for (const auto& m : *messages) sender.send(m);
    }
  } else if (fetch.mode == CatchupMode::snapshot) {
    std::unique_ptr<Session::SnapshotReader> reader;
    try {
      reader = session_.begin_snapshot();
    } catch (const Error& e) {  // version 0: nothing to serve
      end.errc = static_cast<uint32_t>(e.code());
      end.message = "rank " + std::to_string(options_.rank) + ": " + e.what();
    }
    // A gated member serves what its buffers hold, possibly older than the committed version:
    // worth it only when its retained frames bring the fetcher the rest of the way.
    if (reader && reader->version() < session_.version() && !store_.archived(reader->version(), session_.version())) {
      end.errc = static_cast<uint32_t>(Errc::not_found);
      end.message = "rank " + std::to_string(options_.rank) + "'s buffers hold version " +
                    std::to_string(reader->version()) + " (its server has not applied the versions after it) " +
                    "and it no longer holds their frames";
      reader.reset();
    }
    if (reader) {
      const uint32_t count = sender.send_snapshot(
          manifest_, options_.max_message_bytes, reader->version(),
          [&](uint32_t tensor, uint64_t offset, std::span<std::byte> out) { reader->read(tensor, offset, out); });
      end.version = reader->version();
      end.digest = reader->digest();
      logger("tree")->info("rank {}: served a snapshot of version {} ({} pieces) to rank {}", options_.rank,
                           end.version, count, fetch.rank);
    }
  } else {
    end.errc = static_cast<uint32_t>(Errc::invalid_argument);
    end.message = "unknown fetch mode";
  }
  sender.finish(end);
}

void RelayEdges::drop_child(int tree, uint32_t rank, FailureCause cause, const std::string& detail, bool tell) {
  std::shared_ptr<OutboundLink> link;
  {
    std::lock_guard lock(mutex_);
    auto& kids = children_[tree];
    for (auto it = kids.begin(); it != kids.end(); ++it) {
      if ((*it)->peer_rank() == rank) {
        link = *it;
        kids.erase(it);
        break;
      }
    }
  }
  if (!link) return;
  logger("tree")->warn("rank {}: dropped child rank {} in tree {} ({}: {})", options_.rank, rank, tree,
                       failure_cause_name(cause), detail);
  link->cancel_all(true);
  if (tell) report(Report{options_.rank, rank, static_cast<uint32_t>(tree), cause, detail});
}

void RelayEdges::drain_children(int tree) {
  std::vector<std::shared_ptr<OutboundLink>> kids;
  {
    std::lock_guard lock(mutex_);
    kids = children_[tree];
  }
  for (auto& link : kids) {
    bool below;
    while (!(below = link->wait_below(options_.max_inflight_bytes_per_child, 100ms)) &&
           link->stalled_for() <= options_.peer_timeout && !stopping_) {
    }
    if (!below && !stopping_) {
      drop_child(tree, link->peer_rank(), FailureCause::stalled,
                 "drained nothing for " + std::to_string(options_.peer_timeout.count()) + " ms", true);
    } else if (link->dead()) {
      drop_child(tree, link->peer_rank(), FailureCause::link_closed, "its data link failed", true);
    }
  }
}

size_t RelayEdges::forward_locked(int tree, bool first, uint32_t route, const SharedBytes& message,
                                  std::span<const std::byte> body, const SharedBytes& body_owner) {
  std::vector<OutboundLink*> targets;
  auto& kids = children_[tree];
  if (first) {
    for (auto& link : kids) targets.push_back(link.get());
  } else if (route != 0 && route != options_.rank && membership_) {
    // A re-send for one member that this member already holds: pass it on towards that member.
    uint32_t r = route;
    for (uint32_t hops = 0; hops <= membership_->size(); ++hops) {
      const auto p = membership_->parent(r, tree);
      if (!p || *p == kProducerRank) break;
      if (*p == options_.rank) {
        for (auto& link : kids)
          if (link->peer_rank() == r) targets.push_back(link.get());
        break;
      }
      r = *p;
    }
  }
  for (auto* link : targets) {
    if (body.empty())
      link->post(message);
    else
      link->post_pair(message, body, body_owner);
  }
  return targets.size();
}

// ---- parent ---------------------------------------------------------------------------------

std::optional<size_t> RelayEdges::receive(int tree, transport::Connection& parent, uint64_t generation,
                                          std::span<std::byte> into, Status& status) {
  auto request = parent.post_recv(into);
  while ((status = request->wait(200ms)).code == Errc::timeout) {
    bool current;
    {
      std::lock_guard lock(mutex_);
      current = !stopping_ && parents_[tree]->generation == generation;
    }
    if (!current) {
      cancel_and_wait(*request);
      status = Status{Errc::cancelled, "the parent link was replaced"};
      return std::nullopt;
    }
  }
  if (!status.ok()) return std::nullopt;
  return request->bytes();
}

void RelayEdges::read_loop(int tree) {
  std::vector<std::byte> buffer(options_.max_message_bytes);  // the receive buffer, for every parent link
  uint64_t seen = 0;
  while (!stopping_) {
    uint32_t parent;
    uint64_t generation, epoch;
    std::string url;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || parents_[tree]->generation != seen; });
      if (stopping_) return;
      const auto& slot = *parents_[tree];
      seen = generation = slot.generation;
      parent = slot.parent;
      epoch = slot.epoch;
      url = url_of(parent, tree);
    }
    auto current = [&] {
      std::lock_guard lock(mutex_);
      return !stopping_ && parents_[tree]->generation == generation;
    };
    std::shared_ptr<transport::Connection> link;
    try {
      // A parent that is busy or briefly unreachable (connection setup under load) gets a few
      // attempts before the producer hears of it.
      ConnectRetry retry;
      // An attempt to a frozen parent hangs in its handshake: keep attempts short, so that a
      // reassignment (checked between attempts) is not held up by a whole connect timeout.
      retry.attempt_timeout = std::min(options_.connect_timeout, std::max<std::chrono::milliseconds>(1000ms, options_.peer_timeout / 2));
      retry.give_up_after = std::max(options_.connect_timeout, 2 * options_.peer_timeout);
      retry.who = "rank " + std::to_string(options_.rank);
      retry.what = parent == kProducerRank ? "the producer (tree " + std::to_string(tree) + ")"
                                           : "parent rank " + std::to_string(parent);
      retry.cancelled = [&] { return !current(); };
      retry.abandoned = &abandoned_;  // a reassignment ends the handshake wait at once
      link = connect_with_retry(transport_, transport::Url::parse(url), retry);
      send_control(*link, Join{options_.rank, static_cast<uint32_t>(tree)}, options_.connect_timeout, epoch);
      const auto held = store_.resume_state();
      send_control(*link, Resume{options_.rank, static_cast<uint32_t>(tree), held.version, held.attempt, held.have},
                   options_.connect_timeout, epoch);
    } catch (const Error& e) {
      if (link) link->close();
      if (current())
        report(Report{options_.rank, parent, static_cast<uint32_t>(tree), FailureCause::unreachable, e.what()});
      continue;
    }
    {
      std::lock_guard lock(mutex_);
      if (stopping_ || parents_[tree]->generation != generation) {
        link->close();
        continue;
      }
      parents_[tree]->connection = link;
      parents_[tree]->connected_generation = generation;
    }
    changed_.notify_all();
    say_ready_when_up();
    Status status = read_from_parent(tree, *link, generation, buffer);
    {
      std::lock_guard lock(mutex_);
      if (parents_[tree]->connection == link) parents_[tree]->connection.reset();
    }
    link->close();
    if (!status.ok() && current()) {
      logger("tree")->warn("rank {}: link to parent rank {} in tree {} failed: {}", options_.rank, parent, tree,
                           status.message);
      const auto cause = status.code == Errc::corrupt_frame ? FailureCause::refused : failure_cause_of(status);
      report(Report{options_.rank, parent, static_cast<uint32_t>(tree), cause, status.message});
    }
  }
}

void RelayEdges::say_ready_when_up() {
  uint64_t epoch;
  {
    std::lock_guard lock(mutex_);
    for (const auto& slot : parents_)
      if (!slot->connection || slot->connected_generation != slot->generation) return;
    epoch = membership_->epoch();
    if (epoch == ready_epoch_) return;
    ready_epoch_ = epoch;
  }
  report(Ready{options_.rank, session_.version(), session_.digest()});
}

// Reads and relays until the link fails (its status), is replaced or this member stops
// (Errc::cancelled).
Status RelayEdges::read_from_parent(int tree, transport::Connection& parent, uint64_t generation,
                                    std::vector<std::byte>& buffer) {
  for (;;) {
    drain_children(tree);
    Status status;
    auto bytes = receive(tree, parent, generation, buffer, status);
    if (!bytes) return status;
    std::span<const std::byte> message(buffer.data(), *bytes);
    try {
      switch (message_type(message)) {
        case MessageType::frame:
          handle_frame(tree, message);
          break;
        case MessageType::raw:
          if (!handle_raw(tree, parent, generation, message, buffer, status)) return status;
          break;
        default: {
          auto decoded = decode_message(message);
          if (auto* refused = std::get_if<Refused>(&decoded))
            return Status{Errc::corrupt_frame, "the parent refused our JOIN: " + refused->message};
          throw Error(Errc::corrupt_frame, std::string("unexpected ") + message_type_name(message_type(message)) +
                                               " on a data edge");
        }
      }
    } catch (const Error& e) {
      count(&RelayStats::frames_refused);
      logger("tree")->warn("rank {}: refused a message from the parent in tree {}: {}", options_.rank, tree, e.what());
    }
    if (callbacks_.on_data) {
      const uint64_t version = session_.in_flight_version().value_or(0);
      uint64_t handled;
      {
        std::lock_guard lock(stats_mutex_);
        if (version != data_version_) {
          data_version_ = version;
          data_handled_ = 0;
        }
        handled = ++data_handled_;
      }
      callbacks_.on_data(version, handled);
    }
  }
}

void RelayEdges::handle_frame(int tree, std::span<const std::byte> message) {
  const FrameMessage fm = decode_frame_message(message);
  const codec::FrameView view = codec::parse_frame(fm.frame);
  const auto& h = view.header;
  const uint64_t attempt = fm.envelope.attempt;
  count(&RelayStats::frames_received);
  count(&RelayStats::payload_bytes, fm.frame.size());
  if (!session_.admit(Session::DataKind::frame, attempt, h.new_version, fm.envelope.new_layout,
                      options_.peer_timeout)) {
    count(&RelayStats::frames_refused);
    logger("tree")->debug("rank {}: dropped a stale frame (attempt {}, version {})", options_.rank, attempt, h.new_version);
    return;
  }
  const uint32_t chunk = h.kind == codec::FrameKind::seal ? h.chunk_count : h.chunk_index;
  auto shared = copies_.copy(message);
  {
    std::lock_guard lock(sizes_mutex_);
    frame_sizes_.push_back(message.size());
  }
  bool first;
  size_t forwarded;
  {
    std::lock_guard lock(mutex_);
    first = store_.first_sight(attempt, h.new_version, chunk, tree, shared);
    forwarded = forward_locked(tree, first, fm.envelope.route, shared, {}, nullptr);
  }
  count(&RelayStats::frames_forwarded, forwarded);
  if (!first) {
    count(&RelayStats::frames_replayed);
    return;
  }
  if (chunk == 0 || h.kind == codec::FrameKind::seal)
    logger("tree")->debug("rank {}: {} of version {} received", options_.rank,
                          h.kind == codec::FrameKind::seal ? "seal" : "first chunk", h.new_version);
  auto outcome = session_.apply_frame(attempt, view);
  if (outcome.replayed) count(&RelayStats::frames_replayed);
  if (outcome.refused) count(&RelayStats::frames_refused);
  if (outcome.reply) {
    if (std::holds_alternative<Ack>(*outcome.reply))
      logger("tree")->debug("rank {}: ack version {}", options_.rank, h.new_version);
    report(*outcome.reply);
  }
}

// One RAW piece: its header (`message`, in `scratch`) is followed by its bare body, received
// straight into the weights when the piece is new and claimed (into `scratch` otherwise, and
// passed on from there when it must be), forwarded to the children from where it landed, hashed
// there. Returns false when the link can not go on (failed, replaced, or a body that can not be
// skipped); `status` then says why.
bool RelayEdges::handle_raw(int tree, transport::Connection& parent, uint64_t generation,
                            std::span<const std::byte> message, std::span<std::byte> scratch, Status& status) {
  RawChunkHeader h;
  try {
    h = decode_raw_message(message);
  } catch (const Error& e) {
    // Without a header the body's length is unknown: the stream can not be resynchronised.
    status = Status{Errc::corrupt_frame, std::string("unreadable RAW header: ") + e.what()};
    return false;
  }
  const uint64_t attempt = h.envelope.attempt;
  count(&RelayStats::frames_received);
  count(&RelayStats::payload_bytes, h.byte_count);
  const bool admitted =
      session_.admit(Session::DataKind::raw, attempt, h.version, h.envelope.new_layout, options_.peer_timeout);
  auto header = std::make_shared<const std::vector<std::byte>>(message.begin(), message.end());
  bool first = false;
  if (admitted) {
    std::lock_guard lock(mutex_);
    first = store_.first_sight(attempt, h.version, h.chunk_index, tree, header);
  }
  std::optional<std::span<std::byte>> target;
  SharedBytes bounce;  // a placed member's: the body lands there, not in the weights
  if (first) {
    std::optional<Message> refusal;
    target = session_.claim_piece(attempt, h, refusal, &bounce);
    if (refusal) {
      count(&RelayStats::frames_refused);
      report(*refusal);
    }
  } else {
    count(admitted ? &RelayStats::frames_replayed : &RelayStats::frames_refused);
  }
  std::span<std::byte> body;
  if (target) {
    body = *target;
  } else {
    if (h.byte_count > scratch.size()) {
      status = Status{Errc::corrupt_frame, "RAW body of " + std::to_string(h.byte_count) +
                                               " bytes exceeds the receive buffer"};
      return false;
    }
    body = scratch.first(h.byte_count);
  }
  const auto received = receive(tree, parent, generation, body, status);
  const bool whole = received && *received == h.byte_count;
  if (target) {
    std::optional<uint64_t> hash;
    if (whole) hash = raw_piece_hash(h, body);
    auto reply = session_.land_piece(h, hash);
    if (whole) {
      size_t forwarded;
      {
        std::lock_guard lock(mutex_);
        // A placed member keeps no body (a whole checkpoint of bounce buffers): a child that
        // lacks the piece later gets a GAP (docs/placement.md, "Bootstrap and catch-up").
        if (bounce)
          store_.passed_on(attempt, h.chunk_index);
        else
          store_.landed(attempt, h.chunk_index, body);
        forwarded = forward_locked(tree, true, h.envelope.route, header, body, bounce);
      }
      count(&RelayStats::frames_forwarded, forwarded);
    } else {
      store_.forget(attempt, h.chunk_index);
    }
    if (reply) report(*reply);
  } else if (whole && admitted) {
    // Refused here or seen before: the children decide for themselves (a refused piece goes on
    // on first sight; a routed re-send goes on towards its member).
    auto copy = std::make_shared<const std::vector<std::byte>>(body.begin(), body.end());
    std::lock_guard lock(mutex_);
    if (first) store_.landed(attempt, h.chunk_index, *copy, copy);  // served to a child that joins later
    count(&RelayStats::frames_forwarded,
          forward_locked(tree, first, h.envelope.route, header, std::span(*copy), copy));
  }
  if (received && !whole) status = Status{Errc::corrupt_frame, "RAW body shorter than announced"};
  return whole;
}

}  // namespace deltacast::tree
