#include "tools/common/svg_text.h"

#include <cstdio>

namespace deltacast::tools {

std::string svg_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string svg_number(double value) {
  char out[32];
  std::snprintf(out, sizeof out, "%.3g", value);
  return out;
}

}  // namespace deltacast::tools
