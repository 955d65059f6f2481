#include "tools/probe/svg.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>

#include "tools/common/svg_text.h"

namespace deltacast::tools {
namespace {

// A viridis-like ramp, t in [0, 1].
std::string colour(double t) {
  static constexpr std::array<std::array<double, 3>, 5> stops{
      {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}}};
  t = std::clamp(t, 0.0, 1.0) * (stops.size() - 1);
  const size_t k = std::min(static_cast<size_t>(t), stops.size() - 2);
  const double f = t - static_cast<double>(k);
  char out[8];
  std::snprintf(out, sizeof out, "#%02x%02x%02x",
                static_cast<int>(std::lround(stops[k][0] + f * (stops[k + 1][0] - stops[k][0]))),
                static_cast<int>(std::lround(stops[k][1] + f * (stops[k + 1][1] - stops[k][1]))),
                static_cast<int>(std::lround(stops[k][2] + f * (stops[k + 1][2] - stops[k][2]))));
  return out;
}

}  // namespace

std::string bandwidth_heatmap_svg(const RankMatrix& gbit, const std::vector<std::vector<int>>& clusters,
                                  const std::string& title) {
  const int n = static_cast<int>(gbit.size());
  std::vector<int> order;
  std::set<int> placed;
  for (const auto& c : clusters)
    for (int r : c)
      if (r >= 0 && r < n && placed.insert(r).second) order.push_back(r);
  for (int r = 0; r < n; ++r)
    if (!placed.count(r)) order.push_back(r);

  double lo = 0, hi = 0;
  for (const auto& row : gbit)
    for (const auto& v : row)
      if (v && *v > 0) {
        lo = lo == 0 ? *v : std::min(lo, *v);
        hi = std::max(hi, *v);
      }
  if (hi > 0 && hi / lo < 1.01) lo = hi / 2;  // one value: keep the scale finite
  auto scaled = [&](double v) { return hi > 0 ? std::log(v / lo) / std::log(hi / lo) : 0.0; };

  const double cell = std::clamp(640.0 / std::max(n, 1), 4.0, 40.0);
  const double left = 60, top = 60, grid = cell * n;
  const double width = left + grid + 140, height = top + grid + 50;
  const int label_every = std::max(1, static_cast<int>(std::ceil(12.0 / cell)));
  std::string svg;
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
      "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  svg += buf;
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%s</text>\n", left,
                svg_escape(title).c_str());
  svg += buf;
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.0f\" y=\"40\">to (receiver) &#8594;</text>\n<text x=\"14\" y=\"%.0f\" "
                "transform=\"rotate(-90 14 %.0f)\">from (sender) &#8594;</text>\n",
                left, top + grid / 2, top + grid / 2);
  svg += buf;
  for (int i = 0; i < n; ++i) {
    const int from = order[static_cast<size_t>(i)];
    for (int j = 0; j < n; ++j) {
      const int to = order[static_cast<size_t>(j)];
      const auto& v = gbit[static_cast<size_t>(from)][static_cast<size_t>(to)];
      const std::string fill = v && *v > 0 ? colour(scaled(*v)) : "#dddddd";
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>%d -&gt; %d: "
                    "%s</title></rect>\n",
                    left + j * cell, top + i * cell, cell, cell, fill.c_str(), from, to,
                    v ? (svg_number(*v) + " Gbit/s").c_str() : "no figure");
      svg += buf;
    }
  }
  for (int i = 0; i < n; i += label_every) {
    const int r = order[static_cast<size_t>(i)];
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\" dominant-baseline=\"middle\">%d</text>\n"
                  "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%d</text>\n",
                  left - 4, top + (i + 0.5) * cell, r, left + (i + 0.5) * cell, top - 4, r);
    svg += buf;
  }
  // Cluster outlines: each cluster is a contiguous block of `order`.
  size_t at = 0;
  for (const auto& c : clusters) {
    if (c.empty()) continue;
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"#d62728\" "
                  "stroke-width=\"2\"/>\n",
                  left + at * cell, top + at * cell, c.size() * cell, c.size() * cell);
    svg += buf;
    at += c.size();
  }
  // Legend: a vertical ramp from lo (bottom) to hi (top).
  const double lx = left + grid + 30, ly = top, lh = std::max(120.0, grid * 0.6);
  svg += "<defs><linearGradient id=\"ramp\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (int k = 0; k <= 4; ++k) {
    std::snprintf(buf, sizeof buf, "<stop offset=\"%d%%\" stop-color=\"%s\"/>", k * 25, colour(k / 4.0).c_str());
    svg += buf;
  }
  svg += "</linearGradient></defs>\n";
  std::snprintf(buf, sizeof buf,
                "<rect x=\"%.0f\" y=\"%.0f\" width=\"16\" height=\"%.0f\" fill=\"url(#ramp)\" stroke=\"black\"/>\n"
                "<text x=\"%.0f\" y=\"%.0f\">Gbit/s (log)</text>\n",
                lx, ly, lh, lx - 10, ly - 8);
  svg += buf;
  for (int k = 0; k <= 4 && hi > 0; ++k) {
    const double v = lo * std::pow(hi / lo, k / 4.0);
    std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.2f\" dominant-baseline=\"middle\">%s</text>\n", lx + 22,
                  ly + lh - k * lh / 4, svg_number(v).c_str());
    svg += buf;
  }
  std::snprintf(buf, sizeof buf,
                "<rect x=\"%.0f\" y=\"%.0f\" width=\"16\" height=\"12\" fill=\"#dddddd\"/><text x=\"%.0f\" "
                "y=\"%.0f\">no figure</text>\n",
                lx, ly + lh + 14, lx + 22, ly + lh + 24);
  svg += buf;
  svg += "</svg>\n";
  return svg;
}

}  // namespace deltacast::tools
