#include "objstore/digests.h"

#include <openssl/hmac.h>

#include "util/error.h"

namespace deltacast::objstore {

std::string hex(const unsigned char* data, unsigned length) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(size_t{2} * length);
  for (unsigned i = 0; i < length; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 15]);
  }
  return out;
}

std::string digest_hex(const EVP_MD* md, std::span<const std::byte> bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), out, &length, md, nullptr) != 1)
    throw Error(Errc::internal, "OpenSSL digest failed");
  return hex(out, length);
}

std::string hmac_sha256_hex(const std::string& key, const std::string& text) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned length = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(text.data()),
            text.size(), out, &length))
    throw Error(Errc::internal, "OpenSSL HMAC-SHA256 failed");
  return hex(out, length);
}

}  // namespace deltacast::objstore
