#pragma once
// An S3 client for object storage as a transport of versions (issue 34; docs/object-storage.md):
// objects, ranged reads, listings and multipart uploads against AWS S3, GCS's XML API, MinIO or
// Ceph RGW. HTTP and SigV4 signing are libcurl's (CURLOPT_AWS_SIGV4); XML is pugixml's; hashes are
// OpenSSL's. Nothing here knows frames or versions.
//
// Requests are retried, with exponential backoff and jitter, on what may pass: a connection that
// failed or timed out, HTTP 5xx and 429 (SlowDown). A 4xx is the caller's or the store's word and
// is never retried: 403 -> Error(auth), 404 -> Error(not_found), other 4xx -> Error(invalid_argument)
// (each naming the S3 error code and message). Every body is checked: a PUT's ETag against the MD5
// of what was sent, a GET's length against Content-Length (and the range asked), so a truncated or
// substituted response is an Error(corrupt_frame), never data.
//
// Thread-safety: an S3Client may be used from several threads at once (each request has its own
// curl handle).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deltacast::objstore {

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // temporary credentials (x-amz-security-token); empty: none
};

// The credentials of the standard places, in the AWS CLI's order: AWS_ACCESS_KEY_ID +
// AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else the shared credentials file
// (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials), profile AWS_PROFILE (default
// "default"). Never the command line. Throws Error(auth) naming where it looked.
S3Credentials credentials_from_environment();

// Parses an AWS shared credentials file (INI: [profile] sections, key = value lines, # and ;
// comments) and returns `profile`'s. Throws Error(auth) "SOURCE: ..." when the profile or a key is
// missing, Error(config) "SOURCE:LINE: ..." for a line that is neither.
S3Credentials parse_credentials_file(std::string_view text, const std::string& profile, const std::string& source);

struct S3Options {
  std::string endpoint;  // scheme and host[:port], e.g. "http://127.0.0.1:7480" or "https://s3.amazonaws.com"
  std::string region = "us-east-1";
  std::string bucket;
  bool path_style = true;                       // false: virtual-host addressing (https://BUCKET.host/key)
  int max_attempts = 5;                         // per request, the first one included
  std::chrono::milliseconds backoff_base{100};  // the first retry waits about this, doubling each time
  std::chrono::milliseconds backoff_max{5000};
  std::chrono::milliseconds connect_timeout{5000};
  // One attempt fails when it moves less than 1 KiB/s for this long (a stalled server or link),
  // not after a fixed total: a large ranged GET on a shared link may take minutes and progress.
  std::chrono::milliseconds request_timeout{60000};
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without quotes
};

struct MultipartUpload {
  std::string key;
  std::string upload_id;
};

// The URL of a request and the canonical query string SigV4 signs: keys sorted, keys and values
// URI-encoded (RFC 3986 unreserved kept), a valueless key written "key=". Exposed for tests.
std::string canonical_query(std::vector<std::pair<std::string, std::string>> params);
// A key's path, each segment URI-encoded ('/' kept).
std::string encode_key(std::string_view key);

class S3Client {
 public:
  // Throws Error(invalid_argument) for an endpoint without a scheme, an empty bucket, or
  // max_attempts < 1.
  S3Client(S3Options options, S3Credentials credentials);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Options& options() const noexcept { return options_; }

  // PUT of a whole object. Returns its ETag (checked: the MD5 of `body`).
  std::string put(const std::string& key, std::span<const std::byte> body);
  // GET of the whole object, or of bytes [first, first + count) of it. Throws Error(not_found)
  // when the object does not exist, Error(invalid_argument) for a range outside it.
  std::vector<std::byte> get(const std::string& key);
  std::vector<std::byte> get_range(const std::string& key, uint64_t first, uint64_t count);
  // HEAD: nullopt when the object does not exist.
  std::optional<ObjectInfo> head(const std::string& key);
  // DELETE (an object that does not exist is no error, as in S3).
  void remove(const std::string& key);
  // Every object whose key starts with `prefix` (ListObjectsV2, all pages), in key order.
  std::vector<ObjectInfo> list(const std::string& prefix);

  // Multipart upload: create, parts (numbered from 1; every part but the last at least 5 MiB in
  // S3), complete with the parts' ETags in order, or abort (frees the parts).
  std::string create_multipart(const std::string& key);
  // Returns the part's ETag (checked: the MD5 of `body`).
  std::string upload_part(const std::string& key, const std::string& upload_id, int part,
                          std::span<const std::byte> body);
  void complete_multipart(const std::string& key, const std::string& upload_id, const std::vector<std::string>& etags);
  void abort_multipart(const std::string& key, const std::string& upload_id);
  // Multipart uploads begun and neither completed nor aborted, of keys starting with `prefix`.
  std::vector<MultipartUpload> list_multipart(const std::string& prefix);

  // Creates the bucket (tests and tools; a bucket that exists and is ours is no error).
  void create_bucket();

  struct Stats {
    uint64_t requests = 0;  // attempts, retries included
    uint64_t retries = 0;
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
  };
  Stats stats() const;
  // The URL a request for `key` (and `query`, canonical, without '?') goes to: path-style
  // ENDPOINT/BUCKET/KEY or virtual-host BUCKET.HOST/KEY.
  std::string url(const std::string& key, const std::string& query) const;

 private:
  struct Response;
  struct Request;
  Response perform(const Request& request);
  Response attempt(const Request& request);

  S3Options options_;
  S3Credentials credentials_;
  struct Counters;
  Counters* counters_;
};

}  // namespace deltacast::objstore
