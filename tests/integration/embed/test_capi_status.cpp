// Every error the codec, tree and transport raise (util/error.h's Errc) maps to one documented
// dc_status, and every C entry point's guard turns exceptions into that status with the message
// in dc_last_error(): the table of deltacast.h, checked entry by entry.
#include <gtest/gtest.h>

#include <map>
#include <new>
#include <set>
#include <stdexcept>
#include <string>

#include "capi/capi_common.h"
#include "deltacast/deltacast.h"
#include "util/error.h"

namespace deltacast {
namespace {

const std::map<Errc, int> kDocumented = {
    {Errc::invalid_argument, DC_ERR_INVALID_ARGUMENT}, {Errc::corrupt_frame, DC_ERR_CORRUPT},
    {Errc::version_mismatch, DC_ERR_VERSION_MISMATCH}, {Errc::replayed, DC_ERR_REPLAYED},
    {Errc::verify_failed, DC_ERR_VERIFY_FAILED},       {Errc::not_found, DC_ERR_NOT_FOUND},
    {Errc::io, DC_ERR_IO},                             {Errc::timeout, DC_ERR_TIMEOUT},
    {Errc::connection, DC_ERR_CONNECTION},             {Errc::auth, DC_ERR_AUTH},
    {Errc::unsupported, DC_ERR_UNSUPPORTED},           {Errc::cancelled, DC_ERR_CANCELLED},
    {Errc::config, DC_ERR_CONFIG},                     {Errc::state, DC_ERR_STATE},
    {Errc::internal, DC_ERR_INTERNAL},
};

TEST(CApiStatus, EveryErrcMapsToItsOwnDocumentedStatus) {
  std::set<int> seen;
  for (int e = 1; e <= static_cast<int>(Errc::internal); ++e) {
    const auto code = static_cast<Errc>(e);
    ASSERT_TRUE(kDocumented.count(code)) << "Errc " << errc_name(code) << " has no documented status";
    const int status = capi::status_of(code);
    EXPECT_EQ(status, kDocumented.at(code)) << errc_name(code);
    EXPECT_TRUE(dc_is_error(status));
    EXPECT_NE(std::string(dc_status_name(status)), "DC_UNKNOWN_STATUS") << errc_name(code);
    EXPECT_TRUE(seen.insert(status).second) << errc_name(code) << " shares its status";
  }
  EXPECT_EQ(capi::status_of(Errc::ok), DC_OK);
}

TEST(CApiStatus, TheGuardTurnsEveryExceptionIntoAStatusAndAMessage) {
  for (const auto& [code, status] : kDocumented) {
    const std::string message = "failure of kind " + std::string(errc_name(code));
    EXPECT_EQ(capi::guarded([&]() -> int { throw Error(code, message); }), status);
    EXPECT_EQ(std::string(dc_last_error()), message);
  }
  EXPECT_EQ(capi::guarded([]() -> int { throw std::bad_alloc(); }), DC_ERR_NO_MEMORY);
  EXPECT_EQ(capi::guarded([]() -> int { throw std::runtime_error("boom"); }), DC_ERR_INTERNAL);
  EXPECT_EQ(std::string(dc_last_error()), "boom");
  EXPECT_EQ(capi::guarded([]() -> int { throw 42; }), DC_ERR_INTERNAL);
  EXPECT_EQ(capi::guarded([]() -> int { return DC_OK; }), DC_OK);
}

TEST(CApiStatus, DigestsAndSwitchesParseAsDocumented) {
  EXPECT_EQ(capi::parse_digest("held_digest", "00000000000000ff"), 0xffu);
  EXPECT_EQ(capi::parse_digest("held_digest", "0xFF"), 0xffu);
  EXPECT_EQ(capi::parse_digest("held_digest", "255"), 255u);
  EXPECT_EQ(capi::parse_digest("held_digest", "ffffffffffffffff"), ~uint64_t{0});
  for (const char* bad : {"", "-1", "0x", "12z", "1ffffffffffffffff", "+5"}) {
    try {
      capi::parse_digest("held_digest", bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::config);
      EXPECT_NE(std::string(e.what()).find("held_digest"), std::string::npos);
    }
  }
  EXPECT_TRUE(capi::parse_bool("gated", "true"));
  EXPECT_TRUE(capi::parse_bool("gated", "yes"));
  EXPECT_FALSE(capi::parse_bool("gated", "0"));
  EXPECT_THROW(capi::parse_bool("gated", "maybe"), Error);
}

}  // namespace
}  // namespace deltacast
