#include "config/placement_file.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <set>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "config/yaml_walk.h"
#include "util/error.h"

namespace deltacast::config {
namespace placement_file {  // named: unity builds batch this file with config.cpp

using yaml::fail_at;

uint64_t number(const std::string& source, const YAML::Node& node, const std::string& what) {
  if (!node.IsScalar()) fail_at(source, node, what + " expects a non-negative integer, got " + yaml::type_name(node));
  const std::string& text = node.Scalar();
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    fail_at(source, node, what + " expects a non-negative integer, got '" + text + "'");
  return value;
}

// Names are UTF-8, as safetensors headers (JSON) hold them: nlohmann::json's dump() checks it.
bool is_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

std::string name(const std::string& source, const YAML::Node& node, const std::string& what) {
  if (!node.IsScalar() || node.Scalar().empty()) fail_at(source, node, what + " expects a tensor name");
  if (!is_utf8(node.Scalar())) fail_at(source, node, what + " is not UTF-8");
  return node.Scalar();
}

codec::PlacementPart parse_part(const std::string& source, const YAML::Node& node, const std::string& where) {
  codec::PlacementPart part;
  if (node.IsSequence()) {
    if (node.size() != 4 && node.size() != 5)
      fail_at(source, node,
              where + ": a part is [tensor, dim, start, stop] or [tensor, dim, start, stop, at], got " +
                  std::to_string(node.size()) + " items");
    part.tensor = name(source, node[0], where + " tensor");
    part.dim = static_cast<uint32_t>(std::min<uint64_t>(number(source, node[1], where + " dim"), UINT32_MAX));
    part.start = number(source, node[2], where + " start");
    part.stop = number(source, node[3], where + " stop");
    if (node.size() == 5) part.at = number(source, node[4], where + " at");
    return part;
  }
  if (!node.IsMap())
    fail_at(source, node,
            where + ": a part is a list [tensor, dim, start, stop] or a mapping, got " + yaml::type_name(node));
  std::set<std::string> given;
  yaml::for_each_entry(
      source, node, "", {"tensor", "dim", "start", "stop", "at"}, [&](const std::string& key, const YAML::Node& value) {
        given.insert(key);
        if (key == "tensor")
          part.tensor = name(source, value, where + " tensor");
        else if (key == "dim")
          part.dim = static_cast<uint32_t>(std::min<uint64_t>(number(source, value, where + " dim"), UINT32_MAX));
        else if (key == "start")
          part.start = number(source, value, where + " start");
        else if (key == "stop")
          part.stop = number(source, value, where + " stop");
        else
          part.at = number(source, value, where + " at");
      });
  for (const char* key : {"tensor", "dim", "start", "stop"})
    if (!given.count(key)) fail_at(source, node, where + ": the part lacks '" + key + "'");
  return part;
}

std::vector<codec::PlacementPart> parse_parts(const std::string& source, const YAML::Node& node,
                                              const std::string& buffer) {
  if (!node.IsSequence())
    fail_at(source, node, "buffer '" + buffer + "': parts expect a list, got " + yaml::type_name(node));
  if (node.size() == 0) fail_at(source, node, "buffer '" + buffer + "' has no parts");
  std::vector<codec::PlacementPart> parts;
  for (size_t k = 0; k < node.size(); ++k)
    parts.push_back(parse_part(source, node[k], "buffer '" + buffer + "' part " + std::to_string(k)));
  return parts;
}

}  // namespace placement_file

using placement_file::fail_at;
using placement_file::is_utf8;
using placement_file::number;
using placement_file::parse_parts;

std::vector<codec::BufferPlacement> parse_placement(std::string_view text, const std::string& source) {
  const YAML::Node root = yaml::load(text, source);
  if (root.IsNull()) throw Error(Errc::config, source + ": the placement is empty");
  if (!root.IsMap() || root.size() == 0)
    fail_at(source, root,
            std::string("a placement is a mapping from each buffer's name to its parts, got ") + yaml::type_name(root));
  std::vector<codec::BufferPlacement> buffers;
  std::set<std::string> names;
  for (const auto& entry : root) {
    if (!entry.first.IsScalar() || entry.first.Scalar().empty())
      fail_at(source, entry.first, "buffer names must be plain names");
    if (!is_utf8(entry.first.Scalar())) fail_at(source, entry.first, "buffer names must be UTF-8");
    codec::BufferPlacement b;
    b.name = entry.first.Scalar();
    if (!names.insert(b.name).second) fail_at(source, entry.first, "buffer '" + b.name + "' is named twice");
    const YAML::Node& value = entry.second;
    if (value.IsSequence()) {
      b.parts = parse_parts(source, value, b.name);
    } else if (value.IsMap()) {
      bool has_parts = false;
      yaml::for_each_entry(source, value, b.name, {"parts", "shape", "stack", "bytes"},
                           [&](const std::string& key, const YAML::Node& v) {
                             const std::string field = key.substr(b.name.size() + 1);
                             if (field == "parts") {
                               b.parts = parse_parts(source, v, b.name);
                               has_parts = true;
                             } else if (field == "shape") {
                               if (!v.IsSequence() || v.size() == 0)
                                 fail_at(source, v, "buffer '" + b.name + "': shape expects a list of sizes");
                               for (const auto& d : v)
                                 b.shape.push_back(number(source, d, "buffer '" + b.name + "' shape"));
                             } else if (field == "stack") {
                               if (!v.IsScalar() || (v.Scalar() != "true" && v.Scalar() != "false"))
                                 fail_at(source, v, "buffer '" + b.name + "': stack expects true or false");
                               b.stack = v.Scalar() == "true";
                             } else {
                               b.bytes = number(source, v, "buffer '" + b.name + "' bytes");
                             }
                           });
      if (!has_parts) fail_at(source, value, "buffer '" + b.name + "' has no parts");
    } else {
      fail_at(source, value,
              "buffer '" + b.name + "' expects a list of parts or a mapping with parts, got " + yaml::type_name(value));
    }
    buffers.push_back(std::move(b));
  }
  return buffers;
}

std::vector<codec::BufferPlacement> load_placement_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Errc::io, "cannot read placement file " + path);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  if (in.bad()) throw Error(Errc::io, "cannot read placement file " + path);
  return parse_placement(text, path);
}

std::string placement_yaml(const std::vector<codec::BufferPlacement>& buffers) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& b : buffers) {
    out << YAML::Key << YAML::DoubleQuoted << b.name << YAML::Value;
    const bool options = b.stack || !b.shape.empty() || b.bytes != 0;
    if (options) out << YAML::BeginMap << YAML::Key << "parts" << YAML::Value;
    out << YAML::BeginSeq;
    for (const auto& p : b.parts) {
      out << YAML::Flow << YAML::BeginSeq << YAML::DoubleQuoted << p.tensor << p.dim << p.start << p.stop;
      if (p.at) out << *p.at;
      out << YAML::EndSeq;
    }
    out << YAML::EndSeq;
    if (options) {
      if (!b.shape.empty()) {
        out << YAML::Key << "shape" << YAML::Value << YAML::Flow << YAML::BeginSeq;
        for (const auto d : b.shape) out << d;
        out << YAML::EndSeq;
      }
      if (b.stack) out << YAML::Key << "stack" << YAML::Value << true;
      if (b.bytes != 0) out << YAML::Key << "bytes" << YAML::Value << b.bytes;
      out << YAML::EndMap;
    }
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace deltacast::config
