#pragma once
// Mutual challenge-response authentication over a shared secret, HMAC-SHA256 (OpenSSL).
// Backend-neutral: each backend carries these three fixed-size messages over its own wire, in
// this order, before it reads or sends any payload byte:
//
//   client -> server  HELLO      "DCA1" | client_nonce[32]                       (36 bytes)
//   server -> client  CHALLENGE  server_nonce[32] | HMAC(secret, "deltacast/server" | cn | sn)  (64)
//   client -> server  PROOF      HMAC(secret, "deltacast/client" | cn | sn)       (32 bytes)
//
// Both sides contribute a fresh random nonce and both prove knowledge of the secret; the labels
// differ per direction so a server's answer can not be reflected back as a client proof. The client
// checks the server before it sends its proof; the server checks the proof before it accepts the
// connection. All messages are fixed-size, so nothing is allocated from peer-controlled lengths.
// Comparisons are constant-time. The secret is wiped from memory on destruction and never logged.
#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace deltacast::transport::auth {

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;
inline constexpr size_t kHelloSize = 4 + kNonceSize;
inline constexpr size_t kChallengeSize = kNonceSize + kMacSize;
inline constexpr size_t kProofSize = kMacSize;

using Hello = std::array<std::byte, kHelloSize>;
using Challenge = std::array<std::byte, kChallengeSize>;
using Proof = std::array<std::byte, kProofSize>;

// HMAC-SHA256(key, data). Throws Errc::internal if OpenSSL fails. Thread-safe.
std::array<std::byte, kMacSize> hmac_sha256(std::string_view key, std::span<const std::byte> data);

// The connecting side. One object per handshake; not thread-safe.
class ClientHandshake {
 public:
  explicit ClientHandshake(std::string_view secret);
  ~ClientHandshake();
  ClientHandshake(const ClientHandshake&) = delete;
  ClientHandshake& operator=(const ClientHandshake&) = delete;
  // The first message (draws the client nonce).
  Hello hello();
  // Checks the server's challenge and returns the proof to send. Throws Errc::auth when the server
  // does not know the secret, Errc::state when hello() was not called first.
  Proof answer(std::span<const std::byte> challenge);

 private:
  std::string secret_;
  std::array<std::byte, kNonceSize> client_nonce_{};
  bool hello_sent_ = false;
};

// The accepting side. One object per handshake; not thread-safe.
class ServerHandshake {
 public:
  explicit ServerHandshake(std::string_view secret);
  ~ServerHandshake();
  ServerHandshake(const ServerHandshake&) = delete;
  ServerHandshake& operator=(const ServerHandshake&) = delete;
  // Checks HELLO and returns the challenge to send. Throws Errc::auth on a bad magic (not a
  // deltacast peer).
  Challenge challenge(std::span<const std::byte> hello);
  // Checks the client's proof. Throws Errc::auth when it does not prove the secret, Errc::state
  // when challenge() was not called first.
  void verify(std::span<const std::byte> proof);

 private:
  std::string secret_;
  std::array<std::byte, kNonceSize> client_nonce_{};
  std::array<std::byte, kNonceSize> server_nonce_{};
  bool challenged_ = false;
};

}  // namespace deltacast::transport::auth
