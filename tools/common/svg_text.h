#pragma once
// Text for the CLI's SVG plots (`deltacast probe --svg`, `deltacast bench tree --svg`).
#include <string>

namespace deltacast::tools {

// `text` with &, <, > and " escaped for SVG text and attribute values.
std::string svg_escape(const std::string& text);
// A number with 3 significant digits ("%.3g"): tick labels and tooltips.
std::string svg_number(double value);

}  // namespace deltacast::tools
