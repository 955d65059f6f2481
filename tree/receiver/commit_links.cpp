#include "tree/receiver/commit_links.h"

namespace deltacast::tree {

CommitLinks::Link::Link(uint64_t link_id, const std::shared_ptr<transport::Connection>& c, uint32_t peer)
    : id(link_id),
      connection(c),
      out(std::make_shared<OutboundLink>(std::make_unique<SharedConnection>(c), peer, -1)) {}

void CommitLinks::Link::send(const Message& message, uint64_t epoch) {
  if (out->dead()) throw Error(Errc::connection, "the commit link failed");
  out->post(std::make_shared<const std::vector<std::byte>>(encode_message(message, epoch)));
}

void CommitLinks::Link::close() {
  if (out) out->cancel_all();
  if (connection) connection->close();
}

CommitLinks::CommitLinks(transport::Transport& transport, const ReceiverOptions& options, ControlInbox& inbox,
                         ProducerLink& producer, CommitHere commit_here, std::shared_ptr<spdlog::logger> log)
    : transport_(transport),
      options_(options),
      inbox_(inbox),
      producer_(producer),
      commit_here_(std::move(commit_here)),
      log_(std::move(log)),
      decision_(options.rank, hooks()) {}

CommitLinks::~CommitLinks() {
  delegate_link_.close();
  for (auto& [rank, link] : member_links_) link.close();
  connectors_.join_all();
}

DelegatedCommit::Hooks CommitLinks::hooks() {
  DelegatedCommit::Hooks hooks;
  hooks.live = [this](uint32_t rank) { return producer_.membership().live(rank); };
  hooks.to_delegate = [this](uint32_t delegate, const Message& m) { send_to_delegate(delegate, m); };
  hooks.to_member = [this](uint32_t rank, const Message& m) { send_to_member(rank, m); };
  hooks.to_producer = [this](const Message& m) { producer_.send(m); };
  hooks.commit_here = [this](const Commit& c) {
    return commit_here_(c, [](const Message&) {});  // the delegate's own ACTIVE goes in its DECIDED
  };
  return hooks;
}

void CommitLinks::handle(ControlInput& input) {
  switch (input.kind) {
    case ControlInput::Kind::own_answer:
      decision_.own_answer(*input.event.message);
      return;
    case ControlInput::Kind::delegate_link:
      return delegate_connected(input);
    case ControlInput::Kind::from_delegate:
      return from_delegate(input);
    case ControlInput::Kind::member_link:
      return member_connected(input);
    case ControlInput::Kind::from_member:
      return from_member(input);
    case ControlInput::Kind::producer:
      return;
  }
}

void CommitLinks::send_to_delegate(uint32_t delegate, const Message& message) {
  if (delegate != delegate_) {  // a new delegate: the old link is of no use
    delegate_link_.close();
    delegate_link_ = {};
    outbox_.clear();
    delegate_ = delegate;
  }
  if (delegate_link_) {
    delegate_link_.send(message, producer_.epoch());
    return;
  }
  outbox_.push_back(message);
  connect_delegate();
}

void CommitLinks::connect_delegate() {
  if (connecting_ || delegate_link_ || outbox_.empty() || delegate_ == 0) return;
  connecting_ = true;
  const uint32_t delegate = delegate_;
  const std::string url = producer_.url_of(delegate);
  connectors_.spawn([this, delegate, url] {
    ControlInput input;
    input.kind = ControlInput::Kind::delegate_link;
    input.event.rank = delegate;
    try {
      input.connection = transport_.connect(transport::Url::parse(url), options_.connect_timeout);
    } catch (const Error& e) {
      input.event.status = e.status();
    }
    inbox_.push(std::move(input));
  });
}

void CommitLinks::delegate_connected(const ControlInput& input) {
  const ControlEvent& event = input.event;
  connecting_ = false;
  if (event.rank != delegate_ || !input.connection) {
    if (input.connection) input.connection->close();
    if (event.rank == delegate_) {
      // The producer has this member's answer too: it decides if the delegate is gone.
      log_->warn("{}: could not reach the commit delegate (rank {}): {}", who(), event.rank, event.status.message);
      outbox_.clear();
    }
    connect_delegate();  // a newer delegate's answers waited for this attempt to end
    return;
  }
  delegate_link_ =
      Link(inbox_.read(ControlInput::Kind::from_delegate, event.rank, input.connection), input.connection, event.rank);
  try {
    for (const auto& m : outbox_) delegate_link_.send(m, producer_.epoch());
  } catch (const Error& e) {
    log_->warn("{}: commit link to rank {} failed: {}", who(), event.rank, e.what());
  }
  outbox_.clear();
}

void CommitLinks::from_delegate(const ControlInput& input) {
  const ControlEvent& event = input.event;
  if (!delegate_link_ || input.link() != delegate_link_.id) return;  // an older link
  if (!event.message) {
    log_->info("{}: commit link to rank {} closed: {}", who(), event.rank, event.status.message);
    delegate_link_.close();
    delegate_link_ = {};
    delegate_ = 0;
    return;
  }
  if (auto* commit = std::get_if<Commit>(&*event.message)) {
    commit_here_(*commit, [&](const Message& m) {
      try {
        delegate_link_.send(m, producer_.epoch());
      } catch (const Error& e) {
        log_->warn("{}: could not answer the delegate's COMMIT: {}", who(), e.what());
      }
    });
  }
}

void CommitLinks::send_to_member(uint32_t rank, const Message& message) {
  auto it = member_links_.find(rank);
  if (it == member_links_.end()) throw Error(Errc::connection, "no commit link from rank " + std::to_string(rank));
  it->second.send(message, producer_.epoch());
}

void CommitLinks::member_connected(const ControlInput& input) {
  const Message& first = *input.event.message;
  const uint32_t rank = std::holds_alternative<Ack>(first) ? std::get<Ack>(first).rank : std::get<Nack>(first).rank;
  if (auto old = member_links_.find(rank); old != member_links_.end()) old->second.close();
  const uint64_t id = inbox_.read(ControlInput::Kind::from_member, rank, input.connection);
  member_links_[rank] = Link(id, input.connection, rank);
  decision_.from_member(rank, first);
}

void CommitLinks::from_member(const ControlInput& input) {
  const ControlEvent& event = input.event;
  auto it = member_links_.find(event.rank);
  if (it == member_links_.end() || it->second.id != input.link()) return;  // an older link
  if (!event.message) {
    it->second.close();
    member_links_.erase(it);
    decision_.link_lost(event.rank);
  } else {
    decision_.from_member(event.rank, *event.message);
  }
}

}  // namespace deltacast::tree
