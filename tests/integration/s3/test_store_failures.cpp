// Versions over the store when things go wrong (issue 34, "Failure and bad input"): the
// tree::StorePublisher / StoreFollower and objstore::VersionWriter / VersionReader against a real
// RGW (the s3_server fixture, scripts/s3-server.sh) that is killed while a member downloads and
// while the producer uploads, whose S3 key is revoked, whose bucket does not exist, whose objects
// are replaced by junk, and where a producer died in the middle of a multipart upload. After every
// failure the member holds, bit for bit, the last version it committed (its version, its digest
// and every byte against the model's), and once the store is whole again it catches up exactly.
// What test_s3_client.cpp covers already (a wrong secret, a flipped bit, a delta damaged in place)
// is not repeated here.
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "codec/encoder.h"
#include "objstore/s3_client.h"
#include "objstore/version_store.h"
#include "tests/integration/s3/s3_test_env.h"
#include "tests/integration/tree/tree_test_model.h"
#include "tree/store_versions.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
using namespace objstore::s3_test;
using objstore::S3Client;
using objstore::S3Options;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A model's versions: version 0 all zeros (what a member holds before anything); each next version
// rewrites a fraction of the bytes at random, so a delta is as large as a test needs.
class History {
 public:
  History(std::vector<codec::TensorInfo> infos, uint64_t seed) : manifest_(std::move(infos)), seed_(seed) {
    std::vector<Bytes> zeros;
    for (const auto& t : manifest_.tensors()) zeros.emplace_back(t.nbytes());
    versions_.push_back(std::move(zeros));
  }
  const codec::Manifest& manifest() const { return manifest_; }
  uint64_t newest() const { return versions_.size() - 1; }
  const std::vector<Bytes>& bits(uint64_t v) const { return versions_.at(v); }

  // Makes version newest() + 1 from newest(): each byte rewritten at random with probability
  // `fraction` (another `salt`, another version).
  uint64_t next(double fraction, uint64_t salt = 0) {
    std::vector<Bytes> v = versions_.back();
    std::mt19937_64 rng(seed_ * 1000 + versions_.size() + salt * 7919);
    std::bernoulli_distribution rewrite(fraction);
    for (auto& t : v)
      for (auto& b : t)
        if (fraction >= 1 || rewrite(rng)) b = static_cast<std::byte>(rng());
    versions_.push_back(std::move(v));
    return newest();
  }
  codec::ConstWeights weights(uint64_t v) const {
    codec::ConstWeights w{&manifest_, {}};
    for (const auto& t : versions_.at(v)) w.tensors.emplace_back(t.data(), t.size());
    return w;
  }
  uint64_t digest(uint64_t v) const { return codec::StateDigest::full_scan(weights(v)).combined(); }
  // The frames of the delta from v - 1 to v (every chunk of 1 MiB of weights, then the seal), as
  // the tree carries them.
  std::vector<Bytes> delta(uint64_t v) const {
    const codec::ConstWeights base = weights(v - 1), next = weights(v);
    codec::EncodeOptions o;
    o.chunk_bytes = kMiB;
    codec::DeltaEncoder encoder(base, next, codec::StateDigest::full_scan(base), codec::VersionIds{v - 1, v}, o);
    std::vector<Bytes> frames;
    for (uint32_t c = 0; c < encoder.chunk_count(); ++c) frames.push_back(encoder.encode_chunk(c));
    frames.push_back(encoder.seal());
    return frames;
  }
  // Publishes the delta to version v (epoch 1).
  objstore::VersionManifest publish(StorePublisher& publisher, uint64_t v) const {
    return publisher.publish_delta(v, v - 1, 1, digest(v), delta(v));
  }

 private:
  codec::Manifest manifest_;
  uint64_t seed_;
  std::vector<std::vector<Bytes>> versions_;  // [v]
};

// About 1.5 MiB: a delta of a few frames.
std::vector<codec::TensorInfo> small_model() {
  return {{"embed", codec::DType::bf16, {512, 1024}},
          {"layer.0.w", codec::DType::bf16, {512, 512}},
          {"layer.0.norm", codec::DType::bf16, {512}},
          {"head.bias", codec::DType::f32, {333}}};
}

// `mib` MiB of BF16 in 4 MiB tensors, and a small F32 one.
std::vector<codec::TensorInfo> large_model(uint64_t mib) {
  std::vector<codec::TensorInfo> infos;
  for (uint64_t i = 0; i < mib / 4; ++i)
    infos.push_back({"layer." + std::to_string(i) + ".w", codec::DType::bf16, {2048, 1024}});
  infos.push_back({"head.bias", codec::DType::f32, {333}});
  return infos;
}

// A member that reaches only the store: its own buffers, holding version `held` of the history
// (0: zeros), and its follower.
struct Member {
  std::vector<Bytes> bits;
  std::unique_ptr<StoreFollower> follower;

  Member(const History& h, S3Client& client, const StoreLayout& layout, uint64_t held = 0) : bits(h.bits(held)) {
    codec::MutableWeights w{&h.manifest(), {}};
    for (auto& t : bits) w.tensors.emplace_back(t.data(), t.size());
    follower = std::make_unique<StoreFollower>(h.manifest(), client, layout, w, held,
                                               codec::StateDigest::full_scan(w.as_const()));
  }
};

// The member holds version v exactly: its version, its digest, and every byte against the model's.
::testing::AssertionResult holds(const Member& m, const History& h, uint64_t v) {
  if (m.follower->version() != v)
    return ::testing::AssertionFailure() << "the member is at version " << m.follower->version() << ", not " << v;
  if (m.follower->digest() != h.digest(v))
    return ::testing::AssertionFailure() << "the member's digest is not version " << v << "'s";
  if (!same_bits(m.bits, h.weights(v)))
    return ::testing::AssertionFailure() << "the member's bits are not version " << v << "'s";
  return ::testing::AssertionSuccess();
}

// `call` throws an Error of one of `codes` whose message contains `needle`.
::testing::AssertionResult throws(const std::function<void()>& call, std::initializer_list<Errc> codes,
                                  const std::string& needle = "") {
  try {
    call();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (std::find(codes.begin(), codes.end(), e.code()) == codes.end())
      return ::testing::AssertionFailure() << "Error(" << errc_name(e.code()) << "): " << what;
    if (what.find(needle) == std::string::npos)
      return ::testing::AssertionFailure() << "the message does not name '" << needle << "': " << what;
    return ::testing::AssertionSuccess() << what;
  }
  return ::testing::AssertionFailure() << "no Error";
}

std::vector<std::byte> bytes_of(const std::string& text) {
  const auto b = std::as_bytes(std::span(text));
  return {b.begin(), b.end()};
}

// radosgw's PID, when its command line still names the server's ceph.conf (a PID reused since is
// never signalled, as in scripts/s3-server.sh); 0 otherwise.
pid_t rgw_pid(const std::map<std::string, std::string>& env) {
  const std::string dir = env.at("S3_DIR");
  std::ifstream pid_file(dir + "/rgw.pid");
  long pid = 0;
  if (!(pid_file >> pid) || pid <= 0) return 0;
  std::ifstream cmdline("/proc/" + std::to_string(pid) + "/cmdline");
  const std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
  return args.find(dir + "/ceph.conf") == std::string::npos ? 0 : static_cast<pid_t>(pid);
}

// Kills radosgw from a thread of its own the moment `ready()` holds, while the test's thread is
// inside a call to the store: first SIGSTOP, so that no request in flight completes after that
// moment, then scripts/s3-server.sh kill-rgw (SIGKILL: connections reset, new ones refused).
class RgwKiller {
 public:
  RgwKiller(const std::map<std::string, std::string>& env, std::function<bool()> ready)
      : thread_([this, &env, ready = std::move(ready)] {
          while (!done_ && !ready()) std::this_thread::sleep_for(200us);
          if (done_) return;
          if (const pid_t pid = rgw_pid(env)) ::kill(pid, SIGSTOP);
          killed_ = server_script(env, "kill-rgw") == 0;
        }) {}
  ~RgwKiller() { finish(); }
  // Stops waiting (the call returned); true when radosgw was killed.
  bool finish() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    return killed_;
  }

 private:
  std::atomic<bool> done_{false};
  std::atomic<bool> killed_{false};
  std::thread thread_;
};

class StoreFailures : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = server_env();
    client_ = std::make_unique<S3Client>(options_of(env_), credentials_of(env_));
    prefix_ = unique_prefix();
    layout_ = StoreLayout{prefix_ + "job", 5 * kMiB, 2, 16};
  }
  // The next test finds the server as the fixture made it (radosgw up, the key valid), and this
  // test's objects and uploads gone (the OSD keeps them in RAM).
  void TearDown() override {
    if (env_.empty() || !client_) return;
    if (key_revoked_) {
      EXPECT_EQ(server_script(env_, "restore-key"), 0);
    }
    if (server_script(env_, "status") != 0) {
      EXPECT_EQ(server_script(env_, "restart-rgw"), 0);
    }
    try {
      for (const auto& o : client_->list(prefix_)) client_->remove(o.key);
      for (const auto& u : client_->list_multipart(prefix_)) client_->abort_multipart(u.key, u.upload_id);
    } catch (const Error& e) {
      ADD_FAILURE() << "cleaning " << prefix_ << ": " << e.what();
    }
  }
  // A client of its own: few attempts, quick to give up on a store that is away.
  S3Client impatient_client() const {
    S3Options o = options_of(env_);
    o.max_attempts = 3;
    o.connect_timeout = 500ms;
    o.request_timeout = 5000ms;
    return S3Client(o, credentials_of(env_));
  }
  std::string deltas() const { return layout_.prefix + "/deltas"; }

  std::map<std::string, std::string> env_;
  std::unique_ptr<S3Client> client_;
  std::string prefix_;
  StoreLayout layout_;
  bool key_revoked_ = false;
};

// A member six deltas behind (at 2 of 8) downloads; radosgw is stopped dead in the middle of
// delta 5. catch_up fails with a connection error after its few attempts, and the member holds the
// last version it committed (4 at least: deltas 3 and 4 came whole), exactly. radosgw back: it
// catches up to the newest version, exact.
TEST_F(StoreFailures, TheStoreKilledMidDownloadLeavesTheMemberAtACommittedVersion) {
  History h(large_model(8), 1);
  StorePublisher publisher(h.manifest(), *client_, layout_);
  S3Client member_client = impatient_client();
  Member member(h, member_client, layout_);
  h.publish(publisher, h.next(1.0));
  h.publish(publisher, h.next(0.25));
  ASSERT_EQ(member.follower->catch_up(), 2u);
  ASSERT_TRUE(holds(member, h, 2));
  std::vector<uint64_t> sizes(9);  // [v]: delta v's frames object
  while (h.newest() < 8) {
    const auto m = h.publish(publisher, h.next(0.25));
    sizes[m.version] = m.object_size;
  }
  ASSERT_GT(sizes[5], 2 * kMiB);

  // Killed once a MiB of delta 5 is in: deltas 3 and 4 are whole by then, so applied.
  const uint64_t received = member_client.stats().bytes_received;
  RgwKiller killer(env_, [&] { return member_client.stats().bytes_received >= received + sizes[3] + sizes[4] + kMiB; });
  EXPECT_TRUE(throws([&] { member.follower->catch_up(); }, {Errc::connection, Errc::timeout}));
  ASSERT_TRUE(killer.finish()) << "radosgw was not killed";
  const uint64_t held = member.follower->version();
  EXPECT_GE(held, 4u) << "deltas 3 and 4, downloaded whole, were not applied";
  EXPECT_LT(held, 8u) << "the member caught up although radosgw was killed";
  EXPECT_TRUE(holds(member, h, held)) << "after radosgw died";

  ASSERT_EQ(server_script(env_, "restart-rgw"), 0);
  EXPECT_EQ(member.follower->catch_up(), 8u);
  EXPECT_TRUE(holds(member, h, 8));
}

// The producer's radosgw dies once the first 5 MiB part of a 4-part delta is up: publish_delta
// throws; after restart-rgw the dead upload's parts are there but neither a frames object nor a
// manifest of the version, so a member sees only the version before (exact); prune() frees the
// parts; the delta published again is caught up exactly.
TEST_F(StoreFailures, TheStoreKilledMidUploadLeavesNoVersionAndItsPartsAreFreed) {
  History h(large_model(16), 2);
  S3Client producer_client = impatient_client();
  StorePublisher publisher(h.manifest(), producer_client, layout_);
  Member member(h, *client_, layout_);
  h.publish(publisher, h.next(1.0));
  ASSERT_EQ(member.follower->catch_up(), 1u);
  const auto frames = h.delta(h.next(1.0));
  uint64_t size = 0;
  for (const auto& f : frames) size += f.size();
  ASSERT_GT(size, 3 * layout_.part_bytes) << "the delta is not a multipart upload of several parts";

  const uint64_t sent = producer_client.stats().bytes_sent;
  RgwKiller killer(env_, [&] { return producer_client.stats().bytes_sent >= sent + layout_.part_bytes; });
  EXPECT_TRUE(
      throws([&] { publisher.publish_delta(2, 1, 1, h.digest(2), frames); }, {Errc::connection, Errc::timeout}));
  ASSERT_TRUE(killer.finish()) << "radosgw was not killed";
  ASSERT_EQ(server_script(env_, "restart-rgw"), 0);

  EXPECT_FALSE(client_->list_multipart(prefix_).empty()) << "the dead upload left no parts: the test missed it";
  EXPECT_FALSE(client_->head(objstore::frames_key(deltas(), 2))) << "a half-uploaded version's object is visible";
  EXPECT_FALSE(client_->head(objstore::manifest_key(deltas(), 2))) << "a half-uploaded version has a manifest";
  EXPECT_EQ(member.follower->catch_up(), 1u);
  EXPECT_TRUE(holds(member, h, 1));

  publisher.prune();
  EXPECT_TRUE(client_->list_multipart(prefix_).empty()) << "prune() left a dead upload's parts";
  publisher.publish_delta(2, 1, 1, h.digest(2), frames);
  EXPECT_EQ(member.follower->catch_up(), 2u);
  EXPECT_TRUE(holds(member, h, 2));
}

// The S3 key is revoked mid-run (radosgw-admin key rm): the member's catch_up fails at once with
// Error(auth) naming InvalidAccessKeyId (one request; a retry would wait 2 to 4 s), weights
// unchanged; the producer's next publish is refused the same way and leaves nothing. The key
// restored, the member catches up exactly.
TEST_F(StoreFailures, RevokedCredentialsAreRefusedAtOnceAndTheMemberStaysExact) {
  History h(small_model(), 3);
  S3Options slow = options_of(env_);
  slow.max_attempts = 4;
  slow.backoff_base = 4000ms;
  slow.backoff_max = 8000ms;
  S3Client member_client(slow, credentials_of(env_));
  S3Client producer_client(slow, credentials_of(env_));
  StorePublisher publisher(h.manifest(), producer_client, layout_);
  Member member(h, member_client, layout_);
  h.publish(publisher, h.next(1.0));
  ASSERT_EQ(member.follower->catch_up(), 1u);
  h.publish(publisher, h.next(0.05));

  ASSERT_EQ(server_script(env_, "revoke-key"), 0);
  key_revoked_ = true;
  const auto before = member_client.stats();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws([&] { member.follower->catch_up(); }, {Errc::auth}, "InvalidAccessKeyId"));
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(member_client.stats().requests - before.requests, 1u) << "a 403 was retried";
  EXPECT_EQ(member_client.stats().retries, before.retries);
  EXPECT_LT(elapsed, 2s);
  EXPECT_TRUE(holds(member, h, 1));

  const uint64_t v3 = h.next(0.05);
  const auto producer_before = producer_client.stats();
  EXPECT_TRUE(throws([&] { h.publish(publisher, v3); }, {Errc::auth}, "InvalidAccessKeyId"));
  EXPECT_EQ(producer_client.stats().requests - producer_before.requests, 1u) << "a 403 was retried";

  ASSERT_EQ(server_script(env_, "restore-key"), 0);
  key_revoked_ = false;
  EXPECT_FALSE(client_->head(objstore::frames_key(deltas(), 3))) << "a refused publish left an object";
  EXPECT_EQ(member.follower->catch_up(), 2u);
  EXPECT_TRUE(holds(member, h, 2));
}

// A member and a producer pointed at a bucket that does not exist: Error(not_found) naming
// NoSuchBucket and the bucket, at once (not retried); the member's weights (version 1) unchanged;
// the bucket is not created.
TEST_F(StoreFailures, ABucketThatDoesNotExistIsNamedAndNothingIsWritten) {
  History h(small_model(), 4);
  h.next(1.0);
  h.next(0.05);
  S3Options o = options_of(env_);
  o.bucket = "deltacast-missing-" + std::to_string(std::random_device{}());
  S3Client missing(o, credentials_of(env_));
  Member member(h, missing, layout_, 1);
  EXPECT_TRUE(throws([&] { member.follower->catch_up(); }, {Errc::not_found}, "NoSuchBucket"));
  EXPECT_TRUE(throws([&] { member.follower->catch_up(); }, {Errc::not_found}, o.bucket));
  EXPECT_TRUE(holds(member, h, 1));

  StorePublisher publisher(h.manifest(), missing, layout_);
  const uint64_t requests = missing.stats().requests;
  EXPECT_TRUE(throws([&] { h.publish(publisher, 2); }, {Errc::not_found}, o.bucket));
  EXPECT_EQ(missing.stats().requests - requests, 1u) << "a 404 was retried";
  EXPECT_TRUE(throws([&] { publisher.publish_snapshot(2, 1, h.weights(2)); }, {Errc::not_found}, o.bucket));
  EXPECT_TRUE(throws([&] { missing.list(""); }, {Errc::not_found}, "NoSuchBucket")) << "the bucket was created";
  EXPECT_TRUE(holds(member, h, 1));
}

// Junk in the bucket under delta 2 while the member holds version 1: the frames object replaced
// by junk longer and shorter than it was, cut after its first frame, deleted; the manifest not
// JSON, or JSON of another shape. Each is refused with an error naming what is wrong, and the
// member stays exactly at version 1. Then frames that hash right but mix two deltas: applied,
// refused by the seal, rolled back to version 1 exactly. With the bucket whole again it catches up
// exactly. At version 2 (the newest), latest.json not JSON or without a version is refused (a
// member reads it only when the next manifest is not there); last, a latest.json naming a
// version never written: the member stays at 2 with Error(not_found).
TEST_F(StoreFailures, JunkInTheBucketIsRefusedAndTheMemberStaysExact) {
  // Frames in their own object, to damage it apart from the manifest (a version inline in its
  // manifest: test_s3_client's DamagedInlineVersionsAreRefusedNamingWhatIsWrong).
  layout_.inline_bytes = 0;
  History h(small_model(), 5);
  StorePublisher publisher(h.manifest(), *client_, layout_);
  Member member(h, *client_, layout_);
  h.publish(publisher, h.next(1.0));
  ASSERT_EQ(member.follower->catch_up(), 1u);
  History other = h;  // another version 2
  other.next(0.05, 1);
  const objstore::VersionManifest m = h.publish(publisher, h.next(0.05));
  ASSERT_GE(m.frames.size(), 3u);

  const std::string object = objstore::frames_key(deltas(), 2);
  const std::string manifest = objstore::manifest_key(deltas(), 2);
  const std::string latest = objstore::latest_key(deltas());
  struct Damage {
    const char* what;
    std::string key;
    std::vector<std::byte> bytes;
    Errc code;
    std::string needle;
  };
  const auto original = client_->get(object);
  const std::vector<Damage> damages = {
      {"frames replaced by longer junk", object, random_bytes(original.size() + 4096, 51), Errc::corrupt_frame,
       "of version 2"},
      {"frames replaced by shorter junk", object, random_bytes(original.size() / 2, 52), Errc::corrupt_frame,
       "of version 2"},
      {"frames cut after the first frame", object,
       std::vector<std::byte>(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(m.frames[0].size)),
       Errc::corrupt_frame, "of version 2"},
      {"a manifest that is not JSON", manifest, bytes_of(R"({"format": "deltacast.objstore.version/2", "vers)"),
       Errc::corrupt_frame, manifest},
      {"a manifest of another shape", manifest, bytes_of("[2, 1, 1]"), Errc::corrupt_frame, manifest},
  };
  // Each damage in turn: refused naming it, the member exact at `held`, the object put back.
  auto refuse_each = [&](const std::vector<Damage>& list, uint64_t held) {
    for (const Damage& d : list) {
      const auto kept = client_->get(d.key);
      client_->put(d.key, d.bytes);
      EXPECT_TRUE(throws([&] { member.follower->catch_up(); }, {d.code}, d.needle)) << d.what;
      EXPECT_TRUE(holds(member, h, held)) << d.what;
      client_->put(d.key, kept);
    }
  };
  refuse_each(damages, 1);
  client_->remove(object);
  EXPECT_TRUE(throws([&] { member.follower->catch_up(); }, {Errc::not_found}, "NoSuchKey")) << "frames deleted";
  EXPECT_TRUE(holds(member, h, 1)) << "frames deleted";
  client_->put(object, original);

  // Frames that each hash right but do not make version 2 (chunk 1 of another delta from version
  // 1, as if the producer mixed two up), published whole: applied, then refused by the seal's
  // digests and rolled back.
  auto mixed = h.delta(2);
  mixed[1] = other.delta(2)[1];
  ASSERT_NE(mixed[1], h.delta(2)[1]);
  publisher.publish_delta(2, 1, 1, h.digest(2), mixed);
  EXPECT_TRUE(throws([&] { member.follower->catch_up(); }, {Errc::verify_failed})) << "mixed frames";
  EXPECT_TRUE(holds(member, h, 1)) << "mixed frames";
  h.publish(publisher, 2);
  EXPECT_EQ(member.follower->catch_up(), 2u);
  EXPECT_TRUE(holds(member, h, 2));

  // A damaged latest.json: a member reads it only when the next version's manifest is not there (it
  // goes from the manifest of the version after the one it holds), so at the newest version.
  const std::vector<Damage> latest_damages = {
      {"a latest.json that is not JSON", latest, random_bytes(40, 53), Errc::corrupt_frame, latest},
      {"a latest.json without a version", latest, bytes_of(R"({"format": "deltacast.objstore.latest/1"})"),
       Errc::corrupt_frame, latest},
  };
  refuse_each(latest_damages, 2);

  // latest.json names version 7, of which nothing was written: 2 is the newest there is.
  client_->put(latest, bytes_of(R"({"format": "deltacast.objstore.latest/1", "version": 7})"));
  EXPECT_TRUE(throws([&] { member.follower->catch_up(); }, {Errc::not_found}, "version 3"));
  EXPECT_TRUE(holds(member, h, 2));
}

// A producer dies after uploading 2 parts of version 2's frames, the upload never completed: the
// member never sees version 2 (latest, manifest, object: none names it) and stays exact at 1;
// VersionWriter::abort_orphans() frees the upload; version 2 published whole is caught up exactly.
TEST_F(StoreFailures, AMultipartUploadLeftIncompleteIsNeverSeenAndIsFreed) {
  History h(small_model(), 6);
  StorePublisher publisher(h.manifest(), *client_, layout_);
  Member member(h, *client_, layout_);
  h.publish(publisher, h.next(1.0));
  ASSERT_EQ(member.follower->catch_up(), 1u);

  const std::string key = objstore::frames_key(deltas(), 2);
  const std::string id = client_->create_multipart(key);
  client_->upload_part(key, id, 1, random_bytes(5 * kMiB, 61));
  client_->upload_part(key, id, 2, random_bytes(kMiB, 62));
  EXPECT_EQ(member.follower->catch_up(), 1u);
  EXPECT_EQ(member.follower->stats().deltas_applied, 1u);
  EXPECT_TRUE(holds(member, h, 1));
  EXPECT_FALSE(client_->head(key)) << "an incomplete upload is visible as an object";
  objstore::VersionReader reader(*client_, {deltas(), layout_.part_bytes, 2, 16});
  EXPECT_EQ(reader.latest(), 1u);
  EXPECT_TRUE(throws([&] { reader.manifest(2); }, {Errc::not_found}, "NoSuchKey"));

  ASSERT_EQ(client_->list_multipart(prefix_).size(), 1u);
  objstore::VersionWriter writer(*client_, {deltas(), layout_.part_bytes, 2, 16});
  EXPECT_EQ(writer.abort_orphans(), 1u);
  EXPECT_TRUE(client_->list_multipart(prefix_).empty());
  h.publish(publisher, h.next(0.05));
  EXPECT_EQ(member.follower->catch_up(), 2u);
  EXPECT_TRUE(holds(member, h, 2));
}

}  // namespace
}  // namespace deltacast::tree
