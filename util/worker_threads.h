#pragma once
// Threads that live as long as their owner and run one job at a time on every thread. For work
// whose per-thread state (thread_local scratch: scan buffers, zstd contexts, decode buffers) should
// stay warm across calls instead of being rebuilt and page-faulted in by fresh threads each time.
// Driven by one thread at a time: start(job), then wait() before the next start().
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace deltacast {

class WorkerThreads {
 public:
  explicit WorkerThreads(unsigned count);
  ~WorkerThreads();
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;

  size_t size() const noexcept { return threads_.size(); }
  // Runs `job` once on every thread and returns at once. The job must not throw (report errors
  // through captured state).
  void start(std::function<void()> job);
  // Blocks until every thread finished the job of the last start().
  void wait();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> job_;
  size_t busy_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace deltacast
