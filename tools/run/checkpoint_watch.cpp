#include "tools/run/checkpoint_watch.h"

#include <cctype>
#include <thread>

#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools {

namespace fs = std::filesystem;

bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])), db = std::isdigit(static_cast<unsigned char>(b[j]));
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      // Compare the numbers without leading zeros: longer is larger, then digit by digit.
      size_t ia = i, jb = j;
      while (ia + 1 < ie && a[ia] == '0') ++ia;
      while (jb + 1 < je && b[jb] == '0') ++jb;
      if (ie - ia != je - jb) return ie - ia < je - jb;
      if (const int c = a.compare(ia, ie - ia, b, jb, je - jb); c != 0) return c < 0;
      if (ie - i != je - j) return ie - i < je - j;  // "07" after "7": fewer leading zeros first
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

CheckpointWatch::CheckpointWatch(fs::path dir, const std::atomic<bool>& stop, std::chrono::milliseconds poll)
    : dir_(std::move(dir)), stop_(stop), poll_(poll) {}

std::map<std::string, CheckpointWatch::Clock::time_point, decltype(&natural_less)> CheckpointWatch::list() {
  std::map<std::string, Clock::time_point, decltype(&natural_less)> out(&natural_less);
  std::error_code ec;
  fs::directory_iterator it(dir_, ec);
  const auto now = Clock::now();
  // A failed open or step leaves ec set: checked after the loop, so a listing cut short
  // is an error, never a shorter list (which could make an older checkpoint look like the latest).
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto& entry = *it;
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || name.ends_with(".tmp")) continue;
    std::error_code type_ec;
    const bool dir = entry.is_directory(type_ec);
    if (!dir && !(entry.is_regular_file(type_ec) && name.ends_with(".safetensors"))) continue;
    auto [seen, fresh] = first_seen_.emplace(name, now);
    out.emplace(name, seen->second);
  }
  if (ec) throw Error(Errc::io, "trainer.dir " + dir_.string() + ": cannot list it: " + ec.message());
  return out;
}

std::optional<CheckpointWatch::Found> CheckpointWatch::try_open(const std::string& name, Clock::time_point appeared,
                                                                bool quiet) {
  try {
    return Found{name, checkpoint::Checkpoint::open(dir_ / name), appeared};
  } catch (const Error& e) {
    // Incomplete (a shard missing, a file shorter than its header says, no index yet): wait.
    const auto now = Clock::now();
    if (!quiet && now - last_incomplete_log_ > std::chrono::seconds(10)) {
      last_incomplete_log_ = now;
      logger("run")->info("producer: waiting for checkpoint {} to be complete ({})", name, e.what());
    }
    return std::nullopt;
  }
}

std::optional<CheckpointWatch::Found> CheckpointWatch::latest() {
  while (!stop_) {
    const auto names = list();
    for (auto it = names.rbegin(); it != names.rend(); ++it)
      if (auto found = try_open(it->first, it->second, true)) return found;
    std::this_thread::sleep_for(poll_);
  }
  return std::nullopt;
}

std::optional<CheckpointWatch::Found> CheckpointWatch::next_after(const std::string& current) {
  while (!stop_) {
    // A directory that cannot be listed for a while (a network file system's hiccup, a mount
    // being replaced) stops nothing: the tree keeps the current version and the watch retries.
    std::map<std::string, Clock::time_point, decltype(&natural_less)> names(&natural_less);
    try {
      names = list();
    } catch (const Error& e) {
      const auto now = Clock::now();
      if (!unlistable_since_ || now - last_unlistable_log_ > std::chrono::seconds(10)) {
        if (!unlistable_since_) unlistable_since_ = now;
        last_unlistable_log_ = now;
        logger("run")->warn("producer: {}; waiting for it (the receivers keep checkpoint {})", e.what(), current);
      }
      std::this_thread::sleep_for(poll_);
      continue;
    }
    if (unlistable_since_) {
      logger("run")->info("producer: trainer.dir {} can be listed again (after {:.1f} s)", dir_.string(),
                          std::chrono::duration<double>(Clock::now() - *unlistable_since_).count());
      unlistable_since_.reset();
    }
    for (const auto& [name, appeared] : names) {
      if (!natural_less(current, name)) {
        if (name != current && !warned_before_[name]) {
          warned_before_[name] = true;
          logger("run")->warn("producer: ignoring checkpoint {}: its name sorts before the current version's ({})",
                              name, current);
        }
        continue;
      }
      if (auto found = try_open(name, appeared, false)) return found;
      break;  // the next in order is not whole yet: wait for it, skip nothing
    }
    std::this_thread::sleep_for(poll_);
  }
  return std::nullopt;
}

CheckpointWatch::Found CheckpointWatch::open(const std::string& name) {
  list();
  return Found{name, checkpoint::Checkpoint::open(dir_ / name), Clock::now()};
}

}  // namespace deltacast::tools
