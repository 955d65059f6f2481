#include "tools/lib_cost_model.h"

#include <algorithm>

namespace deltacast::tools {

nlohmann::json CostModel::to_json() const {
  return {{"diff_bytes_per_second_per_thread", diff_bytes_per_second_per_thread},
          {"apply_bytes_per_second", apply_bytes_per_second},
          {"round_trips", round_trips},
          {"bytes_per_element", bytes_per_element}};
}

nlohmann::json CostPrediction::terms_json() const {
  return {{"diff", diff},   {"transfer", transfer},       {"fill", fill},
          {"apply", apply}, {"round_trips", round_trips}, {"payload_bytes", payload_bytes}};
}

CostPrediction predict(const CostModel& model, const CostInputs& in) noexcept {
  CostPrediction p;
  const double model_bytes = in.params * model.bytes_per_element;
  p.payload_bytes = in.params * in.change_rate * in.bytes_per_change;
  p.diff = model_bytes / (model.diff_bytes_per_second_per_thread * std::max(1, in.diff_threads));
  p.transfer = p.payload_bytes * in.bottleneck_seconds_per_byte;
  p.fill = in.inner_bytes_per_second > 0 ? in.tree_depth * in.chunk_bytes / in.inner_bytes_per_second : 0;
  p.apply = model_bytes / model.apply_bytes_per_second;
  p.round_trips = model.round_trips * in.rtt_seconds;
  p.seconds = p.diff + p.transfer + p.fill + p.apply + p.round_trips;
  return p;
}

}  // namespace deltacast::tools
