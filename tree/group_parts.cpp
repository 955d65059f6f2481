#include "tree/group_parts.h"

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace deltacast::tree {

std::vector<std::vector<codec::PartRange>> parse_group_parts(const std::string& text, const codec::Manifest& manifest,
                                                             uint32_t ranks) {
  const auto bad = [](const std::string& why) { return Error(Errc::config, "group_parts: " + why); };
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("not JSON (") + e.what() + ")");
  }
  if (!doc.is_array() || doc.size() != ranks)
    throw bad("an array with one entry per rank (" + std::to_string(ranks) + ") is needed");
  std::vector<std::vector<codec::PartRange>> parts(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    if (!doc[r].is_array()) throw bad("rank " + std::to_string(r) + "'s entry is not an array");
    for (const auto& item : doc[r]) {
      const bool range = item.is_array() && item.size() == 3 && item[0].is_string() && item[1].is_number_unsigned() &&
                         item[2].is_number_unsigned();
      if (!item.is_string() && !range)
        throw bad("rank " + std::to_string(r) + ": " + item.dump() +
                  " is neither a tensor name nor [name, first, end]");
      const std::string name = range ? item[0].get<std::string>() : item.get<std::string>();
      const auto index = manifest.find(name);
      if (!index) throw bad("rank " + std::to_string(r) + " names tensor '" + name + "', which is not in the manifest");
      const auto& t = manifest.at(*index);
      // Elements to codec units (an 8-byte element is two units).
      const uint64_t per = codec::dtype_units_per_element(t.dtype);
      const uint64_t first = range ? item[1].get<uint64_t>() : 0;
      const uint64_t end = range ? item[2].get<uint64_t>() : t.numel();
      if (first > end || end > t.numel())
        throw bad("rank " + std::to_string(r) + ": elements [" + std::to_string(first) + ", " + std::to_string(end) +
                  ") of tensor '" + name + "', which has " + std::to_string(t.numel()));
      parts[r].push_back({*index, first * per, end * per});
    }
  }
  return parts;
}

std::vector<std::vector<codec::PartRange>> shard_parts(const CheckpointLayout& layout, const codec::Manifest& manifest,
                                                       uint32_t ranks) {
  if (!layout.sharded || layout.shards.empty())
    throw Error(Errc::config,
                "group_parts: shards needs a sharded checkpoint (model.safetensors.index.json and its shard files), "
                "not " +
                    std::string(layout.shards.empty() ? "the synthetic trainer's versions (no files)"
                                                      : "one unsharded model file") +
                    ": use group_parts: balanced");
  const size_t files = layout.shards.size();
  if (files < ranks)
    throw Error(Errc::config, "group_parts: shards deals " + std::to_string(files) + " shard files to " +
                                  std::to_string(ranks) + " producer ranks: each rank needs at least one file");
  check_layout(layout, manifest.size());
  std::vector<std::vector<codec::PartRange>> parts(ranks);
  for (size_t i = 0; i < files; ++i) {
    const auto rank = static_cast<uint32_t>(i * ranks / files);
    for (uint32_t t : layout.shards[i].tensors) parts[rank].push_back({t, 0, manifest.at(t).units()});
  }
  return parts;
}

}  // namespace deltacast::tree
