#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "config/yaml_walk.h"
#include "util/error.h"
#include "util/json.h"

namespace deltacast::config {
namespace {

// Size arithmetic needs headroom above 64 bits to detect overflow exactly.
__extension__ typedef unsigned __int128 U128;

// A bad value without its source; apply_override adds "SOURCE: key 'x': ".
struct BadValue {
  std::string message;
};

// Not named quoted(): std::quoted (from <iomanip>, which nlohmann/json includes) would win
// argument-dependent lookup for std::string arguments.
std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

template <typename Int>
Int parse_int(std::string_view text, Int min, Int max) {
  Int value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) throw BadValue{"integer " + in_quotes(text) + " is out of range"};
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw BadValue{"expected an integer, got " + in_quotes(text)};
  }
  if (value < min || value > max) {
    throw BadValue{"must be between " + std::to_string(min) + " and " + std::to_string(max) + ", got " + std::string(text)};
  }
  return value;
}

double parse_positive_double(std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(value)) {
    throw BadValue{"expected a number, got " + in_quotes(text)};
  }
  if (value <= 0) throw BadValue{"must be positive, got " + s};
  return value;
}

bool parse_bool(std::string_view text) {
  if (text == "true" || text == "yes" || text == "on" || text == "1") return true;
  if (text == "false" || text == "no" || text == "off" || text == "0") return false;
  throw BadValue{"expected true or false, got " + in_quotes(text)};
}

std::string non_empty(std::string_view text) {
  if (text.empty()) throw BadValue{"must not be empty"};
  return std::string(text);
}

std::string one_of(std::string_view text, std::initializer_list<std::string_view> allowed) {
  for (auto a : allowed) {
    if (text == a) return std::string(text);
  }
  std::string list;
  for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  throw BadValue{"unknown value " + in_quotes(text) + " (expected one of: " + list + ")"};
}

std::string url_value(std::string_view text) {
  if (text.find("://") == std::string_view::npos || text.substr(0, text.find("://")).empty()) {
    throw BadValue{"expected a URL like tcp://127.0.0.1:29500, got " + in_quotes(text)};
  }
  return std::string(text);
}

std::string scheme_value(std::string_view text) {
  const bool ok = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '+' ||
           c == '_' || c == '-';
  });
  if (!ok) throw BadValue{"expected a transport scheme like tcp, ofi+tcp or ucx, got " + in_quotes(text)};
  return std::string(text);
}

std::chrono::milliseconds positive_duration(std::string_view text) {
  auto d = parse_duration(text);
  if (d.count() <= 0) throw BadValue{"must be positive, got " + in_quotes(text)};
  return d;
}

LocalMembers& local_members_of(Config& c) {
  if (!c.members.empty()) {
    throw BadValue{"members are listed explicitly; members.count/host/base_port/cluster apply to the local shorthand"};
  }
  if (!c.local_members) c.local_members.emplace();
  return *c.local_members;
}

using Setter = std::function<void(Config&, std::string_view)>;

// Every scalar key, in documentation order. YAML, env and flags all go through this table.
const std::vector<std::pair<std::string, Setter>>& setters() {
  static const std::vector<std::pair<std::string, Setter>> table = {
      {"producer", [](Config& c, std::string_view v) { c.producer = url_value(v); }},
      {"transport", [](Config& c, std::string_view v) { c.transport = scheme_value(v); }},
      {"topology",
       [](Config& c, std::string_view v) {
         c.topology = one_of(v == "double-binary" ? "double_binary" : v, {"binary", "double_binary", "chain"});
       }},
      {"producer_cluster", [](Config& c, std::string_view v) { c.producer_cluster = std::string(v); }},
      {"clusters", [](Config& c, std::string_view v) { c.clusters = one_of(v, {"manual", "auto"}); }},
      {"probe_file", [](Config& c, std::string_view v) { c.probe_file = std::string(v); }},
      {"commit", [](Config& c, std::string_view v) { c.commit = one_of(v, {"auto", "producer", "delegated"}); }},
      {"chunk_bytes",
       [](Config& c, std::string_view v) {
         const uint64_t n = parse_size(v);
         if (n == 0 || n > (4ull << 30)) throw BadValue{"must be between 1 byte and 4GiB, got " + in_quotes(v)};
         c.chunk_bytes = n;
       }},
      {"retain_versions", [](Config& c, std::string_view v) { c.retain_versions = parse_int<uint32_t>(v, 0, 1024); }},
      {"producers", [](Config& c, std::string_view v) { c.producers = parse_int<uint32_t>(v, 1, 1024); }},
      {"group_parts",
       [](Config& c, std::string_view v) {
         if (v != "balanced" && v != "shards" && (v.empty() || v.front() != '['))
           throw BadValue{"must be balanced, shards or a JSON array with one entry per producer rank, got " +
                          in_quotes(v)};
         c.group_parts = std::string(v);
       }},
      {"members.count",
       [](Config& c, std::string_view v) { local_members_of(c).count = parse_int<int>(v, 1, 1 << 20); }},
      {"members.host", [](Config& c, std::string_view v) { local_members_of(c).host = non_empty(v); }},
      {"members.base_port",
       [](Config& c, std::string_view v) { local_members_of(c).base_port = parse_int<int>(v, 1, 65535); }},
      {"members.cluster", [](Config& c, std::string_view v) { local_members_of(c).cluster = std::string(v); }},
      {"timeouts.connect", [](Config& c, std::string_view v) { c.timeouts.connect = positive_duration(v); }},
      {"timeouts.heartbeat", [](Config& c, std::string_view v) { c.timeouts.heartbeat = positive_duration(v); }},
      {"timeouts.peer", [](Config& c, std::string_view v) { c.timeouts.peer = positive_duration(v); }},
      {"timeouts.refit", [](Config& c, std::string_view v) { c.timeouts.refit = positive_duration(v); }},
      {"timeouts.join", [](Config& c, std::string_view v) { c.timeouts.join = positive_duration(v); }},
      {"timeouts.producer_loss",
       [](Config& c, std::string_view v) { c.timeouts.producer_loss = positive_duration(v); }},
      {"secret_file", [](Config& c, std::string_view v) { c.secret_file = std::string(v); }},
      {"allow_insecure", [](Config& c, std::string_view v) { c.allow_insecure = parse_bool(v); }},
      {"trainer.kind",
       [](Config& c, std::string_view v) {
         c.trainer.kind = one_of(v, {"synth", "watch"});
       }},
      {"trainer.dir", [](Config& c, std::string_view v) { c.trainer.dir = non_empty(v); }},
      {"trainer.read", [](Config& c, std::string_view v) { c.trainer.read = one_of(v, {"pread", "map"}); }},
      {"trainer.params",
       [](Config& c, std::string_view v) {
         const uint64_t n = parse_size(v);
         if (n == 0) throw BadValue{"must be positive"};
         c.trainer.params = n;
       }},
      {"trainer.steps", [](Config& c, std::string_view v) { c.trainer.steps = parse_int<int>(v, 0, 1'000'000); }},
      {"trainer.lr", [](Config& c, std::string_view v) { c.trainer.lr = parse_positive_double(v); }},
      {"trainer.seed",
       [](Config& c, std::string_view v) {
         c.trainer.seed = parse_int<uint64_t>(v, 0, std::numeric_limits<uint64_t>::max());
       }},
      {"egress.producer", [](Config& c, std::string_view v) { c.egress.producer = parse_rate(v); }},
      {"egress.members", [](Config& c, std::string_view v) { c.egress.members = parse_rate(v); }},
      {"egress.burst", [](Config& c, std::string_view v) { c.egress.burst = parse_size(v); }},
      {"store.endpoint",
       [](Config& c, std::string_view v) {
         if (!v.empty() && v.rfind("http://", 0) != 0 && v.rfind("https://", 0) != 0)
           throw BadValue{"must start with http:// or https://, got " + in_quotes(v)};
         c.store.endpoint = std::string(v);
       }},
      {"store.region", [](Config& c, std::string_view v) { c.store.region = non_empty(v); }},
      {"store.bucket", [](Config& c, std::string_view v) { c.store.bucket = non_empty(v); }},
      {"store.prefix",
       [](Config& c, std::string_view v) {
         if (!v.empty() && (v.front() == '/' || v.back() == '/'))
           throw BadValue{"must not begin or end with '/', got " + in_quotes(v)};
         c.store.prefix = std::string(v);
       }},
      {"store.addressing", [](Config& c, std::string_view v) { c.store.addressing = one_of(v, {"path", "virtual"}); }},
      {"store.part_bytes",
       [](Config& c, std::string_view v) {
         const uint64_t n = parse_size(v);
         if (n < (5ull << 20) || n > (5ull << 30)) throw BadValue{"must be between 5MiB and 5GiB (S3's part sizes)"};
         c.store.part_bytes = n;
       }},
      {"store.parallel", [](Config& c, std::string_view v) { c.store.parallel = parse_int<uint32_t>(v, 1, 64); }},
      {"store.retain_versions",
       [](Config& c, std::string_view v) { c.store.retain_versions = parse_int<uint32_t>(v, 1, 1024); }},
      {"store.snapshot_every",
       [](Config& c, std::string_view v) { c.store.snapshot_every = parse_int<uint32_t>(v, 0, 1'000'000); }},
      {"store.inline_bytes",
       [](Config& c, std::string_view v) {
         const uint64_t n = parse_size(v);
         if (n > (64ull << 20)) throw BadValue{"must be at most 64MiB (0: never inline)"};
         c.store.inline_bytes = n;
       }},
      {"store.poll", [](Config& c, std::string_view v) { c.store.poll = positive_duration(v); }},
      {"store.clusters",
       [](Config& c, std::string_view v) {
         // A comma-separated list (env, --set), or a YAML list joined so by the parser.
         c.store.clusters.clear();
         size_t at = 0;
         while (at <= v.size() && !v.empty()) {
           const size_t comma = std::min(v.find(',', at), v.size());
           std::string label(v.substr(at, comma - at));
           label.erase(0, label.find_first_not_of(' '));
           label.erase(label.find_last_not_of(' ') + 1);
           if (label.empty()) throw BadValue{"an empty cluster label in " + in_quotes(v)};
           c.store.clusters.push_back(std::move(label));
           at = comma + 1;
         }
       }},
      {"output.dir", [](Config& c, std::string_view v) { c.output.dir = non_empty(v); }},
      {"output.metrics_file", [](Config& c, std::string_view v) { c.output.metrics_file = std::string(v); }},
      {"output.log_file",
       [](Config& c, std::string_view v) {
         if (!v.empty() && v.back() == '/') throw BadValue{"must name a file, got the directory " + in_quotes(v)};
         c.output.log_file = std::string(v);
       }},
      {"output.checkpoint_dir", [](Config& c, std::string_view v) { c.output.checkpoint_dir = std::string(v); }},
      {"output.keep", [](Config& c, std::string_view v) { c.output.keep = parse_int<uint32_t>(v, 1, 1'000'000); }},
      {"log_level",
       [](Config& c,
          std::string_view v) { c.log_level = one_of(v, {"trace", "debug", "info", "warn", "error", "off"}); }},
  };
  return table;
}

const Setter* find_setter(std::string_view key) {
  for (const auto& [name, setter] : setters()) {
    if (name == key) return &setter;
  }
  return nullptr;
}

// ---- YAML walking ----

using yaml::fail_at;
using yaml::for_each_entry;
using yaml::type_name;
using yaml::where;

void require_map(const std::string& source, const YAML::Node& node, const std::string& key) {
  if (!node.IsMap()) fail_at(source, node, "key '" + key + "' expects a mapping, got " + type_name(node));
}

void set_scalar(Config& config, const std::string& source, const std::string& key, const YAML::Node& value) {
  if (!value.IsScalar()) fail_at(source, value, "key '" + key + "' expects a single value, got " + type_name(value));
  apply_override(config, key, value.Scalar(), where(source, value.Mark()));
}

void parse_explicit_members(Config& config, const std::string& source, const YAML::Node& list) {
  for (const auto& item : list) {
    require_map(source, item, "members[]");
    MemberConfig member;
    bool has_rank = false;
    for_each_entry(source, item, "members[]", {"rank", "host", "cluster", "port", "url", "egress"},
                   [&](const std::string& key, const YAML::Node& value) {
                     if (!value.IsScalar()) fail_at(source, value, "key '" + key + "' expects a single value");
                     const std::string v = value.Scalar();
                     try {
                       if (key == "members[].rank") {
                         member.rank = parse_int<int>(v, 0, (1 << 20) - 1);
                         has_rank = true;
                       } else if (key == "members[].host") {
                         member.host = non_empty(v);
                       } else if (key == "members[].cluster") {
                         member.cluster = v;
                       } else if (key == "members[].port") {
                         member.port = parse_int<int>(v, 1, 65535);
                       } else if (key == "members[].egress") {
                         member.egress = parse_rate(v);
                       } else {
                         member.url = url_value(v);
                       }
                     } catch (const BadValue& bad) {
                       fail_at(source, value, "key '" + key + "': " + bad.message);
                     } catch (const Error& e) {
                       fail_at(source, value, "key '" + key + "': " + e.what());
                     }
                   });
    if (!has_rank) fail_at(source, item, "member entry needs a 'rank'");
    if (member.url.empty() && (member.host.empty() || member.port == 0)) {
      fail_at(source, item, "member " + std::to_string(member.rank) + " needs a 'url' or both 'host' and 'port'");
    }
    config.members.push_back(std::move(member));
  }
}

void parse_document(Config& config, const std::string& source, const YAML::Node& root) {
  if (root.IsNull()) return;  // an empty file: defaults only (validate() reports what is missing)
  require_map(source, root, "(top level)");
  const std::set<std::string> top = {
      "producer",        "producer_cluster", "clusters", "probe_file",  "transport",   "topology", "chunk_bytes",
      "retain_versions", "members",          "timeouts", "secret_file", "trainer",     "output",   "log_level",
      "allow_insecure",  "egress",           "commit",   "producers",   "group_parts", "store"};
  const std::map<std::string, std::set<std::string>> sections = {
      {"timeouts", {"connect", "heartbeat", "peer", "refit", "join", "producer_loss"}},
      {"trainer", {"kind", "dir", "read", "params", "steps", "lr", "seed"}},
      {"output", {"dir", "metrics_file", "log_file", "checkpoint_dir", "keep"}},
      {"egress", {"producer", "members", "burst"}},
      {"store",
       {"endpoint", "region", "bucket", "prefix", "addressing", "part_bytes", "parallel", "retain_versions",
        "snapshot_every", "inline_bytes", "poll", "clusters"}},
  };
  for_each_entry(source, root, "", top, [&](const std::string& key, const YAML::Node& value) {
    if (auto section = sections.find(key); section != sections.end()) {
      require_map(source, value, key);
      for_each_entry(source, value, key, section->second, [&](const std::string& sub, const YAML::Node& v) {
        if (sub == "store.clusters" && v.IsSequence()) {
          std::string joined;
          for (const auto& label : v) {
            if (!label.IsScalar()) fail_at(source, label, "key 'store.clusters' expects a list of cluster labels");
            joined += (joined.empty() ? "" : ",") + label.Scalar();
          }
          apply_override(config, sub, joined, where(source, v.Mark()));
        } else {
          set_scalar(config, source, sub, v);
        }
      });
    } else if (key == "members") {
      if (value.IsSequence()) {
        parse_explicit_members(config, source, value);
      } else if (value.IsMap()) {
        config.local_members.emplace();
        for_each_entry(source, value, key, {"count", "host", "base_port", "cluster"},
                       [&](const std::string& sub, const YAML::Node& v) { set_scalar(config, source, sub, v); });
        if (config.local_members->count == 0) fail_at(source, value, "members: the local shorthand needs 'count'");
      } else {
        fail_at(source, value, "key 'members' expects a list of members or a mapping {count, base_port, ...}, got " +
                                   std::string(type_name(value)));
      }
    } else {
      set_scalar(config, source, key, value);
    }
  });
}

std::string env_name(const std::string& key) {
  std::string name = "DELTACAST_";
  for (char c : key) name += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

uint64_t parse_size(std::string_view text) {
  const std::string s(text);
  auto bad = [&](const std::string& why) { return Error(Errc::config, "bad size " + in_quotes(text) + ": " + why); };
  if (s.empty()) throw bad("empty");
  if (s.front() == '-') throw bad("sizes cannot be negative");
  size_t i = 0;
  U128 whole = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    whole = whole * 10 + static_cast<unsigned>(s[i++] - '0');
    if (whole > std::numeric_limits<uint64_t>::max()) throw bad("too large");
  }
  if (i == 0) throw bad("expected a number like 4MiB, 500M or 4096");
  U128 fraction = 0, scale = 1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      if (scale > 1'000'000'000'000'000ull) throw bad("too many decimals");
      fraction = fraction * 10 + static_cast<unsigned>(s[i++] - '0');
      scale *= 10;
    }
  }
  std::string unit = s.substr(i);
  static const std::map<std::string, uint64_t> units = {
      {"", 1},         {"B", 1},         {"K", 1000},        {"KB", 1000},        {"k", 1000},
      {"kB", 1000},    {"M", 1000000},   {"MB", 1000000},    {"G", 1000000000},   {"GB", 1000000000},
      {"T", 1000000000000ull},           {"TB", 1000000000000ull},                {"KiB", 1ull << 10},
      {"MiB", 1ull << 20},               {"GiB", 1ull << 30}, {"TiB", 1ull << 40}};
  auto it = units.find(unit);
  if (it == units.end()) throw bad("unknown unit " + in_quotes(unit) + " (use B, KiB, MiB, GiB, TiB, K, M, G, T)");
  const U128 scaled_fraction = fraction * it->second;
  if (scaled_fraction % scale != 0) throw bad("not a whole number");
  const U128 total = whole * it->second + scaled_fraction / scale;
  if (total > std::numeric_limits<uint64_t>::max()) throw bad("too large");
  return static_cast<uint64_t>(total);
}

uint64_t parse_rate(std::string_view text) {
  const std::string s(text);
  auto bad = [&](const std::string& why) { return Error(Errc::config, "bad rate " + in_quotes(text) + ": " + why); };
  if (s == "0" || s == "unlimited") return 0;
  if (!s.empty() && s.front() == '-') throw bad("rates cannot be negative");
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) throw bad("expected a number with a unit, like 100Mbit/s, 10Gbit/s or 125MB/s");
  double number = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + i, number);
  if (ec != std::errc() || end != s.data() + i || !std::isfinite(number))
    throw bad("expected a number before the unit");
  std::string unit = s.substr(i);
  if (unit.size() > 2 && unit.ends_with("/s"))
    unit.resize(unit.size() - 2);
  else if (unit.ends_with("bps"))
    unit = unit.substr(0, unit.size() - 3) + "bit";  // Mbps = Mbit/s
  // Bytes per second for one unit.
  static const std::map<std::string, double> units = {{"bit", 1.0 / 8},
                                                      {"Kbit", 1e3 / 8},
                                                      {"kbit", 1e3 / 8},
                                                      {"Mbit", 1e6 / 8},
                                                      {"Gbit", 1e9 / 8},
                                                      {"Tbit", 1e12 / 8},
                                                      {"B", 1},
                                                      {"KB", 1e3},
                                                      {"kB", 1e3},
                                                      {"MB", 1e6},
                                                      {"GB", 1e9},
                                                      {"TB", 1e12},
                                                      {"KiB", 1024.0},
                                                      {"MiB", 1048576.0},
                                                      {"GiB", 1073741824.0},
                                                      {"TiB", 1099511627776.0}};
  auto it = units.find(unit);
  if (it == units.end()) {
    throw bad(unit.empty()
                  ? "a unit is required: bit/s (Kbit/s, Mbit/s, Gbit/s) or bytes (B/s, MB/s, MiB/s, ...)"
                  : "unknown unit " + in_quotes(s.substr(i)) +
                        " (use bit/s, Kbit/s, Mbit/s, Gbit/s, Tbit/s, B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s)");
  }
  const double bytes = std::round(number * it->second);
  if (bytes > 1.8e19) throw bad("too large");
  if (bytes < 1) throw bad("below 1 byte per second (use 0 or unlimited for no cap)");
  return static_cast<uint64_t>(bytes);
}

std::chrono::milliseconds parse_duration(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Error(Errc::config, "bad duration " + in_quotes(text) + ": " + why);
  };
  if (!text.empty() && text.front() == '-') throw bad("durations cannot be negative");
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) throw bad("expected a whole number with a unit, like 500ms, 5s, 2m or 1h");
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + digits, n);
  if (ec != std::errc() || n > (1ull << 40)) throw bad("too large");
  const std::string_view unit = text.substr(digits);
  uint64_t ms_per_unit = 0;
  if (unit == "ms") ms_per_unit = 1;
  else if (unit == "s") ms_per_unit = 1000;
  else if (unit == "m" || unit == "min") ms_per_unit = 60'000;
  else if (unit == "h") ms_per_unit = 3'600'000;
  else
    throw bad(unit.empty() ? "a unit is required (ms, s, m, h)"
                           : "unknown unit " + in_quotes(unit) + " (use ms, s, m, h)");
  return std::chrono::milliseconds(static_cast<int64_t>(n * ms_per_unit));
}

void apply_override(Config& config, std::string_view key, std::string_view value, const std::string& source) {
  const Setter* setter = find_setter(key);
  if (!setter) throw Error(Errc::config, source + ": unknown key '" + std::string(key) + "'");
  try {
    // No key takes control characters; they only arrive by accident (a stray \r from a
    // Windows-edited env file) and would surface far away as an unreachable host or missing file.
    if (std::any_of(value.begin(), value.end(), [](char ch) { return std::iscntrl(static_cast<unsigned char>(ch)); })) {
      throw BadValue{"value contains a control character"};
    }
    (*setter)(config, value);
  } catch (const BadValue& bad) {
    throw Error(Errc::config, source + ": key '" + std::string(key) + "': " + bad.message);
  } catch (const Error& e) {
    throw Error(Errc::config, source + ": key '" + std::string(key) + "': " + e.what());
  }
}

const std::vector<std::string>& overridable_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const auto& entry : setters()) out.push_back(entry.first);
    return out;
  }();
  return keys;
}

void apply_env_overrides(Config& config, const EnvLookup& env) {
  for (const auto& key : overridable_keys()) {
    const std::string name = env_name(key);
    if (auto value = env(name)) apply_override(config, key, *value, "env " + name);
  }
}

void apply_flag_overrides(Config& config, const std::vector<std::string>& assignments) {
  for (const auto& a : assignments) {
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error(Errc::config, "flag --set " + in_quotes(a) + ": expected key=value, e.g. chunk_bytes=8MiB");
    }
    apply_override(config, a.substr(0, eq), a.substr(eq + 1), "flag --set " + a.substr(0, eq));
  }
}

Config parse_config(std::string_view yaml_text, const std::string& source) {
  const YAML::Node root = yaml::load(yaml_text, source);
  Config config;
  parse_document(config, source, root);
  return config;
}

bool commit_is_delegated(const Config& config) {
  if (config.commit != "auto") return config.commit == "delegated";
  if (config.producer_cluster.empty()) return false;
  for (const auto& m : member_list(config))
    if (m.cluster == config.producer_cluster) return false;
  return true;
}

bool commit_is_delegated(Config config, const std::vector<std::vector<int>>& clusters) {
  if (config.clusters == "auto") apply_probe_clusters(config, clusters, "the probe");
  return commit_is_delegated(config);
}

std::vector<MemberConfig> member_list(const Config& config) {
  std::vector<MemberConfig> out;
  if (config.local_members) {
    const LocalMembers& local = *config.local_members;
    for (int r = 0; r < local.count; ++r) {
      out.push_back({r, local.host, local.cluster, local.base_port + r, "", std::nullopt});
    }
  } else {
    out = config.members;
  }
  for (auto& m : out) {
    if (m.url.empty()) m.url = config.transport + "://" + m.host + ":" + std::to_string(m.port);
  }
  std::sort(out.begin(), out.end(), [](const MemberConfig& a, const MemberConfig& b) { return a.rank < b.rank; });
  return out;
}

std::vector<std::string> producer_rank_urls(const Config& config) {
  std::vector<std::string> urls{config.producer};
  if (config.producers <= 1) return urls;
  const size_t colon = config.producer.rfind(':');
  int port = 0;
  try {
    if (colon == std::string::npos || config.producer.find("://") == colon) throw BadValue{""};
    port = parse_int<int>(std::string_view(config.producer).substr(colon + 1), 1, 65535);
  } catch (const BadValue&) {
    throw Error(Errc::config, "config: producers: " + std::to_string(config.producers) + " needs a port in producer '" +
                                  config.producer + "' (rank g listens on that port + g)");
  }
  if (port + static_cast<int>(config.producers) - 1 > 65535)
    throw Error(Errc::config, "config: the producer's port + producers exceeds port 65535");
  for (uint32_t g = 1; g < config.producers; ++g)
    urls.push_back(config.producer.substr(0, colon + 1) + std::to_string(port + static_cast<int>(g)));
  return urls;
}

namespace {

void validate_store(const Config& config, const std::vector<MemberConfig>& members) {
  const StoreConfig& store = config.store;
  if (!store.enabled()) {
    if (!store.clusters.empty())
      throw Error(Errc::config, "config: store.clusters names clusters, but store.endpoint is not set");
    return;
  }
  if (store.bucket.empty()) throw Error(Errc::config, "config: store.endpoint is set but store.bucket is not");
  if (config.producers > 1)
    throw Error(Errc::config, "config: a producer group (producers: " + std::to_string(config.producers) +
                                  ") cannot publish to the store yet: use producers: 1 with store.endpoint");
  for (const auto& label : store.clusters) {
    if (!config.producer_cluster.empty() && label == config.producer_cluster)
      throw Error(Errc::config, "config: store.clusters names '" + label +
                                    "', the producer's own cluster (producer_cluster): its members reach the producer");
    if (std::none_of(members.begin(), members.end(), [&](const MemberConfig& m) { return m.cluster == label; }))
      throw Error(Errc::config, "config: store.clusters names '" + label + "', which no member carries");
  }
}

}  // namespace

void validate(const Config& config) {
  if (config.producer.empty()) {
    throw Error(Errc::config, "config: 'producer' is not set (YAML key producer or env DELTACAST_PRODUCER)");
  }
  if (config.group_parts != "balanced" && config.producers < 2)
    throw Error(Errc::config,
                "config: group_parts (" +
                    (config.group_parts.size() > 40 ? config.group_parts.substr(0, 40) + "..." : config.group_parts) +
                    ") names the parts of a producer group: it needs producers: 2 or more");
  const auto members = member_list(config);
  if (members.empty()) throw Error(Errc::config, "config: no members ('members' list or members.count)");
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].rank != static_cast<int>(i)) {
      throw Error(Errc::config, "config: member ranks must be 0.." + std::to_string(members.size() - 1) +
                                    " each once; rank " + std::to_string(i) + " is " +
                                    (members[i].rank < static_cast<int>(i) ? "repeated" : "missing"));
    }
  }
  const auto ranks = producer_rank_urls(config);
  for (const auto& m : members)
    for (size_t g = 1; g < ranks.size(); ++g)
      if (m.url == ranks[g])
        throw Error(Errc::config, "config: member " + std::to_string(m.rank) + " listens at " + m.url +
                                      ", producer rank " + std::to_string(g) +
                                      "'s address (producers: " + std::to_string(config.producers) +
                                      " take the producer's port + 1.." + std::to_string(config.producers - 1) + ")");
  if (config.local_members && config.local_members->base_port + config.local_members->count - 1 > 65535) {
    throw Error(Errc::config, "config: members.base_port + members.count exceeds port 65535");
  }
  if (config.trainer.kind == "synth" && config.trainer.steps < 1) {
    throw Error(Errc::config, "config: trainer.steps must be at least 1 for the synth trainer (0 means "
                              "'until SIGTERM', which only trainer.kind watch allows)");
  }
  if (config.trainer.kind == "watch" && config.trainer.dir.empty()) {
    throw Error(Errc::config, "config: trainer.kind watch needs trainer.dir (the directory the trainer writes "
                              "its checkpoints into)");
  }
  if (config.timeouts.heartbeat >= config.timeouts.peer) {
    throw Error(Errc::config, "config: timeouts.heartbeat must be shorter than timeouts.peer");
  }
  validate_store(config, members);
}

VersionRoute version_route(const Config& config, int member_rank) {
  const auto members = member_list(config);
  if (member_rank < 0 || static_cast<size_t>(member_rank) >= members.size())
    throw Error(Errc::config, "config: no member of rank " + std::to_string(member_rank));
  const auto& labels = config.store.clusters;
  auto in_store = [&](const MemberConfig& m) {
    return config.store.enabled() && std::find(labels.begin(), labels.end(), m.cluster) != labels.end();
  };
  const MemberConfig& me = members[static_cast<size_t>(member_rank)];
  VersionRoute route;
  if (!in_store(me)) {
    for (const auto& m : members) {
      if (!in_store(m)) ++route.tree_rank;
      if (m.rank == member_rank) break;
    }
    return route;
  }
  for (const auto& m : members) {  // sorted by rank: the first of the cluster is its gateway
    if (m.cluster != me.cluster) continue;
    if (route.gateway < 0) {
      route.gateway = m.rank;
    } else {
      route.behind.push_back(m.rank);
      if (m.rank == member_rank) route.tree_rank = static_cast<uint32_t>(route.behind.size());
    }
  }
  route.kind = route.gateway == member_rank ? VersionRoute::Kind::gateway : VersionRoute::Kind::behind_gateway;
  if (route.kind == VersionRoute::Kind::behind_gateway) route.behind.clear();
  return route;
}

uint32_t producer_tree_members(const Config& config) {
  uint32_t n = 0;
  for (const auto& m : member_list(config))
    n += !config.store.enabled() || std::find(config.store.clusters.begin(), config.store.clusters.end(), m.cluster) ==
                                        config.store.clusters.end();
  return n;
}

std::vector<std::vector<int>> read_probe_clusters(const std::string& path, size_t job_size) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::config, "probe_file '" + path + "': cannot open (clusters: auto)");
  nlohmann::json probe = util::parse_json_bounded(std::string(std::istreambuf_iterator<char>(in), {}));
  if (probe.is_discarded() || !probe.is_object() || !probe.contains("clusters") || !probe["clusters"].is_array())
    throw Error(Errc::config, "probe_file '" + path + "': not a `deltacast probe` report (no clusters list)");
  const auto& ranks = probe["ranks"];
  if (!ranks.is_number_unsigned() || ranks.get<uint64_t>() < 1)
    throw Error(Errc::config, "probe_file '" + path + "': not a `deltacast probe` report (no rank count)");
  const uint64_t measured = ranks.get<uint64_t>();
  if (job_size != 0 && measured != job_size)
    throw Error(Errc::config, "probe_file '" + path + "' measured " + std::to_string(measured) +
                                  " ranks, but this job has " + std::to_string(job_size) +
                                  " (producer + members): probe the same job again");
  std::vector<std::vector<int>> clusters;
  for (size_t k = 0; k < probe["clusters"].size(); ++k) {
    const auto& cluster = probe["clusters"][k];
    if (!cluster.is_array())
      throw Error(Errc::config, "probe_file '" + path + "': cluster " + std::to_string(k) + " is not a list");
    clusters.emplace_back();
    for (const auto& rank : cluster) {
      if (!rank.is_number_unsigned() || rank.get<uint64_t>() >= measured)
        throw Error(Errc::config, "probe_file '" + path + "': cluster " + std::to_string(k) +
                                      " names a rank outside 0.." + std::to_string(measured - 1));
      clusters.back().push_back(rank.get<int>());
    }
  }
  return clusters;
}

std::string probe_cluster_label(const std::vector<std::vector<int>>& clusters, int rank) {
  for (size_t k = 0; k < clusters.size(); ++k)
    for (int r : clusters[k])
      if (r == rank) return "probe-" + std::to_string(k);
  return {};
}

void resolve_clusters(Config& config) {
  if (config.clusters != "auto" || config.probe_file.empty()) return;
  const auto clusters = read_probe_clusters(config.probe_file, member_list(config).size() + 1);
  apply_probe_clusters(config, clusters, "probe_file '" + config.probe_file + "'");
}

void apply_probe_clusters(Config& config, const std::vector<std::vector<int>>& clusters, const std::string& source) {
  auto members = member_list(config);
  const size_t job_size = members.size() + 1;
  for (size_t k = 0; k < clusters.size(); ++k)
    for (int rank : clusters[k])
      if (rank < 0 || static_cast<size_t>(rank) >= job_size)
        throw Error(Errc::config, source + ": cluster " + std::to_string(k) + " names a rank outside 0.." +
                                      std::to_string(job_size - 1));
  for (auto& m : members) {
    const std::string found = probe_cluster_label(clusters, m.rank + 1);
    if (!found.empty()) m.cluster = found;
  }
  config.members = std::move(members);
  config.local_members.reset();
  if (const std::string producer = probe_cluster_label(clusters, 0); !producer.empty())
    config.producer_cluster = producer;
}

std::string checkpoint_dir_for_rank(const std::string& checkpoint_dir, int rank) {
  std::string out = checkpoint_dir;
  for (size_t at = out.find("{rank}"); at != std::string::npos; at = out.find("{rank}", at))
    out.replace(at, 6, std::to_string(rank));
  return out;
}

std::string log_file_for_rank(const std::string& log_file, int rank) {
  if (log_file.empty()) return log_file;
  // The rules of path::stem/extension (the last dot of the file name, not a leading one), by hand.
  const size_t name_start = log_file.rfind('/') == std::string::npos ? 0 : log_file.rfind('/') + 1;
  const size_t dot = log_file.rfind('.');
  const bool has_extension = dot != std::string::npos && dot > name_start;
  const size_t cut = has_extension ? dot : log_file.size();
  return log_file.substr(0, cut) + ".rank" + std::to_string(rank) + log_file.substr(cut);
}

Config load_config(const std::string& path, const EnvLookup& env) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::config, path + ": cannot open configuration file");
  std::stringstream text;
  text << in.rdbuf();
  Config config = parse_config(text.str(), path);
  apply_env_overrides(config, env);
  validate(config);
  return config;
}

}  // namespace deltacast::config
