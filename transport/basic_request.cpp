#include "transport/basic_request.h"

#include <algorithm>

namespace deltacast::transport {

bool BasicRequest::test() {
  progress();
  return finished();
}

bool BasicRequest::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

Status BasicRequest::wait(std::chrono::milliseconds timeout) {
  // Durations are compared in milliseconds before any conversion to the clock's nanoseconds:
  // progress_interval() is milliseconds::max() for backends without polling, which overflows as
  // nanoseconds (UBSan), and so would a timeout above ~292 years (clamped to a year).
  using namespace std::chrono;
  timeout = std::min(timeout, milliseconds(hours(24 * 365)));
  const auto deadline = steady_clock::now() + timeout;
  for (;;) {
    progress();
    std::unique_lock lock(mutex_);
    if (finished_) return status_;
    const auto now = steady_clock::now();
    if (now >= deadline) return Status{Errc::timeout, "request still pending after " + std::to_string(timeout.count()) + " ms"};
    steady_clock::duration slice = deadline - now;
    if (const milliseconds interval = progress_interval(); interval < duration_cast<milliseconds>(slice)) slice = interval;
    finished_cv_.wait_for(lock, slice, [this] { return finished_; });
  }
}

void BasicRequest::cancel() {
  std::function<void()> hook;
  {
    std::lock_guard lock(mutex_);
    if (finished_) return;
    hook = cancel_hook_;
  }
  if (hook) hook();
}

Status BasicRequest::status() {
  std::lock_guard lock(mutex_);
  if (!finished_) return Status{Errc::state, "pending"};
  return status_;
}

size_t BasicRequest::bytes() {
  std::lock_guard lock(mutex_);
  return bytes_;
}

bool BasicRequest::complete(Status status, size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return false;
    finished_ = true;
    status_ = std::move(status);
    bytes_ = bytes;
    cancel_hook_ = nullptr;  // drops references the hook may hold to its backend
  }
  finished_cv_.notify_all();
  return true;
}

void BasicRequest::set_cancel_hook(std::function<void()> hook) {
  std::lock_guard lock(mutex_);
  cancel_hook_ = std::move(hook);
}

std::shared_ptr<BasicRequest> finished_request(Status status, size_t bytes) {
  auto request = std::make_shared<BasicRequest>();
  request->complete(std::move(status), bytes);
  return request;
}

}  // namespace deltacast::transport
