#pragma once
// File helpers shared by the offline CLI commands.
#include <cstddef>
#include <filesystem>
#include <span>
#include <vector>

namespace deltacast::tools {

// Reads a whole file. Throws Error(io) naming the file when it cannot be opened or read.
std::vector<std::byte> read_file(const std::filesystem::path& path);

// Writes `bytes` to a temporary file beside `path`, fsyncs it and renames it over `path`, so
// readers see either the old or the new file, never a partial one. Throws Error(io); on failure
// `path` is untouched and the temporary file removed.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);

}  // namespace deltacast::tools
