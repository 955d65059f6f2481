#include "tree/report_json.h"

namespace deltacast::tree {

void add_repair_json(nlohmann::json& out, const RefitReport& r) {
  nlohmann::json failed = nlohmann::json::array();
  for (const auto& m : r.failed_members)
    failed.push_back({{"rank", m.rank},
                      {"cause", m.cause},
                      {"detected_at_s", m.detected_at_s},
                      {"detection_seconds", m.detection_seconds},
                      {"detected_at_unix", m.detected_at_unix}});
  out["failed_members"] = failed;
  out["epoch"] = r.epoch;
  out["repair_seconds"] = r.repair_seconds;
  out["resent_chunks"] = r.resent_chunks;
  out["commit_delegate"] = r.commit_delegate;  // 0: the producer decided the commit
}

nlohmann::json refit_report_json(const RefitReport& r) {
  const double changed = r.elements ? static_cast<double>(r.changes) / static_cast<double>(r.elements) : 0;
  nlohmann::json out = {{"version", r.version},
                        {"committed", r.committed},
                        {"abort_reason", r.abort_reason},
                        {"changed_fraction", changed},
                        {"changes", r.changes},
                        {"elements", r.elements},
                        {"payload_bytes", r.frames_bytes},
                        {"chunks", r.chunks},
                        {"checkpoint_bytes", r.checkpoint_bytes},
                        {"encode_seconds", r.encode_seconds},
                        {"refit_seconds", r.refit_seconds},
                        {"receivers", r.receivers},
                        {"verified_receivers", r.verified_receivers}};
  add_repair_json(out, r);
  return out;
}

}  // namespace deltacast::tree
