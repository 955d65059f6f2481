#include <gtest/gtest.h>

#include <sys/stat.h>

#include "transport/transport.h"

namespace deltacast::transport {
namespace {

TEST(Url, ParsesEveryForm) {
  auto tcp = Url::parse("tcp://127.0.0.1:7000");
  EXPECT_EQ(tcp.scheme, "tcp");
  EXPECT_EQ(tcp.host, "127.0.0.1");
  EXPECT_EQ(tcp.port, 7000);
  auto ofi = Url::parse("ofi+shm://localhost:0");
  EXPECT_EQ(ofi.scheme, "ofi");
  EXPECT_EQ(ofi.provider, "shm");
  EXPECT_EQ(ofi.full_scheme(), "ofi+shm");
  auto v6 = Url::parse("ucx://[::1]:65535");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 65535);
  auto loop = Url::parse("loop://relay-3");
  EXPECT_EQ(loop.host, "relay-3");
  EXPECT_EQ(loop.port, 0);
}

TEST(Url, RoundTripsThroughStr) {
  for (const char* text : {"tcp://h:1", "ofi+tcp://10.0.0.1:9", "ucx://[fe80::1]:80", "loop://x"}) {
    auto url = Url::parse(text);
    EXPECT_EQ(url.str(), text);
    EXPECT_EQ(Url::parse(url.str()), url);
  }
}

TEST(Url, RejectsMalformedWithInvalidArgument) {
  for (const char* text : {"", "tcp:/h:1", "tcp://h", "tcp://:1", "tcp://h:65536", "tcp://h:1x", "ofi://h:1",
                           "ofi+://h:1", "tcp+x://h:1", "http://h:1", "ucx://::1:5", "ucx://[::1:5", "loop://",
                           "loop://a/b"}) {
    try {
      Url::parse(text);
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << text;
      EXPECT_NE(std::string(e.what()).find("bad transport URL"), std::string::npos);
    }
  }
}

TEST(Factory, KnowsBuiltAndUnknownSchemes) {
  EXPECT_TRUE(backend_built("tcp"));
  EXPECT_TRUE(backend_built("loop"));
  EXPECT_EQ(make_transport("tcp", {})->capabilities().backend, "tcp");
  try {
    make_transport("carrier-pigeon", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
  try {
    make_transport("tcp+x", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
  if (!backend_built("ofi")) {
    try {
      make_transport("ofi+tcp", {});
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::unsupported);
    }
  }
}

TEST(Url, OnlyLoopbackAddressesAreLocal) {
  for (const char* text : {"tcp://127.0.0.1:9", "tcp://127.255.3.4:1", "ofi+tcp://127.0.0.1:7", "ucx://[::1]:80",
                           "tcp://localhost:5", "loop://anything", "ofi+shm://node-a:0"})
    EXPECT_TRUE(Url::parse(text).is_local()) << text;
  for (const char* text : {"tcp://0.0.0.0:9", "tcp://10.0.0.1:9", "ucx://[fe80::1]:80", "tcp://128.0.0.1:9",
                           "tcp://127.0.0.1.evil.example:9", "tcp://myhost:9", "tcp://[::]:9", "ofi+tcp://192.168.1.2:7"})
    EXPECT_FALSE(Url::parse(text).is_local()) << text;
}

TEST(Secret, LoadsFromFileThenEnvironment) {
  std::string path = ::testing::TempDir() + "/deltacast-secret-test";
  {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("s3cret\n", f);
    std::fclose(f);
  }
  // Readable by group or others: refused, as ssh refuses such keys; private: read.
  ::chmod(path.c_str(), 0644);
  try {
    load_secret(path);
    FAIL() << "a world-readable secret file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  ::chmod(path.c_str(), 0640);
  EXPECT_THROW(load_secret(path), Error);
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(load_secret(path), "s3cret");
  ::setenv("DELTACAST_SECRET", "from-env", 1);
  EXPECT_EQ(load_secret(), "from-env");
  ::unsetenv("DELTACAST_SECRET");
  try {
    load_secret();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
  }
  try {
    load_secret(path + ".missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
  }
}

}  // namespace
}  // namespace deltacast::transport
