// Read-only mappings ask for huge pages (checkpoint/mapped_file.h); writable ones do not. Checked
// in the mapping's VmFlags in /proc/self/smaps ("hg": MADV_HUGEPAGE was given).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/mapped_file.h"
#include "test_files.h"

namespace deltacast::checkpoint {
namespace {

namespace fs = std::filesystem;

// The VmFlags of the mapping that contains `p`, or "" when /proc/self/smaps has no such mapping.
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-' && line.find(' ') != std::string::npos &&
        line.find(':') > line.find(' ')) {
      inside = begin <= at && at < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

bool has_flag(const std::string& flags, const std::string& flag) {
  std::istringstream words(flags.substr(flags.find(':') + 1));
  for (std::string w; words >> w;)
    if (w == flag) return true;
  return false;
}

TEST(MappedFile, AReadOnlyMappingAsksForHugePagesAWritableOneDoesNot) {
  if (!fs::exists("/sys/kernel/mm/transparent_hugepage"))
    GTEST_SKIP() << "this kernel has no transparent huge pages (no /sys/kernel/mm/transparent_hugepage)";
  test::TempDir dir;
  const fs::path path = dir.path() / "blob";
  {
    std::ofstream out(path, std::ios::binary);
    const std::vector<char> data(4 << 20, 1);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  const MappedFile reading(path, false);
  const std::string read_flags = vm_flags_of(reading.bytes().data());
  ASSERT_FALSE(read_flags.empty()) << "no mapping at the read-only file's address in /proc/self/smaps";
  EXPECT_TRUE(has_flag(read_flags, "hg")) << read_flags;
  const MappedFile writing(path, true);
  const std::string write_flags = vm_flags_of(writing.bytes().data());
  ASSERT_FALSE(write_flags.empty());
  EXPECT_FALSE(has_flag(write_flags, "hg")) << write_flags;
}

}  // namespace
}  // namespace deltacast::checkpoint
