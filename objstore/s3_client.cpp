#include "objstore/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <pugixml.hpp>

#include "objstore/digests.h"
#include "util/error.h"

namespace deltacast::objstore {
namespace {

// libcurl's global state, once per process.
void init_curl() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw Error(Errc::internal, "curl_global_init failed");
  });
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::string unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

bool unreserved(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '~';
}

std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* digits = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    if (unreserved(c) || (keep_slash && c == '/')) {
      out.push_back(c);
    } else {
      const auto u = static_cast<unsigned char>(c);
      out += '%';
      out.push_back(digits[u >> 4]);
      out.push_back(digits[u & 15]);
    }
  }
  return out;
}

size_t collect_body(char* data, size_t size, size_t n, void* user) {
  auto* out = static_cast<std::vector<std::byte>*>(user);
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  out->insert(out->end(), bytes, bytes + size * n);
  return size * n;
}

size_t collect_header(char* data, size_t size, size_t n, void* user) {
  auto* headers = static_cast<std::vector<std::pair<std::string, std::string>>*>(user);
  const std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) headers->clear();  // a redirect's or a 100 Continue's headers
  const auto colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    headers->emplace_back(std::move(name), trim(line.substr(colon + 1)));
  }
  return size * n;
}

struct Upload {
  std::span<const std::byte> body;
  size_t offset = 0;
};

size_t send_body(char* buffer, size_t size, size_t n, void* user) {
  auto* up = static_cast<Upload*>(user);
  const size_t take = std::min(size * n, up->body.size() - up->offset);
  std::memcpy(buffer, up->body.data() + up->offset, take);
  up->offset += take;
  return take;
}

}  // namespace

struct S3Client::Counters {
  std::atomic<uint64_t> requests{0}, retries{0}, sent{0}, received{0};
  // One connection cache (and DNS and TLS session cache) for every request of this client, on any
  // thread: a request reuses an idle connection to the endpoint instead of a new TCP (and TLS)
  // handshake, one or two round trips across a WAN (docs/performance.md, "Object storage across a
  // WAN"). curl notices a cached connection the server closed and connects again.
  CURLSH* share = nullptr;
  std::mutex locks[CURL_LOCK_DATA_LAST];

  Counters() {
    share = curl_share_init();
    if (!share) throw Error(Errc::internal, "curl_share_init failed");
    curl_share_setopt(
        share, CURLSHOPT_LOCKFUNC, +[](CURL*, curl_lock_data data, curl_lock_access, void* self) {
          static_cast<Counters*>(self)->locks[data].lock();
        });
    curl_share_setopt(
        share, CURLSHOPT_UNLOCKFUNC,
        +[](CURL*, curl_lock_data data, void* self) { static_cast<Counters*>(self)->locks[data].unlock(); });
    curl_share_setopt(share, CURLSHOPT_USERDATA, this);
    for (auto data : {CURL_LOCK_DATA_CONNECT, CURL_LOCK_DATA_DNS, CURL_LOCK_DATA_SSL_SESSION})
      curl_share_setopt(share, CURLSHOPT_SHARE, data);
  }
  ~Counters() { curl_share_cleanup(share); }
  Counters(const Counters&) = delete;
  Counters& operator=(const Counters&) = delete;
};

struct S3Client::Request {
  std::string method = "GET";
  std::string key;  // empty: the bucket
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::string> headers;
  std::span<const std::byte> body;
  std::string what;  // for messages: "GET key"
};

struct S3Client::Response {
  long status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<std::byte> body;
  std::optional<std::string> header(const std::string& name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return std::nullopt;
  }
  std::string text() const { return std::string(reinterpret_cast<const char*>(body.data()), body.size()); }
};

std::string canonical_query(std::vector<std::pair<std::string, std::string>> params) {
  for (auto& [k, v] : params) {
    k = uri_encode(k, false);
    v = uri_encode(v, false);
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [k, v] : params) {
    if (!out.empty()) out += '&';
    out += k;
    out += '=';
    out += v;
  }
  return out;
}

std::string encode_key(std::string_view key) { return uri_encode(key, true); }

S3Credentials parse_credentials_file(std::string_view text, const std::string& profile, const std::string& source) {
  S3Credentials out;
  bool in_profile = false, found = false;
  size_t line_no = 0;
  std::istringstream lines{std::string(text)};
  for (std::string raw; std::getline(lines, raw);) {
    ++line_no;
    const std::string line = trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']')
        throw Error(Errc::config, source + ":" + std::to_string(line_no) + ": a section header without ']'");
      std::string name = trim(std::string_view(line).substr(1, line.size() - 2));
      if (name.starts_with("profile ")) name = trim(std::string_view(name).substr(8));
      in_profile = name == profile;
      found = found || in_profile;
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos)
      throw Error(Errc::config, source + ":" + std::to_string(line_no) + ": neither [profile] nor key = value");
    if (!in_profile) continue;
    const std::string key = trim(std::string_view(line).substr(0, eq));
    const std::string value = trim(std::string_view(line).substr(eq + 1));
    if (key == "aws_access_key_id") out.access_key = value;
    if (key == "aws_secret_access_key") out.secret_key = value;
    if (key == "aws_session_token") out.session_token = value;
  }
  if (!found) throw Error(Errc::auth, source + ": no profile '" + profile + "'");
  if (out.access_key.empty() || out.secret_key.empty())
    throw Error(Errc::auth, source + ": profile '" + profile + "' lacks aws_access_key_id or aws_secret_access_key");
  return out;
}

S3Credentials credentials_from_environment() {
  const char* key = std::getenv("AWS_ACCESS_KEY_ID");
  const char* secret = std::getenv("AWS_SECRET_ACCESS_KEY");
  if (key && *key && secret && *secret) {
    const char* token = std::getenv("AWS_SESSION_TOKEN");
    return S3Credentials{key, secret, token ? token : ""};
  }
  std::string path;
  if (const char* file = std::getenv("AWS_SHARED_CREDENTIALS_FILE"); file && *file) {
    path = file;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    path = std::string(home) + "/.aws/credentials";
  }
  const char* profile_env = std::getenv("AWS_PROFILE");
  const std::string profile = profile_env && *profile_env ? profile_env : "default";
  std::ifstream in(path);
  if (path.empty() || !in)
    throw Error(Errc::auth, "no S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set and " +
                                (path.empty() ? std::string("HOME is not set") : path + " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  return parse_credentials_file(text.str(), profile, path);
}

S3Client::S3Client(S3Options options, S3Credentials credentials)
    : options_(std::move(options)), credentials_(std::move(credentials)), counters_(new Counters) {
  init_curl();
  if (options_.endpoint.find("://") == std::string::npos)
    throw Error(Errc::invalid_argument, "S3 endpoint '" + options_.endpoint + "' has no scheme (http:// or https://)");
  while (!options_.endpoint.empty() && options_.endpoint.back() == '/') options_.endpoint.pop_back();
  if (options_.bucket.empty()) throw Error(Errc::invalid_argument, "S3: no bucket");
  if (options_.max_attempts < 1) throw Error(Errc::invalid_argument, "S3: max_attempts must be at least 1");
  if (credentials_.access_key.empty() || credentials_.secret_key.empty())
    throw Error(Errc::auth, "S3: empty access key or secret");
}

S3Client::~S3Client() { delete counters_; }

S3Client::Stats S3Client::stats() const {
  return Stats{counters_->requests.load(), counters_->retries.load(), counters_->sent.load(),
               counters_->received.load()};
}

std::string S3Client::url(const std::string& key, const std::string& query) const {
  std::string base;
  if (options_.path_style) {
    base = options_.endpoint + "/" + uri_encode(options_.bucket, false);
  } else {
    const auto scheme_end = options_.endpoint.find("://") + 3;
    base = options_.endpoint.substr(0, scheme_end) + options_.bucket + "." + options_.endpoint.substr(scheme_end);
  }
  std::string out = base + (key.empty() && !options_.path_style ? "/" : key.empty() ? "" : "/" + encode_key(key));
  if (!query.empty()) out += "?" + query;
  return out;
}

S3Client::Response S3Client::attempt(const Request& request) {
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) throw Error(Errc::internal, "curl_easy_init failed");
  Response response;
  std::vector<std::pair<std::string, std::string>> query = request.query;
  const std::string target = url(request.key, canonical_query(std::move(query)));
  struct curl_slist* headers = nullptr;
  auto add = [&](const std::string& h) {
    struct curl_slist* next = curl_slist_append(headers, h.c_str());
    if (!next) throw Error(Errc::internal, "curl_slist_append failed");
    headers = next;
  };
  std::unique_ptr<struct curl_slist, decltype(&curl_slist_free_all)> header_guard(nullptr, curl_slist_free_all);
  // curl 7.88 signs what it is given but does not add the payload hash S3 needs (RGW refuses a
  // request without it): the body's SHA-256, signed with the rest.
  add("x-amz-content-sha256: " + digest_hex(EVP_sha256(), request.body));
  if (!credentials_.session_token.empty()) add("x-amz-security-token: " + credentials_.session_token);
  // (No "Expect:" line to skip 100-continue: curl 7.88 signs it as an empty header it never sends.)
  for (const auto& h : request.headers) add(h);
  header_guard.reset(headers);
  const std::string sigv4 = "aws:amz:" + options_.region + ":s3";
  const std::string userpwd = credentials_.access_key + ":" + credentials_.secret_key;
  Upload upload{request.body, 0};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_SHARE, counters_->share);
  curl_easy_setopt(c, CURLOPT_URL, target.c_str());
  curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout.count()));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>((options_.request_timeout.count() + 999) / 1000)));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &response.body);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, collect_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &response.headers);
  if (request.method == "PUT") {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, send_body);
    curl_easy_setopt(c, CURLOPT_READDATA, &upload);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, reinterpret_cast<const char*>(request.body.data()));
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (request.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  counters_->requests++;
  const CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) {
    const Errc code = rc == CURLE_OPERATION_TIMEDOUT ? Errc::timeout : Errc::connection;
    throw Error(code, request.what + " at " + options_.endpoint + ": " + curl_easy_strerror(rc));
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  counters_->sent += request.body.size();
  counters_->received += response.body.size();
  return response;
}

namespace {

// "Code: Message" of an S3 error body (empty when it has none).
std::string s3_error(const std::string& body) {
  pugi::xml_document doc;
  if (!doc.load_string(body.c_str())) return {};
  const auto error = doc.child("Error");
  if (!error) return {};
  std::string out = error.child_value("Code");
  if (const std::string message = error.child_value("Message"); !message.empty()) out += ": " + message;
  return out;
}

bool retryable(long status) { return status >= 500 || status == 429; }

}  // namespace

S3Client::Response S3Client::perform(const Request& request) {
  std::mt19937_64 rng(std::random_device{}());
  for (int attempt_no = 1;; ++attempt_no) {
    std::optional<Error> failure;
    try {
      Response r = attempt(request);
      if (r.status >= 200 && r.status < 300) return r;
      const std::string detail = s3_error(r.text());
      // Named with the bucket: RGW's NoSuchBucket carries an empty message.
      const std::string what = request.what + ": HTTP " + std::to_string(r.status) +
                               (detail.empty() ? "" : " " + detail) + " (bucket " + options_.bucket + " at " +
                               options_.endpoint + ")";
      if (!retryable(r.status)) {
        const Errc code = r.status == 403 || r.status == 401 ? Errc::auth
                          : r.status == 404                  ? Errc::not_found
                                                             : Errc::invalid_argument;
        throw Error(code, what);
      }
      failure = Error(Errc::connection, what);
    } catch (const Error& e) {
      if (e.code() != Errc::connection && e.code() != Errc::timeout) throw;
      failure = e;
    }
    if (attempt_no >= options_.max_attempts)
      throw Error(failure->code(),
                  failure->what() + std::string(" (after ") + std::to_string(attempt_no) + " attempts)");
    counters_->retries++;
    // Exponential backoff with full jitter: a fleet retrying against one store spreads out.
    const auto ceiling =
        std::min(options_.backoff_max.count(), options_.backoff_base.count() << std::min(attempt_no - 1, 20));
    std::uniform_int_distribution<long long> wait(ceiling / 2, std::max<long long>(ceiling, 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait(rng)));
  }
}

std::string S3Client::put(const std::string& key, std::span<const std::byte> body) {
  Request r;
  r.method = "PUT";
  r.key = key;
  r.body = body;
  r.what = "PUT " + key;
  const Response response = perform(r);
  std::string etag = unquote(response.header("etag").value_or(""));
  const std::string md5 = digest_hex(EVP_md5(), body);
  if (etag != md5)
    throw Error(Errc::corrupt_frame,
                "PUT " + key + ": the store's ETag " + etag + " is not the MD5 " + md5 + " of the bytes sent");
  return etag;
}

std::vector<std::byte> S3Client::get(const std::string& key) {
  Request r;
  r.key = key;
  r.what = "GET " + key;
  Response response = perform(r);
  if (const auto length = response.header("content-length");
      length && std::strtoull(length->c_str(), nullptr, 10) != response.body.size())
    throw Error(Errc::corrupt_frame, "GET " + key + ": " + std::to_string(response.body.size()) +
                                         " bytes received, Content-Length says " + *length);
  return std::move(response.body);
}

std::vector<std::byte> S3Client::get_range(const std::string& key, uint64_t first, uint64_t count) {
  if (count == 0) return {};
  Request r;
  r.key = key;
  r.headers.push_back("Range: bytes=" + std::to_string(first) + "-" + std::to_string(first + count - 1));
  r.what = "GET " + key + " bytes " + std::to_string(first) + "+" + std::to_string(count);
  Response response;
  try {
    response = perform(r);
  } catch (const Error& e) {
    if (e.code() == Errc::invalid_argument && std::string(e.what()).find("HTTP 416") != std::string::npos)
      throw Error(Errc::invalid_argument, r.what + ": outside the object");
    throw;
  }
  if (response.status != 206 || response.body.size() != count)
    throw Error(Errc::corrupt_frame, r.what + ": HTTP " + std::to_string(response.status) + " with " +
                                         std::to_string(response.body.size()) +
                                         " bytes (a range outside the object, "
                                         "or a truncated answer)");
  return std::move(response.body);
}

std::optional<ObjectInfo> S3Client::head(const std::string& key) {
  Request r;
  r.method = "HEAD";
  r.key = key;
  r.what = "HEAD " + key;
  try {
    const Response response = perform(r);
    ObjectInfo info{key, std::strtoull(response.header("content-length").value_or("0").c_str(), nullptr, 10),
                    unquote(response.header("etag").value_or(""))};
    return info;
  } catch (const Error& e) {
    if (e.code() == Errc::not_found) return std::nullopt;
    throw;
  }
}

void S3Client::remove(const std::string& key) {
  Request r;
  r.method = "DELETE";
  r.key = key;
  r.what = "DELETE " + key;
  try {
    perform(r);
  } catch (const Error& e) {
    if (e.code() != Errc::not_found) throw;
  }
}

std::vector<ObjectInfo> S3Client::list(const std::string& prefix) {
  std::vector<ObjectInfo> out;
  std::string token;
  for (;;) {
    Request r;
    r.query = {{"list-type", "2"}, {"prefix", prefix}};
    if (!token.empty()) r.query.emplace_back("continuation-token", token);
    r.what = "LIST " + prefix;
    const Response response = perform(r);
    pugi::xml_document doc;
    if (!doc.load_string(response.text().c_str())) throw Error(Errc::corrupt_frame, r.what + ": the answer is not XML");
    const auto result = doc.child("ListBucketResult");
    if (!result) throw Error(Errc::corrupt_frame, r.what + ": no ListBucketResult");
    for (const auto& c : result.children("Contents"))
      out.push_back(ObjectInfo{c.child_value("Key"), std::strtoull(c.child_value("Size"), nullptr, 10),
                               unquote(c.child_value("ETag"))});
    if (std::string(result.child_value("IsTruncated")) != "true") break;
    token = result.child_value("NextContinuationToken");
    if (token.empty()) throw Error(Errc::corrupt_frame, r.what + ": a truncated list without a continuation token");
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  return out;
}

std::string S3Client::create_multipart(const std::string& key) {
  Request r;
  r.method = "POST";
  r.key = key;
  r.query = {{"uploads", ""}};
  r.what = "CREATE MULTIPART " + key;
  const Response response = perform(r);
  pugi::xml_document doc;
  doc.load_string(response.text().c_str());
  std::string id = doc.child("InitiateMultipartUploadResult").child_value("UploadId");
  if (id.empty()) throw Error(Errc::corrupt_frame, r.what + ": no UploadId in the answer");
  return id;
}

std::string S3Client::upload_part(const std::string& key, const std::string& upload_id, int part,
                                  std::span<const std::byte> body) {
  Request r;
  r.method = "PUT";
  r.key = key;
  r.query = {{"partNumber", std::to_string(part)}, {"uploadId", upload_id}};
  r.body = body;
  r.what = "PUT " + key + " part " + std::to_string(part);
  const Response response = perform(r);
  std::string etag = unquote(response.header("etag").value_or(""));
  const std::string md5 = digest_hex(EVP_md5(), body);
  if (etag != md5)
    throw Error(Errc::corrupt_frame,
                r.what + ": the store's ETag " + etag + " is not the MD5 " + md5 + " of the bytes sent");
  return etag;
}

void S3Client::complete_multipart(const std::string& key, const std::string& upload_id,
                                  const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i)
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>\"" + etags[i] + "\"</ETag></Part>";
  xml += "</CompleteMultipartUpload>";
  Request r;
  r.method = "POST";
  r.key = key;
  r.query = {{"uploadId", upload_id}};
  r.body = std::as_bytes(std::span(xml));
  r.headers.push_back("Content-Type: application/xml");
  r.what = "COMPLETE MULTIPART " + key;
  const Response response = perform(r);
  // S3 may answer 200 with an error in the body (a failure after the headers went out).
  if (const std::string error = s3_error(response.text()); !error.empty())
    throw Error(Errc::connection, r.what + ": " + error);
}

void S3Client::abort_multipart(const std::string& key, const std::string& upload_id) {
  Request r;
  r.method = "DELETE";
  r.key = key;
  r.query = {{"uploadId", upload_id}};
  r.what = "ABORT MULTIPART " + key;
  try {
    perform(r);
  } catch (const Error& e) {
    if (e.code() != Errc::not_found) throw;  // already completed or aborted
  }
}

std::vector<MultipartUpload> S3Client::list_multipart(const std::string& prefix) {
  Request r;
  r.query = {{"prefix", prefix}, {"uploads", ""}};
  r.what = "LIST MULTIPART " + prefix;
  const Response response = perform(r);
  pugi::xml_document doc;
  if (!doc.load_string(response.text().c_str())) throw Error(Errc::corrupt_frame, r.what + ": the answer is not XML");
  std::vector<MultipartUpload> out;
  for (const auto& u : doc.child("ListMultipartUploadsResult").children("Upload"))
    out.push_back(MultipartUpload{u.child_value("Key"), u.child_value("UploadId")});
  return out;
}

void S3Client::create_bucket() {
  Request r;
  r.method = "PUT";
  r.what = "CREATE BUCKET " + options_.bucket;
  try {
    perform(r);
  } catch (const Error& e) {
    if (std::string(e.what()).find("BucketAlreadyOwnedByYou") == std::string::npos) throw;
  }
}

}  // namespace deltacast::objstore
