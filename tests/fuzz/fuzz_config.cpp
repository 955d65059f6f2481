// fuzz_config: YAML text through config::parse_config (config/config.h), then validate().
//
// Input: the YAML text.
// Oracles:
//   * parse_config throws nothing but Error(config), and its message starts with
//     "fuzz.yaml:LINE:COL: " (line and column from 1), as the header promises;
//   * a config that parses either validates, or validate() throws Error(config); one that
//     validates has a member list of distinct ranks 0..n-1, and validates again (idempotent);
//   * parsing is deterministic: the same text parses to the same member list again.
#include <string>
#include <string_view>

#include "config/config.h"
#include "fuzz_common.h"
#include "util/error.h"

namespace deltacast::fuzz {
namespace {

constexpr const char* kSource = "fuzz.yaml";

bool same_members(const std::vector<config::MemberConfig>& a, const std::vector<config::MemberConfig>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].rank != b[i].rank || a[i].url != b[i].url || a[i].cluster != b[i].cluster) return false;
  return true;
}

}  // namespace
}  // namespace deltacast::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deltacast;
  const std::string text(reinterpret_cast<const char*>(data), size);
  config::Config config;
  try {
    config = config::parse_config(text, fuzz::kSource);
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == Errc::config, std::string("parse_config threw ") + e.what());
    FUZZ_CHECK(fuzz::has_source_location(e.what(), fuzz::kSource),
               std::string("message without SOURCE:LINE:COL: ") + e.what());
    return 0;
  }
  try {
    config::validate(config);
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == Errc::config, std::string("validate threw ") + e.what());
    return 0;
  }
  config::validate(config);
  const auto members = config::member_list(config);
  for (size_t i = 0; i < members.size(); ++i)
    FUZZ_CHECK(members[i].rank == static_cast<int>(i), "validated member ranks are not 0..n-1");
  FUZZ_CHECK(fuzz::same_members(members, config::member_list(config::parse_config(text, fuzz::kSource))),
             "the same text parsed to another member list");
  return 0;
}
