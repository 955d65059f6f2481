#include "tools/checkpoint/manifest_compare.h"

#include <algorithm>

namespace deltacast::tools {
namespace {

std::string shape_text(const std::vector<uint64_t>& shape) {
  // Appended piece by piece: `(i ? "," : "") + std::to_string(...)` draws GCC 12's false -Wrestrict
  // at -O3 (GCC bug 105651), as in transport/side_channel.cpp.
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

std::optional<std::string> manifest_difference(const codec::Manifest& a, const codec::Manifest& b) {
  const size_t n = std::min(a.size(), b.size());
  for (uint32_t i = 0; i < n; ++i) {
    const auto& x = a.at(i);
    const auto& y = b.at(i);
    if (x.name != y.name) return "tensor #" + std::to_string(i) + " is '" + x.name + "' vs '" + y.name + "'";
    if (x.dtype != y.dtype) {
      return "tensor '" + x.name + "' has dtype " + std::string(codec::dtype_name(x.dtype)) + " vs " +
             std::string(codec::dtype_name(y.dtype));
    }
    if (x.shape != y.shape)
      return "tensor '" + x.name + "' has shape " + shape_text(x.shape) + " vs " + shape_text(y.shape);
  }
  if (a.size() != b.size()) {
    return std::to_string(a.size()) + " tensors vs " + std::to_string(b.size()) + " (first extra: '" +
           (a.size() > n ? a.at(static_cast<uint32_t>(n)).name : b.at(static_cast<uint32_t>(n)).name) + "')";
  }
  return std::nullopt;
}

}  // namespace deltacast::tools
