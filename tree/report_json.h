#pragma once
// A RefitReport as JSON: the keys of `deltacast run`'s steps[] entries (docs/cli.md), which the C
// API's dc_producer_report returns too, so adding a key never changes an ABI.
#include <nlohmann/json.hpp>

#include "tree/producer.h"

namespace deltacast::tree {

// version, committed, abort_reason, changed_fraction, changes, elements, payload_bytes, chunks,
// checkpoint_bytes, encode_seconds, refit_seconds, receivers, verified_receivers, and the repair
// keys (add_repair_json).
nlohmann::json refit_report_json(const RefitReport& r);
// failed_members [{rank, cause, detected_at_s, detection_seconds, detected_at_unix}], epoch, repair_seconds,
// resent_chunks.
void add_repair_json(nlohmann::json& out, const RefitReport& r);

}  // namespace deltacast::tree
