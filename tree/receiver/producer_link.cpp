#include "tree/receiver/producer_link.h"

#include <algorithm>

#include "tree/connect_retry.h"
#include "tree/relay_link.h"

namespace deltacast::tree {

ProducerLink::ProducerLink(transport::Transport& transport, const ReceiverOptions& options)
    : transport_(transport), options_(options), instance_(random_instance()) {}

ProducerLink::Welcomed ProducerLink::hello(Hello hello, std::chrono::milliseconds patience, bool rejoin) {
  const auto start = std::chrono::steady_clock::now();
  ConnectRetry retry;
  retry.attempt_timeout = options_.connect_timeout;
  retry.give_up_after = patience;
  retry.who = who();
  std::shared_ptr<transport::Connection> link =
      connect_with_retry(transport_, transport::Url::parse(options_.producer_url), retry);
  hello.instance = instance_;
  send_control(*link, hello, kControlSendTimeout);
  auto welcome_wait = options_.join_timeout;
  if (rejoin) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(patience - (std::chrono::steady_clock::now() - start));
    welcome_wait = std::min(welcome_wait, std::max(left, options_.peer_timeout));
  }
  auto bytes = recv_message(*link, kWelcomeBufferBytes, welcome_wait);
  const uint64_t epoch = message_header(bytes).epoch;
  auto message = decode_message(bytes);
  if (auto* refused = std::get_if<Refused>(&message))
    throw Error(static_cast<Errc>(refused->errc), "the producer refused " + who() + ": " + refused->message);
  auto* welcome = std::get_if<Welcome>(&message);
  if (!welcome) throw Error(Errc::corrupt_frame, "the producer's first message is not WELCOME");
  {
    std::lock_guard lock(mutex_);
    link_ = std::move(link);
  }
  return Welcomed{std::move(*welcome), epoch};
}

void ProducerLink::take(Welcome welcome, Membership membership) {
  std::lock_guard lock(mutex_);
  membership_.emplace(std::move(membership));
  welcome_ = std::move(welcome);
}

bool ProducerLink::apply_epoch(const EpochUpdate& update, uint64_t epoch) {
  std::lock_guard lock(mutex_);
  if (epoch <= membership_->epoch()) return false;
  if (!update.producer_urls.empty() && update.producer_urls.size() != welcome_.producer_urls.size())
    throw Error(Errc::corrupt_frame, "EPOCH lists " + std::to_string(update.producer_urls.size()) +
                                         " producer ranks' data URLs; the group has " +
                                         std::to_string(welcome_.producer_urls.size()));
  membership_->apply(epoch, update.dead, update.joined, update.moves);
  for (const auto& m : update.joined)
    if (m.rank < welcome_.members.size()) welcome_.members[m.rank] = m;
  if (!update.producer_urls.empty()) welcome_.producer_urls = update.producer_urls;
  return true;
}

Message ProducerLink::recv(std::chrono::milliseconds timeout, std::span<std::byte> buffer, uint64_t* epoch_out) {
  auto link = connection();
  auto request = link->post_recv(buffer);
  Status status = request->wait(timeout);
  if (status.code == Errc::timeout) {
    cancel_and_wait(*request);
    if (!request->status().ok())
      throw Error(Errc::timeout, "no word from the producer for " + std::to_string(timeout.count()) + " ms");
    status = request->status();
  }
  if (!status.ok()) throw Error(Errc::connection, "link to the producer failed: " + status.message);
  std::span<const std::byte> bytes(buffer.data(), request->bytes());
  if (epoch_out) *epoch_out = message_header(bytes).epoch;
  return decode_message(bytes);
}

void ProducerLink::drop() {
  std::lock_guard lock(mutex_);
  if (link_) link_->close();
  link_.reset();
}

std::string ProducerLink::url_of(uint32_t rank) const {
  if (rank >= welcome_.members.size()) throw Error(Errc::invalid_argument, "no member of rank " + std::to_string(rank));
  return welcome_.members[rank].url;
}

std::shared_ptr<transport::Connection> ProducerLink::connection() const {
  std::lock_guard lock(mutex_);
  return link_;
}

void ProducerLink::send(const Message& message) {
  std::shared_ptr<transport::Connection> link;
  uint64_t epoch;
  {
    std::lock_guard lock(mutex_);
    link = link_;
    epoch = membership_ ? membership_->epoch() : 0;
  }
  if (!link) throw Error(Errc::connection, "no link to the producer");
  send_control(*link, message, kControlSendTimeout, epoch);
}

uint64_t ProducerLink::epoch() const {
  std::lock_guard lock(mutex_);
  return membership_ ? membership_->epoch() : 0;
}

void ProducerLink::leave() {
  leaving_ = true;
  std::lock_guard lock(mutex_);
  if (link_) link_->close();
}

}  // namespace deltacast::tree
