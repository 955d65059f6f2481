#include "tools/probe/cost_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "util/env.h"
#include "util/error.h"

namespace deltacast::tools {
namespace {

double number_at(const nlohmann::json& fit, const std::filesystem::path& file,
                 const nlohmann::json::json_pointer& key) {
  if (!fit.contains(key) || !fit.at(key).is_number()) {
    throw Error(Errc::config,
                file.string() + ": no number at '" + key.to_string() + "' (re-run bench/model/cost_model.py fit)");
  }
  return fit.at(key).get<double>();
}

std::filesystem::path executable_dir() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path{} : self.parent_path();
}

}  // namespace

CostModel CostModel::load(const std::filesystem::path& fit_file) {
  std::ifstream in(fit_file);
  if (!in) throw Error(Errc::io, "cannot read the cost model's fit " + fit_file.string());
  nlohmann::json fit;
  try {
    fit = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::config, fit_file.string() + ": not JSON (" + e.what() + ")");
  }
  using P = nlohmann::json::json_pointer;
  auto c = [&](const char* key) { return number_at(fit, fit_file, P("/constants/" + std::string(key))); };
  auto bpc = [&](const char* rate) {
    return number_at(fit, fit_file, P("/bytes_per_change/" + std::string(rate) + "/median"));
  };
  CostModel m;
  m.t_scan_s_per_byte = c("t_scan_s_per_byte");
  m.t_change_s = c("t_change_s");
  m.t_apply_c_s = c("t_apply_c_s");
  m.t_apply_rc_s = c("t_apply_rc_s");
  m.t_scan_rc_s_per_byte = c("t_scan_rc_s_per_byte");
  m.t_hop_s = c("t_hop_s");
  m.c0_s = c("c0_s");
  m.k_rtt_producer = c("k_rtt");
  m.k_rtt_delegated = c("k_rtt_delegated");
  m.bytes_per_change_1 = bpc("0.01");
  m.bytes_per_change_3 = bpc("0.03");
  m.bytes_per_change_5 = bpc("0.05");
  m.source = fit_file.string();
  return m;
}

CostModel CostModel::installed() {
  if (auto file = process_env()("DELTACAST_COST_MODEL"); file && !file->empty()) return load(*file);
  const auto dir = executable_dir();
  const auto file = dir / ".." / "share" / "deltacast" / "cost_model_fit.json";
  if (dir.empty() || !std::filesystem::exists(file)) {
    throw Error(Errc::io, "the cost model's fit is not installed at " + file.lexically_normal().string() +
                              " (set DELTACAST_COST_MODEL to a fit file: tools/probe/cost_model_fit.json)");
  }
  return load(file.lexically_normal());
}

double CostModel::bytes_per_change_at(double change_rate) const noexcept {
  // The nearest measured rate, as project_lib.bytes_per_change_for picks it (exact ties go low).
  const double d1 = std::abs(change_rate - 0.01), d3 = std::abs(change_rate - 0.03), d5 = std::abs(change_rate - 0.05);
  if (d1 <= d3 && d1 <= d5) return bytes_per_change_1;
  return d3 <= d5 ? bytes_per_change_3 : bytes_per_change_5;
}

nlohmann::json CostModel::to_json() const {
  return {
      {"t_scan_s_per_byte", t_scan_s_per_byte},
      {"t_change_s", t_change_s},
      {"t_apply_c_s", t_apply_c_s},
      {"t_apply_rc_s", t_apply_rc_s},
      {"t_scan_rc_s_per_byte", t_scan_rc_s_per_byte},
      {"t_hop_s", t_hop_s},
      {"c0_s", c0_s},
      {"k_rtt_producer", k_rtt_producer},
      {"k_rtt_delegated", k_rtt_delegated},
      {"bytes_per_change", {{"0.01", bytes_per_change_1}, {"0.03", bytes_per_change_3}, {"0.05", bytes_per_change_5}}},
      {"bytes_per_element", bytes_per_element},
      {"source", source.empty() ? "in code" : source}};
}

nlohmann::json CostPrediction::terms_json() const {
  return {{"diff", diff},
          {"transfer", transfer},
          {"fill", fill},
          {"apply", apply},
          {"commit", commit},
          {"commit_round_trips", commit_round_trips},
          {"serial_seconds", serial_seconds},
          {"payload_bytes", payload_bytes},
          {"bytes_per_change", bytes_per_change}};
}

CostPrediction predict(const CostModel& model, const CostInputs& in) noexcept {
  CostPrediction p;
  const double checkpoint_bytes = in.params * model.bytes_per_element;
  const double changes = in.params * in.change_rate;
  p.bytes_per_change = in.bytes_per_change > 0 ? in.bytes_per_change : model.bytes_per_change_at(in.change_rate);
  p.payload_bytes = changes * p.bytes_per_change;
  const int ranks = std::max(1, in.producer_ranks);
  p.diff = (checkpoint_bytes * model.t_scan_s_per_byte + changes * model.t_change_s) /
           (static_cast<double>(std::max(1, in.diff_threads)) * ranks);
  // M ranks push the payload through M uplinks at once; members relay the whole of it whatever M.
  const double seconds_per_byte = in.producer_seconds_per_byte > 0
                                      ? std::max(in.producer_seconds_per_byte / ranks, in.member_seconds_per_byte)
                                      : in.bottleneck_seconds_per_byte / ranks;
  p.transfer = p.payload_bytes * seconds_per_byte;
  p.apply = (changes * (model.t_apply_c_s + model.t_apply_rc_s) + checkpoint_bytes * model.t_scan_rc_s_per_byte) /
            std::max(1, in.apply_threads);
  // One chunk's payload (chunk_bytes of checkpoint) crossing each level, on top of the fitted hop.
  const double chunk_payload = in.chunk_bytes / model.bytes_per_element * in.change_rate * p.bytes_per_change;
  const double chunk_transfer = in.inner_bytes_per_second > 0 ? chunk_payload / in.inner_bytes_per_second : 0;
  p.fill = in.tree_depth * (model.t_hop_s + chunk_transfer);
  p.commit_round_trips = in.delegated_commit ? model.k_rtt_delegated : model.k_rtt_producer;
  p.commit = model.c0_s + p.commit_round_trips * in.rtt_seconds;
  p.seconds = std::max({p.diff, p.transfer, p.apply}) + p.fill + p.commit;
  p.serial_seconds = p.diff + p.transfer + p.apply + p.fill + p.commit;
  return p;
}

}  // namespace deltacast::tools
