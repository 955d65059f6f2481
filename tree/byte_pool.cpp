#include "tree/byte_pool.h"

namespace deltacast::tree {

BytePool::BytePool(size_t max_pooled_bytes) : state_(std::make_shared<State>()) {
  state_->max_pooled = max_pooled_bytes;
}

std::shared_ptr<const std::vector<std::byte>> BytePool::copy(std::span<const std::byte> bytes) {
  std::unique_ptr<std::vector<std::byte>> buffer;
  {
    std::lock_guard lock(state_->mutex);
    auto it = state_->free.lower_bound(bytes.size());
    if (it != state_->free.end() && it->first <= 2 * bytes.size() + 4096) {
      buffer = std::move(it->second);
      state_->pooled -= it->first;
      state_->free.erase(it);
    }
  }
  if (!buffer) buffer = std::make_unique<std::vector<std::byte>>();
  buffer->assign(bytes.begin(), bytes.end());
  std::weak_ptr<State> home = state_;
  return std::shared_ptr<const std::vector<std::byte>>(buffer.release(), [home](const std::vector<std::byte>* done) {
    std::unique_ptr<std::vector<std::byte>> owned(const_cast<std::vector<std::byte>*>(done));
    auto state = home.lock();
    if (!state) return;
    const size_t capacity = owned->capacity();
    std::lock_guard lock(state->mutex);
    if (state->pooled + capacity > state->max_pooled) return;
    owned->clear();  // keeps the capacity and its pages
    state->pooled += capacity;
    state->free.emplace(capacity, std::move(owned));
  });
}

void BytePool::prewarm(const std::vector<size_t>& sizes) {
  // The pool is made one version's frames: a free buffer that would serve one of `sizes` (as
  // copy() picks) is kept for it, a new one is added for each size none serves, and the free
  // buffers no size claimed are let go. Adding buffers for every size regardless grew every
  // relay's idle buffers by a version's frames per version, up to the cap (64 MiB per member: the
  // soak in docs/reliability.md found it); keeping unclaimed ones still grew the pool while frame
  // sizes crept up (buffers just too small for every later frame).
  std::vector<size_t> missing;
  std::multimap<size_t, std::unique_ptr<std::vector<std::byte>>> unclaimed;  // freed outside the lock
  {
    std::lock_guard lock(state_->mutex);
    std::multimap<size_t, std::unique_ptr<std::vector<std::byte>>> claimed;
    for (size_t size : sizes) {
      auto it = state_->free.lower_bound(size);
      if (it != state_->free.end() && it->first <= 2 * size + 4096)
        claimed.insert(state_->free.extract(it));
      else
        missing.push_back(size);
    }
    for (const auto& [capacity, buffer] : state_->free) state_->pooled -= capacity;
    unclaimed.swap(state_->free);
    state_->free.swap(claimed);
  }
  for (size_t size : missing) {
    const size_t capacity = (size + 4095) / 4096 * 4096;
    {
      std::lock_guard lock(state_->mutex);
      if (state_->pooled + capacity > state_->max_pooled) return;
    }
    auto buffer = std::make_unique<std::vector<std::byte>>(capacity);  // zero-filled: touched
    buffer->clear();
    std::lock_guard lock(state_->mutex);
    state_->pooled += buffer->capacity();
    state_->free.emplace(buffer->capacity(), std::move(buffer));
  }
}

size_t BytePool::pooled_bytes() const {
  std::lock_guard lock(state_->mutex);
  return state_->pooled;
}

}  // namespace deltacast::tree
