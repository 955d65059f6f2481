#include "tree/receiver/relay_host.h"

namespace deltacast::tree {

void RelayHost::listen(transport::Transport& transport, const transport::Url& url) {
  listener_ = transport.listen(url);
}

void RelayHost::install(std::unique_ptr<RelayEdges> edges) {
  std::lock_guard lock(mutex_);
  edges_ = std::move(edges);
}

void RelayHost::stop() {
  if (!edges_) return;
  edges_->stop();
  std::lock_guard lock(mutex_);
  totals_ += edges_->stats();
  edges_.reset();
}

RelayStats RelayHost::stats() const {
  std::lock_guard lock(mutex_);
  RelayStats s = totals_;
  if (edges_) s += edges_->stats();
  return s;
}

}  // namespace deltacast::tree
