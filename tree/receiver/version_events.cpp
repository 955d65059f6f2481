#include "tree/receiver/version_events.h"

namespace deltacast::tree {

VersionEvents::VersionEvents(std::atomic<uint64_t>& active, std::function<void(uint64_t)> on_active,
                             std::function<void(uint64_t)> on_aborted)
    : active_(active), on_active_(std::move(on_active)), on_aborted_(std::move(on_aborted)) {}

void VersionEvents::committed(uint64_t version) {
  ++committed_;
  active_.store(version);
  if (on_active_) on_active_(version);
}

void VersionEvents::reached(uint64_t version) {
  if (version <= active_.load()) return;
  active_.store(version);
  if (on_active_) on_active_(version);
}

void VersionEvents::aborted(uint64_t version, const std::function<void()>& answer) {
  ++aborted_;
  answer();
  if (on_aborted_) on_aborted_(version);
}

}  // namespace deltacast::tree
