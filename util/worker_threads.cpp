#include "util/worker_threads.h"

namespace deltacast {

WorkerThreads::WorkerThreads(unsigned count) {
  for (unsigned i = 0; i < count; ++i) threads_.emplace_back([this] { loop(); });
}

WorkerThreads::~WorkerThreads() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void WorkerThreads::start(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    job_ = std::move(job);
    busy_ = threads_.size();
    ++generation_;
  }
  wake_.notify_all();
}

void WorkerThreads::wait() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return busy_ == 0; });
  job_ = nullptr;
}

void WorkerThreads::loop() {
  uint64_t seen = 0;
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    job();
    std::lock_guard lock(mutex_);
    if (--busy_ == 0) done_.notify_all();
  }
}

}  // namespace deltacast
