#pragma once
// Describes how two manifests differ, for error messages of the offline commands.
#include <optional>
#include <string>

#include "codec/manifest.h"

namespace deltacast::tools {

// nullopt when the manifests describe the same coordinate space; otherwise a sentence naming the
// first difference (tensor count, name, dtype or shape). Pure function.
std::optional<std::string> manifest_difference(const codec::Manifest& a, const codec::Manifest& b);

}  // namespace deltacast::tools
