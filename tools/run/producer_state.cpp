// The producer's state file (tools/run/producer_state.h).
#include "tools/run/producer_state.h"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "tree/topology.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/json.h"

namespace deltacast::tools {
namespace {

constexpr const char* kStateFormat = "deltacast.producer_state";
constexpr int kStateFormatVersion = 1;

}  // namespace

ProducerState ProducerState::at_previous() const {
  ProducerState s = *this;
  s.version = previous.version;
  s.digest = previous.digest;
  s.trainer_step = previous.trainer_step;
  s.checkpoint = previous.checkpoint;
  s.history.erase(s.history.upper_bound(previous.version), s.history.end());
  s.previous = {};
  return s;
}

void ProducerState::push_previous(uint64_t next_version) {
  if (version != 0 && version != next_version) previous = {version, digest, trainer_step, checkpoint};
}

std::string state_path(const config::Config& c, int producer_rank) {
  const std::string name =
      producer_rank == 0 ? "producer-state.json" : "producer-state-rank" + std::to_string(producer_rank) + ".json";
  return (std::filesystem::path(c.output.dir) / name).string();
}

namespace {

nlohmann::json state_json(const ProducerState& s) {
  nlohmann::json history = nlohmann::json::array();
  for (const auto& [version, digest] : s.history) history.push_back({{"version", version}, {"digest", hex64(digest)}});
  nlohmann::json out = {{"format", kStateFormat},
                        {"format_version", kStateFormatVersion},
                        {"version", s.version},
                        {"digest", hex64(s.digest)},
                        {"trainer_step", s.trainer_step},
                        {"attempt", s.attempt},
                        {"topology", s.topology},
                        {"params", s.params},
                        {"seed", s.seed},
                        {"lr", s.lr},
                        {"trainer_kind", s.trainer_kind},
                        {"dir", s.dir},
                        {"checkpoint", s.checkpoint},
                        {"history", history},
                        {"full_seconds", s.full_seconds},
                        {"ended", s.ended}};
  if (s.previous.version != 0)
    out["previous"] = {{"version", s.previous.version},
                       {"digest", hex64(s.previous.digest)},
                       {"trainer_step", s.previous.trainer_step},
                       {"checkpoint", s.previous.checkpoint}};
  return out;
}

}  // namespace

void write_state(const std::string& path, const ProducerState& s) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const std::string text = state_json(s).dump(2) + "\n";
  checkpoint::write_file_atomically(path, std::as_bytes(std::span(text)));
}

// Reads and checks the state file. Throws Error(not_found) when it is missing and
// Error(corrupt_frame) naming the problem when it does not parse.
ProducerState read_state(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw Error(Errc::not_found, "--resume: no producer state at " + path +
                                     " (the producer writes it into output.dir after every committed version; "
                                     "is output.dir the one of the run to resume?)");
  auto corrupt = [&](const std::string& why) {
    return Error(Errc::corrupt_frame, "--resume: the producer state " + path + " is corrupt: " + why);
  };
  auto parse_hex = [&](const nlohmann::json& value, const std::string& key) {
    const std::string text = value.get<std::string>();
    uint64_t out = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, 16);
    if (text.size() != 16 || ec != std::errc() || end != text.data() + text.size())
      throw corrupt(key + " '" + text + "' is not 16 hex digits");
    return out;
  };
  ProducerState s;
  std::string why;
  const nlohmann::json j = util::parse_json_bounded(std::string(std::istreambuf_iterator<char>(in), {}), &why);
  if (j.is_discarded()) throw corrupt(why);
  try {
    if (j.value("format", "") != kStateFormat) throw corrupt("it is not a deltacast producer state");
    if (j.at("format_version").get<int>() != kStateFormatVersion)
      throw corrupt("format_version " + j.at("format_version").dump() + " (this build reads " +
                    std::to_string(kStateFormatVersion) + ")");
    s.version = j.at("version").get<uint64_t>();
    s.digest = parse_hex(j.at("digest"), "digest");
    s.trainer_step = j.at("trainer_step").get<uint64_t>();
    s.attempt = j.at("attempt").get<uint64_t>();
    s.topology = j.at("topology").get<std::string>();
    s.params = j.at("params").get<uint64_t>();
    s.seed = j.at("seed").get<uint64_t>();
    s.lr = j.at("lr").get<double>();
    s.trainer_kind = j.value("trainer_kind", std::string("synth"));
    s.dir = j.value("dir", std::string());
    s.checkpoint = j.value("checkpoint", std::string());
    s.full_seconds = j.value("full_seconds", 0.0);
    s.ended = j.value("ended", false);
    for (const auto& h : j.at("history")) {
      const uint64_t version = h.at("version").get<uint64_t>();
      s.history[version] = parse_hex(h.at("digest"), "the digest of version " + std::to_string(version));
    }
    if (j.contains("previous")) {
      const auto& p = j.at("previous");
      s.previous.version = p.at("version").get<uint64_t>();
      s.previous.digest = parse_hex(p.at("digest"), "previous.digest");
      s.previous.trainer_step = p.at("trainer_step").get<uint64_t>();
      s.previous.checkpoint = p.value("checkpoint", std::string());
    }
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(e.what());
  }
  if (s.version == 0) throw corrupt("version 0 (nothing was committed)");
  const auto own = s.history.find(s.version);
  if (own == s.history.end() || own->second != s.digest)
    throw corrupt("its history does not give version " + std::to_string(s.version) + " the digest " + hex64(s.digest));
  if (s.history.rbegin()->first != s.version)
    throw corrupt("its history holds versions after version " + std::to_string(s.version));
  if (s.previous.version != 0) {
    const auto before = s.history.find(s.previous.version);
    if (s.previous.version >= s.version || s.previous.trainer_step >= s.trainer_step || before == s.history.end() ||
        before->second != s.previous.digest)
      throw corrupt("its previous version " + std::to_string(s.previous.version) + " (step " +
                    std::to_string(s.previous.trainer_step) + ", digest " + hex64(s.previous.digest) +
                    ") is not an earlier version of its history");
  }
  return s;
}

void check_state_against_config(const ProducerState& s, const config::Config& c, const std::string& path) {
  std::string diffs;
  auto differ = [&](const std::string& key, const std::string& state, const std::string& config) {
    if (state != config) diffs += (diffs.empty() ? "" : ", ") + key + " " + state + " there, " + config + " here";
  };
  differ("topology", s.topology, std::string(tree::topology_kind_name(tree::parse_topology_kind(c.topology))));
  differ("trainer.kind", s.trainer_kind, c.trainer.kind);
  if (s.trainer_kind == "synth" && c.trainer.kind == "synth") {
    differ("trainer.params", std::to_string(s.params), std::to_string(c.trainer.params));
    differ("trainer.seed", std::to_string(s.seed), std::to_string(c.trainer.seed));
    if (s.lr != c.trainer.lr) differ("trainer.lr", nlohmann::json(s.lr).dump(), nlohmann::json(c.trainer.lr).dump());
  }
  if (s.trainer_kind == "watch" && c.trainer.kind == "watch") differ("trainer.dir", s.dir, c.trainer.dir);
  if (!diffs.empty())
    throw Error(Errc::config, "--resume: " + path + " was written by a run with another config (" + diffs +
                                  "): its versions cannot be rebuilt here");
  if (c.trainer.steps > 0 && s.trainer_step > static_cast<uint64_t>(c.trainer.steps))
    throw Error(Errc::config, "--resume: " + path + " is at trainer step " + std::to_string(s.trainer_step) +
                                  ", past trainer.steps " + std::to_string(c.trainer.steps));
}

}  // namespace deltacast::tools
