#include "tree/protocol.h"

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdio>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "codec/dtype.h"
#include "codec/xxh3.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

// ---------------------------------------------------------------------------------------------
// The schema: every struct that goes on the wire lists its fields here, once, in wire order
// (= declaration order in protocol.h). The encoder and the decoder below both walk these lists;
// adding a message means adding its Schema (and its alternative in Message).
// ---------------------------------------------------------------------------------------------

template <class S, class F>
struct Field {
  using Type = F;
  const char* name;
  F S::*member;
};
template <class S, class F>
constexpr Field<S, F> field(const char* name, F S::*member) {
  return {name, member};
}

template <class T>
struct Schema;  // no definition: a type without a Schema cannot be sent

// Parts of messages.
template <>
struct Schema<Member> {
  static constexpr auto fields = std::tuple{field("rank", &Member::rank), field("url", &Member::url),
                                            field("cluster", &Member::cluster), field("live", &Member::live)};
};
template <>
struct Schema<TreeEdge> {
  static constexpr auto fields =
      std::tuple{field("rank", &TreeEdge::rank), field("tree", &TreeEdge::tree), field("parent", &TreeEdge::parent)};
};
template <>
struct Schema<DeadMember> {
  static constexpr auto fields = std::tuple{field("rank", &DeadMember::rank), field("cause", &DeadMember::cause)};
};
template <>
struct Schema<codec::TensorInfo> {
  static constexpr auto fields =
      std::tuple{field("name", &codec::TensorInfo::name), field("dtype", &codec::TensorInfo::dtype),
                 field("shape", &codec::TensorInfo::shape)};
};
template <>
struct Schema<NamedBytes> {
  static constexpr auto fields = std::tuple{field("name", &NamedBytes::name), field("bytes", &NamedBytes::bytes)};
};
template <>
struct Schema<ShardLayout> {
  static constexpr auto fields = std::tuple{field("file", &ShardLayout::file), field("tensors", &ShardLayout::tensors),
                                            field("metadata", &ShardLayout::metadata)};
};
template <>
struct Schema<CheckpointLayout> {
  static constexpr auto fields =
      std::tuple{field("sharded", &CheckpointLayout::sharded), field("shards", &CheckpointLayout::shards),
                 field("index_metadata_json", &CheckpointLayout::index_metadata_json),
                 field("files", &CheckpointLayout::files)};
};
// A RAW message's body: the envelope (its fixed layout: see Encoder::value), then the 36-byte prefix.
template <>
struct Schema<RawChunkHeader> {
  static constexpr auto fields =
      std::tuple{field("envelope", &RawChunkHeader::envelope),       field("version", &RawChunkHeader::version),
                 field("chunk_index", &RawChunkHeader::chunk_index), field("chunk_count", &RawChunkHeader::chunk_count),
                 field("tensor", &RawChunkHeader::tensor),           field("byte_offset", &RawChunkHeader::byte_offset),
                 field("byte_count", &RawChunkHeader::byte_count)};
};

template <>
struct Schema<SliceRef> {
  static constexpr auto fields = std::tuple{field("tensor", &SliceRef::tensor), field("dim", &SliceRef::dim),
                                            field("start", &SliceRef::start), field("stop", &SliceRef::stop)};
};
template <>
struct Schema<HeldSlice> {
  static constexpr auto fields = std::tuple{field("tensor", &HeldSlice::tensor), field("dim", &HeldSlice::dim),
                                            field("start", &HeldSlice::start), field("stop", &HeldSlice::stop)};
};

// Control messages: the alternatives of Message, each with its type byte.
template <>
struct Schema<Hello> {
  static constexpr MessageType type = MessageType::hello;
  static constexpr auto fields = std::tuple{field("rank", &Hello::rank),
                                            field("data_url", &Hello::data_url),
                                            field("cluster", &Hello::cluster),
                                            field("held_version", &Hello::held_version),
                                            field("held_digest", &Hello::held_digest),
                                            field("attempt_floor", &Hello::attempt_floor),
                                            field("instance", &Hello::instance),
                                            field("slices", &Hello::slices)};
};
template <>
struct Schema<Welcome> {
  static constexpr MessageType type = MessageType::welcome;
  static constexpr auto fields = std::tuple{field("session", &Welcome::session),
                                            field("instance", &Welcome::instance),
                                            field("topology", &Welcome::topology),
                                            field("max_message_bytes", &Welcome::max_message_bytes),
                                            field("members", &Welcome::members),
                                            field("forest", &Welcome::forest),
                                            field("tensors", &Welcome::tensors),
                                            field("committed_version", &Welcome::committed_version),
                                            field("committed_digest", &Welcome::committed_digest),
                                            field("layout", &Welcome::layout),
                                            field("producer_urls", &Welcome::producer_urls)};
};
template <>
struct Schema<Join> {
  static constexpr MessageType type = MessageType::join;
  static constexpr auto fields = std::tuple{field("rank", &Join::rank), field("tree", &Join::tree)};
};
template <>
struct Schema<Ready> {
  static constexpr MessageType type = MessageType::ready;
  static constexpr auto fields =
      std::tuple{field("rank", &Ready::rank), field("version", &Ready::version), field("digest", &Ready::digest)};
};
template <>
struct Schema<Ack> {
  static constexpr MessageType type = MessageType::ack;
  static constexpr auto fields =
      std::tuple{field("rank", &Ack::rank),       field("version", &Ack::version),
                 field("digest", &Ack::digest),   field("applied_changes", &Ack::applied_changes),
                 field("attempt", &Ack::attempt), field("receive_us", &Ack::receive_us)};
};
template <>
struct Schema<Nack> {
  static constexpr MessageType type = MessageType::nack;
  static constexpr auto fields =
      std::tuple{field("rank", &Nack::rank), field("version", &Nack::version), field("errc", &Nack::errc),
                 field("message", &Nack::message), field("attempt", &Nack::attempt)};
};
template <>
struct Schema<Commit> {
  static constexpr MessageType type = MessageType::commit;
  static constexpr auto fields = std::tuple{field("version", &Commit::version), field("attempt", &Commit::attempt),
                                            field("digest", &Commit::digest)};
};
template <>
struct Schema<Abort> {
  static constexpr MessageType type = MessageType::abort;
  static constexpr auto fields =
      std::tuple{field("version", &Abort::version), field("attempt", &Abort::attempt), field("reason", &Abort::reason)};
};
template <>
struct Schema<Active> {
  static constexpr MessageType type = MessageType::active;
  static constexpr auto fields =
      std::tuple{field("rank", &Active::rank), field("version", &Active::version), field("digest", &Active::digest)};
};
template <>
struct Schema<Resume> {
  static constexpr MessageType type = MessageType::resume;
  static constexpr auto fields =
      std::tuple{field("rank", &Resume::rank), field("tree", &Resume::tree), field("version", &Resume::version),
                 field("attempt", &Resume::attempt), field("have", &Resume::have)};
};
template <>
struct Schema<Bye> {
  static constexpr MessageType type = MessageType::bye;
  static constexpr auto fields = std::tuple{};
};
template <>
struct Schema<EpochUpdate> {
  static constexpr MessageType type = MessageType::epoch;
  static constexpr auto fields =
      std::tuple{field("dead", &EpochUpdate::dead), field("joined", &EpochUpdate::joined),
                 field("moves", &EpochUpdate::moves), field("producer_urls", &EpochUpdate::producer_urls)};
};
template <>
struct Schema<Report> {
  static constexpr MessageType type = MessageType::report;
  static constexpr auto fields =
      std::tuple{field("rank", &Report::rank), field("peer", &Report::peer), field("tree", &Report::tree),
                 field("cause", &Report::cause), field("detail", &Report::detail)};
};
template <>
struct Schema<Gap> {
  static constexpr MessageType type = MessageType::gap;
  static constexpr auto fields =
      std::tuple{field("rank", &Gap::rank),       field("child", &Gap::child),     field("tree", &Gap::tree),
                 field("version", &Gap::version), field("attempt", &Gap::attempt), field("chunks", &Gap::chunks)};
};
template <>
struct Schema<Fenced> {
  static constexpr MessageType type = MessageType::fenced;
  static constexpr auto fields = std::tuple{field("replaced", &Fenced::replaced), field("reason", &Fenced::reason)};
};
template <>
struct Schema<Refused> {
  static constexpr MessageType type = MessageType::refused;
  static constexpr auto fields = std::tuple{field("errc", &Refused::errc), field("message", &Refused::message)};
};
template <>
struct Schema<Catchup> {
  static constexpr MessageType type = MessageType::catchup;
  static constexpr auto fields = std::tuple{field("version", &Catchup::version), field("digest", &Catchup::digest),
                                            field("mode", &Catchup::mode), field("sources", &Catchup::sources)};
};
template <>
struct Schema<Fetch> {
  static constexpr MessageType type = MessageType::fetch;
  static constexpr auto fields =
      std::tuple{field("rank", &Fetch::rank), field("mode", &Fetch::mode), field("from_version", &Fetch::from_version),
                 field("version", &Fetch::version)};
};
template <>
struct Schema<FetchEnd> {
  static constexpr MessageType type = MessageType::fetch_end;
  static constexpr auto fields = std::tuple{field("version", &FetchEnd::version), field("digest", &FetchEnd::digest),
                                            field("errc", &FetchEnd::errc), field("message", &FetchEnd::message)};
};
template <>
struct Schema<Delegate> {
  static constexpr MessageType type = MessageType::delegate;
  static constexpr auto fields = std::tuple{field("version", &Delegate::version), field("attempt", &Delegate::attempt),
                                            field("digest", &Delegate::digest), field("delegate", &Delegate::delegate),
                                            field("ranks", &Delegate::ranks)};
};
template <>
struct Schema<Decided> {
  static constexpr MessageType type = MessageType::decided;
  static constexpr auto fields = std::tuple{field("rank", &Decided::rank), field("version", &Decided::version),
                                            field("attempt", &Decided::attempt), field("digest", &Decided::digest),
                                            field("active", &Decided::active)};
};

template <>
struct Schema<LayoutUpdate> {
  static constexpr MessageType type = MessageType::layout;
  static constexpr auto fields =
      std::tuple{field("version", &LayoutUpdate::version), field("attempt", &LayoutUpdate::attempt),
                 field("layout", &LayoutUpdate::layout)};
};

template <>
struct Schema<GroupHello> {
  static constexpr MessageType type = MessageType::group_hello;
  static constexpr auto fields = std::tuple{field("rank", &GroupHello::rank),
                                            field("size", &GroupHello::size),
                                            field("manifest_digest", &GroupHello::manifest_digest),
                                            field("partition", &GroupHello::partition),
                                            field("held_version", &GroupHello::held_version),
                                            field("held_digest", &GroupHello::held_digest),
                                            field("data_url", &GroupHello::data_url),
                                            field("instance", &GroupHello::instance)};
};
template <>
struct Schema<GroupReady> {
  static constexpr MessageType type = MessageType::group_ready;
  static constexpr auto fields = std::tuple{field("rank", &GroupReady::rank), field("version", &GroupReady::version),
                                            field("raw", &GroupReady::raw)};
};
template <>
struct Schema<GroupBegin> {
  static constexpr MessageType type = MessageType::group_begin;
  static constexpr auto fields =
      std::tuple{field("version", &GroupBegin::version),         field("attempt", &GroupBegin::attempt),
                 field("base_digest", &GroupBegin::base_digest), field("new_layout", &GroupBegin::new_layout),
                 field("slices", &GroupBegin::slices),           field("set_slices", &GroupBegin::set_slices),
                 field("set_ends", &GroupBegin::set_ends),       field("scan", &GroupBegin::scan)};
};
template <>
struct Schema<GroupSent> {
  static constexpr MessageType type = MessageType::group_sent;
  static constexpr auto fields = std::tuple{field("rank", &GroupSent::rank),
                                            field("version", &GroupSent::version),
                                            field("attempt", &GroupSent::attempt),
                                            field("chunks", &GroupSent::chunks),
                                            field("base_digest", &GroupSent::base_digest),
                                            field("new_digest", &GroupSent::new_digest),
                                            field("frame_bytes", &GroupSent::frame_bytes),
                                            field("changes", &GroupSent::changes),
                                            field("errc", &GroupSent::errc),
                                            field("message", &GroupSent::message),
                                            field("raw_sum", &GroupSent::raw_sum),
                                            field("slice_deltas", &GroupSent::slice_deltas),
                                            field("slice_scans", &GroupSent::slice_scans)};
};
template <>
struct Schema<GroupDecided> {
  static constexpr MessageType type = MessageType::group_decided;
  static constexpr auto fields =
      std::tuple{field("version", &GroupDecided::version), field("attempt", &GroupDecided::attempt),
                 field("committed", &GroupDecided::committed), field("reason", &GroupDecided::reason),
                 field("digest", &GroupDecided::digest)};
};
template <>
struct Schema<Placed> {
  static constexpr MessageType type = MessageType::placed;
  static constexpr auto fields = std::tuple{field("slices", &Placed::slices)};
};

// ---------------------------------------------------------------------------------------------
// Value rules (docs/protocol.md): integers LE; enums and bools one byte, range-checked; strings
// u32 length + bytes; vectors u32 count + items; bitmaps u32 bit count + packed bytes (bit i in
// byte i/8 at bit i%8, padding bits zero); the envelope attempt u64 | route u32 | reserved u32 0;
// structs their Schema's fields in order.
// ---------------------------------------------------------------------------------------------

// Largest count or length any field may announce: they are small; this refuses absurd values
// before anything is allocated (counts are also checked against the bytes left).
constexpr uint32_t kMaxCount = uint32_t{1} << 28;
// The envelope's flags word: bit 0 is Envelope::new_layout, the others are reserved (zero).
constexpr uint32_t kEnvelopeNewLayout = 1;

template <class T>
inline constexpr bool kIsVector = false;
template <class T>
inline constexpr bool kIsVector<std::vector<T>> = true;

template <class T>
concept Struct = requires {
  Schema<T>::fields;
};

template <class T>
concept Enum = std::is_enum_v<T>;

// The number of data members of the aggregate T: the most initializers T{...} accepts. Checked
// against each Schema, so a member added in protocol.h but forgotten here fails to compile
// instead of being silently dropped from the wire.
struct AnyMember {
  template <class T>
  operator T&() const;  // declared only: used in unevaluated requires-expressions
};
template <class T, class... Init>
constexpr size_t member_count() {
  if constexpr (requires { T{Init{}..., AnyMember{}}; })
    return member_count<T, Init..., AnyMember>();
  else
    return sizeof...(Init);
}
template <Struct T>
constexpr bool schema_lists_every_member() {
  return std::tuple_size_v<std::remove_const_t<decltype(Schema<T>::fields)>> == member_count<T>();
}

bool known_value(FailureCause cause) { return std::string_view(failure_cause_name(cause)) != "unknown"; }
bool known_value(CatchupMode mode) {
  return mode == CatchupMode::none || mode == CatchupMode::replay || mode == CatchupMode::snapshot;
}
bool known_value(codec::DType dtype) { return codec::dtype_from_wire(static_cast<uint8_t>(dtype)).has_value(); }

// The fewest bytes a value of T takes on the wire (bounds a count against the bytes left).
template <class T>
constexpr size_t min_wire_size() {
  if constexpr (std::same_as<T, bool> || Enum<T>) {
    return 1;
  } else if constexpr (std::unsigned_integral<T>) {
    return sizeof(T);
  } else if constexpr (std::same_as<T, std::string> || kIsVector<T>) {
    return 4;
  } else if constexpr (std::same_as<T, Envelope>) {
    return kEnvelopeSize;
  } else {
    static_assert(Struct<T>, "no wire rule for this type");
    return std::apply([](auto... f) { return (size_t{0} + ... + min_wire_size<typename decltype(f)::Type>()); },
                      Schema<T>::fields);
  }
}

static_assert(min_wire_size<RawChunkHeader>() == kEnvelopeSize + kRawPrefixSize);

class Encoder {
 public:
  Encoder(std::vector<std::byte>& out, const char* message) : w_(out), message_(message) {}

  template <class T>
  void value(const T& v, const char* name) {
    if constexpr (std::same_as<T, bool>) {
      w_.u8(v ? 1 : 0);
    } else if constexpr (Enum<T>) {
      static_assert(sizeof(T) == 1);
      if (!known_value(v)) fail(name, "unknown value " + std::to_string(static_cast<unsigned>(v)));
      w_.u8(static_cast<uint8_t>(v));
    } else if constexpr (std::unsigned_integral<T>) {
      w_.put(v);
    } else if constexpr (std::same_as<T, std::string>) {
      count(v.size(), name);
      w_.bytes(std::as_bytes(std::span(v)));
    } else if constexpr (std::same_as<T, std::vector<bool>>) {
      count(v.size(), name);
      const size_t at = w_.size();
      w_.zeros((v.size() + 7) / 8);
      auto& out = w_.buffer();
      for (size_t i = 0; i < v.size(); ++i)
        if (v[i]) out[at + i / 8] |= static_cast<std::byte>(1u << (i % 8));
    } else if constexpr (kIsVector<T>) {
      count(v.size(), name);
      for (const auto& item : v) value(item, name);
    } else if constexpr (std::same_as<T, Envelope>) {
      w_.u64(v.attempt);
      w_.u32(v.route);
      w_.u32(v.new_layout ? kEnvelopeNewLayout : 0);
    } else {
      static_assert(Struct<T>, "no wire rule for this type");
      static_assert(schema_lists_every_member<T>(), "a data member of T is missing from its Schema");
      std::apply([&](const auto&... f) { (value(v.*(f.member), f.name), ...); }, Schema<T>::fields);
    }
  }

 private:
  void count(size_t n, const char* name) {
    if (n > kMaxCount) fail(name, std::to_string(n) + " items, above the limit of " + std::to_string(kMaxCount));
    w_.u32(static_cast<uint32_t>(n));
  }
  // Encoding refuses what decoding would refuse: the caller passed a value that cannot be sent.
  [[noreturn]] void fail(const char* name, const std::string& problem) const {
    throw Error(Errc::invalid_argument,
                std::string("protocol message ") + message_ + ": cannot encode " + name + ": " + problem);
  }
  ByteWriter w_;
  const char* message_;
};

class Decoder {
 public:
  // `reader_name` ("protocol message hello") prefixes truncation errors; `message` ("hello") the others.
  Decoder(std::span<const std::byte> body, const char* reader_name, const char* message)
      : r_(body, reader_name), message_(message) {}

  template <class T>
  void value(T& v, const char* name) {
    if constexpr (std::same_as<T, bool>) {
      const uint8_t b = r_.u8();
      if (b > 1) fail(name, "bool byte " + std::to_string(b) + " is neither 0 nor 1");
      v = b != 0;
    } else if constexpr (Enum<T>) {
      static_assert(sizeof(T) == 1);
      const uint8_t b = r_.u8();
      v = static_cast<T>(b);
      if (!known_value(v)) fail(name, "unknown value " + std::to_string(b));
    } else if constexpr (std::unsigned_integral<T>) {
      v = r_.get<T>();
    } else if constexpr (std::same_as<T, std::string>) {
      const auto bytes = r_.take(count(name));  // bounds-checked before anything is allocated
      v.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    } else if constexpr (std::same_as<T, std::vector<bool>>) {
      const uint32_t n = count(name);
      const auto packed = r_.take((uint64_t{n} + 7) / 8);
      if (n % 8 != 0 && (std::to_integer<unsigned>(packed.back()) >> (n % 8)) != 0)
        fail(name, "padding bits of the bitmap are set");
      v.assign(n, false);
      for (uint32_t i = 0; i < n; ++i) v[i] = ((std::to_integer<unsigned>(packed[i / 8]) >> (i % 8)) & 1u) != 0;
    } else if constexpr (kIsVector<T>) {
      using Item = typename T::value_type;
      static_assert(min_wire_size<Item>() > 0);
      const uint32_t n = count(name);
      if (uint64_t{n} * min_wire_size<Item>() > r_.remaining())  // so a forged count never sizes v
        fail(name,
             "count " + std::to_string(n) + " cannot fit in the " + std::to_string(r_.remaining()) + " bytes left");
      v.clear();
      v.resize(n);
      for (auto& item : v) value(item, name);
    } else if constexpr (std::same_as<T, Envelope>) {
      v.attempt = r_.u64();
      v.route = r_.u32();
      const uint32_t flags = r_.u32();
      if ((flags & ~kEnvelopeNewLayout) != 0) fail(name, "reserved flag bits are set");
      v.new_layout = (flags & kEnvelopeNewLayout) != 0;
    } else {
      static_assert(Struct<T>, "no wire rule for this type");
      std::apply([&](const auto&... f) { (value(v.*(f.member), f.name), ...); }, Schema<T>::fields);
    }
  }

  void expect_end() const {
    if (!r_.at_end())
      throw Error(Errc::corrupt_frame, std::string("protocol message ") + message_ + ": " +
                                           std::to_string(r_.remaining()) + " trailing bytes");
  }
  [[noreturn]] void fail(const char* name, const std::string& problem) const {
    throw Error(Errc::corrupt_frame, std::string("protocol message ") + message_ + ": " + name + ": " + problem);
  }

 private:
  // A count or length, refused above kMaxCount.
  uint32_t count(const char* name) {
    const uint32_t n = r_.u32();
    if (n > kMaxCount) fail(name, "count " + std::to_string(n) + " above the limit of " + std::to_string(kMaxCount));
    return n;
  }
  ByteReader r_;
  const char* message_;
};

// "protocol message <name>" for every type byte, built once: ByteReader keeps a const char*.
const char* reader_name(MessageType type) {
  static const auto names = [] {
    std::array<std::string, 256> out;
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = std::string("protocol message ") + message_type_name(static_cast<MessageType>(i));
    return out;
  }();
  return names[static_cast<uint8_t>(type)].c_str();
}

// Header: magic u32 | type u8 | 3 reserved zero bytes | epoch u64 | body_size u64 (patched).
void begin_message(std::vector<std::byte>& out, MessageType type, uint64_t epoch) {
  ByteWriter w(out);
  w.u32(kMessageMagic);
  w.u8(static_cast<uint8_t>(type));
  w.zeros(3);
  w.u64(epoch);
  w.u64(0);
}
constexpr size_t kBodySizeOffset = 16;
std::vector<std::byte> finish_message(std::vector<std::byte>& out) {
  ByteWriter(out).patch<uint64_t>(kBodySizeOffset, out.size() - kMessageHeaderSize);
  return std::move(out);
}

template <class M>
Message decode_as(std::span<const std::byte> body, MessageType type) {
  Decoder d(body, reader_name(type), message_type_name(type));
  M m;
  d.value(m, message_type_name(type));
  d.expect_end();
  return m;
}

using DecodeFn = Message (*)(std::span<const std::byte>, MessageType);

// Type byte -> decoder of that Message alternative (null: not a control message).
template <size_t... I>
constexpr std::array<DecodeFn, 256> make_decoders(std::index_sequence<I...>) {
  std::array<DecodeFn, 256> table{};
  ((table[static_cast<uint8_t>(Schema<std::variant_alternative_t<I, Message>>::type)] =
        &decode_as<std::variant_alternative_t<I, Message>>),
   ...);
  return table;
}
constexpr auto kMessageCount = std::variant_size_v<Message>;
constexpr auto kDecoders = make_decoders(std::make_index_sequence<kMessageCount>{});

template <size_t... I>
constexpr bool types_are_distinct(std::index_sequence<I...>) {
  const MessageType types[] = {Schema<std::variant_alternative_t<I, Message>>::type...};
  for (size_t a = 0; a < sizeof...(I); ++a) {
    if (types[a] == MessageType::frame || types[a] == MessageType::raw) return false;
    for (size_t b = a + 1; b < sizeof...(I); ++b)
      if (types[a] == types[b]) return false;
  }
  return true;
}
static_assert(types_are_distinct(std::make_index_sequence<kMessageCount>{}),
              "two Message alternatives share a type byte, or one claims FRAME/RAW");

[[noreturn]] void header_error(const std::string& problem) {
  throw Error(Errc::corrupt_frame, "protocol message header: " + problem);
}

// The header of a message of type `want`, refusing any other type.
MessageHeader expect_type(std::span<const std::byte> message, MessageType want) {
  const MessageHeader header = message_header(message);
  if (header.type != want)
    throw Error(Errc::corrupt_frame, std::string("protocol message ") + message_type_name(header.type) + ": not a " +
                                         message_type_name(want) + " message");
  return header;
}

}  // namespace

// clang-format off
const char* failure_cause_name(FailureCause cause) noexcept {
  switch (cause) {
    case FailureCause::link_closed: return "link_closed";
    case FailureCause::silent: return "silent";
    case FailureCause::stalled: return "stalled";
    case FailureCause::replaced: return "replaced";
    case FailureCause::unreachable: return "unreachable";
    case FailureCause::refused: return "refused";
    case FailureCause::left: return "left";
  }
  return "unknown";
}

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
    case MessageType::resume: return "resume";
    case MessageType::bye: return "bye";
    case MessageType::raw: return "raw";
    case MessageType::epoch: return "epoch";
    case MessageType::report: return "report";
    case MessageType::gap: return "gap";
    case MessageType::fenced: return "fenced";
    case MessageType::refused: return "refused";
    case MessageType::catchup: return "catchup";
    case MessageType::fetch: return "fetch";
    case MessageType::fetch_end: return "fetch_end";
    case MessageType::delegate: return "delegate";
    case MessageType::decided: return "decided";
    case MessageType::layout: return "layout";
    case MessageType::group_hello: return "group_hello";
    case MessageType::group_ready: return "group_ready";
    case MessageType::group_begin: return "group_begin";
    case MessageType::group_sent: return "group_sent";
    case MessageType::group_decided: return "group_decided";
    case MessageType::placed: return "placed";
  }
  return "unknown";
}
// clang-format on

std::vector<std::byte> encode_message(const Message& message, uint64_t epoch) {
  return std::visit(
      [epoch](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        constexpr MessageType type = Schema<M>::type;
        std::vector<std::byte> out;
        out.reserve(kMessageHeaderSize + min_wire_size<M>());
        begin_message(out, type, epoch);
        Encoder(out, message_type_name(type)).value(m, message_type_name(type));
        return finish_message(out);
      },
      message);
}

std::vector<std::byte> encode_frame_message(std::span<const std::byte> frame, Envelope envelope, uint64_t epoch) {
  std::vector<std::byte> out;
  out.reserve(kMessageHeaderSize + kEnvelopeSize + frame.size());
  begin_message(out, MessageType::frame, epoch);
  Encoder(out, "frame").value(envelope, "envelope");
  ByteWriter(out).bytes(frame);
  return finish_message(out);
}

std::vector<std::byte> encode_raw_message(const RawChunkHeader& header, uint64_t epoch) {
  if (header.chunk_index >= header.chunk_count)
    throw Error(Errc::invalid_argument, "protocol message raw: cannot encode chunk index " +
                                            std::to_string(header.chunk_index) + " of " +
                                            std::to_string(header.chunk_count) + " chunks");
  std::vector<std::byte> out;
  out.reserve(kMessageHeaderSize + kEnvelopeSize + kRawPrefixSize);
  begin_message(out, MessageType::raw, epoch);
  Encoder(out, "raw").value(header, "raw");
  return finish_message(out);
}

MessageHeader message_header(std::span<const std::byte> message) {
  if (message.size() < kMessageHeaderSize)
    header_error("truncated (" + std::to_string(message.size()) + " of " + std::to_string(kMessageHeaderSize) +
                 " bytes)");
  ByteReader r(message.first(kMessageHeaderSize), "protocol message header");
  const uint32_t magic = r.u32();
  if (magic != kMessageMagic) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", static_cast<unsigned>(magic));
    header_error(std::string("bad magic ") + hex + " (not a deltacast message)");
  }
  const uint8_t type = r.u8();
  const auto reserved = r.take(3);
  if (reserved[0] != std::byte{0} || reserved[1] != std::byte{0} || reserved[2] != std::byte{0})
    header_error("reserved bytes are not zero");
  MessageHeader header;
  header.epoch = r.u64();
  header.body_size = r.u64();
  if (header.body_size != message.size() - kMessageHeaderSize)
    header_error("body size " + std::to_string(header.body_size) + " does not match the " +
                 std::to_string(message.size() - kMessageHeaderSize) + " bytes received");
  header.type = static_cast<MessageType>(type);
  if (std::string_view(message_type_name(header.type)) == "unknown")
    header_error("unknown type " + std::to_string(type));
  return header;
}

MessageType message_type(std::span<const std::byte> message) { return message_header(message).type; }

FrameMessage decode_frame_message(std::span<const std::byte> message) {
  FrameMessage out;
  out.header = expect_type(message, MessageType::frame);
  const auto body = message.subspan(kMessageHeaderSize);
  Decoder d(body.first(std::min(body.size(), kEnvelopeSize)), reader_name(MessageType::frame), "frame");
  d.value(out.envelope, "envelope");
  out.frame = body.subspan(kEnvelopeSize);
  return out;
}

std::span<const std::byte> frame_payload(std::span<const std::byte> message) {
  return decode_frame_message(message).frame;
}

RawChunkHeader decode_raw_message(std::span<const std::byte> message) {
  expect_type(message, MessageType::raw);
  Decoder d(message.subspan(kMessageHeaderSize), reader_name(MessageType::raw), "raw");
  RawChunkHeader h;
  d.value(h, "raw");
  d.expect_end();
  if (h.chunk_index >= h.chunk_count)
    d.fail("chunk_index", std::to_string(h.chunk_index) + " is not below chunk_count " + std::to_string(h.chunk_count));
  return h;
}

uint64_t max_raw_chunk_count(const codec::Manifest& manifest) noexcept {
  return manifest.total_elements() + manifest.size();
}

uint64_t raw_piece_hash(const RawChunkHeader& header, std::span<const std::byte> bytes) noexcept {
  const uint64_t where[2] = {header.tensor, header.byte_offset};
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), XXH3_64bits(where, sizeof where));
}

Message decode_message(std::span<const std::byte> message) {
  const MessageHeader header = message_header(message);
  const DecodeFn decode = kDecoders[static_cast<uint8_t>(header.type)];
  if (decode == nullptr)
    throw Error(Errc::corrupt_frame, std::string("protocol message ") + message_type_name(header.type) +
                                         ": not a control message (use decode_" + message_type_name(header.type) +
                                         "_message)");
  return decode(message.subspan(kMessageHeaderSize), header.type);
}

namespace {
void check_file_name(const std::string& name, const char* what) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    throw Error(Errc::corrupt_frame, std::string("checkpoint layout: ") + what + " '" + name +
                                         "' is not a plain file name");
}
}  // namespace

void check_layout(const CheckpointLayout& layout, size_t tensors) {
  if (layout.shards.empty()) {
    if (layout.sharded || !layout.files.empty() || !layout.index_metadata_json.empty())
      throw Error(Errc::corrupt_frame, "checkpoint layout: files or an index without shards");
    return;
  }
  std::vector<bool> placed(tensors, false);
  std::vector<std::string> names;
  for (const auto& shard : layout.shards) {
    check_file_name(shard.file, "shard");
    names.push_back(shard.file);
    for (uint32_t t : shard.tensors) {
      if (t >= tensors)
        throw Error(Errc::corrupt_frame, "checkpoint layout: shard " + shard.file + " names tensor " +
                                             std::to_string(t) + " of " + std::to_string(tensors));
      if (placed[t])
        throw Error(Errc::corrupt_frame, "checkpoint layout: tensor " + std::to_string(t) + " is in two places");
      placed[t] = true;
    }
  }
  if (const auto missing = std::find(placed.begin(), placed.end(), false); missing != placed.end())
    throw Error(Errc::corrupt_frame, "checkpoint layout: tensor " + std::to_string(missing - placed.begin()) +
                                         " is in no shard");
  if (!layout.sharded && layout.shards.size() != 1)
    throw Error(Errc::corrupt_frame, "checkpoint layout: " + std::to_string(layout.shards.size()) +
                                         " files without an index");
  for (const auto& file : layout.files) {
    check_file_name(file.name, "file");
    names.push_back(file.name);
  }
  std::sort(names.begin(), names.end());
  if (const auto twice = std::adjacent_find(names.begin(), names.end()); twice != names.end())
    throw Error(Errc::corrupt_frame, "checkpoint layout: '" + *twice + "' is named twice");
}

}  // namespace deltacast::tree
