// objstore::S3Client's pure parts (objstore/s3_client.h): what SigV4 signs (canonical query
// strings, encoded keys), the shared credentials file, and what the constructor refuses. The
// requests themselves run against a real Ceph RGW: tests/integration/s3.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "objstore/s3_client.h"
#include "util/error.h"

namespace deltacast::objstore {
namespace {

TEST(S3Query, KeysSortedValuesEncodedValuelessKeysWithEquals) {
  EXPECT_EQ(canonical_query({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(canonical_query({{"uploadId", "a/b+c"}, {"partNumber", "2"}}), "partNumber=2&uploadId=a%2Fb%2Bc");
  EXPECT_EQ(canonical_query({{"prefix", "run 1/v~x"}, {"list-type", "2"}}), "list-type=2&prefix=run%201%2Fv~x");
  EXPECT_EQ(canonical_query({}), "");
}

TEST(S3Key, SegmentsEncodedSlashesKept) {
  EXPECT_EQ(encode_key("run-1/v000042/chunk 7.dcf"), "run-1/v000042/chunk%207.dcf");
  EXPECT_EQ(encode_key("a+b=c&d"), "a%2Bb%3Dc%26d");
  EXPECT_EQ(encode_key("caf\xc3\xa9"), "caf%C3%A9");
}

TEST(S3Credentials, ProfilesCommentsAndErrors) {
  const std::string text =
      "# comment\n[default]\naws_access_key_id = AK1\naws_secret_access_key=SK1\n\n; other\n"
      "[profile ci]\naws_access_key_id = AK2\naws_secret_access_key = SK2\naws_session_token = T2\n";
  const auto d = parse_credentials_file(text, "default", "creds");
  EXPECT_EQ(d.access_key, "AK1");
  EXPECT_EQ(d.secret_key, "SK1");
  EXPECT_EQ(d.session_token, "");
  const auto ci = parse_credentials_file(text, "ci", "creds");
  EXPECT_EQ(ci.access_key, "AK2");
  EXPECT_EQ(ci.session_token, "T2");
  try {
    parse_credentials_file(text, "nope", "creds");
    FAIL() << "a missing profile was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::auth);
    EXPECT_NE(std::string(e.what()).find("no profile 'nope'"), std::string::npos) << e.what();
  }
  try {
    parse_credentials_file("[default]\naws_access_key_id = AK\njunk line\n", "default", "creds");
    FAIL() << "a malformed line was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
    EXPECT_NE(std::string(e.what()).find("creds:3:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_credentials_file("[default]\naws_access_key_id = AK\n", "default", "creds"), Error);
}

TEST(S3Credentials, EnvironmentFirstThenTheFile) {
  ::setenv("AWS_ACCESS_KEY_ID", "ENVKEY", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET", 1);
  EXPECT_EQ(credentials_from_environment().access_key, "ENVKEY");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials", 1);
  try {
    credentials_from_environment();
    FAIL() << "credentials from nowhere";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::auth);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/credentials"), std::string::npos) << e.what();
  }
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::unsetenv("AWS_SHARED_CREDENTIALS_FILE");
}

TEST(S3ClientOptions, RefusesWhatCanNeverWork) {
  const S3Credentials creds{"k", "s", ""};
  EXPECT_THROW(S3Client(S3Options{"127.0.0.1:7480", "us-east-1", "b"}, creds), Error);
  EXPECT_THROW(S3Client(S3Options{"http://127.0.0.1:7480", "us-east-1", ""}, creds), Error);
  S3Options zero{"http://127.0.0.1:7480", "us-east-1", "b"};
  zero.max_attempts = 0;
  EXPECT_THROW(S3Client(zero, creds), Error);
  EXPECT_THROW(S3Client(S3Options{"http://127.0.0.1:7480", "us-east-1", "b"}, S3Credentials{}), Error);
}

// Nothing listens: the request is retried max_attempts times, then fails as a connection error.
TEST(S3ClientRetry, AnUnreachableStoreIsRetriedThenAConnectionError) {
  S3Options o{"http://127.0.0.1:1", "us-east-1", "b"};
  o.max_attempts = 3;
  o.backoff_base = std::chrono::milliseconds(5);
  S3Client client(o, S3Credentials{"k", "s", ""});
  try {
    client.get("x");
    FAIL() << "a GET from nowhere returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::connection) << e.what();
    EXPECT_NE(std::string(e.what()).find("after 3 attempts"), std::string::npos) << e.what();
  }
  EXPECT_EQ(client.stats().requests, 3u);
  EXPECT_EQ(client.stats().retries, 2u);
}

}  // namespace
}  // namespace deltacast::objstore
