#pragma once
// Relay-tree protocol messages (docs/protocol.md is the reference; keep the two in step).
// Every message is a 16-byte header (magic, type, body size) followed by a body. FRAME messages
// carry a codec frame verbatim so a relay forwards the received bytes without touching them.
// Encoding and decoding are pure functions: no I/O, thread-safe.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "codec/manifest.h"

namespace deltacast::tree {

inline constexpr uint32_t kMessageMagic = 0x4D544344;  // "DCTM" little-endian
inline constexpr size_t kMessageHeaderSize = 16;

enum class MessageType : uint8_t {
  hello = 1,
  welcome = 2,
  join = 3,
  ready = 4,
  frame = 5,
  ack = 6,
  nack = 7,
  commit = 8,
  abort = 9,
  active = 10,
  have_request = 11,
  have = 12,
  resume = 13,
  bye = 14,
  raw = 15,  // bootstrap: raw checkpoint bytes, forwarded verbatim like FRAME
};

struct Member {
  uint32_t rank = 0;
  std::string url;      // where this member's listener accepts JOIN / HELLO
  std::string cluster;  // cluster label (topology may keep subtrees inside a cluster)
};

struct Hello {
  uint32_t rank = 0;
  std::string data_url;
  std::string cluster;
  uint64_t held_version = 0;
  uint64_t held_digest = 0;
};
struct Welcome {
  uint64_t session = 0;
  std::string topology;
  uint64_t max_message_bytes = 0;  // largest message any link carries (receive buffer size)
  std::vector<Member> members;     // rank 0 = producer
  std::vector<codec::TensorInfo> tensors;
};
struct Join {
  uint32_t rank = 0;
  uint32_t tree = 0;
};
struct Ready {
  uint32_t rank = 0;
};
struct Ack {
  uint32_t rank = 0;
  uint64_t version = 0;
  uint64_t digest = 0;
  uint64_t applied_changes = 0;
};
struct Nack {
  uint32_t rank = 0;
  uint64_t version = 0;
  uint32_t errc = 0;
  std::string message;
};
struct Commit {
  uint64_t version = 0;
  uint64_t digest = 0;
};
struct Abort {
  uint64_t version = 0;
  std::string reason;
};
struct Active {
  uint32_t rank = 0;
  uint64_t version = 0;
  uint64_t digest = 0;
};
struct HaveRequest {
  uint64_t version = 0;
};
struct Have {
  uint32_t rank = 0;
  uint64_t version = 0;
  std::vector<bool> chunks;  // bit i: chunk i applied
};
struct Resume {
  uint32_t rank = 0;
  uint64_t version = 0;
  std::vector<bool> have;  // bit i: chunk i already held, do not resend
};
struct Bye {};

// A decoded control message. FRAME messages are not decoded into this: use frame_payload().
using Message = std::variant<Hello, Welcome, Join, Ready, Ack, Nack, Commit, Abort, Active,
                             HaveRequest, Have, Resume, Bye>;

// A RAW message announces one piece of the full checkpoint for the bootstrap version (base = all
// zeros): a fixed 36-byte prefix and nothing else. The piece's bytes follow on the same data edge
// as the very next message, bare (no message header), so that a receiver can receive them straight
// into tensor `tensor` at byte `byte_offset` and forward them from there (no copy at any relay).
struct RawChunkHeader {
  uint64_t version = 0;     // the version these bytes create (the receiver holds version - 1 = 0)
  uint32_t chunk_index = 0;
  uint32_t chunk_count = 0;
  uint32_t tensor = 0;
  uint64_t byte_offset = 0;
  uint64_t byte_count = 0;  // size of the bare body message that follows
};
inline constexpr size_t kRawPrefixSize = 8 + 4 + 4 + 4 + 8 + 8;

// Builds a RAW message (header + prefix; the body is sent separately).
std::vector<std::byte> encode_raw_message(const RawChunkHeader& header);
// Parses a RAW message. Throws Error(corrupt_frame).
RawChunkHeader decode_raw_message(std::span<const std::byte> message);
// The verification hash of one piece as it lies in the receiver's buffers: XXH3-64 of the bytes,
// seeded with where they lie. A bootstrap is verified by the sum (mod 2^64) of its pieces' hashes,
// which does not depend on the order in which pieces arrive (double binary trees interleave them).
uint64_t raw_piece_hash(const RawChunkHeader& header, std::span<const std::byte> bytes) noexcept;

// Serialises a control message (header + body).
std::vector<std::byte> encode_message(const Message& message);
// Wraps a codec frame into a FRAME message (one copy; relays forward the result verbatim).
std::vector<std::byte> encode_frame_message(std::span<const std::byte> frame);

// Reads the type from a message's header after checking magic and that body_size matches the
// buffer. Throws Error(corrupt_frame) naming the problem.
MessageType message_type(std::span<const std::byte> message);
// The codec frame inside a FRAME message. Throws Error(corrupt_frame) if it is not one.
std::span<const std::byte> frame_payload(std::span<const std::byte> message);
// Decodes a control message completely (trailing bytes are refused). Throws
// Error(corrupt_frame) for truncation, unknown type, or FRAME (which has no Message form).
Message decode_message(std::span<const std::byte> message);

// Lowercase name of a message type ("hello"), "unknown" otherwise.
const char* message_type_name(MessageType type) noexcept;

}  // namespace deltacast::tree
