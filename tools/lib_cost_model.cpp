#include "tools/lib_cost_model.h"

#include <algorithm>
#include <cmath>

#include "tools/cost_model_fit.h"

namespace deltacast::tools {

CostModel CostModel::fitted() noexcept { return kFittedCostModel; }

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
      {"source", "bench/model/fit.json (docs/performance.md)"}};
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
  p.diff = (checkpoint_bytes * model.t_scan_s_per_byte + changes * model.t_change_s) / std::max(1, in.diff_threads);
  p.transfer = p.payload_bytes * in.bottleneck_seconds_per_byte;
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
