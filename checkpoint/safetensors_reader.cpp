// Reading side of checkpoint/safetensors.h: strict header validation over a mapped file.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/mapped_file.h"
#include "checkpoint/safetensors.h"
#include "util/error.h"
#include "util/json.h"

namespace deltacast::checkpoint {
namespace {

using Json = nlohmann::ordered_json;  // keeps file order: the tie-break for zero-size tensors

constexpr std::string_view kMetadataKey = "__metadata__";

struct ParsedTensor {
  codec::TensorInfo info;
  uint64_t begin = 0;
  uint64_t end = 0;
  size_t file_order = 0;
};

class HeaderParser {
 public:
  explicit HeaderParser(const std::filesystem::path& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw Error(Errc::invalid_argument, "not a safetensors file: " + path_.string() + ": " + problem);
  }

  // Returns the parsed tensors in checkpoint (data offset) order.
  std::vector<ParsedTensor> parse(std::span<const std::byte> file, Metadata& metadata,
                                  uint64_t& data_start) const {
    if (file.size() < 8) {
      fail("file is " + std::to_string(file.size()) + " bytes, shorter than the 8-byte header length");
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(file[i]);
    const uint64_t available = file.size() - 8;
    if (header_len > kMaxHeaderBytes) {
      fail("header length " + std::to_string(header_len) + " exceeds the limit of " +
           std::to_string(kMaxHeaderBytes) + " bytes");
    }
    if (header_len > available) {
      fail("header length " + std::to_string(header_len) + " is larger than the " +
           std::to_string(available) + " bytes that follow it");
    }
    if (header_len < 2) fail("header length " + std::to_string(header_len) + " is too small for a JSON object");
    const auto* text = reinterpret_cast<const char*>(file.data() + 8);
    if (text[0] != '{') fail("header does not start with '{'");
    const Json header = parse_json(std::string_view(text, header_len));
    data_start = 8 + header_len;
    return parse_entries(header, file.size() - data_start, metadata);
  }

 private:
  Json parse_json(std::string_view text) const {
    // nlohmann silently keeps the last of duplicate keys; a checkpoint with two entries of one name
    // is ambiguous, so reject it.
    std::set<std::string> seen;
    std::optional<std::string> duplicate;
    auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
      if (event == Json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    };
    std::string why;
    const Json header = util::parse_json_bounded<Json>(text, &why, callback);
    if (header.is_discarded()) fail("header is not valid JSON: " + why);
    if (duplicate) fail("header names '" + *duplicate + "' twice");
    if (!header.is_object()) fail("header is not a JSON object");
    return header;
  }

  static std::optional<uint64_t> as_u64(const Json& value) {
    if (!value.is_number_unsigned()) return std::nullopt;
    return value.get<uint64_t>();
  }

  std::vector<ParsedTensor> parse_entries(const Json& header, uint64_t data_size, Metadata& metadata) const {
    std::vector<ParsedTensor> tensors;
    for (const auto& [name, entry] : header.items()) {
      if (name == kMetadataKey) {
        parse_metadata(entry, metadata);
        continue;
      }
      tensors.push_back(parse_tensor(name, entry, tensors.size()));
    }
    std::sort(tensors.begin(), tensors.end(), [](const ParsedTensor& a, const ParsedTensor& b) {
      return std::tie(a.begin, a.end, a.file_order) < std::tie(b.begin, b.end, b.file_order);
    });
    uint64_t expected_begin = 0;
    for (const auto& t : tensors) {
      if (t.begin != expected_begin) {
        fail("tensor '" + t.info.name + "' starts at data offset " + std::to_string(t.begin) +
             " but the previous tensor ends at " + std::to_string(expected_begin) +
             (t.begin < expected_begin ? " (overlap)" : " (gap)"));
      }
      expected_begin = t.end;
    }
    if (expected_begin != data_size) {
      fail("tensors cover " + std::to_string(expected_begin) + " bytes of a " +
           std::to_string(data_size) + "-byte data region");
    }
    return tensors;
  }

  void parse_metadata(const Json& entry, Metadata& metadata) const {
    if (!entry.is_object()) fail("__metadata__ is not an object");
    for (const auto& [key, value] : entry.items()) {
      if (!value.is_string()) fail("__metadata__ value of '" + key + "' is not a string");
      metadata[key] = value.get<std::string>();
    }
  }

  ParsedTensor parse_tensor(const std::string& name, const Json& entry, size_t order) const {
    const std::string what = "tensor '" + name + "'";
    if (!entry.is_object()) fail(what + " is not an object");
    for (const auto& [key, unused] : entry.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") fail(what + " has unknown field '" + key + "'");
    }
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) fail(what + " has no dtype string");
    if (!entry.contains("shape") || !entry["shape"].is_array()) fail(what + " has no shape array");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      fail(what + " has no data_offsets pair");
    }
    ParsedTensor t;
    t.file_order = order;
    t.info.name = name;
    const auto dtype_name = entry["dtype"].get<std::string>();
    const auto dtype = codec::dtype_from_name(dtype_name);
    if (!dtype) {
      fail(what + " has dtype '" + dtype_name +
           "', which is not a safetensors dtype (BOOL U8 I8 U16 I16 U32 I32 U64 I64 F16 BF16 F32 F64 F8_E4M3 F8_E5M2)");
    }
    t.info.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& dim : entry["shape"]) {
      const auto d = as_u64(dim);
      if (!d) fail(what + " has a shape entry that is not a non-negative integer: " + dim.dump());
      if (__builtin_mul_overflow(numel, *d, &numel)) fail(what + " has a shape whose element count overflows");
      t.info.shape.push_back(*d);
    }
    const auto begin = as_u64(entry["data_offsets"][0]);
    const auto end = as_u64(entry["data_offsets"][1]);
    if (!begin || !end) fail(what + " has data_offsets that are not non-negative integers");
    if (*end < *begin) fail(what + " has data_offsets end " + std::to_string(*end) + " before begin " + std::to_string(*begin));
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, codec::dtype_size(*dtype), &nbytes)) fail(what + " is too large");
    if (*end - *begin != nbytes) {
      fail(what + " spans " + std::to_string(*end - *begin) + " bytes but " + dtype_name + " shape " +
           entry["shape"].dump() + " needs " + std::to_string(nbytes));
    }
    t.begin = *begin;
    t.end = *end;
    return t;
  }

  const std::filesystem::path& path_;
};

}  // namespace

struct SafetensorsFile::Impl {
  std::filesystem::path path;
  MappedFile mapping;
  codec::Manifest manifest;
  Metadata metadata;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // absolute file offsets, manifest order

  Impl(const std::filesystem::path& p, bool writable) : path(p), mapping(p, writable) {
    HeaderParser parser(path);
    uint64_t data_start = 0;
    auto tensors = parser.parse(mapping.bytes(), metadata, data_start);
    std::vector<codec::TensorInfo> infos;
    infos.reserve(tensors.size());
    for (auto& t : tensors) {
      ranges.emplace_back(data_start + t.begin, t.end - t.begin);
      infos.push_back(std::move(t.info));
    }
    try {
      manifest = codec::Manifest(std::move(infos));
    } catch (const Error& e) {
      parser.fail(e.what());
    }
  }
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  return SafetensorsFile(std::make_unique<Impl>(path, false));
}

SafetensorsFile SafetensorsFile::open_for_update(const std::filesystem::path& path) {
  return SafetensorsFile(std::make_unique<Impl>(path, true));
}

const std::filesystem::path& SafetensorsFile::path() const noexcept { return impl_->path; }
const codec::Manifest& SafetensorsFile::manifest() const noexcept { return impl_->manifest; }
const Metadata& SafetensorsFile::metadata() const noexcept { return impl_->metadata; }
uint64_t SafetensorsFile::file_size() const noexcept { return impl_->mapping.bytes().size(); }

void SafetensorsFile::read(uint32_t tensor, uint64_t offset, std::span<std::byte> out) const {
  const auto& [begin, size] = impl_->ranges.at(tensor);
  DC_ASSERT(offset <= size && out.size() <= size - offset);
  uint64_t done = 0;
  while (done < out.size()) {
    const ssize_t got =
        ::pread(impl_->mapping.fd(), out.data() + done, out.size() - done, static_cast<off_t>(begin + offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw_os_error("cannot read", impl_->path, errno);
    if (got == 0)
      throw Error(Errc::io, "cannot read " + impl_->path.string() + ": it ends at byte " +
                                std::to_string(begin + offset + done) + ", before the data its header announces (" +
                                "truncated after it was opened?)");
    done += static_cast<uint64_t>(got);
  }
}

codec::ConstWeights SafetensorsFile::weights() const {
  codec::ConstWeights w;
  w.manifest = &impl_->manifest;
  const auto bytes = impl_->mapping.bytes();
  for (const auto& [offset, size] : impl_->ranges) w.tensors.emplace_back(bytes.subspan(offset, size));
  return w;
}

codec::MutableWeights SafetensorsFile::mutable_weights() {
  if (!impl_->mapping.writable()) {
    throw Error(Errc::state, impl_->path.string() + " was opened read-only; use open_for_update");
  }
  codec::MutableWeights w;
  w.manifest = &impl_->manifest;
  const auto bytes = impl_->mapping.bytes();
  for (const auto& [offset, size] : impl_->ranges) w.tensors.emplace_back(bytes.subspan(offset, size));
  return w;
}

void SafetensorsFile::flush() { impl_->mapping.sync(impl_->path); }

}  // namespace deltacast::checkpoint
