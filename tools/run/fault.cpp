#include "tools/run/fault.h"

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {
namespace {

uint64_t parse_positive(const std::string& text, const std::string& spec, const char* what) {
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value == 0)
    throw Error(Errc::invalid_argument,
                "--fault " + spec + ": " + what + " must be a positive integer, got '" + text + "'");
  return value;
}

}  // namespace

Fault parse_fault(const std::string& spec) {
  const size_t at = spec.find('@');
  if (at == std::string::npos)
    throw Error(Errc::invalid_argument, "--fault " + spec + ": expected ACTION@VERSION[:N], e.g. kill@3 or stop@2:5");
  Fault f;
  f.action = spec.substr(0, at);
  if (f.action == "kill")
    f.signal = SIGKILL;
  else if (f.action == "stop")
    f.signal = SIGSTOP;
  else if (f.action != "stall")
    throw Error(Errc::invalid_argument,
                "--fault " + spec + ": unknown action '" + f.action + "' (kill, stop or stall)");
  const std::string rest = spec.substr(at + 1);
  const size_t colon = rest.find(':');
  f.version = parse_positive(rest.substr(0, colon), spec, "VERSION");
  if (colon != std::string::npos && rest.substr(colon + 1) == "commit")
    f.at_commit = true;
  else if (colon != std::string::npos)
    f.after = parse_positive(rest.substr(colon + 1), spec, "N");
  return f;
}

void install_fault(tree::ReceiverOptions& options, const Fault& f, int rank) {
  auto seen = std::make_shared<std::atomic<uint64_t>>(0);
  options.on_data = [f, rank, seen](uint64_t version, uint64_t /*handled*/) {
    if (version != f.version || seen->fetch_add(1) + 1 != f.after) return;
    auto log = logger("run");
    if (f.action == "stall") {
      // This relay thread stops draining its parent's link for good; the process, its other
      // threads and its transport's heartbeats go on.
      log->warn("rank {}: --fault stall@{}:{}: this relay thread stops draining now", rank, f.version, f.after);
      log->flush();
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    log->warn("rank {}: --fault {}@{}:{}: {} this process now", rank, f.action, f.version, f.after,
              f.signal == SIGKILL ? "killing" : "stopping");
    log->flush();
    std::raise(f.signal);
  };
}

std::function<void(uint32_t, uint32_t)> producer_fault_hook(const Fault& f,
                                                            const std::shared_ptr<std::atomic<uint64_t>>& sending) {
  auto seen = std::make_shared<std::atomic<uint64_t>>(0);
  return [f, sending, seen](uint32_t, uint32_t) {
    if (sending->load() != f.version || seen->fetch_add(1) + 1 != f.after) return;
    std::printf("producer: --fault %s@%llu:%llu: %s this process now\n", f.action.c_str(),
                static_cast<unsigned long long>(f.version), static_cast<unsigned long long>(f.after),
                f.signal == SIGKILL ? "killing" : "stopping");
    std::fflush(stdout);
    logger("run")->flush();
    std::raise(f.signal);
  };
}

}  // namespace deltacast::tools
