// `deltacast inspect`: describes a .dcx file frame by frame (versions, digests, segments with their
// location coding and value mode, section sizes). Every frame is fully validated first.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "tools/cli.h"
#include "tools/lib_delta_file.h"
#include "util/error.h"

namespace deltacast::tools {
namespace {

using Json = nlohmann::ordered_json;

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

const char* stream_name(codec::StreamId s) {
  switch (s) {
    case codec::StreamId::locations: return "locations";
    case codec::StreamId::sign_bits: return "sign_bits";
    case codec::StreamId::mag_flags: return "mag_flags";
    case codec::StreamId::mag_bytes: return "mag_bytes";
    case codec::StreamId::mag_wide: return "mag_wide";
    case codec::StreamId::plane0: return "plane0";
    case codec::StreamId::plane1: return "plane1";
    case codec::StreamId::plane2: return "plane2";
    case codec::StreamId::plane3: return "plane3";
  }
  return "?";
}

Json describe(const codec::FrameView& f) {
  const auto& h = f.header;
  Json j;
  j["kind"] = h.kind == codec::FrameKind::seal ? "seal" : "chunk";
  j["bytes"] = f.bytes.size();
  j["format_version"] = h.format_version;
  j["base_version"] = h.base_version;
  j["new_version"] = h.new_version;
  j["manifest_digest"] = hex64(h.manifest_digest);
  j["base_digest"] = hex64(h.base_digest);
  j["chunk_index"] = h.chunk_index;
  j["chunk_count"] = h.chunk_count;
  if (h.kind == codec::FrameKind::seal) {
    j["tensors"] = f.tensor_digests.size();
    Json digests = Json::array();
    for (uint64_t d : f.tensor_digests) digests.push_back(hex64(d));
    j["tensor_digests"] = digests;
    return j;
  }
  Json segments = Json::array();
  uint64_t changes = 0;
  for (const auto& s : f.segments) {
    changes += s.change_count;
    segments.push_back(Json{{"tensor", s.tensor_index},
                            {"dtype", std::string(codec::dtype_name(s.dtype))},
                            {"value_mode", codec::value_mode_name(s.value_mode)},
                            {"location_coding", codec::location_coding_name(s.location_coding)},
                            {"element_begin", s.element_begin},
                            {"element_count", s.element_count},
                            {"changes", s.change_count}});
  }
  Json sections = Json::array();
  for (const auto& s : f.sections) {
    sections.push_back(Json{{"stream", stream_name(s.stream)},
                            {"codec", s.codec == codec::SectionCodec::zstd ? "zstd" : "raw"},
                            {"raw_size", s.raw_size},
                            {"stored_size", s.stored_size}});
  }
  j["changes"] = changes;
  j["segments"] = segments;
  j["sections"] = sections;
  return j;
}

void print_text(const std::string& path, const DeltaFile& d) {
  const auto& h0 = d.first_header();
  std::printf("%s: %zu frames, %zu bytes, version %llu -> %llu, base digest %s, manifest %s\n", path.c_str(),
              d.frames.size(), d.bytes.size(), static_cast<unsigned long long>(h0.base_version),
              static_cast<unsigned long long>(h0.new_version), hex64(h0.base_digest).c_str(),
              hex64(h0.manifest_digest).c_str());
  for (const auto& f : d.frames) {
    const auto& h = f.header;
    if (h.kind == codec::FrameKind::seal) {
      std::printf("  seal: %zu bytes, %u chunks, %zu tensor digests\n", f.bytes.size(), h.chunk_count,
                  f.tensor_digests.size());
      continue;
    }
    std::printf("  chunk %u/%u: %zu bytes, %zu segments\n", h.chunk_index, h.chunk_count, f.bytes.size(),
                f.segments.size());
    for (const auto& s : f.segments) {
      std::printf("    tensor %u [%llu, +%llu) %s %s/%s: %llu changes\n", s.tensor_index,
                  static_cast<unsigned long long>(s.element_begin), static_cast<unsigned long long>(s.element_count),
                  std::string(codec::dtype_name(s.dtype)).c_str(), codec::value_mode_name(s.value_mode),
                  codec::location_coding_name(s.location_coding), static_cast<unsigned long long>(s.change_count));
    }
    for (const auto& s : f.sections) {
      std::printf("    section %-9s %-4s %llu -> %llu bytes\n", stream_name(s.stream),
                  s.codec == codec::SectionCodec::zstd ? "zstd" : "raw", static_cast<unsigned long long>(s.raw_size),
                  static_cast<unsigned long long>(s.stored_size));
    }
  }
}

void run_inspect(const std::string& path, bool json) {
  const DeltaFile d = read_delta_file(path);
  if (!json) {
    print_text(path, d);
    return;
  }
  Json j;
  j["file"] = path;
  j["bytes"] = d.bytes.size();
  j["base_version"] = d.first_header().base_version;
  j["new_version"] = d.first_header().new_version;
  Json frames = Json::array();
  for (const auto& f : d.frames) frames.push_back(describe(f));
  j["frames"] = frames;
  std::printf("%s\n", j.dump().c_str());
}

void setup(CLI::App& parent) {
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = parent.add_subcommand("inspect", "describe the frames of a .dcx delta file");
  cmd->add_option("file", *path, ".dcx file")->required();
  cmd->add_flag("--json", *json, "print one JSON object");
  cmd->callback([path, json] { run_inspect(*path, *json); });
}

const CommandRegistrar registrar{"inspect", &setup};

}  // namespace
}  // namespace deltacast::tools
