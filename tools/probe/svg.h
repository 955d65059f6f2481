#pragma once
// The bandwidth heatmap of `deltacast probe --svg` (docs/probe.md): an SVG document, no I/O.
#include <string>
#include <vector>

#include "tools/probe/analysis.h"

namespace deltacast::tools {

// Cell [from][to] of `gbit` coloured on a log scale from the smallest to the largest figure (grey:
// no figure), with a legend. Rows (senders) and columns (receivers) follow the ranks in cluster
// order (`clusters`, then every other rank ascending); each cluster is outlined by a rectangle and
// every rank is labelled (every k-th when there are many). `title` is escaped. Thread-safe.
std::string bandwidth_heatmap_svg(const RankMatrix& gbit, const std::vector<std::vector<int>>& clusters,
                                  const std::string& title);

}  // namespace deltacast::tools
