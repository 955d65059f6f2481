// The backend registry (transport/backend_registry.h): the core finds backends only through it.
// A backend registered here (a fake one) is parsed and made like a built-in; one registered as
// missing says why; a name taken twice is refused; an unknown scheme lists what is there.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "transport/backend_registry.h"
#include "transport/transport.h"

namespace deltacast::transport {
namespace {

int fake_made = 0;

std::unique_ptr<Transport> make_fake(std::string_view provider, const TransportOptions& options) {
  ++fake_made;
  EXPECT_EQ(provider, "blue");
  return make_transport("loop", options);  // any working transport will do
}

BackendInfo named(const std::string& name) {
  BackendInfo info;
  info.name = name;
  return info;
}

void register_fakes_once() {
  static const bool done = [] {
    BackendInfo fake = named("fake");
    fake.takes_provider = true;
    fake.machine_local = [](std::string_view provider) { return provider == "blue"; };
    fake.make = &make_fake;
    register_backend(std::move(fake));
    BackendInfo gone = named("gone");
    gone.missing = "gone was not found when this deltacast was configured";
    register_backend(std::move(gone));
    return true;
  }();
  (void)done;
}

std::string error_of(const std::function<void()>& call, Errc expected) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(BackendRegistry, TheBuiltinsAreRegisteredByTheBackendsTarget) {
  for (const char* name : {"tcp", "loop", "ofi", "ucx"}) {
    const BackendInfo* b = find_backend(name);
    ASSERT_NE(b, nullptr) << name;
    EXPECT_EQ(b->name, name);
  }
  EXPECT_TRUE(find_backend("ofi")->takes_provider);
  EXPECT_TRUE(find_backend("loop")->address_is_name);
  EXPECT_NE(find_backend("tcp")->make, nullptr);
  EXPECT_EQ(find_backend("nope"), nullptr);
}

TEST(BackendRegistry, ARegisteredBackendIsParsedAndMadeLikeABuiltin) {
  register_fakes_once();
  const Url url = Url::parse("fake+blue://10.1.2.3:77");
  EXPECT_EQ(url.scheme, "fake");
  EXPECT_EQ(url.provider, "blue");
  EXPECT_EQ(url.port, 77);
  EXPECT_TRUE(url.is_local());  // the backend says so for "blue", whatever the host
  EXPECT_FALSE(Url::parse("fake+red://10.1.2.3:77").is_local());
  error_of([] { Url::parse("fake://h:1"); }, Errc::invalid_argument);  // needs its provider
  const int before = fake_made;
  EXPECT_NE(make_transport("fake+blue", {}), nullptr);
  EXPECT_EQ(fake_made, before + 1);
  EXPECT_TRUE(backend_built("fake+blue"));
}

TEST(BackendRegistry, AMissingBackendSaysWhy) {
  register_fakes_once();
  EXPECT_FALSE(backend_built("gone"));
  EXPECT_EQ(Url::parse("gone://h:1").scheme, "gone");  // its addresses still parse
  const std::string what = error_of([] { make_transport("gone", {}); }, Errc::unsupported);
  EXPECT_NE(what.find("not built into this deltacast"), std::string::npos) << what;
  EXPECT_NE(what.find("gone was not found when this deltacast was configured"), std::string::npos) << what;
  for (const auto& name : built_backends()) EXPECT_NE(name, "gone");
}

TEST(BackendRegistry, ANameTakenTwiceOrEmptyIsRefused) {
  register_fakes_once();
  error_of([] { register_backend(named("tcp")); }, Errc::internal);
  error_of([] { register_backend(named("")); }, Errc::internal);
  EXPECT_NE(find_backend("tcp")->make, nullptr);  // the first registration stands
}

TEST(BackendRegistry, AnUnknownSchemeListsTheRegisteredOnes) {
  const std::string what = error_of([] { make_transport("pigeon", {}); }, Errc::invalid_argument);
  EXPECT_NE(what.find("pigeon"), std::string::npos) << what;
  EXPECT_NE(what.find("tcp"), std::string::npos) << what;
  EXPECT_NE(what.find("ofi+PROVIDER"), std::string::npos) << what;
  const std::string parse = error_of([] { Url::parse("pigeon://h:1"); }, Errc::invalid_argument);
  EXPECT_NE(parse.find("unknown scheme 'pigeon'"), std::string::npos) << parse;
}

}  // namespace
}  // namespace deltacast::transport
