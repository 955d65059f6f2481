// fuzz_make_corpus SOURCE_DIR OUT_DIR: writes the seed corpus of every fuzz target into
// OUT_DIR/<target>/seed-* from real frames and messages: the golden frames (tests/golden), deltas
// of the fuzz models (fuzz_models.h) in every location coding and value mode, one protocol message
// of every type, safetensors files and a sharded checkpoint, the example config. Each delta seed
// is applied and verified here first, so a seed that no longer applies fails this program.
// Regenerate (docs/fuzzing.md): build fuzz_make_corpus, run it with tests/fuzz/corpus.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "../unit/codec/codec_test_util.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "codec/location_coding.h"
#include "codec/placement.h"
#include "config/placement_file.h"
#include "fuzz_models.h"
#include "tree/protocol.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::fuzz {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;
using codec::testing::OwnedWeights;

fs::path g_out;
size_t g_written = 0;

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  const std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return Bytes(reinterpret_cast<const std::byte*>(c.data()), reinterpret_cast<const std::byte*>(c.data()) + c.size());
}
Bytes as_bytes(std::string_view s) {
  return Bytes(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
}
void append(Bytes& out, const Bytes& more) { out.insert(out.end(), more.begin(), more.end()); }

void seed(const std::string& target, const std::string& name, const Bytes& bytes) {
  fs::create_directories(g_out / target);
  std::ofstream(g_out / target / ("seed-" + name), std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ++g_written;
}
Bytes with_prefix(uint8_t first, const Bytes& rest) {
  Bytes out{std::byte{first}};
  append(out, rest);
  return out;
}

// ---- fuzz_frame_apply ----

OwnedWeights owned(const FuzzModel& model) {
  OwnedWeights w(model.manifest);
  w.bytes = model.base;
  return w;
}

// Encodes base -> next (version v -> v + 1), checks that the frames apply and verify, and returns
// them concatenated.
Bytes delta(const OwnedWeights& base, const OwnedWeights& next, uint64_t v, const codec::EncodeOptions& opts,
            codec::DeltaStats& stats) {
  auto d = codec::encode_delta(base.view(), next.view(), codec::StateDigest::full_scan(base.view()), {v, v + 1}, opts);
  stats.add(d.stats);
  OwnedWeights receiver = base;
  codec::DeltaApplier applier(*base.manifest, receiver.mut(), v, codec::StateDigest::full_scan(receiver.view()));
  Bytes out;
  for (const auto& f : d.frames) {
    applier.apply(f);
    append(out, f);
  }
  applier.verify();
  applier.commit();
  if (!(receiver == next)) throw std::runtime_error("a seed delta does not reproduce its new version");
  return out;
}

// As in training, small weights (small exponents) change far more often than large ones: the
// case the receiver-side context model (classed_gaps) is for. BF16 tensors only, +-1 ulp.
void mutate_by_magnitude(OwnedWeights& w, std::mt19937_64& rng) {
  for (uint32_t t = 0; t < w.manifest->size(); ++t) {
    if (w.manifest->at(t).dtype != codec::DType::bf16) continue;
    auto& bytes = w.bytes[t];
    for (size_t at = 0; at + 2 <= bytes.size(); at += 2) {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + at, 2);
      const unsigned exponent = (bits >> 7) & 0xFF;
      const unsigned per_mille = exponent <= 116 ? 400 : exponent <= 118 ? 60 : 5;
      if (rng() % 1000 >= per_mille) continue;
      bits = static_cast<uint16_t>((bits & 0x7F) == 0x7F ? bits - 1 : bits + 1);
      std::memcpy(bytes.data() + at, &bits, 2);
    }
  }
}

void frame_apply_seeds(const fs::path& golden) {
  const char* kGolden[] = {"v2-small", "v2-bad-checksum", "v2-truncated", "v2-bad-magic", "v2-future-version"};
  for (const char* g : kGolden) seed("frame_apply", std::string("golden-") + g, with_prefix(0, read_file(golden / (std::string(g) + ".dcx"))));
  const Bytes small = read_file(golden / "v2-small.dcx");
  seed("frame_apply", "golden-v2-small-staged", with_prefix(8, small));
  seed("frame_apply", "golden-v2-small-patched", with_prefix(6, small));
  {  // the golden delta must apply to model 0: its base bits are the golden base
    OwnedWeights receiver = owned(fuzz_model(0));
    codec::DeltaApplier applier(fuzz_model(0).manifest, receiver.mut(), kBaseVersion,
                                codec::StateDigest::full_scan(receiver.view()));
    for (auto f : codec::split_frames(small)) applier.apply(f);
    applier.verify();
  }

  codec::DeltaStats stats;
  for (unsigned m = 0; m < kModelCount; ++m) {
    const OwnedWeights base = owned(fuzz_model(m));
    std::mt19937_64 rng(1000 + m);
    struct Variant {
      const char* name;
      double density;  // < 0: mutate_by_magnitude
      bool wild;
      codec::ValueMode mode;
      bool overwrite;
      bool classed;
      uint64_t chunk_bytes;
    };
    const Variant variants[] = {
        {"ulp-sparse", 0.002, false, codec::ValueMode::ulp_delta, false, true, 4096},
        {"ulp", 0.03, false, codec::ValueMode::ulp_delta, false, true, 4096},
        {"ulp-unclassed", 0.03, false, codec::ValueMode::ulp_delta, false, false, 1 << 20},
        {"ulp-dense", 0.5, false, codec::ValueMode::ulp_delta, false, true, 2048},
        {"ulp-wild", 0.05, true, codec::ValueMode::ulp_delta, false, true, 4096},
        {"xor", 0.03, true, codec::ValueMode::xor_bits, false, true, 4096},
        {"overwrite", 0.03, true, codec::ValueMode::ulp_delta, true, true, 4096},
        {"all", 1.0, false, codec::ValueMode::ulp_delta, false, true, 4096},
        {"by-magnitude", -1, false, codec::ValueMode::ulp_delta, false, true, 1 << 20},
    };
    for (const auto& v : variants) {
      OwnedWeights next = base;
      if (v.density < 0)
        mutate_by_magnitude(next, rng);
      else
        codec::testing::mutate(next, v.density, rng, v.wild);
      codec::EncodeOptions opts;
      opts.chunk_bytes = v.chunk_bytes;
      opts.xor_safe_mode = v.mode;
      opts.allow_classed = v.classed;
      if (v.overwrite) opts.overwrite_tensors.assign(base.manifest->size(), true);
      const Bytes frames = delta(base, next, kBaseVersion, opts, stats);
      const std::string name = "model" + std::to_string(m) + "-" + v.name;
      seed("frame_apply", name, with_prefix(static_cast<uint8_t>(m), frames));
      if (std::string(v.name) == "ulp") {
        seed("frame_apply", name + "-staged", with_prefix(static_cast<uint8_t>(m | 8), frames));
        OwnedWeights third = next;
        codec::testing::mutate(third, 0.01, rng);
        Bytes two = frames;
        append(two, delta(next, third, kBaseVersion + 1, opts, stats));
        seed("frame_apply", name + "-two-versions", with_prefix(static_cast<uint8_t>(m), two));
        seed("frame_apply", name + "-two-versions-staged", with_prefix(static_cast<uint8_t>(m | 8), two));
      }
    }
  }
  std::fprintf(stderr, "make_corpus: frame_apply segments by location coding:");
  for (int c = 0; c < codec::kLocationCodingCount; ++c)
    std::fprintf(stderr, " %s=%llu", codec::location_coding_name(static_cast<codec::LocationCoding>(c)),
                 static_cast<unsigned long long>(stats.segments_by_coding[c]));
  std::fprintf(stderr, "\n");
}

// ---- fuzz_locations ----

void location_seed(const std::string& name, codec::DType dtype, uint64_t n, const codec::ScanOutput& scan,
                   const codec::ClassSpec& classes) {
  codec::SegmentChanges changes{n, &scan, classes};
  Bytes stream;
  const auto plan = codec::encode_locations(changes, stream);
  Bytes out;
  ByteWriter w(out);
  w.u8(static_cast<uint8_t>(plan.coding));
  w.u8(static_cast<uint8_t>(dtype));
  w.u32(static_cast<uint32_t>(n));
  w.u32(static_cast<uint32_t>(scan.positions.size()));
  append(out, stream);
  seed("locations", name + "-" + codec::location_coding_name(plan.coding), out);
}

void locations_seeds() {
  std::mt19937_64 rng(5);
  const std::pair<const char*, double> densities[] = {{"one", 0}, {"sparse", 0.01}, {"medium", 0.1}, {"dense", 0.6}, {"all", 1}};
  for (const auto& [name, density] : densities) {
    const uint64_t n = 3000;
    codec::ScanOutput scan;
    for (uint32_t i = 0; i < n; ++i)
      if (density >= 1 || (rng() % 10000) < density * 10000 || (density == 0 && i == 1234)) scan.positions.push_back(i);
    location_seed(name, codec::DType::bf16, n, scan, {});
  }
  location_seed("none", codec::DType::f32, 100, codec::ScanOutput{}, {});
  {  // a tiny segment: varints
    codec::ScanOutput scan;
    scan.positions = {3, 200, 9000};
    location_seed("tiny", codec::DType::u8, 10000, scan, {});
  }
  {  // classed: 3 classes laid out in blocks, rank = position inside the block
    codec::ClassSpec classes;
    classes.count = 3;
    classes.thresholds[0] = 0x3C00;
    classes.thresholds[1] = 0x3E00;
    codec::ScanOutput scan;
    const uint32_t block = 2000;
    const double rate[3] = {0.2, 0.05, 0.01};
    for (uint8_t j = 0; j < 3; ++j) {
      scan.class_sizes[j] = block;
      for (uint32_t r = 0; r < block; ++r)
        if ((rng() % 1000) < rate[j] * 1000) {
          scan.positions.push_back(j * block + r);
          scan.change_class.push_back(j);
          scan.change_rank.push_back(r);
        }
    }
    location_seed("classed", codec::DType::bf16, 3 * block, scan, classes);
  }
}

// ---- fuzz_tree_message and fuzz_raw_header ----

void tree_message_seeds(const fs::path& golden) {
  using namespace tree;
  Welcome welcome;
  welcome.session = 0x1122334455667788ull;
  welcome.instance = 7;
  welcome.topology = "double_binary";
  welcome.max_message_bytes = 9 << 20;
  welcome.members = {{0, "tcp://10.0.0.1:5000", "", true}, {1, "tcp://10.0.0.2:5001", "east", false}};
  welcome.forest = {{1, 0, 0}, {1, 1, 0}};
  welcome.tensors = {{"a.weight", codec::DType::bf16, {4, 8}}, {"b", codec::DType::f32, {}}};
  welcome.committed_version = 41;
  welcome.committed_digest = 0xfeedfacecafebeefull;
  std::vector<bool> have(13);
  have[0] = have[7] = have[12] = true;
  CheckpointLayout layout;
  layout.sharded = true;
  layout.shards = {{"model-00001-of-00002.safetensors", {1}, {{"format", "pt"}}},
                   {"model-00002-of-00002.safetensors", {0}, {}}};
  layout.index_metadata_json = R"({"total_size":132})";
  layout.files = {{"config.json", R"({"model_type": "llama"})"}, {"generation_config.json", R"({"top_p": 0.9})"}};
  const std::vector<std::pair<const char*, Message>> messages = {
      {"hello", Hello{3, "tcp://10.0.0.4:7000", "west", 7, 0x9999888877776666ull, 12, 0xabcdef0123456789ull, {}}},
      {"hello_placed", Hello{4, "tcp://10.0.0.5:7000", "", 0, 0, 0, 1, {{"lm_head.weight", 0, 512, 1000}}}},
      {"placed", Placed{{{"lm_head.weight", 0, 512, 1000}, {"model.norm.weight", 0, 0, 4096}}}},
      {"welcome", welcome},
      {"join", Join{5, 1}},
      {"ready", Ready{5, 8, 0x77}},
      {"ack", Ack{2, 5, 0xdeadbeef, 1234, 19, 25'000}},
      {"nack", Nack{4, 6, 3, "wrong base", 20}},
      {"commit", Commit{8, 21, 77}},
      {"abort", Abort{8, 22, "dry run"}},
      {"active", Active{1, 8, 77}},
      {"resume", Resume{2, 1, 4, 19, have}},
      {"bye", Bye{}},
      {"epoch", EpochUpdate{{{3, FailureCause::silent}},
                            {{5, "tcp://10.0.0.6:1", "east", true}},
                            {{6, 0, 1}},
                            {"tcp://10.0.0.1:7", "tcp://10.0.0.2:7"}}},
      {"report", Report{1, 3, 1, FailureCause::stalled, "no progress"}},
      {"gap", Gap{1, 4, 0, 9, 31, {0, 2, 17}}},
      {"fenced", Fenced{true, "new instance"}},
      {"refused", Refused{6, "unknown rank 42"}},
      {"catchup", Catchup{9, 0x1234, CatchupMode::snapshot, {{0, "tcp://p:1", "", true}}}},
      {"fetch", Fetch{5, CatchupMode::replay, 3, 9}},
      {"fetch_end", FetchEnd{9, 0x1234, 7, "io failed"}},
      {"delegate", Delegate{9, 31, 0xfeed, 2, {1, 2, 5}}},
      {"decided", Decided{2, 9, 31, 0xfeed, {1, 2}}},
      {"layout", LayoutUpdate{42, 33, layout}},
      {"layout-committed", LayoutUpdate{41, 0, CheckpointLayout{false, {{"model.safetensors", {0, 1}, {}}}, "", {}}}},
      {"group_hello", GroupHello{2, 4, 0x1111, 0x2222, 9, {1, 2, 3}, "tcp://10.0.0.9:7002", 0x42}},
      {"group_ready", GroupReady{3, 10, true}},
      {"group_begin", GroupBegin{10, 78, 0x77, false, {{1, 0, 0, 8}}, {0}, {1}, {0}}},
      {"group_sent", GroupSent{3, 10, 78, 17, {5, 6}, {8, 9}, 4096, 12, 0, "", 0xfeed, {7}, {9}}},
      {"group_decided", GroupDecided{10, 78, true, ""}},
  };
  for (const auto& [name, m] : messages) seed("tree_message", name, encode_message(m, 3));
  const Bytes golden_bytes = read_file(golden / "v2-small.dcx");
  const auto frames = codec::split_frames(golden_bytes);
  seed("tree_message", "frame", encode_frame_message(frames.back(), Envelope{12, 0}, 2));
  seed("tree_message", "frame-new-layout", encode_frame_message(frames.back(), Envelope{33, 0, true}, 2));
  seed("tree_message", "raw", encode_raw_message(RawChunkHeader{{5, 3}, 1, 2, 9, 1, 64, 128}, 1));
}

// One RAW record of fuzz_raw_header: u8 length, the message, the body.
void raw_record(Bytes& out, const tree::RawChunkHeader& h, std::span<const std::byte> body) {
  const Bytes m = tree::encode_raw_message(h, 0);
  out.push_back(static_cast<std::byte>(m.size()));
  append(out, m);
  out.insert(out.end(), body.begin(), body.end());
}

void raw_header_seeds() {
  for (unsigned m = 0; m < kModelCount; ++m) {
    const FuzzModel& model = fuzz_model(m);
    // Pieces of at most 256 bytes (whole elements), every tensor covered: a whole bootstrap.
    std::vector<tree::RawChunkHeader> pieces;
    for (uint32_t t = 0; t < model.manifest.size(); ++t) {
      const uint64_t size = model.base[t].size();
      for (uint64_t at = 0; at < size; at += 256) pieces.push_back({{1, 0}, 1, 0, 0, t, at, std::min<uint64_t>(256, size - at)});
    }
    for (uint32_t i = 0; i < pieces.size(); ++i) {
      pieces[i].chunk_index = i;
      pieces[i].chunk_count = static_cast<uint32_t>(pieces.size());
    }
    auto body = [&](const tree::RawChunkHeader& h) {
      return std::span<const std::byte>(model.base[h.tensor]).subspan(h.byte_offset, h.byte_count);
    };
    Bytes whole{std::byte{static_cast<uint8_t>(m)}}, reversed = whole, cut = whole;
    for (const auto& h : pieces) raw_record(whole, h, body(h));
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) raw_record(reversed, *it, body(*it));
    // Every piece but the last, whose body the end of the input cuts short (no ACK: dropped).
    for (const auto& h : pieces) raw_record(cut, h, &h == &pieces.back() ? body(h).first(h.byte_count / 2) : body(h));
    const std::string name = "model" + std::to_string(m);
    seed("raw_header", name + "-bootstrap", whole);
    seed("raw_header", name + "-reversed", reversed);
    seed("raw_header", name + "-cut-short", cut);
  }
}

// ---- fuzz_safetensors_header ----

void safetensors_seeds(const fs::path& scratch) {
  const std::string sep = "\n#SHARD#\n";
  for (unsigned m = 0; m < kModelCount; ++m) {
    const FuzzModel& model = fuzz_model(m);
    const std::string name = "model" + std::to_string(m);
    checkpoint::write_safetensors(scratch / "one.safetensors", model.view(), {{"format", "pt"}});
    seed("safetensors_header", name + "-file", with_prefix(0, read_file(scratch / "one.safetensors")));
    const size_t shards = m == 0 ? 2 : 3;
    const fs::path dir = scratch / ("sharded" + std::to_string(m));
    checkpoint::write_checkpoint(dir, model.view(), checkpoint::even_layout(model.manifest, shards));
    Bytes sharded = with_prefix(1, read_file(dir / checkpoint::kIndexFileName));
    Bytes shards_only{std::byte{3}};
    for (size_t k = 1; k <= shards; ++k) {
      char file[64];
      std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", k, shards);
      append(sharded, as_bytes(sep));
      append(sharded, read_file(dir / file));
      if (k == 1) {
        append(shards_only, as_bytes(sep));
        append(shards_only, read_file(dir / file));
      }
    }
    seed("safetensors_header", name + "-sharded", sharded);
    seed("safetensors_header", name + "-shard-without-index", shards_only);
  }
}

// ---- fuzz_config ----

void config_seeds(const fs::path& source) {
  seed("config", "local-9", read_file(source / "examples" / "local-9.yaml"));
  seed("config", "explicit-members", as_bytes(R"(producer: tcp://10.0.0.1:29500
transport: ofi+tcp
topology: chain
members:
  - {rank: 0, host: 10.0.0.2, port: 29501, cluster: east}
  - rank: 1
    url: tcp://10.0.0.3:29501
    cluster: west
allow_insecure: true
)"));
  seed("config", "watch", as_bytes(R"(producer: tcp://127.0.0.1:29500
members: {count: 2, base_port: 40000}
trainer: {kind: watch, dir: /ckpt/run, steps: 0}
output: {dir: out, metrics_file: out/m.json, log_file: out/run.log}
timeouts: {connect: 500ms, heartbeat: 1s, peer: 4s, refit: 1h, join: 2m, producer_loss: 30s}
chunk_bytes: 1.5MiB
retain_versions: 0
log_level: debug
secret_file: /etc/deltacast/secret
)"));
  seed("config", "bad-key", as_bytes("producer: tcp://127.0.0.1:1\nmembers: {count: 1}\nfoo: 1\n"));
  seed("config", "anchors", as_bytes("base: &b {count: 2}\nmembers: *b\n"));
}

// ---- fuzz_placement ----

void placement_seeds() {
  // Buffers of the target's model (fuzz_placement.cpp): fused rows, a column slice, stacked
  // experts, 8-byte units placed with `at`, a padded buffer; then as placement_yaml writes it.
  const std::vector<codec::BufferPlacement> buffers = {
      {"qk", {{"q", 0, 2, 6, {}}, {"k", 0, 0, 2, {}}}, false, {}, 0},
      {"o_cols", {{"o", 1, 4, 8, {}}}, false, {}, 0},
      {"experts", {{"e0", 1, 0, 1, {}}, {"e1", 1, 0, 1, {}}}, true, {}, 0},
      {"d", {{"d", 0, 1, 5, 2}}, false, {8}, 64},
      {"n", {{"n", 0, 0, 4, {}}}, false, {6}, 0}};
  seed("placement", "written", as_bytes(config::placement_yaml(buffers)));
  seed("placement", "lists", as_bytes("qk:\n  - [q, 0, 2, 6]\n  - [k, 0, 0, 2]\no_cols: [[o, 1, 4, 8]]\n"));
  seed("placement", "mappings", as_bytes(R"(experts:
  stack: true
  parts:
    - {tensor: e0, dim: 1, start: 0, stop: 1}
    - {tensor: e1, dim: 1, start: 0, stop: 1, at: 1}
n: {parts: [[n, 0, 0, 4]], shape: [6], bytes: 12}
)"));
  seed("placement", "json",
       as_bytes(R"({"qk": [["q", 0, 2, 6], ["k", 0, 0, 2]], "d": {"parts": [["d", 0, 1, 5, 2]], "shape": [8]}})"));
  seed("placement", "overlap", as_bytes("x: [[q, 0, 0, 4, 0], [k, 0, 0, 4, 2]]\n"));
  seed("placement", "anchors", as_bytes("a: &p [[q, 0, 0, 8]]\nb: *p\n"));
}

}  // namespace
}  // namespace deltacast::fuzz

int main(int argc, char** argv) {
  using namespace deltacast::fuzz;
  if (argc != 3) {
    std::fprintf(stderr, "usage: fuzz_make_corpus SOURCE_DIR OUT_DIR\n");
    return 2;
  }
  const fs::path source = argv[1];
  g_out = argv[2];
  const fs::path scratch = fs::temp_directory_path() / ("deltacast-make-corpus-" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  try {
    frame_apply_seeds(source / "tests" / "golden");
    locations_seeds();
    tree_message_seeds(source / "tests" / "golden");
    raw_header_seeds();
    safetensors_seeds(scratch);
    config_seeds(source);
    placement_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_corpus: %s\n", e.what());
    fs::remove_all(scratch);
    return 1;
  }
  fs::remove_all(scratch);
  std::printf("make_corpus: %zu seeds written under %s\n", g_written, g_out.c_str());
  return 0;
}
