#pragma once
// Hex digests the object store needs (OpenSSL): the S3 client's payload hash and ETag checks, and
// the signed manifests of the version layout (objstore/version_store.h). Internal to objstore/.
#include <cstddef>
#include <span>
#include <string>

#include <openssl/evp.h>

namespace deltacast::objstore {

// Lower-case hex of `length` bytes.
std::string hex(const unsigned char* data, unsigned length);
// The hex digest of `bytes` by OpenSSL's `md` (EVP_sha256(), EVP_md5()). Throws Error(internal).
std::string digest_hex(const EVP_MD* md, std::span<const std::byte> bytes);
// Hex HMAC-SHA256 of `text` with `key`. Throws Error(internal).
std::string hmac_sha256_hex(const std::string& key, const std::string& text);

}  // namespace deltacast::objstore
