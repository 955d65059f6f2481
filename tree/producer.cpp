#include "tree/producer.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "tree/protocol.h"
#include "tree/relay_link.h"
#include "util/log.h"
#include "util/worker_threads.h"

namespace deltacast::tree {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr size_t kControlBufferBytes = size_t{1} << 20;
constexpr auto kControlSendTimeout = 60s;
constexpr auto kRootStallTimeout = 300s;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct Producer::Impl {
  transport::Transport& transport;
  const codec::Manifest& manifest;
  ProducerOptions options;
  std::shared_ptr<spdlog::logger> log = logger("tree");
  std::unique_ptr<transport::Listener> listener;
  std::optional<Topology> topology;
  uint64_t max_message_bytes = 0;

  std::vector<std::unique_ptr<transport::Connection>> control;  // [rank - 1]
  std::vector<bool> live;                                       // [rank - 1]
  std::vector<std::unique_ptr<OutboundLink>> roots;             // [tree]
  std::unique_ptr<ControlInbox> inbox;

  std::vector<std::vector<std::byte>> baseline;  // [tensor]: bits of `version`
  codec::StateDigest baseline_digest;
  // Encoder threads, created at the first refit and kept: the codec's per-thread scratch stays warm.
  std::unique_ptr<WorkerThreads> encoders;
  uint64_t version = 0;
  bool finished = false;

  Impl(transport::Transport& t, const codec::Manifest& m, ProducerOptions o)
      : transport(t), manifest(m), options(std::move(o)) {}

  codec::ConstWeights baseline_weights() const {
    codec::ConstWeights w{&manifest, {}};
    for (const auto& t : baseline) w.tensors.emplace_back(t.data(), t.size());
    return w;
  }
  uint32_t live_count() const {
    return static_cast<uint32_t>(std::count(live.begin(), live.end(), true));
  }
  // The root link of `tree` once it has room (back-pressure); throws Error(connection) when dead.
  OutboundLink& ready_root(int tree) {
    auto& root = *roots.at(tree);
    root.wait_below(options.max_inflight_bytes_per_root, kRootStallTimeout);
    if (root.dead())
      throw Error(Errc::connection, "the link to the root of tree " + std::to_string(tree) + " failed");
    return root;
  }
  void send_frame(int tree, const SharedBytes& message) { ready_root(tree).post(message); }
  // Sends one bootstrap piece: its RAW header, then the body from the caller's memory.
  void send_raw(int tree, const RawChunkHeader& header, std::span<const std::byte> body) {
    auto& root = ready_root(tree);
    root.post(std::make_shared<const std::vector<std::byte>>(encode_raw_message(header)));
    root.post_view(body);
  }
  // Waits until no root link still reads from caller memory (post_view). Never throws: a link
  // that stalls is cancelled.
  void settle_roots() noexcept {
    for (auto& root : roots) {
      if (!root) continue;
      try {
        root->flush(kRootStallTimeout);
      } catch (...) {
        root->cancel_all();
      }
    }
  }
  void broadcast(const Message& message) {
    auto bytes = encode_message(message);
    for (size_t i = 0; i < control.size(); ++i) {
      if (!live[i]) continue;
      try {
        send_message(*control[i], bytes, kControlSendTimeout);
      } catch (const Error& e) {
        log->warn("rank {} unreachable: {}", i + 1, e.what());
        live[i] = false;
      }
    }
  }
  void accept_phase(bool want_hellos, std::vector<Hello>& hellos, Clock::time_point deadline);
  // Collects every live receiver's answer for report.version, then sends COMMIT (all verified)
  // or ABORT and waits until every live receiver is active again. Sets report.refit_seconds
  // (from `start`) at that point; on_commit (adopting the baseline) runs after it, off the
  // refit's critical path, and also when waiting for ACTIVE fails once COMMIT is out.
  void joint_commit(RefitReport& report, uint64_t expected_digest, bool dry_run,
                    Clock::time_point start, const std::function<void()>& on_commit = {});
  void wait_active(uint64_t want, bool committed, Clock::time_point deadline);
  // Copies `next` into the baseline (the new committed bits).
  void adopt_baseline(const codec::ConstWeights& next) {
    for (size_t t = 0; t < baseline.size(); ++t)
      std::memcpy(baseline[t].data(), next.tensors[t].data(), baseline[t].size());
  }
};

void Producer::Impl::accept_phase(bool want_hellos, std::vector<Hello>& hellos,
                                  Clock::time_point deadline) {
  const uint32_t n = options.receivers;
  auto done = [&] {
    if (want_hellos) return control.size() == n && std::all_of(control.begin(), control.end(),
                                                               [](auto& c) { return c != nullptr; });
    return std::all_of(roots.begin(), roots.end(), [](auto& r) { return r != nullptr; });
  };
  while (!done()) {
    if (Clock::now() > deadline)
      throw Error(Errc::timeout, want_hellos ? "not every receiver said HELLO in time"
                                             : "the tree roots did not JOIN in time");
    auto connection = listener->accept(500ms);
    if (!connection) continue;
    std::vector<std::byte> bytes;
    try {
      bytes = recv_message(*connection, kControlBufferBytes, options.join_timeout);
    } catch (const Error& e) {
      log->warn("dropping a connection from {}: {}", connection->peer(), e.what());
      continue;
    }
    auto message = decode_message(bytes);
    if (auto* hello = std::get_if<Hello>(&message)) {
      if (hello->rank < 1 || hello->rank > n || control[hello->rank - 1])
        throw Error(Errc::invalid_argument, "HELLO from rank " + std::to_string(hello->rank) +
                                                ": expected each of ranks 1.." +
                                                std::to_string(n) + " once");
      control[hello->rank - 1] = std::move(connection);
      hellos[hello->rank - 1] = *hello;
    } else if (auto* join = std::get_if<Join>(&message)) {
      int member = static_cast<int>(join->rank) - 1;
      int tree = static_cast<int>(join->tree);
      if (!topology || tree < 0 || tree >= topology->trees() || topology->root(tree) != member)
        throw Error(Errc::invalid_argument, "JOIN from rank " + std::to_string(join->rank) +
                                                " which is not a root of tree " +
                                                std::to_string(tree));
      roots[tree] = std::make_unique<OutboundLink>(std::move(connection), member, tree);
    } else {
      throw Error(Errc::corrupt_frame, "a connection's first message is neither HELLO nor JOIN");
    }
  }
}

void Producer::Impl::joint_commit(RefitReport& report, uint64_t expected_digest, bool dry_run,
                                  Clock::time_point start, const std::function<void()>& on_commit) {
  const uint64_t v = report.version;
  const size_t n = control.size();
  enum class Answer { none, verified, refused };
  std::vector<Answer> answers(n, Answer::none);
  for (size_t i = 0; i < n; ++i)
    if (!live[i]) answers[i] = Answer::refused;
  report.receivers = live_count();
  auto deadline = Clock::now() + options.version_timeout;
  auto pending = [&] { return std::count(answers.begin(), answers.end(), Answer::none); };
  auto refuse = [&](size_t i, const std::string& why) {
    answers[i] = Answer::refused;
    if (report.abort_reason.empty()) report.abort_reason = "rank " + std::to_string(i + 1) + ": " + why;
  };

  while (pending() > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto item = left.count() > 0 ? inbox->pop(left) : std::nullopt;
    if (!item) {
      for (size_t i = 0; i < n; ++i)
        if (answers[i] == Answer::none) refuse(i, "no ack within the version timeout");
      break;
    }
    size_t i = item->source;
    if (!item->message) {
      live[i] = false;
      refuse(i, "control link failed: " + item->status.message);
      continue;
    }
    if (auto* ack = std::get_if<Ack>(&*item->message); ack && ack->version == v) {
      if (ack->digest == expected_digest) {
        answers[i] = Answer::verified;
      } else {
        refuse(i, "acked a digest that differs from the producer's");
      }
    } else if (auto* nack = std::get_if<Nack>(&*item->message); nack && nack->version == v) {
      refuse(i, std::string(errc_name(static_cast<Errc>(nack->errc))) + ": " + nack->message);
    }
  }
  report.verified_receivers =
      static_cast<uint32_t>(std::count(answers.begin(), answers.end(), Answer::verified));
  bool all_verified = report.verified_receivers == n && n > 0;
  report.committed = all_verified && !dry_run;
  if (all_verified && dry_run) report.abort_reason = "dry run";

  log->debug("version {}: every answer in at {:.1f} ms", v, 1e3 * seconds_since(start));
  if (report.committed) {
    broadcast(Commit{v, expected_digest});
  } else {
    broadcast(Abort{v, report.abort_reason});
  }
  // Once COMMIT is out the version is committed: on_commit runs even when the wait below fails.
  try {
    wait_active(report.committed ? v : version, report.committed, deadline);
  } catch (...) {
    if (report.committed && on_commit) on_commit();
    throw;
  }
  report.refit_seconds = seconds_since(start);
  if (report.committed && on_commit) on_commit();
}

// Waits until every live receiver is active at `want` (a dead control link counts as done)
// before anything else goes down the tree. Throws Error(timeout | state).
void Producer::Impl::wait_active(uint64_t want, bool committed, Clock::time_point deadline) {
  const size_t n = control.size();
  std::vector<bool> active(n, false);
  for (size_t i = 0; i < n; ++i) active[i] = !live[i];
  while (std::count(active.begin(), active.end(), false) > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto item = inbox->pop(std::max(left, std::chrono::milliseconds(10'000)));
    if (!item) throw Error(Errc::timeout, "receivers did not confirm version " + std::to_string(want));
    size_t i = item->source;
    if (!item->message) {
      live[i] = false;
      active[i] = true;
      continue;
    }
    if (auto* a = std::get_if<Active>(&*item->message)) {
      if (a->version != want)
        throw Error(Errc::state, "rank " + std::to_string(i + 1) + " is active at version " +
                                     std::to_string(a->version) + ", expected " +
                                     std::to_string(want));
      active[i] = true;
    } else if (auto* nack = std::get_if<Nack>(&*item->message); nack && committed) {
      throw Error(Errc::state, "rank " + std::to_string(i + 1) + " could not commit version " +
                                   std::to_string(want) + ": " + nack->message);
    }
  }
}

Producer::Producer(transport::Transport& transport, const codec::Manifest& manifest,
                   ProducerOptions options)
    : impl_(std::make_unique<Impl>(transport, manifest, std::move(options))) {
  auto& d = *impl_;
  if (d.options.receivers == 0) throw Error(Errc::invalid_argument, "a producer needs receivers");
  if (d.options.encode.chunk_bytes == 0)
    throw Error(Errc::invalid_argument, "chunk_bytes must be positive");
  d.listener = transport.listen(transport::Url::parse(d.options.listen_url));
  // A frame covers at most chunk_bytes of checkpoint; coded values are never much larger than
  // the raw bits, and seal frames hold 8 bytes per tensor.
  d.max_message_bytes = 2 * d.options.encode.chunk_bytes + 16 * manifest.size() + (size_t{1} << 20);
  d.baseline.resize(manifest.size());
  for (size_t i = 0; i < manifest.size(); ++i) d.baseline[i].resize(manifest.tensors()[i].nbytes());
  d.baseline_digest = codec::StateDigest::full_scan(d.baseline_weights(), d.options.encode.threads);
}

Producer::~Producer() {
  if (impl_->inbox) impl_->inbox->stop();
}

std::string Producer::url() const { return impl_->listener->local_url().str(); }
uint64_t Producer::version() const noexcept { return impl_->version; }
const codec::StateDigest& Producer::digest() const { return impl_->baseline_digest; }

void Producer::start() {
  auto& d = *impl_;
  const uint32_t n = d.options.receivers;
  auto deadline = Clock::now() + d.options.join_timeout;
  d.control.resize(n);
  d.live.assign(n, true);
  std::vector<Hello> hellos(n);
  d.accept_phase(true, hellos, deadline);

  Welcome welcome;
  welcome.session = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  welcome.topology = std::string(topology_kind_name(d.options.topology));
  welcome.max_message_bytes = d.max_message_bytes;
  welcome.members.push_back({0, url(), ""});
  std::vector<std::string> labels;
  for (uint32_t r = 1; r <= n; ++r) {
    welcome.members.push_back({r, hellos[r - 1].data_url, hellos[r - 1].cluster});
    labels.push_back(hellos[r - 1].cluster);
  }
  welcome.tensors = d.manifest.tensors();
  d.topology.emplace(d.options.topology, std::move(labels));
  d.roots.resize(d.topology->trees());
  d.broadcast(welcome);
  d.accept_phase(false, hellos, deadline);

  for (uint32_t r = 1; r <= n; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto bytes = recv_message(*d.control[r - 1], kControlBufferBytes, std::max(left, 1000ms));
    if (!std::holds_alternative<Ready>(decode_message(bytes)))
      throw Error(Errc::corrupt_frame, "rank " + std::to_string(r) + " sent something else than READY");
  }
  std::vector<transport::Connection*> links;
  for (auto& c : d.control) links.push_back(c.get());
  d.inbox = std::make_unique<ControlInbox>(std::move(links), kControlBufferBytes);
  d.log->info("tree of {} receivers is up ({})", n, welcome.topology);
}

RefitReport Producer::refit(const codec::ConstWeights& next, RefitOptions refit_options) {
  auto& d = *impl_;
  if (!d.inbox) throw Error(Errc::state, "Producer::refit before start()");
  codec::ConstWeights checked = next;
  checked.manifest = &d.manifest;
  codec::check_weights(checked);
  auto start = Clock::now();

  RefitReport report;
  report.version = d.version + 1;
  codec::EncodeOptions encode = d.options.encode;
  // From the all-zero state an XOR mask is the value itself; ulp distances would be huge.
  if (d.version == 0) encode.xor_safe_mode = codec::ValueMode::xor_bits;
  if (refit_options.value_mode) encode.xor_safe_mode = *refit_options.value_mode;
  auto base = d.baseline_weights();
  codec::DeltaEncoder encoder(base, checked, d.baseline_digest, {d.version, report.version}, encode);
  const uint32_t count = encoder.chunk_count();
  report.chunks = count;

  // Workers encode chunks in index order (an atomic cursor); this thread sends each one as soon
  // as it and every earlier chunk are ready, so encoding overlaps sending.
  std::vector<SharedBytes> slots(count);
  std::mutex mutex;
  std::condition_variable ready;
  std::atomic<uint32_t> cursor{0};
  std::atomic<bool> cancel{false};
  codec::DeltaStats total;
  double encode_seconds = 0;
  Status worker_status;
  auto work = [&] {
    codec::DeltaStats stats;
    double seconds = 0;
    try {
      for (uint32_t i; !cancel && (i = cursor.fetch_add(1)) < count;) {
        auto t0 = Clock::now();
        auto frame = encoder.encode_chunk(i, &stats);
        auto message = std::make_shared<const std::vector<std::byte>>(encode_frame_message(frame));
        seconds += seconds_since(t0);
        std::lock_guard lock(mutex);
        slots[i] = std::move(message);
        ready.notify_all();
      }
    } catch (const Error& e) {
      std::lock_guard lock(mutex);
      if (worker_status.ok()) worker_status = e.status();
      cancel = true;
      ready.notify_all();
    }
    std::lock_guard lock(mutex);
    total.add(stats);
    encode_seconds += seconds;
  };
  if (!d.encoders) d.encoders = std::make_unique<WorkerThreads>(std::max(1u, encode.threads));
  d.encoders->start(work);
  auto join_workers = [&] { d.encoders->wait(); };
  try {
    for (uint32_t i = 0; i < count; ++i) {
      SharedBytes message;
      {
        std::unique_lock lock(mutex);
        ready.wait(lock, [&] { return slots[i] != nullptr || !worker_status.ok(); });
        if (!worker_status.ok()) throw Error(worker_status);
        message = std::move(slots[i]);
      }
      if (message->size() > d.max_message_bytes)
        throw Error(Errc::internal, "chunk frame of " + std::to_string(message->size()) +
                                        " bytes exceeds the announced message limit");
      d.send_frame(d.topology->tree_for_chunk(i), message);
      if (i == 0) d.log->debug("version {}: first chunk posted at {:.1f} ms", report.version, 1e3 * seconds_since(start));
      report.frames_bytes += message->size() - kMessageHeaderSize;
      if (d.options.on_progress) d.options.on_progress(i + 1, count);
    }
  } catch (...) {
    cancel = true;
    join_workers();
    throw;
  }
  join_workers();
  auto seal = std::make_shared<const std::vector<std::byte>>(encode_frame_message(encoder.seal()));
  d.send_frame(0, seal);
  d.log->debug("version {}: seal posted at {:.1f} ms", report.version, 1e3 * seconds_since(start));
  report.frames_bytes += seal->size() - kMessageHeaderSize;
  report.changes = total.changes;
  report.elements = total.elements;
  report.checkpoint_bytes = total.checkpoint_bytes;
  report.encode_seconds = encode_seconds;

  const codec::StateDigest new_digest = encoder.new_digest();
  // Once COMMIT is out the version is committed: the baseline, its digest and the version move
  // together (even if waiting for ACTIVE then fails).
  d.joint_commit(report, new_digest.combined(), refit_options.dry_run, start, [&] {
    d.adopt_baseline(checked);
    d.baseline_digest = new_digest;
    d.version = report.version;
  });
  d.log->info("version {} {} in {:.3f} s ({} chunks, {} payload bytes, {} changes)",
              report.version, report.committed ? "committed" : "aborted", report.refit_seconds,
              report.chunks, report.frames_bytes, report.changes);
  return report;
}

RefitReport Producer::bootstrap(const codec::ConstWeights& full) {
  auto& d = *impl_;
  if (!d.inbox) throw Error(Errc::state, "Producer::bootstrap before start()");
  if (d.version != 0) throw Error(Errc::state, "bootstrap needs receivers at version 0");
  codec::ConstWeights checked = full;
  checked.manifest = &d.manifest;
  codec::check_weights(checked);
  auto start = Clock::now();
  struct Piece {
    uint32_t tensor;
    uint64_t offset, size;
  };
  std::vector<Piece> pieces;
  for (uint32_t t = 0; t < d.manifest.size(); ++t) {
    const uint64_t size = checked.tensors[t].size();
    // Whole elements per piece: receivers refuse a piece that splits an element.
    const uint64_t w = codec::dtype_size(d.manifest.at(t).dtype);
    const uint64_t piece_bytes = std::max(w, d.options.encode.chunk_bytes / w * w);
    for (uint64_t off = 0; off < size; off += piece_bytes)
      pieces.push_back({t, off, std::min(piece_bytes, size - off)});
  }
  if (pieces.empty()) throw Error(Errc::invalid_argument, "the checkpoint holds no bytes");
  RefitReport report;
  report.version = 1;
  report.chunks = static_cast<uint32_t>(pieces.size());
  report.elements = d.manifest.total_elements();
  report.changes = report.elements;
  report.checkpoint_bytes = d.manifest.total_bytes();
  // Each piece goes out as a RAW header and a bare body sent straight from `full` (no copy):
  // every send must have finished before this returns, errors included.
  struct SettleRoots {
    Impl& d;
    ~SettleRoots() { d.settle_roots(); }
  } settle{d};
  uint64_t expected = 0;  // the sum of the pieces' hashes (raw_piece_hash) the receivers ack
  for (uint32_t i = 0; i < pieces.size(); ++i) {
    const auto& p = pieces[i];
    const RawChunkHeader header{1, i, report.chunks, p.tensor, p.offset, p.size};
    const auto body = checked.tensors[p.tensor].subspan(p.offset, p.size);
    expected += raw_piece_hash(header, body);
    d.send_raw(d.topology->tree_for_chunk(i), header, body);
    report.frames_bytes += p.size;
    if (d.options.on_progress) d.options.on_progress(i + 1, report.chunks);
  }
  // The baseline's StateDigest (the next delta's base digest) is computed once the receivers
  // are active, off the bootstrap's critical path; receivers compute theirs the same way.
  d.joint_commit(report, expected, false, start, [&] {
    d.adopt_baseline(checked);
    d.baseline_digest = codec::StateDigest::full_scan(d.baseline_weights(), d.options.encode.threads);
    d.version = 1;
  });
  d.log->info("full checkpoint (version 1) {} in {:.3f} s ({} raw chunks, {} bytes)",
              report.committed ? "committed" : "aborted", report.refit_seconds, report.chunks,
              report.frames_bytes);
  return report;
}

RefitReport Producer::publish(const std::vector<std::vector<std::byte>>& frames,
                              uint64_t new_version, uint64_t expected_digest,
                              RefitOptions refit_options) {
  auto& d = *impl_;
  if (!d.inbox) throw Error(Errc::state, "Producer::publish before start()");
  auto start = Clock::now();
  RefitReport report;
  report.version = new_version;
  for (const auto& frame : frames) {
    auto header = codec::parse_frame(frame).header;
    int tree = header.kind == codec::FrameKind::seal ? 0 : d.topology->tree_for_chunk(header.chunk_index);
    d.send_frame(tree, std::make_shared<const std::vector<std::byte>>(encode_frame_message(frame)));
    report.frames_bytes += frame.size();
    if (header.kind == codec::FrameKind::chunk) ++report.chunks;
  }
  d.joint_commit(report, expected_digest, refit_options.dry_run, start);
  if (report.committed) d.version = new_version;
  return report;
}

void Producer::finish() {
  auto& d = *impl_;
  if (d.finished || !d.inbox) return;
  d.finished = true;
  for (auto& root : d.roots)
    if (root) root->flush(kRootStallTimeout);
  d.broadcast(Bye{});
  d.inbox->stop();
}

}  // namespace deltacast::tree
