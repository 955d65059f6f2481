// libfabric shm endpoints are named by deltacast, and regions left by killed processes are removed
// (a reused pid used to make fi_enable fail with "Device or resource busy").
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/transport/peer_process.h"
#include "transport/ofi/shm_names.h"
#include "transport/transport.h"

namespace deltacast::transport {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::vector<std::string> regions_of(pid_t pid, const std::string& directory = "/dev/shm") {
  std::vector<std::string> names;
  std::string prefix = "deltacast-" + std::to_string(pid) + "-";
  for (const auto& entry : fs::directory_iterator(directory)) {
    std::string name = entry.path().filename().string();
    if (name.starts_with(prefix)) names.push_back(name);
  }
  return names;
}

pid_t dead_pid() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(OfiShmNames, AreUniqueAndCarryThePid) {
  std::set<std::string> names;
  for (int k = 0; k < 100; ++k) names.insert(ofi::unique_shm_endpoint_name());
  EXPECT_EQ(names.size(), 100u);
  for (const auto& name : names) {
    EXPECT_TRUE(name.starts_with("deltacast-" + std::to_string(::getpid()) + "-")) << name;
    EXPECT_EQ(name.find('/'), std::string::npos) << name;
    EXPECT_LT(name.size(), 64u) << name;
  }
}

TEST(OfiShmNames, OnlyRegionsOfDeadDeltacastProcessesAreRemoved) {
  fs::path dir = fs::temp_directory_path() / ("dc-shm-sweep-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  pid_t dead = dead_pid();
  const std::vector<std::string> stale = {"deltacast-" + std::to_string(dead) + "-00ab-0",
                                          "deltacast-" + std::to_string(dead) + "-00ab-7"};
  const std::vector<std::string> kept = {"deltacast-" + std::to_string(::getpid()) + "-00ab-0",
                                         "deltacast-" + std::to_string(::getppid()) + "-00ab-0",
                                         std::to_string(dead) + ":0:0",  // libfabric's default name
                                         "deltacast-" + std::to_string(dead),
                                         "deltacast-notapid-1",
                                         "deltacast--1-x"};
  for (const auto& name : stale) std::ofstream(dir / name) << "x";
  for (const auto& name : kept) std::ofstream(dir / name) << "x";
  EXPECT_EQ(ofi::remove_stale_shm_regions(dir.string()), stale.size());
  for (const auto& name : stale) EXPECT_FALSE(fs::exists(dir / name)) << name;
  for (const auto& name : kept) EXPECT_TRUE(fs::exists(dir / name)) << name;
  EXPECT_EQ(ofi::remove_stale_shm_regions(dir.string()), 0u);
  EXPECT_EQ(ofi::remove_stale_shm_regions((dir / "missing").string()), 0u);
  fs::remove_all(dir);
}

TEST(OfiShm, TheRegionsOfAKilledPeerAreRemovedByTheNextTransport) {
  TransportOptions options;
  options.secret = "shm-secret";
  options.connect_timeout = 5s;
  options.heartbeat_interval = 100ms;
  options.peer_timeout = 1500ms;
  constexpr size_t kMessage = 1 << 20;
  std::optional<testing::StreamingPeer> peer;
  peer.emplace("ofi+shm", options, kMessage);  // forked before this process has transport threads
  pid_t peer_pid = peer->pid();
  {
    auto client = make_transport("ofi+shm", options);
    auto connection = client->connect(peer->url(), 5s);
    std::vector<std::byte> buffer(kMessage);
    auto recv = connection->post_recv(buffer);
    auto status = recv->wait(30s);
    ASSERT_TRUE(status.ok()) << errc_name(status.code) << ": " << status.message;
    EXPECT_FALSE(regions_of(::getpid()).empty()) << "this process's endpoint is not deltacast-named";
    EXPECT_FALSE(regions_of(peer_pid).empty()) << "the peer's endpoint is not deltacast-named";
    peer.reset();  // SIGKILL and reap: the peer never closes its endpoint
    EXPECT_FALSE(regions_of(peer_pid).empty()) << "a killed process left nothing behind?";
  }
  auto next = make_transport("ofi+shm", options);
  EXPECT_TRUE(regions_of(peer_pid).empty()) << "the killed peer's shared memory is still there";
}

}  // namespace
}  // namespace deltacast::transport
