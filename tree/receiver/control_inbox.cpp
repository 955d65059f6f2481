#include "tree/receiver/control_inbox.h"

namespace deltacast::tree {

void ControlInbox::open() {
  while (auto stale = inputs_.pop(std::chrono::milliseconds(0)))
    if (stale->connection) stale->connection->close();
  readers_ = std::make_unique<ControlReaders>(kControlBufferBytes, [this](ControlEvent e) {
    ControlInput input;
    input.kind = static_cast<ControlInput::Kind>(e.generation & 7);
    input.event = std::move(e);
    inputs_.push(std::move(input));
  });
}

uint64_t ControlInbox::read(ControlInput::Kind kind, uint32_t rank, std::shared_ptr<transport::Connection> connection,
                            size_t max_bytes) {
  const uint64_t id = next_link_++;
  readers_->add(rank, (id << 3) | static_cast<uint64_t>(kind), std::move(connection), max_bytes);
  return id;
}

void ControlInbox::close() {
  if (readers_) readers_->stop();
  readers_.reset();
}

}  // namespace deltacast::tree
