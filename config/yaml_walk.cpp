#include "config/yaml_walk.h"

namespace deltacast::config::yaml {

std::string where(const std::string& source, const YAML::Mark& mark) {
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

void fail_at(const std::string& source, const YAML::Node& node, const std::string& message) {
  throw Error(Errc::config, where(source, node.Mark()) + ": " + message);
}

const char* type_name(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "nothing";
  }
  return "nothing";
}

YAML::Node load(std::string_view text, const std::string& source) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::ParserException& e) {
    throw Error(Errc::config, where(source, e.mark) + ": malformed YAML: " + e.msg);
  }
}

}  // namespace deltacast::config::yaml
