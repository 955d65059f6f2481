// The producer's public calls that are not refits: construction (a fresh start or a resume),
// start() (every member's HELLO, the initial live set, the threads), the accessors and finish().
#include "tree/producer.h"

#include <cstdio>

#include "tree/producer/impl.h"
#include "tree/secure_start.h"

namespace deltacast::tree {

using namespace std::chrono_literals;

namespace {

// A producer group's rank, its partition and chunk numbering (nullopt: one producer).
std::optional<ProducerGroup> make_group(const codec::Manifest& manifest, const ProducerOptions& options) {
  const ProducerGroupOptions& g = options.group;
  if (g.size == 0) throw Error(Errc::invalid_argument, "a producer group needs at least one rank");
  if (g.rank >= g.size)
    throw Error(Errc::invalid_argument,
                "producer rank " + std::to_string(g.rank) + " is outside a group of " + std::to_string(g.size));
  if (g.size == 1 && g.parts.empty()) return std::nullopt;
  if (g.rank > 0 && g.coordinator_url.empty())
    throw Error(Errc::invalid_argument,
                "producer rank " + std::to_string(g.rank) + " needs the coordinator's URL (group.coordinator_url)");
  if (options.encode.chunk_bytes == 0) throw Error(Errc::invalid_argument, "chunk_bytes must be positive");
  auto partition =
      g.parts.empty() ? codec::Partition::balanced(manifest, g.size) : codec::Partition::from_parts(manifest, g.parts);
  if (partition.ranks() != g.size)
    throw Error(Errc::invalid_argument, "the trainer's layout has parts for " + std::to_string(partition.ranks()) +
                                            " ranks; the group has " + std::to_string(g.size));
  auto chunks = codec::group_chunks(manifest, partition, options.encode.chunk_bytes);
  return ProducerGroup(g.rank, std::move(partition), std::move(chunks));
}

}  // namespace

Producer::Impl::Impl(transport::Transport& t, const codec::Manifest& m, ProducerOptions o)
    : transport(t), manifest(m), options(std::move(o)), group(make_group(m, options)) {
  baseline = group ? std::make_unique<BaselineStore>(m, group->partition.part(group->rank), options.encode.threads)
                   : std::make_unique<BaselineStore>(m, options.encode.threads);
}

bool Producer::Impl::feeds(int tree) const {
  return !group || !membership || membership->producer_of(tree) == group->rank;
}

Producer::Producer(transport::Transport& transport, const codec::Manifest& manifest, ProducerOptions options)
    : impl_(std::make_unique<Impl>(transport, manifest, std::move(options))) {
  auto& d = *impl_;
  if (d.options.receivers == 0) throw Error(Errc::invalid_argument, "a producer needs receivers");
  if (d.options.encode.chunk_bytes == 0) throw Error(Errc::invalid_argument, "chunk_bytes must be positive");
  try {
    check_layout(d.options.layout, manifest.size());
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, std::string("the producer's ") + e.what());
  }
  require_authenticated(transport, {d.options.listen_url}, d.options.allow_insecure, "the producer");
  d.listener = transport.listen(transport::Url::parse(d.options.listen_url));
  // A frame covers at most chunk_bytes of checkpoint; coded values are never much larger than
  // the raw bits, and seal frames hold 8 bytes per tensor.
  d.max_message_bytes = 2 * d.options.encode.chunk_bytes + 16 * manifest.size() + (size_t{1} << 20);
  // A group's all-zero version 0 is the sum of its ranks' parts (the coordinator learns it once
  // every rank said GROUP_HELLO: no process holds the whole model).
  d.zero_digest = d.group ? 0 : d.baseline->digest().combined();
  if (!d.group) d.remember_version(0, d.zero_digest);
  d.layout = std::make_shared<const CheckpointLayout>(d.options.layout);
  if (d.options.resume) {
    // A restarted producer: the baseline is the committed version's bits, checked against the
    // digest its predecessor recorded, and the version chain goes on from there.
    const ProducerResume& r = *d.options.resume;
    const std::string v = std::to_string(r.version);
    if (r.version == 0) throw Error(Errc::invalid_argument, "resume: version 0 is a fresh start, not a resume");
    if (d.part_rank()) {
      // A part rank: its part's bits. The coordinator checks them against its record of the part
      // (GROUP_HELLO) and the sum of every part against the committed version's digest.
      codec::ConstWeights held = r.baseline;
      held.manifest = &manifest;
      d.baseline->adopt(codec::SpanReader(held), r.version, std::nullopt);
      d.version = r.version;
      d.options.resume.reset();
      return;
    }
    const auto known = r.history.find(r.version);
    if (known == r.history.end())
      throw Error(Errc::invalid_argument, "resume: the history lacks the digest of version " + v);
    if (r.history.rbegin()->first != r.version)
      throw Error(Errc::invalid_argument, "resume: the history holds versions newer than version " + v);
    if (r.previous && d.coordinator()) {
      const uint64_t p = r.previous->version;
      if (p == 0 || p >= r.version || !r.history.contains(p) || !r.previous->load)
        throw Error(Errc::invalid_argument, "resume: the previous version " + std::to_string(p) +
                                                " must be before version " + v +
                                                ", in the history, and come with its part's loader");
      d.previous = r.previous;
    }
    codec::ConstWeights checked = r.baseline;
    checked.manifest = &manifest;
    if (d.group) {
      d.baseline->adopt(codec::SpanReader(checked), r.version, std::nullopt);  // checked by the sum at start
    } else {
      codec::check_weights(checked);
      d.baseline->adopt(checked, r.version, std::nullopt);
    }
    if (!d.group && d.baseline->digest().combined() != known->second) {
      char text[128];
      std::snprintf(text, sizeof text, "resume: the baseline's digest %016llx is not version %llu's %016llx",
                    static_cast<unsigned long long>(d.baseline->digest().combined()),
                    static_cast<unsigned long long>(r.version), static_cast<unsigned long long>(known->second));
      throw Error(Errc::verify_failed, text);
    }
    d.version = r.version;
    d.attempt = r.attempt;
    d.history.clear();
    for (const auto& [version, digest] : r.history) d.remember_version(version, digest);
    d.options.resume.reset();  // its baseline spans need not outlive the constructor
  }
}

Producer::~Producer() { impl_->stop_threads(); }

Producer::Impl::~Impl() { stop_threads(); }

std::string Producer::url() const { return impl_->listener->local_url().str(); }

const CheckpointLayout& Producer::layout() const { return *impl_->layout; }

uint64_t Producer::version() const noexcept { return impl_->version; }

uint64_t Producer::part_bytes() const {
  const auto& d = *impl_;
  return d.group ? d.group->partition.part_bytes(d.group->rank) : d.manifest.total_bytes();
}

const codec::StateDigest& Producer::digest() const { return impl_->baseline->digest(); }

// The producer's state file reads these (tools/run/run_command.cpp); they change only in the version
// calls, on the host thread.
uint64_t Producer::attempt() const noexcept { return impl_->attempt; }

std::map<uint64_t, uint64_t> Producer::history() const { return impl_->history; }

std::chrono::steady_clock::time_point Producer::session_start() const noexcept { return impl_->session_start; }

StartReport Producer::start(std::optional<std::chrono::milliseconds> timeout) {
  auto& d = *impl_;
  std::lock_guard drive(d.drive);
  if (d.membership) throw Error(Errc::state, "Producer::start called twice");
  if (d.part_rank()) return d.rank_start(Clock::now() + timeout.value_or(d.options.join_timeout));
  const uint32_t n = d.options.receivers;
  d.control.resize(n + 1);
  d.replaced.resize(n + 1);
  d.start_hellos.assign(n + 1, {});
  d.members.assign(n + 1, Member{});
  for (uint32_t r = 0; r <= n; ++r) d.members[r].rank = r;
  d.members[0] = Member{0, url(), "", true};
  d.readers = std::make_unique<ControlReaders>(kControlBufferBytes, d.event_sink(ProducerEvent::Kind::control));
  d.session_start = Clock::now();
  d.start_acceptor();
  const auto deadline = Clock::now() + timeout.value_or(d.options.join_timeout);
  auto said_hello = [&] {
    uint32_t k = 0;
    for (uint32_t r = 1; r <= n; ++r) k += d.control[r].connection != nullptr || d.start_hellos[r].refused;
    return k;
  };
  while (said_hello() < n) {
    if (Clock::now() > deadline)
      throw Error(Errc::timeout, "not every receiver said HELLO in time (" + std::to_string(said_hello()) + " of " +
                                     std::to_string(n) + ")");
    d.pump(200ms);
  }
  if (d.coordinator()) d.wait_for_ranks(deadline);
  StartReport report = d.place_members_at_start();
  d.roots.assign(d.membership->trees(), nullptr);
  d.root_lost.assign(d.membership->trees(), Clock::now());

  Welcome welcome = d.make_welcome();
  // The ranks first: the roots of their trees JOIN them as soon as the members read theirs.
  if (d.coordinator()) d.tell_ranks(welcome);
  // The start's "repair": every live member says READY once its parent links are up. It is
  // registered first, so that a member failed while WELCOMEs go out is not waited for.
  Impl::Repair start{Clock::now(), d.epoch(), {}};
  for (uint32_t r : d.live_ranks()) start.waiting.insert(r);
  d.repairs.push_back(start);
  for (uint32_t r = 1; r <= n; ++r) {
    if (!d.control[r].connection) continue;  // refused
    welcome.instance = d.control[r].instance;
    d.control[r].told_layout = d.layout;
    if (d.membership->live(r)) {
      if (!d.send_to(r, welcome)) d.fail(r, FailureCause::link_closed, "WELCOME could not be sent", Clock::now());
      continue;
    }
    // Not at the committed version: it catches up from live peers, as a rejoining member does.
    d.control[r].catching_up = true;
    if (!d.send_to(r, welcome) || !d.send_catchup(r, d.start_hellos[r].held_version)) d.close_control(r);
  }
  // Nobody was at the committed version: wait until the first member caught up (from the
  // producer's snapshot) and was admitted.
  while (d.live_ranks().empty()) {
    if (Clock::now() > deadline)
      throw Error(Errc::timeout, "no receiver caught up to version " + std::to_string(d.version) + " in time");
    bool anyone = false;
    for (uint32_t r = 1; r <= n; ++r) anyone = anyone || d.control[r].connection != nullptr;
    if (!anyone) throw Error(Errc::connection, "every receiver failed while catching up during start");
    d.pump(50ms);
    d.admit_caught_up();
  }
  auto up = [&] {
    if (!d.repairs.empty() && !d.repairs.front().waiting.empty()) return false;
    for (int t = 0; t < static_cast<int>(d.roots.size()); ++t)
      if (!d.roots[t] && d.feeds(t)) return false;
    return true;
  };
  while (!up()) {
    if (Clock::now() > deadline) throw Error(Errc::timeout, "the tree did not come up in time");
    if (d.live_ranks().empty()) throw Error(Errc::connection, "every receiver failed during start");
    if (d.coordinator() && !d.missing_ranks().empty())
      throw Error(Errc::connection, "during start, " + d.missing_ranks());
    d.pump(50ms);
  }
  d.repair_seconds = 0;  // the start is not a repair
  d.log->info("tree of {} receivers is up ({}{}) at version {}: {} live, {} catching up, {} refused", n,
              welcome.topology, d.group ? ", " + std::to_string(d.group->size) + " producer ranks" : std::string(),
              d.version, report.count(MemberAtStart::Role::live), report.count(MemberAtStart::Role::catching_up),
              report.count(MemberAtStart::Role::refused));
  d.idle = std::thread([&d] { d.idle_loop(); });
  return report;
}

void Producer::finish() {
  auto& d = *impl_;
  std::unique_lock drive(d.drive);
  if (d.finished || !d.membership) return;
  d.finished = true;
  if (d.part_rank()) {
    d.rank_finish();
    drive.unlock();
    d.stop_threads();
    d.listener->close();
    return;
  }
  d.pump(0ms);
  // A member on its way back (restarted, fenced, or admitted while a version was in flight) is
  // given the time a join gets to reach the committed version: BYE would leave it behind.
  d.wait_for_catch_ups();
  for (auto& root : d.roots)
    if (root) root->flush(kRootSettleTimeout);
  if (d.options.before_bye) d.options.before_bye();
  d.broadcast(Bye{}, true);
  if (d.coordinator()) d.tell_ranks(Bye{});
  drive.unlock();
  d.stop_threads();
  // Nobody answers any more: a member trying to (re)join must fail fast, not wait for WELCOME.
  d.listener->close();
  while (auto event = d.events.pop(0ms))
    if (event->connection) event->connection->close();
}

}  // namespace deltacast::tree
