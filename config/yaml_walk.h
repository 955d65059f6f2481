#pragma once
// Walking a YAML document with errors that name their place (config's own helper, shared by the
// run config and placement files): every failure throws Error(Errc::config) as
// "SOURCE:LINE:COL: message".
#include <set>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "util/error.h"

namespace deltacast::config::yaml {

// "SOURCE:LINE:COL" (1-based) of `mark`.
std::string where(const std::string& source, const YAML::Mark& mark);

[[noreturn]] void fail_at(const std::string& source, const YAML::Node& node, const std::string& message);

// "a mapping", "a list", "a scalar" or "nothing": for messages.
const char* type_name(const YAML::Node& node);

// Parses `text` (YAML, or JSON: a subset). Throws Error(config) "SOURCE:LINE:COL: malformed YAML: ...".
YAML::Node load(std::string_view text, const std::string& source);

// Calls visit(full key, value) for each entry of `map` (prefix + "." + key); refuses keys that are
// not plain names, keys outside `allowed` (listing them) and duplicate keys.
template <typename Visit>
void for_each_entry(const std::string& source, const YAML::Node& map, const std::string& prefix,
                    const std::set<std::string>& allowed, Visit visit) {
  std::set<std::string> seen;
  for (const auto& entry : map) {
    const YAML::Node& key_node = entry.first;
    if (!key_node.IsScalar()) fail_at(source, key_node, "keys must be plain names");
    const std::string key = key_node.Scalar();
    const std::string full = prefix.empty() ? key : prefix + "." + key;
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail_at(source, key_node, "unknown key '" + full + "' (known here: " + list + ")");
    }
    if (!seen.insert(key).second) fail_at(source, key_node, "duplicate key '" + full + "'");
    visit(full, entry.second);
  }
}

}  // namespace deltacast::config::yaml
