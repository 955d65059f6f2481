#include "tools/bench/tree_svg.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>

#include "tools/common/svg_text.h"

namespace deltacast::tools {
namespace {

// A step of 1, 2 or 5 x 10^k giving about `ticks` intervals up to `top`.
double nice_step(double top, int ticks) {
  const double raw = top / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

constexpr std::array<const char*, 6> kColours = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

}  // namespace

std::string line_plot_svg(const PlotAxes& axes, const std::vector<PlotSeries>& series) {
  std::set<double> xs;
  double y_top = 0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.xy) {
      if (axes.log_x && !(x > 0)) continue;
      xs.insert(x);
      y_top = std::max(y_top, y);
    }
  const double step = nice_step(y_top > 0 ? y_top * 1.05 : 1.0, 5);
  y_top = step * std::ceil((y_top > 0 ? y_top * 1.05 : 1.0) / step);
  double x_lo = xs.empty() ? 1 : *xs.begin(), x_hi = xs.empty() ? 2 : *xs.rbegin();
  if (x_hi <= x_lo) {  // one x value: centre it
    x_lo = axes.log_x ? x_lo / 2 : x_lo - 1;
    x_hi = axes.log_x ? x_hi * 2 : x_hi + 1;
  }
  const double left = 80, top = 50, width = 640, height = 360, legend = 170;
  const double total_w = left + width + legend, total_h = top + height + 70;
  auto px = [&](double x) {
    const double t = axes.log_x ? std::log(x / x_lo) / std::log(x_hi / x_lo) : (x - x_lo) / (x_hi - x_lo);
    return left + 20 + t * (width - 40);
  };
  auto py = [&](double y) { return top + height - y / y_top * height; };

  std::string svg;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
                "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" "
                "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                total_w, total_h, total_w, total_h);
  svg += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"24\" font-size=\"14\">", left);
  svg += buf + svg_escape(axes.title) + "</text>\n";
  std::snprintf(buf, sizeof buf,
                "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"black\"/>\n", left,
                top, width, height);
  svg += buf;
  for (double y = 0; y <= y_top * (1 + 1e-9); y += step) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.0f\" y1=\"%.2f\" x2=\"%.0f\" y2=\"%.2f\" stroke=\"#e0e0e0\"/>\n"
                  "<text x=\"%.0f\" y=\"%.2f\" text-anchor=\"end\" dominant-baseline=\"middle\">%s</text>\n",
                  left, py(y), left + width, py(y), left - 6, py(y), svg_number(y).c_str());
    svg += buf;
  }
  for (double x : xs) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.2f\" y1=\"%.0f\" x2=\"%.2f\" y2=\"%.0f\" stroke=\"#e0e0e0\"/>\n"
                  "<text x=\"%.2f\" y=\"%.0f\" text-anchor=\"middle\">",
                  px(x), top, px(x), top + height, px(x), top + height + 16);
    svg += buf + svg_escape(axes.x_tick ? axes.x_tick(x) : svg_number(x)) + "</text>\n";
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">", left + width / 2,
                top + height + 40);
  svg += buf + svg_escape(axes.x_label) + (axes.log_x ? " (log scale)" : "") + "</text>\n";
  std::snprintf(buf, sizeof buf, "<text x=\"18\" y=\"%.0f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.0f)\">",
                top + height / 2, top + height / 2);
  svg += buf + svg_escape(axes.y_label) + "</text>\n";

  for (size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const char* colour = kColours[k % kColours.size()];
    std::string points;
    for (const auto& [x, y] : s.xy) {
      if (axes.log_x && !(x > 0)) continue;
      std::snprintf(buf, sizeof buf, "%.2f,%.2f ", px(x), py(y));
      points += buf;
    }
    if (!points.empty()) {
      std::snprintf(buf, sizeof buf, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", colour);
      svg += buf + points + "\"/>\n";
    }
    for (const auto& [x, y] : s.xy) {
      if (axes.log_x && !(x > 0)) continue;
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"><title>", px(x), py(y),
                    colour);
      svg += buf + svg_escape(s.name + ": " + (axes.x_tick ? axes.x_tick(x) : svg_number(x)) + ", " + svg_number(y)) +
             "</title></circle>\n";
    }
    const double ly = top + 10 + 20 * static_cast<double>(k);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"3\"/>\n"
                  "<text x=\"%.0f\" y=\"%.0f\" dominant-baseline=\"middle\">",
                  left + width + 16, ly, left + width + 40, ly, colour, left + width + 46, ly);
    svg += buf + svg_escape(s.name) + "</text>\n";
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace deltacast::tools
