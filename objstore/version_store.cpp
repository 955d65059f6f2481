#include "objstore/version_store.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "objstore/digests.h"
#include "util/error.h"
#include "util/json.h"

namespace deltacast::objstore {
namespace {

constexpr const char* kManifestFormat = "deltacast.objstore.version/2";
constexpr const char* kLatestFormat = "deltacast.objstore.latest/1";

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "/" + name;
}

std::string version_dir(const std::string& prefix, uint64_t version) {
  char name[32];
  std::snprintf(name, sizeof name, "v%020" PRIu64, version);
  return join(prefix, name);
}

// Runs work(i) for i in [0, n) on up to `threads` threads; rethrows the first failure after
// every thread stopped (the others stop taking work once one failed).
void parallel_for(size_t n, unsigned threads, const std::function<void(size_t)>& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex mutex;
  auto run = [&] {
    for (size_t i; !failed && (i = next.fetch_add(1)) < n;) {
      try {
        work(i);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!first) first = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::min<size_t>(std::max(1u, threads), n); ++t) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

uint64_t u64_of(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || !j[key].is_number_unsigned())
    throw Error(Errc::corrupt_frame, source + ": '" + key + "' is missing or not a whole number");
  return j[key].get<uint64_t>();
}

std::string text_of(const std::vector<std::byte>& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::string sha256_hex(std::span<const std::byte> bytes) { return digest_hex(EVP_sha256(), bytes); }

// Equal without an early exit (a signature is compared with one computed here).
bool same_text(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void put_latest(S3Client& client, const std::string& prefix, uint64_t version) {
  const std::string latest = nlohmann::json{{"format", kLatestFormat}, {"version", version}}.dump();
  client.put(latest_key(prefix), std::as_bytes(std::span(latest)));
}

}  // namespace

std::string manifest_key(const std::string& prefix, uint64_t version) {
  return version_dir(prefix, version) + "/manifest.json";
}
std::string frames_key(const std::string& prefix, uint64_t version) { return version_dir(prefix, version) + "/frames"; }
std::string latest_key(const std::string& prefix) { return join(prefix, "latest.json"); }

std::string VersionManifest::to_json() const {
  nlohmann::json frames_json = nlohmann::json::array();
  for (const auto& f : frames) {
    nlohmann::json entry = {{"offset", f.offset}, {"size", f.size}, {"xxh3", f.xxh3}};
    if (!f.sha256.empty()) entry["sha256"] = f.sha256;
    frames_json.push_back(std::move(entry));
  }
  nlohmann::json j{{"format", kManifestFormat},
                   {"version", version},
                   {"base_version", base_version},
                   {"epoch", epoch},
                   {"digest", digest},
                   {"kind", kind},
                   {"object", object},
                   {"object_size", object_size},
                   {"frames", frames_json}};
  if (!signature.empty()) j["signature"] = signature;
  return j.dump();  // keys sorted (std::map): the same manifest gives the same text, which is signed
}

void VersionManifest::sign(const std::string& secret, const std::vector<std::span<const std::byte>>& frame_bytes) {
  if (frame_bytes.size() != frames.size())
    throw Error(Errc::internal, "object store: signing " + std::to_string(frame_bytes.size()) + " frames of " +
                                    std::to_string(frames.size()));
  for (size_t i = 0; i < frames.size(); ++i) frames[i].sha256 = sha256_hex(frame_bytes[i]);
  signature.clear();
  signature = hmac_sha256_hex(secret, to_json());
}

void VersionManifest::check_signature(const std::string& secret, const std::string& source) const {
  if (signature.empty())
    throw Error(Errc::auth, source + ": the manifest of version " + std::to_string(version) +
                                " is not signed, and this job has a secret: only its producer's versions apply");
  VersionManifest unsigned_copy = *this;
  unsigned_copy.signature.clear();
  if (!same_text(hmac_sha256_hex(secret, unsigned_copy.to_json()), signature))
    throw Error(Errc::auth, source + ": the manifest of version " + std::to_string(version) +
                                " was not signed with this job's secret (written by someone else, or another job)");
}

VersionManifest VersionManifest::parse(std::string_view text, const std::string& source) {
  std::string why;
  const nlohmann::json j = util::parse_json_bounded(text, &why);
  if (j.is_discarded() || !j.is_object()) throw Error(Errc::corrupt_frame, source + ": not a JSON object " + why);
  if (!j.contains("format") || j["format"] != kManifestFormat)
    throw Error(Errc::corrupt_frame, source + ": not a " + std::string(kManifestFormat) + " manifest");
  VersionManifest m;
  m.version = u64_of(j, "version", source);
  m.base_version = u64_of(j, "base_version", source);
  m.epoch = u64_of(j, "epoch", source);
  m.digest = u64_of(j, "digest", source);
  m.object_size = u64_of(j, "object_size", source);
  if (!j.contains("kind") || !j["kind"].is_string() || !j.contains("object") || !j["object"].is_string() ||
      !j.contains("frames") || !j["frames"].is_array())
    throw Error(Errc::corrupt_frame, source + ": 'kind', 'object' or 'frames' is missing");
  m.kind = j["kind"].get<std::string>();
  m.object = j["object"].get<std::string>();
  if (m.kind != "delta" && m.kind != "snapshot") throw Error(Errc::corrupt_frame, source + ": kind '" + m.kind + "'");
  uint64_t end = 0;
  for (const auto& f : j["frames"]) {
    if (!f.is_object()) throw Error(Errc::corrupt_frame, source + ": a frame entry is not an object");
    StoredFrame s{u64_of(f, "offset", source), u64_of(f, "size", source), u64_of(f, "xxh3", source), ""};
    if (f.contains("sha256")) {
      if (!f["sha256"].is_string() || f["sha256"].get<std::string>().size() != 64)
        throw Error(Errc::corrupt_frame, source + ": a frame's sha256 is not 64 hex digits");
      s.sha256 = f["sha256"].get<std::string>();
    }
    if (s.offset != end || s.size > m.object_size - std::min(m.object_size, s.offset) || s.size == 0)
      throw Error(Errc::corrupt_frame, source + ": frame " + std::to_string(m.frames.size()) +
                                           " does not follow the one before inside the object");
    end = s.offset + s.size;
    m.frames.push_back(s);
  }
  if (end != m.object_size)
    throw Error(Errc::corrupt_frame, source + ": the frames cover " + std::to_string(end) + " of the object's " +
                                         std::to_string(m.object_size) + " bytes");
  if (j.contains("signature")) {
    if (!j["signature"].is_string()) throw Error(Errc::corrupt_frame, source + ": 'signature' is not text");
    m.signature = j["signature"].get<std::string>();
  }
  return m;
}

VersionWriter::VersionWriter(S3Client& client, VersionStoreOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.part_bytes < (uint64_t{5} << 20))
    throw Error(Errc::invalid_argument, "object store: part_bytes must be at least 5 MiB (S3's smallest part)");
}

VersionManifest VersionWriter::publish(uint64_t version, uint64_t base_version, uint64_t epoch, uint64_t digest,
                                       const std::vector<std::span<const std::byte>>& frames, const std::string& kind) {
  if (frames.empty())
    throw Error(Errc::invalid_argument, "object store: version " + std::to_string(version) + " has no frames");
  VersionManifest m;
  m.version = version;
  m.base_version = base_version;
  m.epoch = epoch;
  m.digest = digest;
  m.kind = kind;
  uint64_t total = 0;
  for (const auto& f : frames) total += f.size();
  const bool inline_frames = total <= options_.inline_bytes;
  const std::string manifest_name = manifest_key(options_.prefix, version);
  m.object = inline_frames ? manifest_name : frames_key(options_.prefix, version);
  std::vector<std::byte> object;
  object.reserve(total);
  for (const auto& f : frames) {
    m.frames.push_back(StoredFrame{object.size(), f.size(), XXH3_64bits(f.data(), f.size()), ""});
    object.insert(object.end(), f.begin(), f.end());
  }
  m.object_size = object.size();
  if (!options_.secret.empty()) m.sign(options_.secret, frames);  // every field set: what is signed
  if (inline_frames) {
    // One object, so one PUT and (for a reader) one GET: the manifest's line, then the frames.
    const std::string line = m.to_json() + "\n";
    object.insert(object.begin(), reinterpret_cast<const std::byte*>(line.data()),
                  reinterpret_cast<const std::byte*>(line.data() + line.size()));
    client_.put(manifest_name, object);
    put_latest(client_, options_.prefix, version);
    return m;
  }
  const std::span<const std::byte> body(object);
  if (body.size() <= options_.part_bytes) {
    client_.put(m.object, body);
  } else {
    const size_t parts = (body.size() + options_.part_bytes - 1) / options_.part_bytes;
    const std::string id = client_.create_multipart(m.object);
    std::vector<std::string> etags(parts);
    try {
      parallel_for(parts, options_.parallel, [&](size_t p) {
        const uint64_t first = p * options_.part_bytes;
        etags[p] =
            client_.upload_part(m.object, id, static_cast<int>(p + 1),
                                body.subspan(first, std::min<uint64_t>(options_.part_bytes, body.size() - first)));
      });
      client_.complete_multipart(m.object, id, etags);
    } catch (...) {
      try {
        client_.abort_multipart(m.object, id);
      } catch (const Error&) {  // the store is away: abort_orphans() cleans up later
      }
      throw;
    }
  }
  // The object is whole: only now may a manifest name it, and only then latest.
  const std::string manifest = m.to_json();
  client_.put(manifest_name, std::as_bytes(std::span(manifest)));
  put_latest(client_, options_.prefix, version);
  return m;
}

std::vector<uint64_t> VersionWriter::prune() {
  std::vector<uint64_t> versions;
  for (const auto& o : client_.list(options_.prefix.empty() ? "v" : options_.prefix + "/v")) {
    if (!o.key.ends_with("/manifest.json")) continue;
    const auto slash = o.key.rfind('/');
    const auto start = o.key.rfind('/', slash - 1);
    const std::string dir =
        o.key.substr(start == std::string::npos ? 0 : start + 1, slash - (start == std::string::npos ? 0 : start + 1));
    if (dir.size() == 21 && dir[0] == 'v') versions.push_back(std::stoull(dir.substr(1)));
  }
  std::sort(versions.begin(), versions.end());
  std::vector<uint64_t> deleted;
  for (size_t i = 0; i + options_.retain_versions < versions.size(); ++i) {
    client_.remove(manifest_key(options_.prefix, versions[i]));  // unseen first, then the bytes
    client_.remove(frames_key(options_.prefix, versions[i]));
    deleted.push_back(versions[i]);
  }
  // The parts of a publish whose abort failed (the store was away) or of a writer that died.
  abort_orphans();
  return deleted;
}

size_t VersionWriter::abort_orphans() {
  const auto uploads = client_.list_multipart(options_.prefix);
  for (const auto& u : uploads) client_.abort_multipart(u.key, u.upload_id);
  return uploads.size();
}

VersionReader::VersionReader(S3Client& client, VersionStoreOptions options)
    : client_(client), options_(std::move(options)) {}

std::optional<uint64_t> VersionReader::latest() {
  std::vector<std::byte> bytes;
  try {
    bytes = client_.get(latest_key(options_.prefix));
  } catch (const Error& e) {
    if (e.code() == Errc::not_found && std::string(e.what()).find("NoSuchKey") != std::string::npos)
      return std::nullopt;
    throw;
  }
  const std::string source = latest_key(options_.prefix);
  const nlohmann::json j = util::parse_json_bounded(text_of(bytes));
  if (j.is_discarded() || !j.is_object() || !j.contains("format") || j["format"] != kLatestFormat)
    throw Error(Errc::corrupt_frame, source + ": not a " + std::string(kLatestFormat) + " record");
  return u64_of(j, "version", source);
}

VersionManifest VersionReader::manifest(uint64_t version) {
  const std::string key = manifest_key(options_.prefix, version);
  std::vector<std::byte> body = client_.get(key);
  // The manifest's line; an inline version's frames follow its '\n' (a JSON text written by
  // to_json() holds no raw newline).
  const auto newline = std::find(body.begin(), body.end(), std::byte{'\n'});
  VersionManifest m = VersionManifest::parse(
      std::string_view(reinterpret_cast<const char*>(body.data()), static_cast<size_t>(newline - body.begin())), key);
  const bool inline_frames = m.object == key;
  if (m.version != version || (!inline_frames && m.object != frames_key(options_.prefix, version)))
    throw Error(Errc::corrupt_frame,
                key + ": the manifest of version " + std::to_string(m.version) + " (object " + m.object + ")");
  const uint64_t after = newline == body.end() ? 0 : static_cast<uint64_t>(body.end() - newline - 1);
  if (after != (inline_frames ? m.object_size : 0))
    throw Error(Errc::corrupt_frame, key + ": " + std::to_string(after) + " bytes follow the manifest of version " +
                                         std::to_string(version) + ", which names " +
                                         std::to_string(inline_frames ? m.object_size : 0) +
                                         " inline (truncated, or written by something else)");
  if (!options_.secret.empty()) m.check_signature(options_.secret, key);
  if (inline_frames) {
    body.erase(body.begin(), newline + 1);
    m.inline_frames = std::move(body);
  }
  return m;
}

std::vector<std::vector<std::byte>> VersionReader::frames(const VersionManifest& m) {
  std::vector<std::vector<std::byte>> out(m.frames.size());
  // Frame i's bytes, `at` the start of its range: checked against the manifest's hashes.
  const auto take = [&](size_t i, const std::byte* at) {
    const StoredFrame& f = m.frames[i];
    out[i].assign(at, at + f.size);
    if (XXH3_64bits(out[i].data(), out[i].size()) != f.xxh3)
      throw Error(Errc::corrupt_frame, m.object + ": frame " + std::to_string(i) + " of version " +
                                           std::to_string(m.version) + " does not hash to its manifest's xxh3");
    // Signed (checked by manifest()): the frame must be what the producer hashed.
    if (!options_.secret.empty() && sha256_hex(out[i]) != f.sha256)
      throw Error(Errc::auth, m.object + ": frame " + std::to_string(i) + " of version " + std::to_string(m.version) +
                                  " is not the one its signed manifest names (SHA-256)");
  };
  if (m.object == manifest_key(options_.prefix, m.version)) {  // inline: manifest() fetched them
    if (m.inline_frames.size() != m.object_size)
      throw Error(Errc::corrupt_frame, m.object + ": version " + std::to_string(m.version) + " holds " +
                                           std::to_string(m.inline_frames.size()) + " inline bytes of " +
                                           std::to_string(m.object_size));
    for (size_t i = 0; i < m.frames.size(); ++i) take(i, m.inline_frames.data() + m.frames[i].offset);
    return out;
  }
  // Consecutive frames in a few large ranges (about object / parallel bytes, at least 4 MiB), each
  // one GET, split here: a request costs round trips across a WAN, and a delta has many small
  // frames (docs/performance.md, "Object storage across a WAN").
  constexpr uint64_t kMinRange = uint64_t{4} << 20;
  const uint64_t target =
      std::max(kMinRange, (m.object_size + options_.parallel - 1) / std::max(1u, options_.parallel));
  std::vector<std::pair<size_t, size_t>> groups;  // [first frame, end frame)
  for (size_t i = 0; i < m.frames.size();) {
    size_t end = i + 1;
    while (end < m.frames.size() && m.frames[end].offset + m.frames[end].size - m.frames[i].offset <= target) ++end;
    groups.emplace_back(i, end);
    i = end;
  }
  parallel_for(groups.size(), options_.parallel, [&](size_t g) {
    const auto [first, end] = groups[g];
    const uint64_t from = m.frames[first].offset;
    const uint64_t bytes = m.frames[end - 1].offset + m.frames[end - 1].size - from;
    std::vector<std::byte> range;
    try {
      range = client_.get_range(m.object, from, bytes);
    } catch (const Error& e) {
      // A range outside the object or a short answer: the object is not the one the manifest names
      // (truncated or replaced), as when its bytes differ.
      if (e.code() != Errc::invalid_argument && e.code() != Errc::corrupt_frame) throw;
      throw Error(Errc::corrupt_frame, m.object + ": frames " + std::to_string(first) + ".." + std::to_string(end - 1) +
                                           " of version " + std::to_string(m.version) + " are not in the object (" +
                                           e.what() + ")");
    }
    for (size_t i = first; i < end; ++i) take(i, range.data() + (m.frames[i].offset - from));
  });
  return out;
}

}  // namespace deltacast::objstore
