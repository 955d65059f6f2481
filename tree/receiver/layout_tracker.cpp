#include "tree/receiver/layout_tracker.h"

#include <iterator>
#include <string>

#include "util/error.h"

namespace deltacast::tree {

void LayoutTracker::restart(std::shared_ptr<const CheckpointLayout> announced, uint64_t committed_version,
                            uint64_t held_version) {
  std::lock_guard lock(mutex_);
  pending_.clear();
  parked_.reset();
  if (!current_ || held_version == committed_version)
    current_ = std::move(announced);
  else
    pending_[committed_version] = Pending{0, std::move(announced)};
}

bool LayoutTracker::ack_may_leave(const Ack& ack, const std::function<bool(uint64_t attempt)>& awaits_layout) {
  std::lock_guard lock(mutex_);
  if (!awaits_layout(ack.attempt)) return true;
  for (const auto& [version, pending] : pending_)
    if (pending.attempt == ack.attempt) return true;
  parked_ = ack;
  return false;
}

std::optional<Ack> LayoutTracker::take(const LayoutUpdate& update, size_t tensors, uint64_t attempt_floor) {
  try {
    check_layout(update.layout, tensors);
  } catch (const Error& e) {
    throw Error(Errc::corrupt_frame,
                "the producer's LAYOUT of version " + std::to_string(update.version) + ": " + e.what());
  }
  if (update.attempt != 0 && update.attempt <= attempt_floor) return std::nullopt;  // ended here
  std::lock_guard lock(mutex_);
  pending_[update.version] = Pending{update.attempt, std::make_shared<const CheckpointLayout>(update.layout)};
  if (!parked_ || parked_->attempt != update.attempt) return std::nullopt;
  std::optional<Ack> released = parked_;
  parked_.reset();
  return released;
}

void LayoutTracker::adopt(uint64_t version) {
  std::lock_guard lock(mutex_);
  const auto after = pending_.upper_bound(version);
  if (after != pending_.begin()) current_ = std::prev(after)->second.layout;
  pending_.erase(pending_.begin(), after);
}

void LayoutTracker::forget(uint64_t attempt) {
  std::lock_guard lock(mutex_);
  std::erase_if(pending_,
                [&](const auto& entry) { return entry.second.attempt != 0 && entry.second.attempt <= attempt; });
  if (parked_ && parked_->attempt <= attempt) parked_.reset();
}

std::shared_ptr<const CheckpointLayout> LayoutTracker::current() const {
  std::lock_guard lock(mutex_);
  return current_;
}

std::map<uint64_t, uint64_t> LayoutTracker::pending() const {
  std::lock_guard lock(mutex_);
  std::map<uint64_t, uint64_t> versions;
  for (const auto& [version, entry] : pending_) versions[version] = entry.attempt;
  return versions;
}

std::optional<Ack> LayoutTracker::parked() const {
  std::lock_guard lock(mutex_);
  return parked_;
}

}  // namespace deltacast::tree
