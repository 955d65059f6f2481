#pragma once
// The one queue a live member's control thread serves (tree/receiver_serve.cpp), in arrival order:
// the producer's messages, the commit links' messages (docs/protocol.md, "Delegated commit"), this
// member's own answers, and the links a delegated commit opened or accepted. Each link read into
// it gets an id; a link's kind and id travel in its ControlEvent's generation (kind in the low
// three bits), so a message of a link already replaced is told apart from its successor's.
//
//  * open() starts the readers of one producer connection, after dropping (and closing) what the
//    last one left queued; close() stops and joins them. Link ids keep counting across
//    connections.
//
// Thread-safety: push(): any thread. The rest: the control thread.
#include <cstdint>
#include <memory>
#include <optional>

#include "transport/transport.h"
#include "tree/relay_link.h"

namespace deltacast::tree {

// One input of the control thread.
struct ControlInput {
  enum class Kind : uint64_t {
    producer = 0,       // a message on the producer's link (or its failure)
    from_delegate = 1,  // ... on the link to this member's commit delegate
    from_member = 2,    // ... on a member's link to this delegate
    own_answer = 3,     // this member's ACK or NACK, after the producer was sent it
    delegate_link = 4,  // the link to the delegate connected (or failed: connection null)
    member_link = 5     // a member opened a commit link here (its first message)
  };
  Kind kind = Kind::producer;
  ControlEvent event;                                 // rank, message (or the link's failure)
  std::shared_ptr<transport::Connection> connection;  // delegate_link (connected, or null), member_link
  // The id of the link a message came on (producer, from_delegate, from_member).
  uint64_t link() const { return event.generation >> 3; }
};

class ControlInbox {
 public:
  void push(ControlInput input) { inputs_.push(std::move(input)); }
  std::optional<ControlInput> pop(std::chrono::milliseconds timeout) { return inputs_.pop(timeout); }

  void open();
  // Reads `connection` as a link of `kind` (producer, from_delegate or from_member) until close();
  // returns its id. max_bytes: its largest message (0: kControlBufferBytes).
  uint64_t read(ControlInput::Kind kind, uint32_t rank, std::shared_ptr<transport::Connection> connection,
                size_t max_bytes = 0);
  void close();

 private:
  EventQueue<ControlInput> inputs_;
  std::unique_ptr<ControlReaders> readers_;  // while a producer connection is served
  uint64_t next_link_ = 1;
};

}  // namespace deltacast::tree
