// parse_json_bounded (util/json.h): the depth limit, the reasons it gives, and the caller's callback.
#include "util/json.h"

#include <gtest/gtest.h>

#include <string>

namespace deltacast::util {
namespace {

std::string nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

TEST(ParseJsonBounded, AcceptsDocumentsUpToTheDepthLimit) {
  // Depth counts the containers around a value: the outermost array is at depth 0.
  const auto ok = parse_json_bounded(nested(kMaxJsonDepth + 1));
  ASSERT_FALSE(ok.is_discarded());
  ASSERT_EQ(ok.dump(), nested(kMaxJsonDepth + 1));
  std::string why;
  ASSERT_TRUE(parse_json_bounded(nested(kMaxJsonDepth + 2), &why).is_discarded());
  ASSERT_NE(why.find("nested deeper than 64 levels"), std::string::npos) << why;
}

TEST(ParseJsonBounded, AHugelyNestedDocumentIsRefusedWithoutRecursion) {
  // 400 KB of brackets: nlohmann parses it, but a copy or dump() of the result overflows the stack.
  std::string why;
  const auto j = parse_json_bounded("{\"a\": " + nested(200000) + "}", &why);
  ASSERT_TRUE(j.is_discarded());
  ASSERT_NE(why.find("nested deeper"), std::string::npos) << why;
}

TEST(ParseJsonBounded, MalformedJsonGivesNlohmannsReasonWithTheOffset) {
  std::string why;
  ASSERT_TRUE(parse_json_bounded("{\"a\": [1, 2,", &why).is_discarded());
  ASSERT_NE(why.find("parse error"), std::string::npos) << why;
  ASSERT_NE(why.find("column 13"), std::string::npos) << why;  // where it ended
  ASSERT_TRUE(parse_json_bounded("").is_discarded());
}

TEST(ParseJsonBounded, TheCallersCallbackSeesTheEventsAndCanDropValues) {
  int keys = 0;
  const auto j = parse_json_bounded(
      R"({"keep": 1, "drop": [2, 3], "also": {"x": 4}})", nullptr,
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key) ++keys;
        return !(depth == 1 && event == nlohmann::json::parse_event_t::array_end && parsed.is_array());
      });
  ASSERT_FALSE(j.is_discarded());
  ASSERT_EQ(keys, 4);
  ASSERT_EQ(j.dump(), R"({"also":{"x":4},"keep":1})");
}

}  // namespace
}  // namespace deltacast::util
