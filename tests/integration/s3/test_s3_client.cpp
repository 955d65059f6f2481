// objstore::S3Client against a real S3 server: Ceph RGW on 127.0.0.1 (the s3_server fixture,
// scripts/s3-server.sh), which checks every SigV4 signature and payload hash. Objects, ranges,
// listings, multipart uploads completed and aborted, refusals that are never retried (a wrong
// secret, a bucket that does not exist, a range outside the object), and a radosgw stopped in
// the middle of a sequence of requests: retried until it is back.
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include "codec/encoder.h"
#include "objstore/digests.h"
#include "objstore/s3_client.h"
#include "objstore/version_store.h"
#include "tests/integration/s3/s3_test_env.h"
#include "tests/integration/tree/tree_test_model.h"
#include "tree/store_uplink.h"
#include "tree/store_versions.h"
#include "util/error.h"

namespace deltacast::objstore {
namespace {

using namespace std::chrono_literals;
using namespace s3_test;

class S3Server : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = server_env();
    client_ = std::make_unique<S3Client>(options_of(env_), credentials_of(env_));
    prefix_ = unique_prefix();
  }
  std::map<std::string, std::string> env_;
  std::unique_ptr<S3Client> client_;
  std::string prefix_;
};

TEST_F(S3Server, ObjectsRangesListingAndDelete) {
  S3Client& s3 = *client_;
  const auto a = random_bytes(100'003, 1);
  const auto b = random_bytes(17, 2);
  const auto etag = s3.put(prefix_ + "a.bin", a);
  s3.put(prefix_ + "sub dir/b+c.bin", b);  // a key with a space and a '+': signed as encoded
  EXPECT_EQ(s3.get(prefix_ + "a.bin"), a);
  EXPECT_EQ(s3.get(prefix_ + "sub dir/b+c.bin"), b);
  for (auto [first, count] : {std::pair<uint64_t, uint64_t>{0, 1}, {1, 1000}, {99'000, 1003}, {100'002, 1}}) {
    const auto got = s3.get_range(prefix_ + "a.bin", first, count);
    EXPECT_EQ(got, std::vector<std::byte>(a.begin() + first, a.begin() + first + count)) << first << "+" << count;
  }
  const auto head = s3.head(prefix_ + "a.bin");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->size, a.size());
  EXPECT_EQ(head->etag, etag);
  const auto listed = s3.list(prefix_);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, prefix_ + "a.bin");
  EXPECT_EQ(listed[0].size, a.size());
  EXPECT_EQ(listed[1].key, prefix_ + "sub dir/b+c.bin");
  s3.remove(prefix_ + "a.bin");
  s3.remove(prefix_ + "a.bin");  // gone already: no error
  EXPECT_FALSE(s3.head(prefix_ + "a.bin"));
  try {
    s3.get(prefix_ + "a.bin");
    FAIL() << "a deleted object was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found) << e.what();
    EXPECT_NE(std::string(e.what()).find("NoSuchKey"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s3.list(prefix_).size(), 1u);
}

TEST_F(S3Server, MultipartCompletedAndAborted) {
  S3Client& s3 = *client_;
  const size_t part = size_t{5} << 20;  // S3's smallest part but the last
  const auto p1 = random_bytes(part, 3), p2 = random_bytes(part, 4), p3 = random_bytes(12'345, 5);
  const std::string key = prefix_ + "big.bin";
  const std::string id = s3.create_multipart(key);
  std::vector<std::string> etags{s3.upload_part(key, id, 1, p1), s3.upload_part(key, id, 2, p2),
                                 s3.upload_part(key, id, 3, p3)};
  bool pending = false;
  for (const auto& u : s3.list_multipart(prefix_)) pending = pending || u.upload_id == id;
  EXPECT_TRUE(pending) << "an upload in progress is not listed";
  EXPECT_FALSE(s3.head(key)) << "an incomplete multipart upload is visible as an object";
  s3.complete_multipart(key, id, etags);
  std::vector<std::byte> whole(p1);
  whole.insert(whole.end(), p2.begin(), p2.end());
  whole.insert(whole.end(), p3.begin(), p3.end());
  EXPECT_EQ(s3.get(key), whole);
  // A range across the first part boundary.
  EXPECT_EQ(s3.get_range(key, part - 3, 6), std::vector<std::byte>(whole.begin() + part - 3, whole.begin() + part + 3));
  for (const auto& u : s3.list_multipart(prefix_)) EXPECT_NE(u.upload_id, id) << "a completed upload is still listed";

  // Aborted: its parts are freed, no object appears.
  const std::string orphan = prefix_ + "orphan.bin";
  const std::string id2 = s3.create_multipart(orphan);
  s3.upload_part(orphan, id2, 1, p1);
  s3.abort_multipart(orphan, id2);
  for (const auto& u : s3.list_multipart(prefix_)) EXPECT_NE(u.upload_id, id2) << "an aborted upload is still listed";
  EXPECT_FALSE(s3.head(orphan));
}

TEST_F(S3Server, RefusalsAreNamedAndNeverRetried) {
  S3Options o = options_of(env_);
  {
    S3Client wrong(o, S3Credentials{env_.at("AWS_ACCESS_KEY_ID"), "not-the-secret", ""});
    try {
      wrong.put(prefix_ + "x", random_bytes(10, 6));
      FAIL() << "a wrong secret was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::auth) << e.what();
      EXPECT_NE(std::string(e.what()).find("SignatureDoesNotMatch"), std::string::npos) << e.what();
    }
    EXPECT_EQ(wrong.stats().requests, 1u) << "a 403 was retried";
  }
  {
    S3Options missing = o;
    missing.bucket = "no-such-bucket-" + std::to_string(std::random_device{}());
    S3Client none(missing, credentials_of(env_));
    try {
      none.get("x");
      FAIL() << "a bucket that does not exist answered";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::not_found) << e.what();
      EXPECT_NE(std::string(e.what()).find("NoSuchBucket"), std::string::npos) << e.what();
    }
    EXPECT_EQ(none.stats().requests, 1u);
  }
  S3Client& s3 = *client_;
  s3.put(prefix_ + "small", random_bytes(10, 7));
  EXPECT_THROW(s3.get_range(prefix_ + "small", 10, 5), Error);
  EXPECT_THROW(s3.get_range(prefix_ + "small", 5, 10), Error);  // runs past the end: a short answer
  s3.create_bucket();                                           // ours already: no error
}

// radosgw dies in the middle of a sequence of requests and comes back 1.5 s later: the client
// retries (backoff) and every object is read intact; nothing half-done is visible meanwhile.
TEST_F(S3Server, AStoreThatGoesAwayIsRetriedUntilItIsBack) {
  S3Options o = options_of(env_);
  o.max_attempts = 12;
  o.backoff_base = 100ms;
  o.backoff_max = 1000ms;
  o.connect_timeout = 1000ms;
  S3Client s3(o, credentials_of(env_));
  const auto body = random_bytes(1 << 20, 8);
  s3.put(prefix_ + "before", body);
  ASSERT_EQ(server_script(env_, "kill-rgw"), 0);
  std::thread back([&] {
    std::this_thread::sleep_for(1500ms);
    EXPECT_EQ(server_script(env_, "restart-rgw"), 0);
  });
  std::vector<std::byte> got;
  try {
    got = s3.get(prefix_ + "before");
  } catch (...) {
    back.join();
    throw;
  }
  back.join();
  EXPECT_EQ(got, body);
  EXPECT_GT(s3.stats().retries, 0u) << "radosgw was down, yet nothing was retried";
  s3.put(prefix_ + "after", body);
  EXPECT_EQ(s3.get(prefix_ + "after"), body);
}

// ---- versions in the bucket (objstore/version_store.h) ----

std::vector<std::vector<std::byte>> some_frames(size_t count, size_t each, uint64_t seed) {
  std::vector<std::vector<std::byte>> out;
  for (size_t i = 0; i < count; ++i) out.push_back(random_bytes(each + i * 13, seed + i));
  return out;
}

std::vector<std::span<const std::byte>> spans_of(const std::vector<std::vector<std::byte>>& frames) {
  return {frames.begin(), frames.end()};
}

// A small version (one PUT) and a large one (a multipart upload of 5 MiB parts, 3 at a time) are
// read back frame by frame, exact; latest names the newest; prune keeps retain_versions.
TEST_F(S3Server, VersionsPublishedAreReadBackExactAndPruned) {
  VersionStoreOptions o{prefix_ + "run", uint64_t{5} << 20, 3, 2};
  VersionWriter writer(*client_, o);
  VersionReader reader(*client_, o);
  EXPECT_FALSE(reader.latest());
  const auto small = some_frames(5, 1000, 10);
  const auto large = some_frames(4, 3 << 20, 20);  // 12 MiB: three parts
  writer.publish(1, 0, 1, 0x11, spans_of(small), "snapshot");
  EXPECT_EQ(reader.latest(), 1u);
  writer.publish(2, 1, 1, 0x22, spans_of(large));
  EXPECT_EQ(reader.latest(), 2u);
  const VersionManifest m2 = reader.manifest(2);
  EXPECT_EQ(m2.base_version, 1u);
  EXPECT_EQ(m2.digest, 0x22u);
  EXPECT_EQ(reader.frames(m2), large);
  EXPECT_EQ(m2.object, frames_key(o.prefix, 2)) << "12 MiB is above inline_bytes (4 MiB): a frames object";
  // The small version is inline (the default inline_bytes): one object, read with one GET.
  EXPECT_FALSE(client_->head(frames_key(o.prefix, 1)));
  const uint64_t before = client_->stats().requests;
  const VersionManifest m1 = reader.manifest(1);
  EXPECT_EQ(m1.object, manifest_key(o.prefix, 1));
  EXPECT_EQ(m1.kind, "snapshot");
  EXPECT_EQ(reader.frames(m1), small);
  EXPECT_EQ(client_->stats().requests - before, 1u);
  writer.publish(3, 2, 2, 0x33, spans_of(small));
  EXPECT_EQ(writer.prune(), std::vector<uint64_t>{1});
  EXPECT_THROW(reader.manifest(1), Error);
  EXPECT_EQ(reader.frames(reader.manifest(3)), small);
  EXPECT_EQ(writer.abort_orphans(), 0u);
}

// Bad bytes in the bucket are caught, never returned: an object overwritten with junk of the same
// size (the frame named), a truncated object, a manifest that names an object that is gone, a
// manifest of another version under this version's key.
TEST_F(S3Server, DamagedVersionsAreRefusedNamingWhatIsWrong) {
  VersionStoreOptions o{prefix_ + "run", uint64_t{5} << 20, 2, 4};
  o.inline_bytes = 0;  // a frames object beside the manifest (inline: the next test)
  VersionWriter writer(*client_, o);
  VersionReader reader(*client_, o);
  const auto frames = some_frames(3, 4000, 30);
  writer.publish(5, 4, 1, 0x55, spans_of(frames));
  const VersionManifest m = reader.manifest(5);
  auto expect_corrupt = [&](const char* what, const std::string& needle) {
    try {
      reader.frames(reader.manifest(5));
      ADD_FAILURE() << what << ": read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  const std::vector<std::byte> original = client_->get(m.object);
  std::vector<std::byte> junk = original;
  junk[m.frames[1].offset + 5] ^= std::byte{1};
  client_->put(m.object, junk);
  expect_corrupt("one flipped bit", "frame 1 of version 5");
  junk = original;
  junk.resize(m.frames[2].offset + 10);
  client_->put(m.object, junk);
  expect_corrupt("a truncated object", "bytes");
  client_->remove(m.object);
  expect_corrupt("a missing object", "NoSuchKey");
  const std::string other = reader.manifest(5).to_json();
  VersionManifest moved = VersionManifest::parse(other, "m");
  moved.version = 6;
  const std::string text = moved.to_json();
  client_->put(manifest_key(o.prefix, 5), std::as_bytes(std::span(text)));
  try {
    reader.manifest(5);
    ADD_FAILURE() << "a manifest of version 6 was taken for version 5";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_frame) << e.what();
  }
}

// The same for a version inline in its manifest object: a flipped bit among its frames, the
// object cut short, a flipped bit in the manifest's line; and, signed, frames replaced with
// others of the same size whose hashes were rewritten (a writer of the bucket without the secret).
TEST_F(S3Server, DamagedInlineVersionsAreRefusedNamingWhatIsWrong) {
  VersionStoreOptions o{prefix_ + "inline", uint64_t{5} << 20, 2, 4};
  o.secret = "the-job-secret";
  VersionWriter writer(*client_, o);
  VersionReader reader(*client_, o);
  const auto frames = some_frames(3, 4000, 31);
  writer.publish(5, 4, 1, 0x55, spans_of(frames));
  const std::string key = manifest_key(o.prefix, 5);
  const VersionManifest m = reader.manifest(5);
  ASSERT_EQ(m.object, key);
  ASSERT_EQ(reader.frames(m), frames);
  const std::vector<std::byte> original = client_->get(key);
  const size_t line = original.size() - m.object_size;  // the manifest's line and its '\n'
  auto refusal = [&](const std::vector<std::byte>& body) {
    client_->put(key, body);
    try {
      reader.frames(reader.manifest(5));
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(Errc::internal, std::string("read"));
  };
  std::vector<std::byte> junk = original;
  junk[line + m.frames[1].offset + 5] ^= std::byte{1};
  auto [code, what] = refusal(junk);
  EXPECT_EQ(code, Errc::corrupt_frame) << what;
  EXPECT_NE(what.find("frame 1 of version 5"), std::string::npos) << what;
  junk = original;
  junk.resize(line + m.frames[2].offset + 10);
  std::tie(code, what) = refusal(junk);
  EXPECT_EQ(code, Errc::corrupt_frame) << what;
  EXPECT_NE(what.find("bytes follow the manifest of version 5"), std::string::npos) << what;
  junk = original;
  junk[line / 2] ^= std::byte{2};
  std::tie(code, what) = refusal(junk);
  EXPECT_TRUE(code == Errc::corrupt_frame || code == Errc::auth) << what;
  // Other frames of the same sizes, their xxh3 and sha256 rewritten in the manifest: the
  // signature no longer matches.
  const auto others = some_frames(3, 4000, 32);
  VersionManifest forged = m;
  std::vector<std::byte> body;
  for (size_t i = 0; i < others.size(); ++i) {
    forged.frames[i].xxh3 = XXH3_64bits(others[i].data(), others[i].size());
    forged.frames[i].sha256 = objstore::digest_hex(EVP_sha256(), others[i]);
    body.insert(body.end(), others[i].begin(), others[i].end());
  }
  const std::string forged_line = forged.to_json() + "\n";
  body.insert(body.begin(), reinterpret_cast<const std::byte*>(forged_line.data()),
              reinterpret_cast<const std::byte*>(forged_line.data() + forged_line.size()));
  std::tie(code, what) = refusal(body);
  EXPECT_EQ(code, Errc::auth) << what;
  // Put back, it reads exact again.
  client_->put(key, original);
  EXPECT_EQ(reader.frames(reader.manifest(5)), frames);
}

// A producer that dies after uploading some parts: no manifest, latest unchanged, the version
// never seen; abort_orphans() frees the parts.
TEST_F(S3Server, APartlyUploadedVersionIsNeverSeenAndItsPartsAreFreed) {
  VersionStoreOptions o{prefix_ + "run", uint64_t{5} << 20, 2, 4};
  VersionWriter writer(*client_, o);
  VersionReader reader(*client_, o);
  writer.publish(1, 0, 1, 0x1, spans_of(some_frames(2, 100, 40)));
  const std::string key = frames_key(o.prefix, 2);
  const std::string id = client_->create_multipart(key);
  client_->upload_part(key, id, 1, random_bytes(size_t{5} << 20, 41));
  EXPECT_EQ(reader.latest(), 1u);
  EXPECT_THROW(reader.manifest(2), Error);
  EXPECT_FALSE(client_->head(key));
  EXPECT_EQ(writer.abort_orphans(), 1u);
  EXPECT_TRUE(client_->list_multipart(o.prefix).empty());
}

// Virtual-host addressing (BUCKET.host/KEY, as AWS prefers) against the same server: radosgw
// runs with `rgw dns name = localhost` and curl resolves BUCKET.localhost to loopback. Objects,
// a range, a listing, a multipart upload and a version written path-style and read
// virtual-host-style (and back) are the same bytes; a bucket that does not exist is NoSuchBucket.
TEST_F(S3Server, VirtualHostAddressingSeesTheSameBucket) {
  S3Options o = options_of(env_);
  const std::string port = o.endpoint.substr(o.endpoint.rfind(':') + 1);
  o.endpoint = "http://localhost:" + port;
  o.path_style = false;
  S3Client vhost(o, credentials_of(env_));
  ASSERT_EQ(vhost.url("k", ""), "http://" + o.bucket + ".localhost:" + port + "/k");
  const auto body = random_bytes(100'000, 61);
  vhost.put(prefix_ + "a b+c.bin", body);
  EXPECT_EQ(client_->get(prefix_ + "a b+c.bin"), body) << "written virtual-host, read path-style";
  EXPECT_EQ(vhost.get_range(prefix_ + "a b+c.bin", 99'990, 10), std::vector<std::byte>(body.end() - 10, body.end()));
  const auto listed = vhost.list(prefix_);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].key, prefix_ + "a b+c.bin");
  const std::string key = prefix_ + "big.bin";
  const auto p1 = random_bytes(size_t{5} << 20, 62), p2 = random_bytes(777, 63);
  const std::string id = vhost.create_multipart(key);
  vhost.complete_multipart(key, id, {vhost.upload_part(key, id, 1, p1), vhost.upload_part(key, id, 2, p2)});
  std::vector<std::byte> whole(p1);
  whole.insert(whole.end(), p2.begin(), p2.end());
  EXPECT_EQ(client_->get(key), whole);
  VersionStoreOptions vo{prefix_ + "run", uint64_t{5} << 20, 2, 4};
  const auto frames = some_frames(3, 3000, 64);
  VersionWriter(*client_, vo).publish(1, 0, 1, 0x1, spans_of(frames));
  VersionReader reader(vhost, vo);
  EXPECT_EQ(reader.frames(reader.manifest(1)), frames);
  o.bucket = "no-such-bucket-" + std::to_string(std::random_device{}());
  try {
    S3Client(o, credentials_of(env_)).get("k");
    ADD_FAILURE() << "a bucket that does not exist answered";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found) << e.what();
    EXPECT_NE(std::string(e.what()).find("NoSuchBucket"), std::string::npos) << e.what();
  }
}

// ---- a producer's versions over the store (tree/store_versions.h) ----

// The frames of the delta from `base` to `next` (every chunk, then the seal), as the tree carries them.
std::vector<std::vector<std::byte>> delta_frames(const tree::Model& base, const tree::Model& next, uint64_t v) {
  codec::EncodeOptions o;
  o.chunk_bytes = 64 << 10;
  codec::DeltaEncoder encoder(base.weights(), next.weights(), codec::StateDigest::full_scan(base.weights()),
                              codec::VersionIds{v - 1, v}, o);
  std::vector<std::vector<std::byte>> frames;
  for (uint32_t c = 0; c < encoder.chunk_count(); ++c) frames.push_back(encoder.encode_chunk(c));
  frames.push_back(encoder.seal());
  return frames;
}

uint64_t digest_of(const tree::Model& m) { return codec::StateDigest::full_scan(m.weights()).combined(); }

// Zeroed buffers of `manifest` (version 0), appended to `held` (empty: its pointers are taken),
// as a follower's weights.
codec::MutableWeights zeroed(const codec::Manifest& manifest, std::vector<tree::Bytes>& held) {
  for (const auto& t : manifest.tensors()) held.emplace_back(t.nbytes());
  codec::MutableWeights w{&manifest, {}};
  for (auto& t : held) w.tensors.emplace_back(t.data(), t.size());
  return w;
}

// A member that only reaches the store: from version 0 it takes the newest snapshot and replays
// the deltas after it; one that holds a version whose next delta was pruned takes the snapshot
// too; one that is one version behind replays it. Every one ends exact on the newest version.
TEST_F(S3Server, AMemberCatchesUpFromTheStoreBySnapshotAndReplay) {
  tree::StoreLayout layout{prefix_ + "job", uint64_t{5} << 20, 2, 2};
  tree::Model model = tree::Model::make(91);
  tree::StorePublisher publisher(model.manifest, *client_, layout);
  std::vector<tree::Model> versions{model};  // [v - 1]
  publisher.publish_snapshot(1, 1, model.weights(), 100'000);
  // A member at version 1 (took the snapshot before the deltas came).
  std::vector<tree::Bytes> early(model.tensors);
  codec::MutableWeights early_w{&model.manifest, {}};
  for (auto& t : early) early_w.tensors.emplace_back(t.data(), t.size());
  tree::StoreFollower behind(model.manifest, *client_, layout, early_w, 1,
                             codec::StateDigest::full_scan(early_w.as_const()));
  for (uint64_t v = 2; v <= 5; ++v) {
    tree::Model next = versions.back();
    next.step(v);
    publisher.publish_delta(v, v - 1, 1, digest_of(next), delta_frames(versions.back(), next, v));
    versions.push_back(next);
    if (v == 4) publisher.publish_snapshot(4, 1, next.weights(), 100'000);
    publisher.prune();  // 2 deltas kept: 2 and 3 are gone by the end
    if (v == 2) {
      EXPECT_EQ(behind.catch_up(), 2u);  // one delta behind: replayed
      EXPECT_EQ(behind.stats().snapshots_taken, 0u);
    }
  }
  const tree::Model& newest = versions.back();
  // From version 0: the snapshot of version 4, then delta 5.
  std::vector<tree::Bytes> fresh;
  codec::MutableWeights fresh_w = zeroed(model.manifest, fresh);
  tree::StoreFollower newcomer(model.manifest, *client_, layout, fresh_w, 0,
                               codec::StateDigest::full_scan(fresh_w.as_const()));
  EXPECT_EQ(newcomer.catch_up(), 5u);
  EXPECT_EQ(newcomer.stats().snapshots_taken, 1u);
  EXPECT_EQ(newcomer.stats().deltas_applied, 1u);
  EXPECT_TRUE(tree::same_bits(fresh, newest.weights()));
  EXPECT_EQ(newcomer.digest(), digest_of(newest));
  // At version 2, delta 3 pruned: the snapshot, then delta 5.
  EXPECT_EQ(behind.catch_up(), 5u);
  EXPECT_EQ(behind.stats().snapshots_taken, 1u);
  EXPECT_TRUE(tree::same_bits(early, newest.weights()));
  EXPECT_EQ(newcomer.catch_up(), 5u);  // nothing new: nothing done
}

// A delta whose object was damaged in the bucket is refused and rolled back: the member stays
// exactly at the version it held, and catches up once the producer publishes a good version.
TEST_F(S3Server, ADamagedDeltaLeavesTheMemberAtItsVersion) {
  tree::StoreLayout layout{prefix_ + "job", uint64_t{5} << 20, 2, 4};
  tree::Model v1 = tree::Model::make(92);
  tree::StorePublisher publisher(v1.manifest, *client_, layout);
  publisher.publish_snapshot(1, 1, v1.weights(), 100'000);
  std::vector<tree::Bytes> held;
  codec::MutableWeights w = zeroed(v1.manifest, held);
  tree::StoreFollower member(v1.manifest, *client_, layout, w, 0, codec::StateDigest::full_scan(w.as_const()));
  ASSERT_EQ(member.catch_up(), 1u);
  tree::Model v2 = v1;
  v2.step(2);
  auto frames = delta_frames(v1, v2, 2);
  const auto m = publisher.publish_delta(2, 1, 1, digest_of(v2), frames);
  // Overwrite the object with the frames of another delta of the same sizes: every XXH3 differs.
  std::vector<std::byte> junk = client_->get(m.object);
  for (size_t i = 0; i < junk.size(); i += 97) junk[i] ^= std::byte{0x10};
  client_->put(m.object, junk);
  EXPECT_THROW(member.catch_up(), Error);
  EXPECT_EQ(member.version(), 1u);
  EXPECT_TRUE(tree::same_bits(held, v1.weights())) << "a refused delta left bits behind";
  publisher.publish_delta(2, 1, 1, digest_of(v2), frames);  // published again, whole
  EXPECT_EQ(member.catch_up(), 2u);
  EXPECT_TRUE(tree::same_bits(held, v2.weights()));
}

// A relay (a gateway) sees each delta before a bit of it lands and applies it on its own thread;
// a relay that does not apply it, and a delta whose manifest names another digest than its seal,
// leave the member exactly at the version it held. Broken by applying before the relay, by
// trusting a relay that returned, or by not comparing the manifest's digest.
TEST_F(S3Server, ARelayAppliesEachDeltaItselfAndAWrongDigestIsRefused) {
  tree::StoreLayout layout{prefix_ + "job", uint64_t{5} << 20, 2, 4};
  tree::Model v1 = tree::Model::make(95);
  tree::StorePublisher publisher(v1.manifest, *client_, layout);
  publisher.publish_snapshot(1, 1, v1.weights(), 100'000);
  std::vector<tree::Bytes> held;
  codec::MutableWeights w = zeroed(v1.manifest, held);
  tree::StoreFollower member(v1.manifest, *client_, layout, w, 0, codec::StateDigest::zeros(v1.manifest));
  ASSERT_EQ(member.catch_up(), 1u);
  tree::Model v2 = v1;
  v2.step(2);
  const auto frames = delta_frames(v1, v2, 2);
  publisher.publish_delta(2, 1, 1, digest_of(v1), frames);  // the manifest names the base's digest
  EXPECT_THROW(member.catch_up(), Error);
  EXPECT_EQ(member.version(), 1u);
  EXPECT_TRUE(tree::same_bits(held, v1.weights())) << "a delta of another digest left bits behind";
  publisher.publish_delta(2, 1, 1, digest_of(v2), frames);
  member.relay_deltas([](const objstore::VersionManifest&, const std::vector<std::vector<std::byte>>&,
                         const std::function<void()>&) {});
  try {
    member.catch_up();
    ADD_FAILURE() << "a relay that did not apply was trusted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::state) << e.what();
  }
  EXPECT_EQ(member.version(), 1u);
  std::vector<uint64_t> relayed;
  member.relay_deltas([&](const objstore::VersionManifest& m, const std::vector<std::vector<std::byte>>& f,
                          const std::function<void()>& apply) {
    EXPECT_EQ(member.version(), m.base_version);
    EXPECT_TRUE(tree::same_bits(held, v1.weights())) << "applied before the relay had it";
    EXPECT_EQ(f, frames);
    relayed.push_back(m.version);
    std::thread(apply).join();
  });
  EXPECT_EQ(member.catch_up(), 2u);
  EXPECT_EQ(relayed, std::vector<uint64_t>{2});
  EXPECT_TRUE(tree::same_bits(held, v2.weights()));
  EXPECT_EQ(member.digest(), digest_of(v2));
}

// The uplink of a producer (tree/store_uplink.h): version 1 whole, then deltas, a whole version at
// least every retain_versions versions; a member from version 0 reaches every version exactly, at
// every step, whatever was pruned. The records beside the versions (model, acks, end) read back,
// and a fresh uplink clears an earlier chain.
TEST_F(S3Server, TheUplinkKeepsEveryVersionReachableFromVersionZero) {
  const tree::StoreLayout layout{prefix_ + "job", uint64_t{5} << 20, 2, 2};
  tree::Model model = tree::Model::make(93);
  auto uplink_client = std::make_unique<S3Client>(options_of(env_), credentials_of(env_));
  client_->put(layout.prefix + "/deltas/stale", std::as_bytes(std::span("x", 1)));  // an earlier chain's
  tree::StoreUplink uplink(model.manifest, std::move(uplink_client), {layout, 0, true});
  EXPECT_TRUE(client_->list(layout.prefix + "/deltas/").empty()) << "a fresh uplink left an earlier chain";
  const auto read_back = tree::read_model(*client_, layout);
  ASSERT_TRUE(read_back);
  EXPECT_EQ(read_back->digest(), model.manifest.digest());
  EXPECT_FALSE(tree::read_end(*client_, layout));
  ASSERT_TRUE(uplink.wants_snapshot(1));
  uplink.snapshot(1, std::make_shared<const codec::OwnedWeights>(model.weights()));
  std::vector<uint64_t> whole{1};
  for (uint64_t v = 2; v <= 7; ++v) {
    tree::Model next = model;
    next.step(v);
    uplink.delta(v, v - 1, digest_of(next), delta_frames(model, next, v));
    if (uplink.wants_snapshot(v)) {
      uplink.snapshot(v, std::make_shared<const codec::OwnedWeights>(next.weights()));
      whole.push_back(v);
    }
    uplink.wait_idle();
    model = next;
    std::vector<tree::Bytes> fresh;
    codec::MutableWeights w = zeroed(model.manifest, fresh);
    tree::StoreFollower member(model.manifest, *client_, layout, w, 0, codec::StateDigest::zeros(model.manifest));
    EXPECT_EQ(member.catch_up(), v);
    EXPECT_TRUE(tree::same_bits(fresh, model.weights())) << "version " << v;
  }
  EXPECT_EQ(whole, (std::vector<uint64_t>{1, 3, 5, 7}));  // retain_versions 2: whole every 2 versions
  tree::publish_ack(*client_, layout, 4, {7, digest_of(model)});
  const auto ack = tree::read_ack(*client_, layout, 4);
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->version, 7u);
  EXPECT_EQ(ack->digest, digest_of(model));
  EXPECT_FALSE(tree::read_ack(*client_, layout, 5));
  const auto stats = uplink.finish(7);
  EXPECT_EQ(stats.deltas, 6u);
  EXPECT_EQ(stats.snapshots, 4u);
  EXPECT_EQ(stats.failed, 0u);
  EXPECT_EQ(tree::read_end(*client_, layout), 7u);
  client_->put(layout.prefix + "/model.json", std::as_bytes(std::span("{\"format\": 1}", 13)));
  EXPECT_THROW(tree::read_model(*client_, layout), Error);
  EXPECT_GT(tree::clear_store(*client_, layout), 0u);
  EXPECT_TRUE(client_->list(layout.prefix + "/").empty());
}

// A job with a secret signs its versions: a member with the secret takes the producer's versions
// and refuses one that someone with write access to the bucket made, frames and seal consistent
// (unsigned, or signed with another secret), staying exact at the version before. Without the
// secret (the gap docs/object-storage.md names) such a version applies.
TEST_F(S3Server, AForgedVersionIsRefusedWhenTheJobHasASecret) {
  tree::StoreLayout layout{prefix_ + "job", uint64_t{5} << 20, 2, 4, "the-job-secret"};
  tree::Model v1 = tree::Model::make(94);
  tree::StorePublisher producer(v1.manifest, *client_, layout);
  producer.publish_snapshot(1, 1, v1.weights(), 100'000);
  tree::Model v2 = v1;
  v2.step(2);
  producer.publish_delta(2, 1, 1, digest_of(v2), delta_frames(v1, v2, 2));
  tree::Model forged = v2;
  forged.step(77);
  for (const std::string& secret : {std::string(), std::string("a-guessed-secret")}) {
    tree::StoreLayout theirs = layout;
    theirs.secret = secret;
    tree::StorePublisher writer(v1.manifest, *client_, theirs);
    writer.publish_delta(3, 2, 1, digest_of(forged), delta_frames(v2, forged, 3));
    std::vector<tree::Bytes> held;
    codec::MutableWeights w = zeroed(v1.manifest, held);
    tree::StoreFollower member(v1.manifest, *client_, layout, w, 0, codec::StateDigest::zeros(v1.manifest));
    try {
      member.catch_up();
      ADD_FAILURE() << "a forged version 3 (secret '" << secret << "') was applied";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::auth) << e.what();
      EXPECT_NE(std::string(e.what()).find(secret.empty() ? "is not signed" : "was not signed with this job's secret"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(member.version(), 2u);
    EXPECT_TRUE(tree::same_bits(held, v2.weights())) << "a forged version left bits behind";
  }
  // A member without the secret cannot tell: it applies the forgery (why a job with a store should
  // have a secret_file).
  tree::StoreLayout open = layout;
  open.secret.clear();
  std::vector<tree::Bytes> held;
  codec::MutableWeights w = zeroed(v1.manifest, held);
  tree::StoreFollower unsigned_member(v1.manifest, *client_, open, w, 0, codec::StateDigest::zeros(v1.manifest));
  EXPECT_EQ(unsigned_member.catch_up(), 3u);
  EXPECT_TRUE(tree::same_bits(held, forged.weights()));
}

}  // namespace
}  // namespace deltacast::objstore
