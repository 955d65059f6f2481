#include "transport/auth.h"

#include <cstring>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "transport/transport.h"
#include "util/error.h"

namespace deltacast::transport::auth {
namespace {

constexpr char kMagic[4] = {'D', 'C', 'A', '1'};
constexpr std::string_view kServerLabel = "deltacast/server";
constexpr std::string_view kClientLabel = "deltacast/client";

std::array<std::byte, kNonceSize> random_nonce() {
  std::array<std::byte, kNonceSize> nonce{};
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    throw Error(Errc::internal, "auth: RAND_bytes failed to draw a nonce");
  }
  return nonce;
}

// MAC over label | client_nonce | server_nonce.
std::array<std::byte, kMacSize> transcript_mac(std::string_view secret, std::string_view label,
                                               std::span<const std::byte> client_nonce,
                                               std::span<const std::byte> server_nonce) {
  std::vector<std::byte> data(label.size() + client_nonce.size() + server_nonce.size());
  std::memcpy(data.data(), label.data(), label.size());
  std::memcpy(data.data() + label.size(), client_nonce.data(), client_nonce.size());
  std::memcpy(data.data() + label.size() + client_nonce.size(), server_nonce.data(), server_nonce.size());
  return hmac_sha256(secret, data);
}

bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void wipe(std::string& secret) {
  if (!secret.empty()) OPENSSL_cleanse(secret.data(), secret.size());
}

}  // namespace

std::array<std::byte, kMacSize> hmac_sha256(std::string_view key, std::span<const std::byte> data) {
  std::array<std::byte, kMacSize> mac{};
  unsigned int length = 0;
  // HMAC() with a null key pointer is rejected by some OpenSSL versions; an empty key is valid.
  static const unsigned char kEmpty = 0;
  const void* key_ptr = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  if (HMAC(EVP_sha256(), key_ptr, static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(),
           reinterpret_cast<unsigned char*>(mac.data()), &length) == nullptr ||
      length != kMacSize) {
    throw Error(Errc::internal, "auth: HMAC-SHA256 failed");
  }
  return mac;
}

ClientHandshake::ClientHandshake(std::string_view secret) : secret_(secret) {}
ClientHandshake::~ClientHandshake() { wipe(secret_); }

Hello ClientHandshake::hello() {
  client_nonce_ = random_nonce();
  hello_sent_ = true;
  Hello message{};
  std::memcpy(message.data(), kMagic, sizeof kMagic);
  std::memcpy(message.data() + sizeof kMagic, client_nonce_.data(), kNonceSize);
  return message;
}

Proof ClientHandshake::answer(std::span<const std::byte> challenge) {
  if (!hello_sent_) throw Error(Errc::state, "auth: answer() before hello()");
  if (challenge.size() != kChallengeSize) {
    throw Error(Errc::auth, "auth: server challenge has " + std::to_string(challenge.size()) +
                                " bytes, expected " + std::to_string(kChallengeSize));
  }
  auto server_nonce = challenge.first(kNonceSize);
  auto expected = transcript_mac(secret_, kServerLabel, client_nonce_, server_nonce);
  if (!equal_constant_time(expected, challenge.subspan(kNonceSize, kMacSize))) {
    throw Error(Errc::auth, "auth: the server did not prove the shared secret (a different secret_file, or not a deltacast endpoint)");
  }
  return transcript_mac(secret_, kClientLabel, client_nonce_, server_nonce);
}

ServerHandshake::ServerHandshake(std::string_view secret) : secret_(secret) {}
ServerHandshake::~ServerHandshake() { wipe(secret_); }

Challenge ServerHandshake::challenge(std::span<const std::byte> hello) {
  if (hello.size() != kHelloSize || std::memcmp(hello.data(), kMagic, sizeof kMagic) != 0) {
    throw Error(Errc::auth, "auth: peer did not open with a deltacast HELLO");
  }
  std::memcpy(client_nonce_.data(), hello.data() + sizeof kMagic, kNonceSize);
  server_nonce_ = random_nonce();
  challenged_ = true;
  Challenge message{};
  std::memcpy(message.data(), server_nonce_.data(), kNonceSize);
  auto mac = transcript_mac(secret_, kServerLabel, client_nonce_, server_nonce_);
  std::memcpy(message.data() + kNonceSize, mac.data(), kMacSize);
  return message;
}

void ServerHandshake::verify(std::span<const std::byte> proof) {
  if (!challenged_) throw Error(Errc::state, "auth: verify() before challenge()");
  auto expected = transcript_mac(secret_, kClientLabel, client_nonce_, server_nonce_);
  if (!equal_constant_time(expected, proof)) {
    throw Error(Errc::auth, "auth: the client did not prove the shared secret (a different secret_file, or not a deltacast endpoint)");
  }
}

}  // namespace deltacast::transport::auth

namespace deltacast::transport {

std::string random_secret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw Error(Errc::internal, "RAND_bytes failed to draw a secret");
  std::string hex;
  for (unsigned char b : bytes) {
    hex += "0123456789abcdef"[b >> 4];
    hex += "0123456789abcdef"[b & 15];
  }
  return hex;
}

}  // namespace deltacast::transport
