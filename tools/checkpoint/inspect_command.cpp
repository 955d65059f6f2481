// `deltacast inspect`: describes a .dcx file frame by frame (versions, digests, segments with their
// location coding and value mode, section sizes; every frame fully validated first), or a
// checkpoint (a .safetensors file or a sharded directory: its layout and its tensors in canonical
// order, with the index each has in deltas and the file holding it).
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "codec/digest.h"
#include "tools/checkpoint/delta_file.h"
#include "tools/cli.h"
#include "util/bytes.h"
#include "util/error.h"

namespace deltacast::tools::inspect_command {  // its own namespace: unity builds batch the commands together
namespace {

using Json = nlohmann::ordered_json;

const char* stream_name(codec::StreamId s) {
  switch (s) {
    case codec::StreamId::locations:
      return "locations";
    case codec::StreamId::sign_bits:
      return "sign_bits";
    case codec::StreamId::mag_flags:
      return "mag_flags";
    case codec::StreamId::mag_bytes:
      return "mag_bytes";
    case codec::StreamId::mag_wide:
      return "mag_wide";
    case codec::StreamId::plane0:
      return "plane0";
    case codec::StreamId::plane1:
      return "plane1";
    case codec::StreamId::plane2:
      return "plane2";
    case codec::StreamId::plane3:
      return "plane3";
    case codec::StreamId::location_index:
      return "location_index";
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

bool is_checkpoint(const std::string& path) {
  const std::filesystem::path p(path);
  return std::filesystem::is_directory(p) || p.extension() == ".safetensors";
}

void inspect_checkpoint(const std::string& path, bool json) {
  const auto c = checkpoint::Checkpoint::open(path);
  const auto& m = c.manifest();
  const auto& layout = c.layout();
  const uint64_t digest = codec::StateDigest::full_scan(c.weights(), 2).combined();
  if (json) {
    Json j;
    j["checkpoint"] = path;
    j["sharded"] = layout.sharded;
    Json files = Json::array();
    for (const auto& shard : layout.shards)
      files.push_back(Json{{"file", shard.file}, {"tensors", shard.tensors.size()}});
    j["files"] = files;
    j["tensors"] = m.size();
    j["bytes"] = m.total_bytes();
    j["manifest_digest"] = hex64(m.digest());
    j["state_digest"] = hex64(digest);
    Json tensors = Json::array();
    for (uint32_t i = 0; i < m.size(); ++i) {
      Json shape = Json::array();
      for (uint64_t d : m.at(i).shape) shape.push_back(d);
      tensors.push_back(Json{{"index", i},
                             {"name", m.at(i).name},
                             {"dtype", std::string(codec::dtype_name(m.at(i).dtype))},
                             {"shape", shape},
                             {"file", c.file_of(i)}});
    }
    j["tensor_list"] = tensors;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("%s: %s, %zu file%s, %zu tensors, %llu bytes, manifest %s, state digest %s\n", path.c_str(),
              layout.sharded ? "sharded checkpoint" : "single-file checkpoint", layout.shards.size(),
              layout.shards.size() == 1 ? "" : "s", m.size(), static_cast<unsigned long long>(m.total_bytes()),
              hex64(m.digest()).c_str(), hex64(digest).c_str());
  for (uint32_t i = 0; i < m.size(); ++i) {
    std::string shape;
    for (uint64_t d : m.at(i).shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    std::printf("  %4u %-40s %-8s [%s] %s\n", i, m.at(i).name.c_str(),
                std::string(codec::dtype_name(m.at(i).dtype)).c_str(), shape.c_str(), c.file_of(i).c_str());
  }
}

void run_inspect(const std::string& path, bool json) {
  if (is_checkpoint(path)) return inspect_checkpoint(path, json);
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
  auto* cmd = parent.add_subcommand("inspect", "describe a .dcx delta file frame by frame, or a checkpoint's tensors");
  cmd->add_option("path", *path, ".dcx file, .safetensors file or sharded checkpoint directory")->required();
  cmd->add_flag("--json", *json, "print one JSON object");
  cmd->callback([path, json] { run_inspect(*path, *json); });
}

const CommandRegistrar registrar{"inspect", &setup};

}  // namespace
}  // namespace deltacast::tools::inspect_command
