#pragma once
// The plot of `deltacast bench tree --svg` (docs/benchmarks.md): a line chart as a plain SVG
// document, no I/O. Broadcast: busbw against size on a log x axis, one line per topology; refit:
// refit seconds against change rate.
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace deltacast::tools {

struct PlotSeries {
  std::string name;                           // legend text (a topology)
  std::vector<std::pair<double, double>> xy;  // points in x order; x > 0 on a log axis
};

struct PlotAxes {
  std::string title, x_label, y_label;
  bool log_x = false;
  // Tick text for an x value (ticks sit at the distinct x values of the data).
  std::function<std::string(double)> x_tick;
};

// The chart: y from 0 to the largest value (plus headroom) with 5 ticks, a legend, each point a
// marker with a tooltip. Texts are escaped. Series without points are listed in the legend only.
std::string line_plot_svg(const PlotAxes& axes, const std::vector<PlotSeries>& series);

}  // namespace deltacast::tools
