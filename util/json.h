#pragma once
// JSON that comes from outside the process (checkpoint headers and indexes, a peer's messages, a
// received checkpoint layout, state, record and report files) is parsed through parse_json_bounded.
// nlohmann's parser and destructor are iterative, but copying or dumping a value recurses once per
// level of nesting: a document of a few hundred KB nested a few hundred thousand levels deep
// parses fine and then overflows the stack wherever it is next copied or written (seen: a sharded
// checkpoint whose index metadata was such a document crashed `deltacast inspect`). No format
// deltacast reads nests deeper than a handful of levels, so deeper documents are refused at parse.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace deltacast::util {

inline constexpr int kMaxJsonDepth = 64;

// A parser callback that keeps every value.
struct KeepEveryValue {
  template <class Event, class Value>
  bool operator()(int, Event, Value&) const noexcept {
    return true;
  }
};

// Parses `text` into a JsonT (nlohmann::json or nlohmann::ordered_json). `inner(depth, event,
// value)` is nlohmann's parser callback (return false to drop a value), called for every event of
// a document within the depth limit. On malformed JSON or a document nested deeper than
// kMaxJsonDepth returns a discarded value (is_discarded()) and, when `why` is given, sets it to the
// reason (nlohmann's message, with the byte offset). Never throws for bad input.
template <class JsonT = nlohmann::json, class Callback = KeepEveryValue>
JsonT parse_json_bounded(std::string_view text, std::string* why = nullptr, Callback inner = {}) {
  bool too_deep = false;
  auto bounded = [&](int depth, typename JsonT::parse_event_t event, JsonT& parsed) {
    if (depth > kMaxJsonDepth) {
      too_deep = true;
      return false;  // dropped; the parser goes on over it without keeping anything
    }
    return inner(depth, event, parsed);
  };
  JsonT out;
  try {
    out = JsonT::parse(text.begin(), text.end(), bounded);
  } catch (const nlohmann::json::exception& e) {
    if (why) *why = e.what();
    return JsonT(JsonT::value_t::discarded);
  }
  if (too_deep) {
    if (why) *why = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return JsonT(JsonT::value_t::discarded);
  }
  return out;
}

}  // namespace deltacast::util
