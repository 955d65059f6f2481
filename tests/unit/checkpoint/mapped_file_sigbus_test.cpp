// A checkpoint file truncated by another process while it is mapped: the SIGBUS that follows is
// reported on stderr naming the file (checkpoint/mapped_file.h) before the process dies of it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "test_files.h"

namespace deltacast::checkpoint {
namespace {

namespace fs = std::filesystem;

// A single-file checkpoint of one 1 MiB U8 tensor.
fs::path write_model(const fs::path& dir) {
  fs::path path = dir / "model.safetensors";
  const std::string header = R"({"w":{"dtype":"U8","shape":[1048576],"data_offsets":[0,1048576]}})";
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  const std::vector<char> data(1 << 20, 7);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return path;
}

// Reads every byte of the checkpoint's tensors after the file was cut to 4 KiB, then exits 0.
void read_after_truncation(const fs::path& path) {
  const auto c = Checkpoint::open(path);
  fs::resize_file(path, 4096);
  volatile unsigned sum = 0;
  for (const auto& t : c.weights().tensors)
    for (std::byte b : t) sum = sum + std::to_integer<unsigned>(b);
  std::exit(sum == 1 ? 1 : 0);
}

TEST(MappedFileDeathTest, ACheckpointTruncatedWhileMappedIsNamedWhenTheReadFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const test::TempDir dir;
  const fs::path path = write_model(dir.path());
  EXPECT_EXIT(read_after_truncation(path), testing::KilledBySignal(SIGBUS),
              "deltacast: fatal: .*model\\.safetensors could not be read while deltacast had it mapped .SIGBUS.: it "
              "shrank");
}

// A handler installed before the first mapping (UCX and Python install theirs) still runs, after
// the message.
void earlier_handler(int, siginfo_t*, void*) {
  const char text[] = "the earlier handler ran\n";
  (void)!::write(STDERR_FILENO, text, sizeof text - 1);
  ::_exit(3);
}
void read_with_an_earlier_handler(const fs::path& path) {
  struct sigaction sa {};
  sa.sa_sigaction = earlier_handler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
  read_after_truncation(path);
}

TEST(MappedFileDeathTest, TheHandlerItReplacedRunsAfterTheMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const test::TempDir dir;
  const fs::path path = write_model(dir.path());
  EXPECT_EXIT(read_with_an_earlier_handler(path), testing::ExitedWithCode(3),
              "model\\.safetensors could not be read(.|\n)*the earlier handler ran");
}

TEST(MappedFileDeathTest, AFaultOutsideEveryMappingIsLeftToTheDefaultAction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const test::TempDir dir;
  const fs::path path = write_model(dir.path());
  const auto keep = Checkpoint::open(path);  // the handler is installed
  EXPECT_EXIT(raise(SIGBUS), testing::KilledBySignal(SIGBUS), "^$");
}

}  // namespace
}  // namespace deltacast::checkpoint
