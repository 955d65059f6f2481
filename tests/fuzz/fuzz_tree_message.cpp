// fuzz_tree_message: one relay-tree message (tree/protocol.h) through the decoder a member or the
// producer runs on every message it receives.
//
// Input: the message bytes.
// Oracles:
//   * decoding throws nothing but Error(corrupt_frame);
//   * the wire encoding is canonical (docs/protocol.md: bools 0/1, enums range-checked, bitmap
//     padding zero, no trailing bytes), so a control message that decodes re-encodes, with its
//     header's epoch, to exactly the input bytes; so does a FRAME message (envelope + payload);
//   * a decoded FRAME message's payload lies inside the input.
#include <string>
#include <variant>

#include "fuzz_common.h"
#include "tree/protocol.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltacast;
  const std::vector<std::byte> message(reinterpret_cast<const std::byte*>(data),
                                       reinterpret_cast<const std::byte*>(data) + size);
  tree::MessageHeader header;
  try {
    header = tree::message_header(message);
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == Errc::corrupt_frame, std::string("message_header threw ") + e.what());
    return 0;
  }
  FUZZ_CHECK(header.body_size == size - tree::kMessageHeaderSize, "body size does not match the message");
  try {
    if (header.type == tree::MessageType::frame) {
      const tree::FrameMessage m = tree::decode_frame_message(message);
      FUZZ_CHECK(m.frame.data() >= message.data() && m.frame.data() + m.frame.size() == message.data() + size,
                 "the frame payload is not the message's tail");
      FUZZ_CHECK(fuzz::same_bytes(tree::encode_frame_message(m.frame, m.envelope, header.epoch), message),
                 "a FRAME message does not re-encode to its bytes");
    } else if (header.type == tree::MessageType::raw) {
      const tree::RawChunkHeader h = tree::decode_raw_message(message);
      FUZZ_CHECK(fuzz::same_bytes(tree::encode_raw_message(h, header.epoch), message),
                 "a RAW message does not re-encode to its bytes");
    } else {
      const tree::Message m = tree::decode_message(message);
      FUZZ_CHECK(tree::message_type(message) == header.type, "message_type disagrees with message_header");
      const auto again = tree::encode_message(m, header.epoch);
      FUZZ_CHECK(fuzz::same_bytes(again, message),
                 std::string("a ") + tree::message_type_name(header.type) + " message does not re-encode to its bytes");
      FUZZ_CHECK(tree::decode_message(again).index() == m.index(), "decoded alternative changed");
    }
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == Errc::corrupt_frame, "decoding threw " + std::string(errc_name(e.code())) + ": " + e.what());
  }
  return 0;
}
