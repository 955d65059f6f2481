#pragma once
// BasicRequest: the Request every in-tree backend returns. A backend finishes it once with
// complete(); waiters block on a condition variable. Backends that make progress only when asked
// (loopback) override progress() and next_progress_deadline().
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

#include "transport/transport.h"

namespace deltacast::transport {

class BasicRequest : public Request {
 public:
  bool test() override;
  Status wait(std::chrono::milliseconds timeout) override;
  // Runs the cancel hook (if any and not finished). The hook decides whether the request can
  // still be withdrawn; it calls complete(cancelled) when it can.
  void cancel() override;
  Status status() override;
  size_t bytes() override;

  // Finishes the request. Only the first call has an effect; returns whether it was this one.
  // Thread-safe; never calls user code.
  bool complete(Status status, size_t bytes);
  // Sets what cancel() does. Call before handing the request out.
  void set_cancel_hook(std::function<void()> hook);
  bool finished() const;

 protected:
  // Lets a polled backend move data; called without the request lock held.
  virtual void progress() {}
  // How long wait() may sleep before calling progress() again (polled backends).
  virtual std::chrono::milliseconds progress_interval() const { return std::chrono::milliseconds::max(); }

 private:
  mutable std::mutex mutex_;
  std::condition_variable finished_cv_;
  bool finished_ = false;
  Status status_;
  size_t bytes_ = 0;
  std::function<void()> cancel_hook_;
};

// A request already finished with `status` and `bytes` (a post on a link known to have failed).
std::shared_ptr<BasicRequest> finished_request(Status status, size_t bytes = 0);

}  // namespace deltacast::transport
