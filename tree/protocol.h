#pragma once
// Relay-tree protocol messages (docs/protocol.md is the reference; keep the two in step).
// Every message is a 24-byte header (magic, type, membership epoch, body size) followed by a body.
// FRAME and RAW messages carry an envelope (attempt id, route) and then their payload, so a relay
// forwards the received bytes verbatim. Each control message's fields are listed once, in a
// schema table that both the encoder and the decoder read (protocol.cpp).
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
// magic u32 | type u8 | 3 reserved zero bytes | epoch u64 | body_size u64
inline constexpr size_t kMessageHeaderSize = 24;
// The largest control message (everything but WELCOME and frames) a producer or member accepts
// from a peer; a header announcing more is refused before anything is allocated.
inline constexpr size_t kControlBufferBytes = size_t{1} << 20;

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
  resume = 13,
  bye = 14,
  raw = 15,  // bootstrap / snapshot piece: raw checkpoint bytes, forwarded verbatim like FRAME
  epoch = 16,
  report = 17,
  gap = 18,
  fenced = 19,
  refused = 20,
  catchup = 21,
  fetch = 22,
  fetch_end = 23,
  delegate = 24,  // producer -> live members: who decides this attempt's commit (commit: delegated)
  decided = 25,   // delegate -> producer: the attempt committed, these members are active
  layout = 26,    // producer -> member: the checkpoint layout of a version (it changed)
  // A producer group's link (docs/producer-group.md).
  group_hello = 27,  // answered by WELCOME (the members' message: the rank learns the same shape)
  group_ready = 28,
  group_begin = 29,
  group_sent = 30,
  group_decided = 31,
  placed = 32,  // member -> producer: the slices it holds, stated after WELCOME (docs/placement.md)
};

// Why a member left the live set, or why a link is reported (REPORT, EPOCH, the report's
// failed_members[].cause).
enum class FailureCause : uint8_t {
  link_closed = 1,  // the peer closed the link or the process died (EOF, reset)
  silent = 2,       // no heartbeat for timeouts.peer (frozen or partitioned)
  stalled = 3,      // alive but drained nothing for timeouts.peer (reported by its parent)
  replaced = 4,     // a new instance said HELLO for the same rank (fenced)
  unreachable = 5,  // connecting to the peer failed
  refused = 6,      // the peer broke the protocol (unexpected or malformed message)
  left = 7,         // graceful leave
};
// "link_closed", "silent", ... ("unknown" otherwise).
const char* failure_cause_name(FailureCause cause) noexcept;

// Parent rank of a tree root: the producer, job rank 0.
inline constexpr uint32_t kProducerRank = 0;

struct Member {
  uint32_t rank = 0;
  std::string url;      // where this member's listener accepts JOIN / FETCH (the producer: HELLO)
  std::string cluster;  // cluster label (topology keeps each cluster boundary crossed once)
  bool live = true;     // in the live set of the epoch the message carries
};

// One edge of the forest: `rank`'s parent in `tree` (kProducerRank for a root).
struct TreeEdge {
  uint32_t rank = 0;
  uint32_t tree = 0;
  uint32_t parent = 0;
  bool operator==(const TreeEdge&) const = default;
};

struct DeadMember {
  uint32_t rank = 0;
  FailureCause cause = FailureCause::link_closed;
};

// member -> producer, first message of a control link.
// A canonical slice a member holds (docs/placement.md): start:stop along `dim` of the tensor named
// `tensor` (by name: at HELLO the member has no manifest yet).
struct HeldSlice {
  std::string tensor;
  uint32_t dim = 0;
  uint64_t start = 0;
  uint64_t stop = 0;
  bool operator==(const HeldSlice&) const = default;
};
struct Hello {
  uint32_t rank = 0;
  std::string data_url;
  std::string cluster;
  uint64_t held_version = 0;  // committed version in the member's buffers (0: all zeros)
  uint64_t held_digest = 0;   // its combined StateDigest
  uint64_t attempt_floor = 0; // highest attempt id the member saw end (COMMIT/ABORT)
  uint64_t instance = 0;      // random per process: a new instance of a rank fences the old one
  // The distinct canonical slices its placement holds (empty: every tensor whole).
  std::vector<HeldSlice> slices;
};
// A name and its bytes: one `__metadata__` entry of a shard, or one small file that lies beside
// the shards (config.json, tokenizer files).
struct NamedBytes {
  std::string name;
  std::string bytes;
  bool operator==(const NamedBytes&) const = default;
};
// One file of the producer's checkpoint: its name, its tensors (manifest indices) in data order,
// and its `__metadata__`.
struct ShardLayout {
  std::string file;
  std::vector<uint32_t> tensors;
  std::vector<NamedBytes> metadata;
  bool operator==(const ShardLayout&) const = default;
};
// How the producer's checkpoint lies on disk, so that a member can write what it holds as the
// trainer wrote it (`output.checkpoint_dir`). No shards: the producer has no files (a synthetic
// trainer); members write one model.safetensors. Each tensor is in exactly one shard
// (check_layout).
struct CheckpointLayout {
  bool sharded = false;               // a Hugging Face directory with model.safetensors.index.json
  std::vector<ShardLayout> shards;
  std::string index_metadata_json;    // sharded: the index's "metadata" object, as JSON text
  std::vector<NamedBytes> files;      // small non-tensor files beside the shards (size-capped)
  bool operator==(const CheckpointLayout&) const = default;
};
// Throws Error(corrupt_frame) unless every tensor 0..tensors-1 is in exactly one shard, shard and
// file names are plain file names (no '/', not "." or "..", not empty) and no name repeats. An
// empty layout passes.
void check_layout(const CheckpointLayout& layout, size_t tensors);

// producer -> member: the session's shape at the epoch in the header.
struct Welcome {
  uint64_t session = 0;
  uint64_t instance = 0;           // the Hello.instance this answers
  std::string topology;            // "binary" | "double_binary" | "chain"
  uint64_t max_message_bytes = 0;  // largest message any link carries (receive buffer size)
  std::vector<Member> members;     // every rank 0..N (rank 0 = producer), with liveness
  std::vector<TreeEdge> forest;    // every live member's parent in every tree
  std::vector<codec::TensorInfo> tensors;
  uint64_t committed_version = 0;  // the producer's last committed version and its digest
  uint64_t committed_digest = 0;
  CheckpointLayout layout;         // the producer's files (empty: none)
  // A producer group (docs/producer-group.md): producer rank g's data URL, where the roots of its
  // trees JOIN ([0]: this coordinator's). Empty: one producer, members[0]'s URL.
  std::vector<std::string> producer_urls;
};
// child -> parent, first message of a data edge (the epoch in the header is the child's); a
// RESUME follows at once.
struct Join {
  uint32_t rank = 0;
  uint32_t tree = 0;
};
// member -> producer: edges up (after WELCOME) or caught up (after CATCHUP), holding this version.
struct Ready {
  uint32_t rank = 0;
  uint64_t version = 0;
  uint64_t digest = 0;
};
struct Ack {
  uint32_t rank = 0;
  uint64_t version = 0;
  uint64_t digest = 0;
  uint64_t applied_changes = 0;
  uint64_t attempt = 0;  // the attempt verified (a late ACK of an aborted attempt is not the retry's)
  // From this member's first data message of the attempt to its verification, microseconds, on
  // its own clock: how long it took to receive the version, which its ACK's arrival does not show
  // when the ACK queued behind what the member forwards (a relay with a slow egress).
  uint64_t receive_us = 0;
};
struct Nack {
  uint32_t rank = 0;
  uint64_t version = 0;
  uint32_t errc = 0;
  std::string message;
  uint64_t attempt = 0;  // the attempt refused
};
struct Commit {
  uint64_t version = 0;
  uint64_t attempt = 0;
  uint64_t digest = 0;
};
struct Abort {
  uint64_t version = 0;
  uint64_t attempt = 0;
  std::string reason;
};
struct Active {
  uint32_t rank = 0;
  uint64_t version = 0;
  uint64_t digest = 0;
};
// child -> parent right after JOIN: which chunks of the in-flight attempt it already holds, so
// the parent sends only the retained ones it lacks. version/attempt 0 with an empty bitmap: none.
struct Resume {
  uint32_t rank = 0;
  uint32_t tree = 0;
  uint64_t version = 0;
  uint64_t attempt = 0;
  std::vector<bool> have;  // bit i: chunk i held
};
struct Bye {};
// producer -> every live member: the membership changed; the epoch is the header's.
struct EpochUpdate {
  std::vector<DeadMember> dead;    // left the live set in this epoch
  std::vector<Member> joined;      // entered the live set in this epoch
  std::vector<TreeEdge> moves;     // new parents (every other edge stays)
  // A producer group's data URLs (Welcome::producer_urls) when a rank came back at another one
  // (its trees' roots are in `moves`: they JOIN it there); empty: unchanged.
  std::vector<std::string> producer_urls;
};
// member -> producer: a link to `peer` failed (or a child stopped draining).
struct Report {
  uint32_t rank = 0;  // reporter
  uint32_t peer = 0;
  uint32_t tree = 0;
  FailureCause cause = FailureCause::link_closed;
  std::string detail;
};
// parent -> producer: a new child lacks chunks this parent no longer retains.
struct Gap {
  uint32_t rank = 0;  // reporter (the parent)
  uint32_t child = 0;
  uint32_t tree = 0;
  uint64_t version = 0;
  uint64_t attempt = 0;
  std::vector<uint32_t> chunks;  // chunk indexes (the seal is chunk_count)
};
// producer -> an instance it no longer counts live (sent before the link closes).
struct Fenced {
  bool replaced = false;  // another instance holds the rank now: exit; otherwise rejoin
  std::string reason;
};
// producer -> a HELLO it refuses (wrong digest, unknown rank, ...). Nothing was written.
struct Refused {
  uint32_t errc = 0;
  std::string message;
};
enum class CatchupMode : uint8_t { none = 0, replay = 1, snapshot = 2 };
// producer -> a rejoining member after WELCOME: reach `version` this way, then READY.
struct Catchup {
  uint64_t version = 0;
  uint64_t digest = 0;
  CatchupMode mode = CatchupMode::none;
  std::vector<Member> sources;  // peers to fetch from, in preference order (rank 0: the producer)
};
// rejoining member -> a peer's listener, first message: send me `mode` data to reach `version`.
struct Fetch {
  uint32_t rank = 0;
  CatchupMode mode = CatchupMode::replay;
  uint64_t from_version = 0;  // replay: the version held
  uint64_t version = 0;       // the version wanted (replay: every version up to it)
};
// serving peer -> rejoining member: the fetch is over (errc 0) or failed.
struct FetchEnd {
  uint64_t version = 0;
  uint64_t digest = 0;
  uint32_t errc = 0;
  std::string message;
};

// producer -> every live member, once the attempt's last data message is posted (commit:
// delegated, docs/protocol.md "Delegated commit"): `delegate` commits this attempt once every rank
// of `ranks` still live in its epoch acked it with `digest`; members send it their ACK or NACK too.
struct Delegate {
  uint64_t version = 0;
  uint64_t attempt = 0;
  uint64_t digest = 0;
  uint32_t delegate = 0;
  std::vector<uint32_t> ranks;  // the attempt's members (live when it started)
};
// delegate -> producer: the attempt committed; `active` answered ACTIVE to the delegate's COMMIT.
struct Decided {
  uint32_t rank = 0;  // the delegate
  uint64_t version = 0;
  uint64_t attempt = 0;
  uint64_t digest = 0;
  std::vector<uint32_t> active;
};

// producer -> member, on the control link (docs/protocol.md "Checkpoint layouts"): `version` lies
// on disk as `layout`, which differs from the committed version's. attempt > 0: sent to every
// live member before any data of that attempt, whose data messages then carry
// Envelope::new_layout (a member does not ACK such an attempt before it holds this message).
// attempt 0: the layout of the committed version `version`, sent to a member catching up to it.
// Decoding does not check the layout against a manifest: the member runs check_layout on it.
struct LayoutUpdate {
  uint64_t version = 0;
  uint64_t attempt = 0;
  CheckpointLayout layout;
};

// ---- A producer group (docs/producer-group.md): rank r (1..M-1) <-> the coordinator (rank 0),
// on the rank's group link. Digests of a part are per tensor, the sums over the part's ranges. ----
// rank -> coordinator, first message of a group link. The coordinator answers WELCOME (the
// session's shape, as a member gets it: members, forest, producer_urls, the committed version) or
// REFUSED.
struct GroupHello {
  uint32_t rank = 0;  // 1..size-1
  uint32_t size = 0;  // M
  uint64_t manifest_digest = 0;
  uint64_t partition = 0;             // codec::Partition::fingerprint()
  uint64_t held_version = 0;          // the committed version its part holds (0: all zeros)
  std::vector<uint64_t> held_digest;  // its part's digest at held_version
  std::string data_url;               // where the roots of its trees JOIN
  uint64_t instance = 0;              // random per process: a new instance replaces the old
};
// rank -> coordinator: its trainer asked for `version`: a delta of its part (refit), or (raw)
// version 1 as its part's RAW pieces (bootstrap). Every rank of a version must send it the same way.
struct GroupReady {
  uint32_t rank = 0;
  uint64_t version = 0;
  bool raw = false;
};
// coordinator -> every rank: send your part of `version` as `attempt`, on the base whose combined
// digest is `base_digest` (with a LAYOUT first when new_layout).
// A canonical slice by manifest index (a producer group's plan of its placed members' slices).
struct SliceRef {
  uint32_t tensor = 0;
  uint32_t dim = 0;
  uint64_t start = 0;
  uint64_t stop = 0;
  bool operator==(const SliceRef&) const = default;
};
struct GroupBegin {
  uint64_t version = 0;
  uint64_t attempt = 0;
  uint64_t base_digest = 0;
  bool new_layout = false;
  // Placed members (docs/placement.md): the seal's slice table in order (`slices`), the members'
  // distinct slice sets (`set_slices`: indices into `slices`, set k ending before set_ends[k]), and
  // the slices whose base digest each rank scans from its part (`scan`: indices). Empty: none.
  std::vector<SliceRef> slices;
  std::vector<uint32_t> set_slices;
  std::vector<uint32_t> set_ends;
  std::vector<uint32_t> scan;
};
// rank -> coordinator: its part of the attempt is out (errc 0: `chunks` frames or RAW pieces, with
// the part's digests of the base and of the new version; RAW: raw_sum, the sum of its pieces'
// raw_piece_hash), or it could not send it (errc, message).
struct GroupSent {
  uint32_t rank = 0;
  uint64_t version = 0;
  uint64_t attempt = 0;
  uint32_t chunks = 0;
  std::vector<uint64_t> base_digest;
  std::vector<uint64_t> new_digest;
  uint64_t frame_bytes = 0;
  uint64_t changes = 0;
  uint32_t errc = 0;
  std::string message;
  uint64_t raw_sum = 0;
  // Placed members: per slice of GROUP_BEGIN's table, the digest change of this part's changes in
  // it, and per `scan` index its part's digest of that slice at the base.
  std::vector<uint64_t> slice_deltas;
  std::vector<uint64_t> slice_scans;
};
// coordinator -> every rank: how the attempt ended.
struct GroupDecided {
  uint64_t version = 0;
  uint64_t attempt = 0;
  bool committed = false;
  std::string reason;   // aborted: why
  uint64_t digest = 0;  // committed: the version's combined digest (a rank's state file keeps it)
};

// member -> producer, on the control link before the READY that follows a WELCOME: the member
// holds only these canonical slices (it learnt its placement after HELLO: an engine that reads
// the manifest first). Replaces what HELLO said; checked as HELLO's are (a refusal fences it).
struct Placed {
  std::vector<HeldSlice> slices;
};

// A decoded control message. FRAME and RAW messages are not decoded into this: use
// decode_frame_message() / decode_raw_message().
using Message = std::variant<Hello, Welcome, Join, Ready, Ack, Nack, Commit, Abort, Active, Resume, Bye, EpochUpdate,
                             Report, Gap, Fenced, Refused, Catchup, Fetch, FetchEnd, Delegate, Decided, LayoutUpdate,
                             GroupHello, GroupReady, GroupBegin, GroupSent, GroupDecided, Placed>;

struct MessageHeader {
  MessageType type = MessageType::bye;
  uint64_t epoch = 0;
  uint64_t body_size = 0;
};

// The envelope of a FRAME or RAW message (not part of the codec frame, whose format stays):
// attempt: the producer's id of the version attempt that sent it (a retry of an aborted version
//   number gets a new id, so a stale in-flight frame is never taken for the retry's);
// route: 0 = the whole tree; a member rank = a re-send for that member: relays that already hold
//   it pass it on only towards that member;
// new_layout: the attempt's version has another checkpoint layout than the committed one, sent
//   as LAYOUT (LayoutUpdate) on the control link: a member holds its ACK until it has that LAYOUT
//   (the data comes through relays, the LAYOUT straight from the producer: no order between them).
struct Envelope {
  uint64_t attempt = 0;
  uint32_t route = 0;
  bool new_layout = false;
};
// attempt u64 | route u32 | flags u32 (bit 0: new_layout; the other bits zero)
inline constexpr size_t kEnvelopeSize = 16;

struct FrameMessage {
  MessageHeader header;
  Envelope envelope;
  std::span<const std::byte> frame;  // the codec frame, verbatim
};

// A RAW message announces one piece of a full checkpoint (bootstrap version 1, or a snapshot
// piece on a FETCH link): header + envelope + a fixed 36-byte prefix and nothing else. The piece's
// bytes follow on the same link as the very next message, bare (no message header), so that a
// receiver can receive them straight into tensor `tensor` at byte `byte_offset` and forward them
// from there (no copy at any relay).
struct RawChunkHeader {
  Envelope envelope;
  uint64_t version = 0;     // the version these bytes belong to
  uint32_t chunk_index = 0;
  uint32_t chunk_count = 0;
  uint32_t tensor = 0;
  uint64_t byte_offset = 0;
  uint64_t byte_count = 0;  // size of the bare body message that follows
};
inline constexpr size_t kRawPrefixSize = 8 + 4 + 4 + 4 + 8 + 8;

// The most pieces a full checkpoint of `manifest` can come in (each piece holds whole elements of
// one tensor; an empty tensor may take one): a RAW header announcing more is refused before
// anything is sized by its chunk_count.
uint64_t max_raw_chunk_count(const codec::Manifest& manifest) noexcept;

// Builds a RAW message (header + envelope + prefix; the body is sent separately).
std::vector<std::byte> encode_raw_message(const RawChunkHeader& header, uint64_t epoch = 0);
// Parses a RAW message. Throws Error(corrupt_frame).
RawChunkHeader decode_raw_message(std::span<const std::byte> message);
// The verification hash of one piece as it lies in the receiver's buffers: XXH3-64 of the bytes,
// seeded with where they lie. A bootstrap is verified by the sum (mod 2^64) of its pieces' hashes,
// which does not depend on the order in which pieces arrive (double binary trees interleave them).
uint64_t raw_piece_hash(const RawChunkHeader& header, std::span<const std::byte> bytes) noexcept;

// Serialises a control message (header + body) sent in membership epoch `epoch`.
std::vector<std::byte> encode_message(const Message& message, uint64_t epoch = 0);
// Wraps a codec frame into a FRAME message (one copy; relays forward the result verbatim).
std::vector<std::byte> encode_frame_message(std::span<const std::byte> frame, Envelope envelope = {},
                                            uint64_t epoch = 0);

// Reads a message's header after checking magic, reserved bytes and that body_size matches the
// buffer. Throws Error(corrupt_frame) naming the problem.
MessageHeader message_header(std::span<const std::byte> message);
// message_header(message).type.
MessageType message_type(std::span<const std::byte> message);
// The parts of a FRAME message. Throws Error(corrupt_frame) if it is not one.
FrameMessage decode_frame_message(std::span<const std::byte> message);
// The codec frame inside a FRAME message. Throws Error(corrupt_frame) if it is not one.
std::span<const std::byte> frame_payload(std::span<const std::byte> message);
// Decodes a control message completely (trailing bytes are refused). Throws
// Error(corrupt_frame) for truncation, unknown type, a field out of range, or FRAME/RAW
// (which have no Message form).
Message decode_message(std::span<const std::byte> message);

// Lowercase name of a message type ("hello"), "unknown" otherwise.
const char* message_type_name(MessageType type) noexcept;

}  // namespace deltacast::tree
