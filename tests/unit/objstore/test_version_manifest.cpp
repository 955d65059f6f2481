// objstore::VersionManifest (objstore/version_store.h): a manifest written reads back equal, and
// every inconsistency a damaged or hostile manifest can carry is refused naming it.
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "objstore/version_store.h"
#include "util/error.h"

namespace deltacast::objstore {
namespace {

VersionManifest sample() {
  VersionManifest m;
  m.version = 42;
  m.base_version = 41;
  m.epoch = 3;
  m.digest = 0xfeedfacecafebeefull;
  m.object = frames_key("run-1", 42);
  m.frames = {{0, 100, 1, ""}, {100, 7, 2, ""}, {107, 50, 3, ""}};
  m.object_size = 157;
  return m;
}

std::string refusal(const std::string& json) {
  try {
    VersionManifest::parse(json, "m.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::corrupt_frame);
    return e.what();
  }
  return "";
}

TEST(VersionManifest, RoundTripsAndKeysAreOrdered) {
  const VersionManifest m = sample();
  const VersionManifest back = VersionManifest::parse(m.to_json(), "m.json");
  EXPECT_EQ(back.version, 42u);
  EXPECT_EQ(back.base_version, 41u);
  EXPECT_EQ(back.epoch, 3u);
  EXPECT_EQ(back.digest, m.digest);
  EXPECT_EQ(back.object, "run-1/v00000000000000000042/frames");
  ASSERT_EQ(back.frames.size(), 3u);
  EXPECT_EQ(back.frames[2].offset, 107u);
  EXPECT_EQ(back.frames[2].xxh3, 3u);
  EXPECT_EQ(manifest_key("", 7), "v00000000000000000007/manifest.json");
  EXPECT_EQ(latest_key("a/b"), "a/b/latest.json");
  // Zero-padded: the store's key order is the version order.
  EXPECT_LT(manifest_key("p", 9), manifest_key("p", 10));
}

TEST(VersionManifest, RefusesWhatIsNotConsistent) {
  EXPECT_NE(refusal("[1,2]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(refusal("{\"format\":\"other\"}").find("manifest"), std::string::npos);
  auto edit = [](const std::function<void(VersionManifest&)>& f) {
    VersionManifest m = sample();
    f(m);
    return m.to_json();
  };
  EXPECT_NE(refusal(edit([](auto& m) { m.frames[1].offset = 99; })).find("frame 1"), std::string::npos);   // overlap
  EXPECT_NE(refusal(edit([](auto& m) { m.frames[2].offset = 108; })).find("frame 2"), std::string::npos);  // gap
  EXPECT_NE(refusal(edit([](auto& m) { m.object_size = 200; })).find("cover 157"), std::string::npos);
  EXPECT_NE(refusal(edit([](auto& m) { m.object_size = 150; })).find("frame 2"), std::string::npos);
  EXPECT_NE(refusal(edit([](auto& m) { m.frames[0].size = 0; })).find("frame 0"), std::string::npos);
  EXPECT_NE(refusal(edit([](auto& m) { m.kind = "junk"; })).find("kind"), std::string::npos);
  std::string no_digest = sample().to_json();
  no_digest.replace(no_digest.find("\"digest\""), 8, "\"digestX\"");
  EXPECT_NE(refusal(no_digest).find("'digest'"), std::string::npos);
  EXPECT_NE(refusal(std::string(70, '[') + std::string(70, ']')).find("not a JSON object"), std::string::npos);
}

// With the job's secret a manifest is signed: it reads back and checks, and any field changed
// after signing, another secret, or no signature at all is refused (Error(auth)).
TEST(VersionManifest, SignedManifestsCheckAndForgeriesAreRefused) {
  VersionManifest m = sample();
  const std::vector<std::byte> a(100, std::byte{1}), b(7, std::byte{2}), c(50, std::byte{3});
  const std::vector<std::span<const std::byte>> bytes{a, b, c};
  m.sign("job-secret", bytes);
  EXPECT_EQ(m.signature.size(), 64u);
  EXPECT_EQ(m.frames[0].sha256,
            "80f93e8c7d0e1e083e6aab0b073011d858d092951eb4bb2d595cd43173e04704");  // SHA-256 of 100 x 0x01
  const VersionManifest back = VersionManifest::parse(m.to_json(), "m.json");
  EXPECT_EQ(back.frames[1].sha256, m.frames[1].sha256);
  EXPECT_NO_THROW(back.check_signature("job-secret", "m.json"));
  auto refused = [](const VersionManifest& x, const std::string& secret) {
    try {
      x.check_signature(secret, "m.json");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::auth);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused(back, "another-secret").find("not signed with this job's secret"), std::string::npos);
  for (const auto& change : std::vector<std::function<void(VersionManifest&)>>{
           [](VersionManifest& x) { x.digest ^= 1; }, [](VersionManifest& x) { x.base_version = 40; },
           [](VersionManifest& x) { x.frames[2].sha256[0] = x.frames[2].sha256[0] == 'a' ? 'b' : 'a'; },
           [](VersionManifest& x) { x.frames[0].xxh3 = 9; }}) {
    VersionManifest forged = VersionManifest::parse(m.to_json(), "m.json");
    change(forged);
    EXPECT_NE(refused(VersionManifest::parse(forged.to_json(), "m.json"), "job-secret").find("was not signed"),
              std::string::npos);
  }
  EXPECT_NE(refused(sample(), "job-secret").find("is not signed"), std::string::npos);
}

}  // namespace
}  // namespace deltacast::objstore
