#include "tree/store_uplink.h"

#include <chrono>

#include "util/error.h"
#include "util/log.h"

namespace deltacast::tree {

StoreUplink::StoreUplink(const codec::Manifest& manifest, std::unique_ptr<objstore::S3Client> client, Options options)
    : manifest_(manifest),
      client_(std::move(client)),
      options_(std::move(options)),
      publisher_(manifest_, *client_, options_.layout) {
  if (options_.fresh) {
    const size_t cleared = clear_store(*client_, options_.layout);
    if (cleared > 0)
      logger("store")->info("store: cleared {} objects of an earlier chain under {}/", cleared, options_.layout.prefix);
  }
  publish_model(*client_, options_.layout, manifest_);
  thread_ = std::thread([this] { loop(); });
}

StoreUplink::~StoreUplink() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StoreUplink::delta(uint64_t version, uint64_t base_version, uint64_t digest,
                        std::vector<std::vector<std::byte>> frames) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(Job{version, base_version, digest, std::move(frames), nullptr});
  }
  changed_.notify_all();
}

bool StoreUplink::wants_snapshot(uint64_t version) const {
  std::lock_guard lock(mutex_);
  return version == 1 || broken_ || (options_.snapshot_every > 0 && version % options_.snapshot_every == 0) ||
         version >= last_snapshot_ + options_.layout.retain_versions;
}

void StoreUplink::snapshot(uint64_t version, std::shared_ptr<const codec::OwnedWeights> bits) {
  {
    std::lock_guard lock(mutex_);
    broken_ = false;  // this snapshot mends the chain (if it fails, it is broken again)
    last_snapshot_ = version;
    queue_.push_back(Job{version, 0, 0, {}, std::move(bits)});
  }
  changed_.notify_all();
}

bool StoreUplink::publish(Job& job) {
  const auto start = std::chrono::steady_clock::now();
  const uint64_t sent_before = client_->stats().bytes_sent;
  bool ok = true;
  try {
    if (job.bits)
      publisher_.publish_snapshot(job.version, 0, job.bits->view());
    else
      publisher_.publish_delta(job.version, job.base_version, 0, job.digest, job.frames);
    publisher_.prune();
  } catch (const Error& e) {
    logger("store")->warn("store: version {} ({}) was not published: {}", job.version, job.bits ? "whole" : "delta",
                          e.what());
    ok = false;
    std::lock_guard lock(mutex_);
    stats_.last_error = e.what();
  }
  std::lock_guard lock(mutex_);
  if (ok) ++(job.bits ? stats_.snapshots : stats_.deltas);
  stats_.bytes_uploaded += client_->stats().bytes_sent - sent_before;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ok;
}

void StoreUplink::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    // In order: the versions behind this one wait while it is tried again.
    const auto first_failure = std::chrono::steady_clock::now();
    bool ok = publish(job);
    while (!ok) {
      std::unique_lock lock(mutex_);
      if (stopping_ || std::chrono::steady_clock::now() - first_failure >= options_.give_up) break;
      changed_.wait_for(lock, options_.retry_every, [&] { return stopping_; });
      if (stopping_) break;
      ++stats_.retried;
      lock.unlock();
      ok = publish(job);
    }
    {
      std::lock_guard lock(mutex_);
      if (!ok) {
        logger("store")->error(
            "store: version {} dropped after {} s of failures: {}; the next version goes whole", job.version,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - first_failure).count(), stats_.last_error);
        ++stats_.failed;
        broken_ = true;
      }
      busy_ = false;
    }
    changed_.notify_all();
  }
}

void StoreUplink::wait_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

StoreUplink::Stats StoreUplink::finish(uint64_t last_version) {
  wait_idle();
  try {
    publish_end(*client_, options_.layout, last_version);
  } catch (const Error& e) {
    logger("store")->error("store: end.json (version {}) was not written: {}", last_version, e.what());
    std::lock_guard lock(mutex_);
    ++stats_.failed;
    stats_.last_error = e.what();
  }
  return stats();
}

StoreUplink::Stats StoreUplink::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace deltacast::tree
