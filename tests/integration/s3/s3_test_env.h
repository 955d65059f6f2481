#pragma once
// What the tests against the real S3 server share (tests/integration/s3): the s3_server fixture's
// env file (DELTACAST_S3_ENV: S3_ENDPOINT, S3_REGION, S3_BUCKET, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, S3_DIR), client options and keys made from it, the server's script
// (DELTACAST_S3_SERVER_SCRIPT: kill-rgw, restart-rgw, revoke-key, ...), random bytes and a key
// prefix of each test's own.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "objstore/s3_client.h"

namespace deltacast::objstore::s3_test {

// KEY=VALUE lines of the fixture's env file.
inline std::map<std::string, std::string> server_env() {
  const char* path = std::getenv("DELTACAST_S3_ENV");
  if (!path) throw std::runtime_error("DELTACAST_S3_ENV is not set (run through ctest: the s3_server fixture)");
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path + " (did the s3_server fixture start?)");
  std::map<std::string, std::string> out;
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos || line[0] == '#') continue;
    std::string value = line.substr(eq + 1);
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'')) value = value.substr(1, value.size() - 2);
    out[line.substr(0, eq)] = value;
  }
  return out;
}

// The server's endpoint, region and bucket; retries 20 ms apart at first.
inline S3Options options_of(const std::map<std::string, std::string>& env) {
  S3Options o;
  o.endpoint = env.at("S3_ENDPOINT");
  o.region = env.count("S3_REGION") ? env.at("S3_REGION") : "us-east-1";
  o.bucket = env.at("S3_BUCKET");
  o.backoff_base = std::chrono::milliseconds(20);
  return o;
}

inline S3Credentials credentials_of(const std::map<std::string, std::string>& env) {
  return S3Credentials{env.at("AWS_ACCESS_KEY_ID"), env.at("AWS_SECRET_ACCESS_KEY"), ""};
}

// scripts/s3-server.sh COMMAND on the fixture's server directory (S3_DIR); its exit status.
inline int server_script(const std::map<std::string, std::string>& env, const std::string& command) {
  return std::system(
      (std::string("bash ") + DELTACAST_S3_SERVER_SCRIPT + " " + command + " " + env.at("S3_DIR")).c_str());
}

inline std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// "test-NAME-RANDOM/": the current test's own keys, so runs and tests never see each other's.
inline std::string unique_prefix() {
  return std::string("test-") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" +
         std::to_string(std::random_device{}()) + "/";
}

}  // namespace deltacast::objstore::s3_test
