#pragma once
// A relay tree inside one test process, for the tree tests that kill, freeze and restart members
// at exact messages: the producer and every member are threads of this process, each with its OWN
// loopback transport (so a fault hook or loop::kill acts on one member only). Each member joins,
// attaches zeroed buffers (version 0) and serves until its receiver ends (join_and_serve); what it
// throws is kept as its failure. A subclass says how a member's Receiver is made and calls start().
#include <cctype>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/time_scale.h"
#include "tests/integration/tree/tree_test_model.h"
#include "transport/loopback/loopback.h"
#include "transport/transport.h"
#include "tree/producer.h"
#include "tree/receiver.h"

namespace deltacast::tree {

// The running test's name with every non-alphanumeric character replaced by '-' (loopback names).
inline std::string test_name() {
  std::string s = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (auto& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  return s;
}

class LoopCluster {
 public:
  LoopCluster(const LoopCluster&) = delete;
  LoopCluster& operator=(const LoopCluster&) = delete;
  // Subclasses whose receivers call back into them call finish() in their own destructor first.
  virtual ~LoopCluster() {
    if (!finished_) finish();
  }
  // Ends the producer, then waits for every member thread (a member marked frozen() is killed
  // first: it would never notice).
  void finish() {
    finished_ = true;
    producer_->finish();
    for (uint32_t r = 1; r < threads_.size(); ++r) {
      if (frozen_.count(r)) transport::loopback::kill(*transports_[r]);
      if (threads_[r].joinable()) threads_[r].join();
    }
  }
  // A new process for rank r (after the old one is killed here): fresh buffers at version 0, the
  // same rank. `before_join`, when given, runs on the new member's transport before its receiver
  // exists (to install a fault hook from its first message on).
  void restart(uint32_t r, const std::function<void(transport::Transport&)>& before_join = {}) {
    transport::loopback::kill(*transports_[r]);
    if (threads_[r].joinable()) threads_[r].join();
    failures_[r].clear();
    buffers_[r].clear();
    forget(r);
    transports_[r] = make_member_transport();
    if (before_join) before_join(*transports_[r]);
    receivers_[r] = make_receiver(r);
    threads_[r] = std::thread([this, r] { serve(r); });
  }

  Producer& producer() { return *producer_; }
  transport::Transport& producer_transport() { return *producer_transport_; }
  transport::Transport& transport_of(uint32_t r) { return *transports_[r]; }
  Receiver& receiver(uint32_t r) { return *receivers_[r]; }
  uint32_t size() const { return static_cast<uint32_t>(receivers_.size() - 1); }
  const std::string& failure(uint32_t r) const { return failures_[r]; }
  std::string failures() const {
    std::string all;
    for (size_t r = 1; r < failures_.size(); ++r)
      if (!failures_[r].empty()) all += "rank " + std::to_string(r) + ": " + failures_[r] + "\n";
    return all;
  }
  bool holds(uint32_t r, const codec::ConstWeights& expected) const { return same_bits(buffers_[r], expected); }
  const std::vector<Bytes>& buffers(uint32_t r) const { return buffers_[r]; }
  // Member r's weights, to change them behind its back (only while it is idle between versions).
  std::vector<Bytes>& buffers_mut(uint32_t r) { return buffers_[r]; }
  bool finished() const { return finished_; }
  // Marks member r frozen (finish() kills it) or no longer frozen.
  void frozen(uint32_t r) { frozen_.insert(r); }
  void thawed(uint32_t r) { frozen_.erase(r); }

 protected:
  LoopCluster(std::string name, uint32_t n, std::chrono::milliseconds peer_timeout)
      : name_(std::move(name)),
        peer_timeout_(peer_timeout),
        transports_(n + 1),
        receivers_(n + 1),
        threads_(n + 1),
        failures_(n + 1),
        buffers_(n + 1) {}

  // Creates the producer (listening at producer_url()) and the members, starts every member's
  // thread and then the producer. When the start throws, every member thread is ended before the
  // exception leaves (joinable threads would terminate the process).
  void start(const codec::Manifest& manifest, ProducerOptions po) {
    producer_transport_ = make_member_transport();
    po.listen_url = producer_url();
    po.peer_timeout = peer_timeout_;
    producer_ = std::make_unique<Producer>(*producer_transport_, manifest, po);
    const auto n = size();
    for (uint32_t r = 1; r <= n; ++r) {
      transports_[r] = make_member_transport();
      receivers_[r] = make_receiver(r);
    }
    for (uint32_t r = 1; r <= n; ++r) threads_[r] = std::thread([this, r] { serve(r); });
    try {
      producer_->start();
    } catch (...) {
      for (uint32_t r = 1; r <= n; ++r) transport::loopback::kill(*transports_[r]);
      for (uint32_t r = 1; r <= n; ++r)
        if (threads_[r].joinable()) threads_[r].join();
      finished_ = true;
      throw;
    }
  }

  // The member options every cluster shares: rank, addresses, timeouts (a killed member's thread
  // stops trying to rejoin after 1 s).
  ReceiverOptions receiver_options(uint32_t r) const {
    ReceiverOptions ro;
    ro.rank = r;
    ro.producer_url = producer_url();
    ro.listen_url = "loop://" + name_ + "-r" + std::to_string(r);
    ro.peer_timeout = peer_timeout_;
    ro.connect_timeout = test_time::scaled(std::chrono::seconds(2));
    ro.join_timeout = test_time::scaled(std::chrono::seconds(10));
    ro.producer_loss_timeout = std::chrono::seconds(1);
    return ro;
  }
  virtual std::unique_ptr<Receiver> make_receiver(uint32_t r) = 0;
  // Member r's life: joins, attaches its buffers (kept in `buffers`) and serves (join_and_serve by
  // default). What it throws is kept as its failure.
  virtual void serve_member(uint32_t /*r*/, Receiver& receiver, std::vector<Bytes>& buffers) {
    join_and_serve(receiver, buffers);
  }
  // Drops what the subclass recorded about member r's previous life (restart()).
  virtual void forget(uint32_t /*r*/) {}
  std::string producer_url() const { return "loop://" + name_ + "-producer"; }

 private:
  std::unique_ptr<transport::Transport> make_member_transport() const {
    transport::TransportOptions to;
    to.peer_timeout = peer_timeout_;
    return transport::make_transport("loop", to);
  }
  void serve(uint32_t r) {
    try {
      serve_member(r, *receivers_[r], buffers_[r]);
    } catch (const std::exception& e) {
      failures_[r] = e.what();
    }
  }

  std::string name_;
  std::chrono::milliseconds peer_timeout_;
  std::unique_ptr<transport::Transport> producer_transport_;
  std::unique_ptr<Producer> producer_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<std::unique_ptr<Receiver>> receivers_;
  std::vector<std::thread> threads_;
  std::vector<std::string> failures_;
  std::vector<std::vector<Bytes>> buffers_;
  std::set<uint32_t> frozen_;
  bool finished_ = false;
};

}  // namespace deltacast::tree
