#include "tools/run/run_support.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <openssl/evp.h>
#include <spdlog/sinks/basic_file_sink.h>

#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

// Every subsystem that logs (util/log.h creates loggers on first use; creating them here means
// set_log_level and the log file reach all of them).
constexpr const char* kSubsystems[] = {"tree", "transport", "codec", "run", "cli"};

}  // namespace

std::string weights_sha256(const codec::ConstWeights& weights) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw Error(Errc::internal, "OpenSSL SHA-256 is not available");
  for (const auto& t : weights.tensors) EVP_DigestUpdate(ctx.get(), t.data(), t.size());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    char byte[3];
    std::snprintf(byte, sizeof byte, "%02x", digest[i]);
    hex += byte;
  }
  return hex;
}

void write_json(const std::string& path, const nlohmann::json& value) {
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  if (!out) throw Error(Errc::io, "cannot write " + path);
  out << value.dump(2) << "\n";
}

namespace {
// A "Name:   N kB" line of /proc/self/status, in bytes (0 when absent).
uint64_t status_kb_field(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(name, 0) == 0) return std::stoull(line.substr(name.size())) * 1024;
  return 0;
}
}  // namespace

uint64_t rss_anon_bytes() { return status_kb_field("RssAnon:"); }

uint64_t peak_rss_bytes() { return status_kb_field("VmHWM:"); }

void set_log_level(const std::string& level) {
  for (const char* subsystem : kSubsystems) logger(subsystem)->set_level(spdlog::level::from_str(level));
}

std::shared_ptr<spdlog::logger> open_log_file(const config::Config& c, int rank) {
  if (c.output.log_file.empty()) return nullptr;
  const std::string path = config::log_file_for_rank(c.output.log_file, rank);
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink;
  try {
    sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  } catch (const spdlog::spdlog_ex& e) {
    throw Error(Errc::io, "output.log_file: cannot open " + path + ": " + e.what());
  }
  sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
  for (const char* subsystem : kSubsystems) logger(subsystem);
  // Before any transport or tree thread exists: nothing logs while the sink lists change. Every
  // line is flushed: a member killed or crashing must not lose its last lines.
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) {
    l->sinks().push_back(sink);
    l->flush_on(spdlog::level::trace);
  });
  auto file_only = std::make_shared<spdlog::logger>("run", sink);
  file_only->set_level(spdlog::level::trace);
  return file_only;
}

}  // namespace deltacast::tools
