// Checkpoints as users keep them (checkpoint/checkpoint.h): single files and Hugging Face sharded
// directories behind one name-sorted manifest. Round trips on several layouts compare bits; a
// delta made from one layout applies to another; every malformed index is refused by name.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "codec/applier.h"
#include "codec/encoder.h"
#include "codec/owned_weights.h"
#include "test_files.h"
#include "util/error.h"

namespace deltacast::checkpoint {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// A model whose file order is not name order (as real checkpoints), with odd sizes, a 0-dim and an
// empty tensor.
codec::Manifest model_manifest() {
  return codec::Manifest({{"model.layers.1.mlp.weight", codec::DType::bf16, {33, 65}},
                          {"model.embed_tokens.weight", codec::DType::bf16, {101, 16}},
                          {"lm_head.weight", codec::DType::bf16, {101, 16}},
                          {"model.layers.0.norm", codec::DType::f32, {16}},
                          {"model.layers.0.scale", codec::DType::f16, {}},
                          {"model.empty", codec::DType::bf16, {0, 3}},
                          {"model.layers.10.q8", codec::DType::f8_e4m3, {77}},
                          {"model.layers.2.codes", codec::DType::i8, {9}}});
}

// Tensors of a manifest, owned (copyable).
struct Bytes {
  const codec::Manifest* manifest;
  std::vector<std::vector<std::byte>> tensors;
  codec::ConstWeights view() const {
    codec::ConstWeights w{manifest, {}};
    for (const auto& t : tensors) w.tensors.emplace_back(t.data(), t.size());
    return w;
  }
  codec::MutableWeights mutable_view() {
    codec::MutableWeights w{manifest, {}};
    for (auto& t : tensors) w.tensors.emplace_back(t.data(), t.size());
    return w;
  }
};

Bytes random_weights(const codec::Manifest& m, uint64_t seed) {
  Bytes w{&m, {}};
  std::mt19937_64 rng(seed);
  for (const auto& t : m.tensors()) {
    w.tensors.emplace_back(t.nbytes());
    for (auto& b : w.tensors.back()) b = static_cast<std::byte>(rng());
  }
  return w;
}

// Changes ~1% of the bytes of every non-empty tensor.
void perturb(Bytes& w, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& t : w.tensors) {
    if (t.empty()) continue;
    for (size_t k = 0; k <= t.size() / 100; ++k) t[rng() % t.size()] ^= std::byte{1};
  }
}

// Random weights (seed) and a copy with ~1% of their bytes changed (seed + 1).
std::pair<Bytes, Bytes> base_and_next(const codec::Manifest& m, uint64_t seed) {
  auto base = random_weights(m, seed);
  auto next = base;
  perturb(next, seed + 1);
  return {std::move(base), std::move(next)};
}

// The same tensors, bit for bit, by name.
bool same_tensors(const codec::ConstWeights& a, const codec::ConstWeights& b) {
  if (a.manifest->size() != b.manifest->size()) return false;
  for (uint32_t i = 0; i < a.manifest->size(); ++i) {
    const auto j = b.manifest->find(a.manifest->at(i).name);
    if (!j || a.tensors[i].size() != b.tensors[*j].size()) return false;
    if (!a.tensors[i].empty() && std::memcmp(a.tensors[i].data(), b.tensors[*j].data(), a.tensors[i].size()) != 0)
      return false;
  }
  return true;
}

Errc errc_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return Errc::ok;
}

TEST(ShardedCheckpoint, RoundTripsOnEveryLayoutWithOneNameSortedManifest) {
  const auto m = model_manifest();
  const auto w = random_weights(m, 1);
  TempDir dir;
  std::optional<uint64_t> manifest_digest;
  const std::vector<std::pair<size_t, bool>> layouts = {{1, false}, {1, true}, {3, true}, {m.size(), true}};
  for (const auto& [shards, sharded] : layouts) {
    const fs::path out = dir.path() / ("ckpt-" + std::to_string(shards) + (sharded ? "-dir" : ".safetensors"));
    const Layout layout = even_layout(m, shards, sharded);
    write_checkpoint(out, w.view(), layout);
    const auto c = Checkpoint::open(out);
    EXPECT_EQ(c.layout().sharded, sharded);
    ASSERT_EQ(c.layout().shards.size(), shards);
    for (size_t k = 0; k < shards; ++k) {
      EXPECT_EQ(c.layout().shards[k].file, sharded ? layout.shards[k].file : out.filename().string());
      EXPECT_EQ(c.layout().shards[k].tensors, layout.shards[k].tensors) << "file order of shard " << k;
    }
    EXPECT_TRUE(same_tensors(c.weights(), w.view())) << out;
    for (uint32_t i = 1; i < c.manifest().size(); ++i)
      EXPECT_LT(c.manifest().at(i - 1).name, c.manifest().at(i).name);
    if (!manifest_digest) manifest_digest = c.manifest().digest();
    EXPECT_EQ(c.manifest().digest(), *manifest_digest) << "the layout changed the canonical manifest";
    if (sharded) {
      EXPECT_TRUE(fs::exists(out / kIndexFileName));
      const auto index = nlohmann::json::parse(test::read_raw(out / kIndexFileName));
      EXPECT_EQ(index["weight_map"].size(), m.size());
      EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), m.total_bytes());
    }
  }
}

// A delta encoded from two single files applies to the same model stored as shards, and one
// encoded from shards applies to a single file: the canonical coordinates do not see shards.
TEST(ShardedCheckpoint, ADeltaFromOneLayoutAppliesToAnother) {
  const auto m = model_manifest();
  const auto [base, next] = base_and_next(m, 2);
  TempDir dir;
  const std::vector<std::pair<Layout, Layout>> pairs = {{even_layout(m, 1, false), even_layout(m, 3)},
                                                        {even_layout(m, 4), even_layout(m, 1, false)},
                                                        {even_layout(m, 2), even_layout(m, m.size())}};
  int n = 0;
  for (const auto& [from, to] : pairs) {
    const fs::path a = dir.path() / ("from-base-" + std::to_string(n)), b = dir.path() / ("from-next-" + std::to_string(n));
    const fs::path target = dir.path() / ("to-" + std::to_string(n)), result = dir.path() / ("result-" + std::to_string(n));
    ++n;
    write_checkpoint(a, base.view(), from);
    write_checkpoint(b, next.view(), from);
    write_checkpoint(target, base.view(), to);
    const auto ca = Checkpoint::open(a), cb = Checkpoint::open(b);
    const auto delta = codec::encode_delta(ca.weights(), cb.weights(), codec::StateDigest::full_scan(ca.weights()),
                                           {1, 2}, {});
    const auto ct = Checkpoint::open(target);
    codec::OwnedWeights copy(ct.weights());
    codec::DeltaApplier applier(copy.manifest(), copy.mutable_view(), 1, codec::StateDigest::full_scan(ct.weights()));
    for (const auto& f : delta.frames) applier.apply(f);
    applier.verify();
    applier.commit();
    write_checkpoint(result, copy.view(), ct.layout());
    const auto cr = Checkpoint::open(result);
    EXPECT_TRUE(same_tensors(cr.weights(), next.view())) << "pair " << n;
    ASSERT_EQ(cr.layout().shards.size(), to.shards.size());
    for (size_t k = 0; k < to.shards.size(); ++k) EXPECT_EQ(cr.layout().shards[k].tensors, to.shards[k].tensors);
  }
}

// Checkpoint::reader() reads, with pread, the bytes the mappings show, on every layout (whole
// tensors and pieces at odd offsets); a diff over the readers gives the frames of a diff over the
// mappings.
TEST(ShardedCheckpoint, TheReaderReadsWhatTheMappingsShow) {
  const auto m = model_manifest();
  const auto [base, next] = base_and_next(m, 4);
  TempDir dir;
  int n = 0;
  for (const auto& layout : {even_layout(m, 1, false), even_layout(m, 3), even_layout(m, m.size())}) {
    const fs::path a = dir.path() / ("base-" + std::to_string(n)), b = dir.path() / ("next-" + std::to_string(n));
    ++n;
    write_checkpoint(a, base.view(), layout);
    write_checkpoint(b, next.view(), layout);
    const auto ca = Checkpoint::open(a), cb = Checkpoint::open(b);
    const auto mapped = ca.weights();
    ASSERT_EQ(&ca.reader().manifest(), &ca.manifest());
    for (uint32_t t = 0; t < m.size(); ++t) {
      const auto& want = mapped.tensors[t];
      std::vector<std::byte> got(want.size());
      ca.reader().read(t, 0, got);
      EXPECT_TRUE(got.empty() || std::memcmp(got.data(), want.data(), got.size()) == 0)
          << "layout " << n << " tensor " << t;
      if (want.size() < 3) continue;
      std::vector<std::byte> piece(want.size() - 2);
      ca.reader().read(t, 1, std::span(piece).first(piece.size() - 1));
      EXPECT_EQ(std::memcmp(piece.data(), want.data() + 1, piece.size() - 1), 0) << "layout " << n << " tensor " << t;
    }
    codec::EncodeOptions opts;
    opts.chunk_bytes = 1000;  // several chunks, tensors split across them
    const auto over_maps = codec::encode_delta(ca.weights(), cb.weights(), {1, 2}, opts);
    const auto over_reads = codec::encode_delta(ca.reader(), cb.reader(), {1, 2}, opts);
    EXPECT_EQ(over_reads.frames, over_maps.frames) << "layout " << n;
    EXPECT_EQ(over_reads.new_digest, over_maps.new_digest) << "layout " << n;
  }
}

// The reader reads the file the checkpoint opened: a file renamed over its path afterwards (a
// trainer replacing a checkpoint) is not read; one truncated under it (rewritten in place) is an
// Error(io) naming the file, not SIGBUS or bytes of the wrong version.
TEST(ShardedCheckpoint, TheReaderReadsTheOpenedFileAndATruncationIsAnError) {
  const auto m = model_manifest();
  const auto old_bytes = random_weights(m, 6), new_bytes = random_weights(m, 7);
  TempDir dir;
  const fs::path file = dir.path() / "model.safetensors";
  write_checkpoint(file, old_bytes.view(), even_layout(m, 1, false));
  const auto c = Checkpoint::open(file);
  write_checkpoint(file, new_bytes.view(), even_layout(m, 1, false));  // a new file renamed over it
  for (uint32_t t = 0; t < c.manifest().size(); ++t) {                 // c's manifest is sorted by name, m is not
    std::vector<std::byte> got(c.manifest().at(t).nbytes());
    c.reader().read(t, 0, got);
    const auto& want = old_bytes.tensors[*m.find(c.manifest().at(t).name)];
    EXPECT_TRUE(got.empty() || std::memcmp(got.data(), want.data(), got.size()) == 0) << t;
  }
  const auto d = Checkpoint::open(file);
  fs::resize_file(file, fs::file_size(file) / 2);
  const uint32_t last = *d.manifest().find(d.layout().shards[0].tensors.back());  // its data ends last
  std::vector<std::byte> got(d.manifest().at(last).nbytes());
  std::string message;
  EXPECT_EQ(errc_of([&] { d.reader().read(last, 0, got); }, &message), Errc::io);
  EXPECT_NE(message.find(file.string()), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

// Every safetensors dtype (8-byte ones included: BatchNorm counters, position ids, F64 buffers),
// each changed, written to disk as shards, diffed, applied and read back bit-exact.
TEST(ShardedCheckpoint, EveryDtypeChangedRoundTripsBitExact) {
  const codec::Manifest m({{"bool", codec::DType::bool_, {17}},      {"u8", codec::DType::u8, {33}},
                           {"i8", codec::DType::i8, {33}},            {"u16", codec::DType::u16, {9, 7}},
                           {"i16", codec::DType::i16, {65}},          {"u32", codec::DType::u32, {31}},
                           {"i32", codec::DType::i32, {3, 11}},       {"u64", codec::DType::u64, {29}},
                           {"i64.num_batches_tracked", codec::DType::i64, {}},
                           {"i64.position_ids", codec::DType::i64, {1, 513}},
                           {"f16", codec::DType::f16, {40}},          {"bf16", codec::DType::bf16, {129, 3}},
                           {"f32", codec::DType::f32, {77}},          {"f64", codec::DType::f64, {45}},
                           {"f8e4m3", codec::DType::f8_e4m3, {19}},   {"f8e5m2", codec::DType::f8_e5m2, {19}},
                           {"empty.i64", codec::DType::i64, {0}}});
  const auto base = random_weights(m, 11);
  auto next = base;
  perturb(next, 12);
  for (uint32_t i = 0; i < m.size(); ++i) {
    if (m.at(i).nbytes() == 0) continue;
    ASSERT_NE(std::memcmp(base.tensors[i].data(), next.tensors[i].data(), m.at(i).nbytes()), 0) << m.at(i).name;
  }
  TempDir dir;
  write_checkpoint(dir.path() / "base", base.view(), even_layout(m, 4));
  write_checkpoint(dir.path() / "next", next.view(), even_layout(m, 4));
  const auto cb = Checkpoint::open(dir.path() / "base"), cn = Checkpoint::open(dir.path() / "next");
  const auto delta =
      codec::encode_delta(cb.weights(), cn.weights(), codec::StateDigest::full_scan(cb.weights()), {4, 5}, {});
  codec::OwnedWeights copy(cb.weights());
  codec::DeltaApplier applier(copy.manifest(), copy.mutable_view(), 4, codec::StateDigest::full_scan(cb.weights()));
  for (const auto& f : delta.frames) applier.apply(f);
  applier.verify();
  applier.audit();
  applier.commit();
  write_checkpoint(dir.path() / "result", copy.view(), cb.layout());
  EXPECT_TRUE(same_tensors(Checkpoint::open(dir.path() / "result").weights(), next.view()));
  EXPECT_GT(delta.stats.changes, 0u);
}

TEST(ShardedCheckpoint, InPlaceWritesReachEveryShard) {
  const auto m = model_manifest();
  const auto w = random_weights(m, 4);
  auto next = w;
  perturb(next, 5);
  TempDir dir;
  write_checkpoint(dir.path() / "c", w.view(), even_layout(m, 3));
  {
    auto c = Checkpoint::open_for_update(dir.path() / "c");
    auto mw = c.mutable_weights();
    const auto nv = next.view();
    for (uint32_t i = 0; i < m.size(); ++i) {
      const auto j = *nv.manifest->find(c.manifest().at(i).name);
      if (!mw.tensors[i].empty()) std::memcpy(mw.tensors[i].data(), nv.tensors[j].data(), mw.tensors[i].size());
    }
    c.flush();
  }
  EXPECT_TRUE(same_tensors(Checkpoint::open(dir.path() / "c").weights(), next.view()));
}

struct BadIndex : ::testing::Test {
  codec::Manifest m = model_manifest();
  Bytes w = random_weights(m, 6);
  TempDir dir;
  fs::path ckpt = dir.path() / "c";
  void SetUp() override { write_checkpoint(ckpt, w.view(), even_layout(m, 3)); }
  nlohmann::ordered_json index() const { return nlohmann::ordered_json::parse(test::read_raw(ckpt / kIndexFileName)); }
  void write_index(const std::string& text) const { test::write_raw(ckpt / kIndexFileName, text); }
  void expect_refused(Errc code, const std::string& words) const {
    std::string message;
    EXPECT_EQ(errc_of([&] { Checkpoint::open(ckpt); }, &message), code) << message;
    EXPECT_NE(message.find(words), std::string::npos) << "'" << words << "' not in: " << message;
  }
};

TEST_F(BadIndex, AMissingShardIsNamed) {
  fs::remove(ckpt / "model-00002-of-00003.safetensors");
  expect_refused(Errc::not_found, "model-00002-of-00003.safetensors");
}

TEST_F(BadIndex, ATensorListedTwiceInTheIndexIsRefused) {
  std::string text = test::read_raw(ckpt / kIndexFileName);
  const std::string entry = "\"lm_head.weight\": \"model-00001-of-00003.safetensors\"";
  const auto at = text.find("\"weight_map\": {");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + std::strlen("\"weight_map\": {"), "\n    " + entry + ",");
  write_index(text);
  expect_refused(Errc::invalid_argument, "twice");
}

TEST_F(BadIndex, ATensorInTwoShardsIsRefused) {
  // Shard 3 rewritten to also hold a tensor of shard 1 (the index still names shard 1 for it).
  const auto layout = even_layout(m, 3);
  auto third = layout.shards[2];
  third.tensors.push_back(layout.shards[0].tensors.front());
  std::vector<codec::TensorInfo> infos;
  std::vector<std::span<const std::byte>> spans;
  const auto v = w.view();
  for (const auto& name : third.tensors) {
    infos.push_back(m.at(*m.find(name)));
    spans.push_back(v.tensors[*m.find(name)]);
  }
  const codec::Manifest fm(infos);
  write_safetensors(ckpt / third.file, codec::ConstWeights{&fm, spans});
  expect_refused(Errc::invalid_argument, "'" + layout.shards[0].tensors.front() + "'");
}

TEST_F(BadIndex, ShardsThatDisagreeWithTheIndexAreRefused) {
  const auto original = index();
  auto j = original;
  const std::string moved = j["weight_map"].begin().key();
  j["weight_map"][moved] = "model-00003-of-00003.safetensors";  // it is in shard 1
  write_index(j.dump());
  expect_refused(Errc::invalid_argument, moved);
  // A tensor the index lists that no shard holds.
  j = original;
  j["weight_map"]["model.ghost"] = "model-00001-of-00003.safetensors";
  write_index(j.dump());
  expect_refused(Errc::invalid_argument, "model.ghost");
  // A shard holding a tensor the index does not list (shard 3 holds several: it stays named).
  j = original;
  const std::string unlisted = even_layout(m, 3).shards[2].tensors.back();
  j["weight_map"].erase(unlisted);
  write_index(j.dump());
  expect_refused(Errc::invalid_argument, unlisted);
}

TEST_F(BadIndex, MalformedIndexesAreRefused) {
  write_index("{not json");
  expect_refused(Errc::invalid_argument, "not valid JSON");
  write_index("{\"metadata\": {}}");
  expect_refused(Errc::invalid_argument, "weight_map");
  write_index("{\"weight_map\": {\"x\": \"../escape.safetensors\"}}");
  expect_refused(Errc::invalid_argument, "not a file in this directory");
  write_index("{\"weight_map\": {\"x\": 3}}");
  expect_refused(Errc::invalid_argument, "not a file name");
}

// An index is read whole, so it is bounded (as a safetensors header: 100 MB), and a FIFO in its
// place is refused at once (the read used to wait for a writer, forever).
TEST_F(BadIndex, AnIndexThatIsTooLargeOrNotAFileIsRefused) {
  fs::resize_file(ckpt / kIndexFileName, kMaxHeaderBytes + 1);  // sparse: costs no disk
  expect_refused(Errc::invalid_argument, "more than the 100000000 bytes");
  fs::remove(ckpt / kIndexFileName);
  ASSERT_EQ(::mkfifo((ckpt / kIndexFileName).c_str(), 0600), 0);
  expect_refused(Errc::invalid_argument, "is not a regular file");
}

// A symlink loop where a file is expected is an Error(io) as the contract says, not a
// std::filesystem error that callers catching Error (the watch producer) do not expect.
TEST_F(BadIndex, ASymlinkLoopIsAnIoError) {
  fs::remove(ckpt / kIndexFileName);
  fs::create_symlink(kIndexFileName, ckpt / kIndexFileName);
  expect_refused(Errc::io, "symbolic links");
  const fs::path single = dir.path() / "single";
  fs::create_directories(single);
  fs::create_symlink("x.safetensors", single / "x.safetensors");
  std::string message;
  EXPECT_EQ(errc_of([&] { Checkpoint::open(single); }, &message), Errc::io) << message;
}

// A small index whose metadata nests 200000 levels deep parsed, and then overflowed the stack when
// it was copied or written out (every command crashed with SIGSEGV): refused at parse now.
TEST_F(BadIndex, AnIndexNestedTooDeeplyIsRefusedNotACrash) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  write_index("{\"metadata\": {\"x\": " + deep + "}, \"weight_map\": {}}");
  expect_refused(Errc::invalid_argument, "nested deeper than");
}

TEST(ShardedCheckpoint, DirectoriesWithoutAnIndexHoldExactlyOneFile) {
  const auto m = model_manifest();
  const auto w = random_weights(m, 7);
  TempDir dir;
  write_checkpoint(dir.path() / "model.safetensors", w.view(), even_layout(m, 1, false));
  const auto c = Checkpoint::open(dir.path());
  EXPECT_FALSE(c.layout().sharded);
  EXPECT_TRUE(same_tensors(c.weights(), w.view()));
  write_checkpoint(dir.path() / "other.safetensors", w.view(), even_layout(m, 1, false));
  std::string message;
  EXPECT_EQ(errc_of([&] { Checkpoint::open(dir.path()); }, &message), Errc::invalid_argument);
  EXPECT_NE(message.find("2 .safetensors files"), std::string::npos) << message;
  EXPECT_EQ(errc_of([&] { Checkpoint::open(dir.path() / "nothing"); }), Errc::io);
}

TEST(ShardedCheckpoint, WritingRefusesALayoutThatDoesNotPlaceEveryTensorOnce) {
  const auto m = model_manifest();
  const auto w = random_weights(m, 8);
  TempDir dir;
  auto layout = even_layout(m, 2);
  layout.shards[1].tensors.pop_back();
  EXPECT_EQ(errc_of([&] { write_checkpoint(dir.path() / "a", w.view(), layout); }), Errc::invalid_argument);
  layout = even_layout(m, 2);
  layout.shards[1].tensors.push_back(layout.shards[0].tensors.front());
  EXPECT_EQ(errc_of([&] { write_checkpoint(dir.path() / "b", w.view(), layout); }), Errc::invalid_argument);
  EXPECT_FALSE(fs::exists(dir.path() / "b" / kIndexFileName));
}

// Every file under `dir`: relative name -> "size:hash of the bytes".
std::map<std::string, std::string> files_under(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string bytes = test::read_raw(e.path());
    out[fs::relative(e.path(), dir).string()] =
        std::to_string(bytes.size()) + ":" + std::to_string(std::hash<std::string>{}(bytes));
  }
  return out;
}

// Entries of `dir` left by a write (staging directories).
std::vector<std::string> staging_left(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".partial") != std::string::npos) out.push_back(e.path().filename());
  return out;
}

// A model and two versions of it (v2: ~1% of v1's bytes changed), for the tests of writing a
// directory again.
class ShardedRewrite : public ::testing::Test {
 protected:
  ShardedRewrite() : v1(random_weights(m, 21)), v2(v1) { perturb(v2, 22); }
  const codec::Manifest m = model_manifest();
  Bytes v1;
  Bytes v2;
  TempDir dir;
};

// A sharded directory written again (apply --out onto the directory a server loads) is swapped in
// whole: the new shards and index, what lay beside the shards kept, shards the new index does not
// name gone, nothing left behind.
TEST_F(ShardedRewrite, RewritingADirectorySwapsItInWholeAndKeepsWhatLayBesideTheShards) {
  const fs::path out = dir.path() / "serve";
  write_checkpoint(out, v1.view(), even_layout(m, 3));
  test::write_raw(out / "config.json", "{\"model_type\": \"llama\"}\n");
  fs::create_directory(out / "original");
  test::write_raw(out / "original" / "params.json", "{}\n");
  test::write_raw(out / "model-00009-of-00009.safetensors", "stale");
  test::write_raw(out / ".gitattributes", "*.safetensors filter=lfs\n");
  write_checkpoint(out, v2.view(), even_layout(m, 2));
  const auto c = Checkpoint::open(out);
  EXPECT_TRUE(same_tensors(c.weights(), v2.view()));
  EXPECT_EQ(c.layout().shards.size(), 2U);
  EXPECT_EQ(test::read_raw(out / "config.json"), "{\"model_type\": \"llama\"}\n");
  EXPECT_EQ(test::read_raw(out / "original" / "params.json"), "{}\n");
  EXPECT_EQ(test::read_raw(out / ".gitattributes"), "*.safetensors filter=lfs\n");
  EXPECT_FALSE(fs::exists(out / "model-00009-of-00009.safetensors"));
  EXPECT_FALSE(fs::exists(out / "model-00003-of-00003.safetensors"));
  EXPECT_EQ(staging_left(dir.path()), std::vector<std::string>{});
  // Through a symlink (a `latest` link): the directory it names is replaced, the link stays.
  fs::create_directory_symlink("serve", dir.path() / "latest");
  write_checkpoint(dir.path() / "latest", v1.view(), even_layout(m, 3));
  EXPECT_TRUE(fs::is_symlink(dir.path() / "latest"));
  EXPECT_TRUE(same_tensors(Checkpoint::open(out).weights(), v1.view()));
  EXPECT_EQ(test::read_raw(out / "config.json"), "{\"model_type\": \"llama\"}\n");
  EXPECT_EQ(staging_left(dir.path()), std::vector<std::string>{});
}

// A write that fails part-way (here the third shard exceeds RLIMIT_FSIZE: EFBIG, as a full disk
// gives ENOSPC) leaves the directory byte for byte as it was: never new shards beside old ones.
TEST_F(ShardedRewrite, AWriteThatFailsPartWayLeavesTheDirectoryAsItWas) {
  Layout layout;  // the largest tensor (4290 bytes) alone in the last shard
  layout.sharded = true;
  layout.shards.push_back({"model-00001-of-00003.safetensors", {}, {}});
  layout.shards.push_back({"model-00002-of-00003.safetensors", {"model.embed_tokens.weight"}, {}});
  layout.shards.push_back({"model-00003-of-00003.safetensors", {"model.layers.1.mlp.weight"}, {}});
  for (const auto& t : m.tensors())
    if (t.name != "model.embed_tokens.weight" && t.name != "model.layers.1.mlp.weight")
      layout.shards[0].tensors.push_back(t.name);
  const fs::path out = dir.path() / "serve";
  write_checkpoint(out, v1.view(), layout);
  test::write_raw(out / "config.json", "{}\n");
  const auto before = files_under(out);

  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 4096;  // every shard but the last fits
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  const Errc code = errc_of([&] { write_checkpoint(out, v2.view(), layout); }, &message);
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);

  EXPECT_EQ(code, Errc::io) << message;
  EXPECT_NE(message.find("model-00003-of-00003"), std::string::npos) << message;
  EXPECT_EQ(files_under(out), before) << "a failed write changed the directory";
  EXPECT_EQ(staging_left(dir.path()), std::vector<std::string>{});
  EXPECT_TRUE(same_tensors(Checkpoint::open(out).weights(), v1.view()));
}

// The old directory is removed after the swap: one holding another file system's mount point is
// refused before anything changes (a tmpfs mounted inside it: needs CAP_SYS_ADMIN).
TEST_F(ShardedRewrite, ADirectoryHoldingAMountPointIsNotReplaced) {
  const fs::path out = dir.path() / "serve";
  write_checkpoint(out, v1.view(), even_layout(m, 2));
  fs::create_directory(out / "data");
  if (::mount("tmpfs", (out / "data").c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
  test::write_raw(out / "data" / "keep.bin", "precious");
  const auto before = files_under(out);
  std::string message;
  const Errc code = errc_of([&] { write_checkpoint(out, v2.view(), even_layout(m, 3)); }, &message);
  const auto after = files_under(out);
  ::umount2((out / "data").c_str(), MNT_DETACH);
  EXPECT_EQ(code, Errc::io);
  EXPECT_NE(message.find("mount point"), std::string::npos) << message;
  EXPECT_EQ(after, before);
  EXPECT_EQ(staging_left(dir.path()), std::vector<std::string>{});
}

// A volume's root (a container's model mount) cannot be swapped: its files are written in place,
// each atomically, the index last; what lay beside the shards stays.
TEST_F(ShardedRewrite, AMountedVolumeIsWrittenInPlace) {
  const fs::path out = dir.path() / "volume";
  fs::create_directory(out);
  if (::mount("tmpfs", out.c_str(), "tmpfs", 0, "size=4m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
  write_checkpoint(out, v1.view(), even_layout(m, 3));
  test::write_raw(out / "config.json", "{}\n");
  write_checkpoint(out, v2.view(), even_layout(m, 3));
  const bool v2_read = same_tensors(Checkpoint::open(out).weights(), v2.view());
  const std::string config = test::read_raw(out / "config.json");
  const bool still_mounted = ::umount2(out.c_str(), MNT_DETACH) == 0;
  EXPECT_TRUE(v2_read);
  EXPECT_EQ(config, "{}\n");
  EXPECT_TRUE(still_mounted) << "the volume was replaced instead of written";
  EXPECT_EQ(staging_left(dir.path()), std::vector<std::string>{});
}

}  // namespace
}  // namespace deltacast::checkpoint
