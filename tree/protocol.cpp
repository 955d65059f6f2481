#include "tree/protocol.h"

#include <cstring>
#include <string_view>
#include <type_traits>

#include "codec/xxh3.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

// Upper bound on any length field inside a control message: they are small; this refuses
// absurd counts before allocating.
constexpr uint64_t kMaxControlField = uint64_t{1} << 28;

class Writer {
 public:
  explicit Writer(MessageType type) {
    bytes_.resize(kMessageHeaderSize);
    put_at(0, kMessageMagic);
    bytes_[4] = static_cast<std::byte>(type);
  }
  template <typename T>
  void put(T value) {
    static_assert(std::is_integral_v<T>);
    size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    put_at(at, value);
  }
  void put_string(std::string_view s) {
    put(static_cast<uint32_t>(s.size()));
    append(reinterpret_cast<const std::byte*>(s.data()), s.size());
  }
  void put_bitmap(const std::vector<bool>& bits) {
    put(static_cast<uint32_t>(bits.size()));
    std::vector<std::byte> packed((bits.size() + 7) / 8);
    for (size_t i = 0; i < bits.size(); ++i)
      if (bits[i]) packed[i / 8] |= static_cast<std::byte>(1u << (i % 8));
    append(packed.data(), packed.size());
  }
  void append(const std::byte* data, size_t size) {
    bytes_.insert(bytes_.end(), data, data + size);
  }
  std::vector<std::byte> finish() {
    put_at(8, static_cast<uint64_t>(bytes_.size() - kMessageHeaderSize));
    return std::move(bytes_);
  }

 private:
  template <typename T>
  void put_at(size_t at, T value) {
    for (size_t i = 0; i < sizeof(T); ++i)
      bytes_[at + i] = static_cast<std::byte>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff);
  }
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> body, const char* what) : body_(body), what_(what) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<uint64_t>(std::to_integer<uint8_t>(body_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  uint32_t get_count() {
    uint32_t n = get<uint32_t>();
    if (n > kMaxControlField) fail("count too large");
    return n;
  }
  std::string get_string() {
    uint32_t n = get_count();
    need(n);
    std::string s(reinterpret_cast<const char*>(body_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::vector<bool> get_bitmap() {
    uint32_t n = get_count();
    size_t packed = (size_t{n} + 7) / 8;
    need(packed);
    std::vector<bool> bits(n);
    for (uint32_t i = 0; i < n; ++i)
      bits[i] = (std::to_integer<uint8_t>(body_[pos_ + i / 8]) >> (i % 8)) & 1u;
    pos_ += packed;
    return bits;
  }
  void finish() const {
    if (pos_ != body_.size()) fail("trailing bytes");
  }
  [[noreturn]] void fail(const char* problem) const {
    throw Error(Errc::corrupt_frame,
                std::string("protocol message ") + what_ + ": " + problem);
  }

 private:
  void need(size_t n) const {
    if (body_.size() - pos_ < n) fail("truncated");
  }
  std::span<const std::byte> body_;
  size_t pos_ = 0;
  const char* what_;
};

uint64_t load_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

struct EncodeVisitor {
  std::vector<std::byte> operator()(const Hello& m) const {
    Writer w(MessageType::hello);
    w.put(m.rank);
    w.put_string(m.data_url);
    w.put_string(m.cluster);
    w.put(m.held_version);
    w.put(m.held_digest);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Welcome& m) const {
    Writer w(MessageType::welcome);
    w.put(m.session);
    w.put_string(m.topology);
    w.put(m.max_message_bytes);
    w.put(static_cast<uint32_t>(m.members.size()));
    for (const auto& member : m.members) {
      w.put(member.rank);
      w.put_string(member.url);
      w.put_string(member.cluster);
    }
    w.put(static_cast<uint32_t>(m.tensors.size()));
    for (const auto& t : m.tensors) {
      w.put_string(t.name);
      w.put(static_cast<uint8_t>(t.dtype));
      w.put(static_cast<uint32_t>(t.shape.size()));
      for (uint64_t d : t.shape) w.put(d);
    }
    return w.finish();
  }
  std::vector<std::byte> operator()(const Join& m) const {
    Writer w(MessageType::join);
    w.put(m.rank);
    w.put(m.tree);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Ready& m) const {
    Writer w(MessageType::ready);
    w.put(m.rank);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Ack& m) const {
    Writer w(MessageType::ack);
    w.put(m.rank);
    w.put(m.version);
    w.put(m.digest);
    w.put(m.applied_changes);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Nack& m) const {
    Writer w(MessageType::nack);
    w.put(m.rank);
    w.put(m.version);
    w.put(m.errc);
    w.put_string(m.message);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Commit& m) const {
    Writer w(MessageType::commit);
    w.put(m.version);
    w.put(m.digest);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Abort& m) const {
    Writer w(MessageType::abort);
    w.put(m.version);
    w.put_string(m.reason);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Active& m) const {
    Writer w(MessageType::active);
    w.put(m.rank);
    w.put(m.version);
    w.put(m.digest);
    return w.finish();
  }
  std::vector<std::byte> operator()(const HaveRequest& m) const {
    Writer w(MessageType::have_request);
    w.put(m.version);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Have& m) const {
    Writer w(MessageType::have);
    w.put(m.rank);
    w.put(m.version);
    w.put_bitmap(m.chunks);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Resume& m) const {
    Writer w(MessageType::resume);
    w.put(m.rank);
    w.put(m.version);
    w.put_bitmap(m.have);
    return w.finish();
  }
  std::vector<std::byte> operator()(const Bye&) const { return Writer(MessageType::bye).finish(); }
};

}  // namespace

const char* message_type_name(MessageType type) noexcept {
  switch (type) {
    case MessageType::hello: return "hello";
    case MessageType::welcome: return "welcome";
    case MessageType::join: return "join";
    case MessageType::ready: return "ready";
    case MessageType::frame: return "frame";
    case MessageType::ack: return "ack";
    case MessageType::nack: return "nack";
    case MessageType::commit: return "commit";
    case MessageType::abort: return "abort";
    case MessageType::active: return "active";
    case MessageType::have_request: return "have_request";
    case MessageType::have: return "have";
    case MessageType::resume: return "resume";
    case MessageType::bye: return "bye";
    case MessageType::raw: return "raw";
  }
  return "unknown";
}

std::vector<std::byte> encode_message(const Message& message) {
  return std::visit(EncodeVisitor{}, message);
}

std::vector<std::byte> encode_frame_message(std::span<const std::byte> frame) {
  Writer w(MessageType::frame);
  w.append(frame.data(), frame.size());
  return w.finish();
}

std::vector<std::byte> encode_raw_message(const RawChunkHeader& header) {
  Writer w(MessageType::raw);
  w.put(header.version);
  w.put(header.chunk_index);
  w.put(header.chunk_count);
  w.put(header.tensor);
  w.put(header.byte_offset);
  w.put(header.byte_count);
  return w.finish();
}

RawChunkHeader decode_raw_message(std::span<const std::byte> message) {
  if (message_type(message) != MessageType::raw)
    throw Error(Errc::corrupt_frame, "protocol message is not RAW");
  auto body = message.subspan(kMessageHeaderSize);
  if (body.size() != kRawPrefixSize)
    throw Error(Errc::corrupt_frame, "RAW message of " + std::to_string(body.size()) +
                                         " body bytes, expected " + std::to_string(kRawPrefixSize));
  Reader r(body, "raw");
  RawChunkHeader h;
  h.version = r.get<uint64_t>();
  h.chunk_index = r.get<uint32_t>();
  h.chunk_count = r.get<uint32_t>();
  h.tensor = r.get<uint32_t>();
  h.byte_offset = r.get<uint64_t>();
  h.byte_count = r.get<uint64_t>();
  if (h.chunk_index >= h.chunk_count)
    throw Error(Errc::corrupt_frame, "RAW chunk index " + std::to_string(h.chunk_index) +
                                         " out of " + std::to_string(h.chunk_count));
  return h;
}

uint64_t raw_piece_hash(const RawChunkHeader& header, std::span<const std::byte> bytes) noexcept {
  const uint64_t where[2] = {header.tensor, header.byte_offset};
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), XXH3_64bits(where, sizeof where));
}

MessageType message_type(std::span<const std::byte> message) {
  if (message.size() < kMessageHeaderSize)
    throw Error(Errc::corrupt_frame, "protocol message shorter than its 16-byte header (" +
                                         std::to_string(message.size()) + " bytes)");
  uint32_t magic = static_cast<uint32_t>(load_u64(message.data()) & 0xffffffffu);
  if (magic != kMessageMagic)
    throw Error(Errc::corrupt_frame, "protocol message has a bad magic number");
  uint64_t body = load_u64(message.data() + 8);
  if (body != message.size() - kMessageHeaderSize)
    throw Error(Errc::corrupt_frame, "protocol message body size " + std::to_string(body) +
                                         " does not match the " +
                                         std::to_string(message.size() - kMessageHeaderSize) +
                                         " bytes received");
  auto type = static_cast<MessageType>(std::to_integer<uint8_t>(message[4]));
  if (std::string_view(message_type_name(type)) == "unknown")
    throw Error(Errc::corrupt_frame, "protocol message has unknown type " +
                                         std::to_string(std::to_integer<int>(message[4])));
  return type;
}

std::span<const std::byte> frame_payload(std::span<const std::byte> message) {
  if (message_type(message) != MessageType::frame)
    throw Error(Errc::corrupt_frame, "protocol message is not a FRAME");
  return message.subspan(kMessageHeaderSize);
}

Message decode_message(std::span<const std::byte> message) {
  MessageType type = message_type(message);
  Reader r(message.subspan(kMessageHeaderSize), message_type_name(type));
  Message out;
  switch (type) {
    case MessageType::hello: {
      Hello m;
      m.rank = r.get<uint32_t>();
      m.data_url = r.get_string();
      m.cluster = r.get_string();
      m.held_version = r.get<uint64_t>();
      m.held_digest = r.get<uint64_t>();
      out = std::move(m);
      break;
    }
    case MessageType::welcome: {
      Welcome m;
      m.session = r.get<uint64_t>();
      m.topology = r.get_string();
      m.max_message_bytes = r.get<uint64_t>();
      uint32_t members = r.get_count();
      for (uint32_t i = 0; i < members; ++i) {
        Member member;
        member.rank = r.get<uint32_t>();
        member.url = r.get_string();
        member.cluster = r.get_string();
        m.members.push_back(std::move(member));
      }
      uint32_t tensors = r.get_count();
      for (uint32_t i = 0; i < tensors; ++i) {
        codec::TensorInfo t;
        t.name = r.get_string();
        auto dtype = codec::dtype_from_wire(r.get<uint8_t>());
        if (!dtype) r.fail("unknown dtype");
        t.dtype = *dtype;
        uint32_t dims = r.get_count();
        for (uint32_t d = 0; d < dims; ++d) t.shape.push_back(r.get<uint64_t>());
        m.tensors.push_back(std::move(t));
      }
      out = std::move(m);
      break;
    }
    case MessageType::join: {
      Join m;
      m.rank = r.get<uint32_t>();
      m.tree = r.get<uint32_t>();
      out = m;
      break;
    }
    case MessageType::ready: out = Ready{r.get<uint32_t>()}; break;
    case MessageType::ack: {
      Ack m;
      m.rank = r.get<uint32_t>();
      m.version = r.get<uint64_t>();
      m.digest = r.get<uint64_t>();
      m.applied_changes = r.get<uint64_t>();
      out = m;
      break;
    }
    case MessageType::nack: {
      Nack m;
      m.rank = r.get<uint32_t>();
      m.version = r.get<uint64_t>();
      m.errc = r.get<uint32_t>();
      m.message = r.get_string();
      out = std::move(m);
      break;
    }
    case MessageType::commit: {
      Commit m;
      m.version = r.get<uint64_t>();
      m.digest = r.get<uint64_t>();
      out = m;
      break;
    }
    case MessageType::abort: {
      Abort m;
      m.version = r.get<uint64_t>();
      m.reason = r.get_string();
      out = std::move(m);
      break;
    }
    case MessageType::active: {
      Active m;
      m.rank = r.get<uint32_t>();
      m.version = r.get<uint64_t>();
      m.digest = r.get<uint64_t>();
      out = m;
      break;
    }
    case MessageType::have_request: out = HaveRequest{r.get<uint64_t>()}; break;
    case MessageType::have: {
      Have m;
      m.rank = r.get<uint32_t>();
      m.version = r.get<uint64_t>();
      m.chunks = r.get_bitmap();
      out = std::move(m);
      break;
    }
    case MessageType::resume: {
      Resume m;
      m.rank = r.get<uint32_t>();
      m.version = r.get<uint64_t>();
      m.have = r.get_bitmap();
      out = std::move(m);
      break;
    }
    case MessageType::bye: out = Bye{}; break;
    case MessageType::frame:
      throw Error(Errc::corrupt_frame, "FRAME is not a control message (use frame_payload)");
    case MessageType::raw:
      throw Error(Errc::corrupt_frame, "RAW is not a control message (use decode_raw_message)");
  }
  r.finish();
  return out;
}

}  // namespace deltacast::tree
