#include "tree/frame_store.h"

#include <algorithm>

namespace deltacast::tree {

FrameStore::FrameStore(size_t in_flight_budget, uint32_t retain_versions)
    : budget_(in_flight_budget), retain_versions_(retain_versions) {}

bool FrameStore::first_sight(uint64_t attempt, uint64_t version, uint32_t chunk, int tree,
                             const SharedBytes& message) {
  std::lock_guard lock(mutex_);
  if (attempt != attempt_) {
    attempt_ = attempt;
    version_ = version;
    in_flight_.clear();
    kept_bytes_ = 0;
  }
  if (in_flight_.count(chunk)) return false;
  StoredMessage stored{chunk, tree, nullptr, {}, nullptr, message && message_type(*message) == MessageType::raw};
  if (message && kept_bytes_ + message->size() <= budget_) {
    stored.message = message;
    kept_bytes_ += message->size();
  }
  in_flight_.emplace(chunk, std::move(stored));
  return true;
}

void FrameStore::landed(uint64_t attempt, uint32_t chunk, std::span<const std::byte> body, SharedBytes owner) {
  std::lock_guard lock(mutex_);
  if (attempt != attempt_) return;
  auto it = in_flight_.find(chunk);
  if (it == in_flight_.end()) return;
  it->second.body = body;
  it->second.body_owner = std::move(owner);
}

void FrameStore::passed_on(uint64_t attempt, uint32_t chunk) {
  std::lock_guard lock(mutex_);
  if (attempt != attempt_) return;
  auto it = in_flight_.find(chunk);
  if (it == in_flight_.end()) return;
  if (it->second.message) kept_bytes_ -= it->second.message->size();
  it->second.message = nullptr;
  it->second.passed = true;
}

void FrameStore::forget(uint64_t attempt, uint32_t chunk) {
  std::lock_guard lock(mutex_);
  if (attempt != attempt_) return;
  auto it = in_flight_.find(chunk);
  if (it == in_flight_.end()) return;
  if (it->second.message) kept_bytes_ -= it->second.message->size();
  in_flight_.erase(it);
}

FrameStore::ResumeState FrameStore::resume_state() const {
  std::lock_guard lock(mutex_);
  ResumeState state{version_, attempt_, {}};
  for (const auto& [chunk, stored] : in_flight_) {
    if (chunk >= state.have.size()) state.have.resize(chunk + 1, false);
    state.have[chunk] = true;
  }
  return state;
}

FrameStore::ResumePlan FrameStore::plan_resume(int tree, uint64_t attempt,
                                               const std::vector<bool>& have) const {
  std::lock_guard lock(mutex_);
  ResumePlan plan{{}, {}, version_, attempt_};
  if (attempt_ == 0) return plan;
  // A child that holds another attempt (an older one, or none) holds nothing of this one.
  const bool same = attempt == attempt_;
  for (const auto& [chunk, stored] : in_flight_) {
    if (stored.tree != tree) continue;
    if (same && chunk < have.size() && have[chunk]) continue;
    // A RAW piece whose body is still landing here is forwarded once it landed, to every child
    // this member has then (the new one included): neither send it nor call it a gap.
    if (stored.raw && stored.body.empty() && !stored.passed) continue;
    if (stored.message)
      plan.send.push_back(stored);
    else
      plan.gaps.push_back(chunk);
  }
  return plan;
}

void FrameStore::end_attempt(uint64_t attempt, bool committed) {
  std::lock_guard lock(mutex_);
  if (attempt != attempt_) return;
  const bool whole = !in_flight_.empty() && in_flight_.rbegin()->first + 1 == in_flight_.size();
  if (committed && whole && retain_versions_ > 0) {
    std::vector<SharedBytes> messages;
    for (const auto& [chunk, stored] : in_flight_) {
      if (!stored.message || stored.raw) break;
      messages.push_back(stored.message);
    }
    if (messages.size() == in_flight_.size()) {
      uint64_t bytes = 0;
      for (const auto& m : messages) bytes += m->size();
      archive_[version_] = std::move(messages);
      archive_bytes_[version_] = bytes;
      while (archive_.size() > retain_versions_) {
        archive_.erase(archive_.begin());
        archive_bytes_.erase(archive_bytes_.begin());
      }
      retained_.versions = static_cast<uint32_t>(archive_.size());
      retained_.bytes = 0;
      for (const auto& [v, b] : archive_bytes_) retained_.bytes += b;
      retained_.peak_versions = std::max(retained_.peak_versions, retained_.versions);
      retained_.peak_bytes = std::max(retained_.peak_bytes, retained_.bytes);
      retained_.largest_version_bytes = std::max(retained_.largest_version_bytes, bytes);
    }
  }
  in_flight_.clear();
  kept_bytes_ = 0;
}

std::optional<std::vector<SharedBytes>> FrameStore::archived(uint64_t from, uint64_t to) const {
  std::lock_guard lock(mutex_);
  std::vector<SharedBytes> all;
  for (uint64_t v = from + 1; v <= to; ++v) {
    auto it = archive_.find(v);
    if (it == archive_.end()) return std::nullopt;
    all.insert(all.end(), it->second.begin(), it->second.end());
  }
  return all;
}

uint64_t FrameStore::newest_archived() const {
  std::lock_guard lock(mutex_);
  return archive_.empty() ? 0 : archive_.rbegin()->first;
}

FrameStore::Retained FrameStore::retained() const {
  std::lock_guard lock(mutex_);
  return retained_;
}

}  // namespace deltacast::tree
