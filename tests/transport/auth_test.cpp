#include <cstring>

#include <gtest/gtest.h>

#include "transport/auth.h"
#include "util/error.h"

namespace deltacast::transport::auth {
namespace {

std::string hex(std::span<const std::byte> bytes) {
  std::string out;
  char buf[3];
  for (auto b : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>(b));
    out += buf;
  }
  return out;
}

TEST(Hmac, MatchesRfc4231TestCase2) {
  const char* data = "what do ya want for nothing?";
  auto mac = hmac_sha256("Jefe", std::as_bytes(std::span(data, std::strlen(data))));
  EXPECT_EQ(hex(mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Handshake, SameSecretSucceedsBothWays) {
  ClientHandshake client("shared");
  ServerHandshake server("shared");
  auto challenge = server.challenge(client.hello());
  auto proof = client.answer(challenge);
  EXPECT_NO_THROW(server.verify(proof));
}

TEST(Handshake, ClientDetectsServerWithoutSecret) {
  ClientHandshake client("zq-secret-77");
  ServerHandshake server("guess");
  auto challenge = server.challenge(client.hello());
  try {
    client.answer(challenge);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::auth);
    EXPECT_EQ(std::string(e.what()).find("zq-secret-77"), std::string::npos) << "secret leaked into a message";
  }
}

TEST(Handshake, ServerRejectsForgedAndReflectedProofs) {
  ClientHandshake client("shared");
  ServerHandshake server("shared");
  auto challenge = server.challenge(client.hello());
  // Reflection: the server's own MAC sent back as the client proof must fail (labels differ).
  Proof reflected{};
  std::memcpy(reflected.data(), challenge.data() + kNonceSize, kMacSize);
  EXPECT_THROW(server.verify(reflected), Error);
  auto proof = client.answer(challenge);
  proof[0] ^= std::byte{1};
  try {
    server.verify(proof);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::auth);
  }
}

TEST(Handshake, ProofIsBoundToFreshNonces) {
  // A proof recorded from one session must not open another (replay).
  ClientHandshake c1("shared");
  ServerHandshake s1("shared");
  auto proof1 = c1.answer(s1.challenge(c1.hello()));
  ClientHandshake c2("shared");
  ServerHandshake s2("shared");
  s2.challenge(c2.hello());
  EXPECT_THROW(s2.verify(proof1), Error);
}

TEST(Handshake, RejectsNonDeltacastHelloAndBadOrder) {
  ServerHandshake server("shared");
  Hello junk{};
  std::memcpy(junk.data(), "GET ", 4);
  EXPECT_THROW(server.challenge(junk), Error);
  ServerHandshake fresh("shared");
  try {
    fresh.verify(Proof{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::state);
  }
  ClientHandshake client("shared");
  EXPECT_THROW(client.answer(Challenge{}), Error);
}

TEST(Handshake, ChallengeOfWrongSizeIsAuthFailure) {
  ClientHandshake client("shared");
  client.hello();
  std::array<std::byte, 10> short_challenge{};
  try {
    client.answer(short_challenge);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::auth);
  }
}

}  // namespace
}  // namespace deltacast::transport::auth
