#include "tests/fleet/fleet_sim.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <new>
#include <optional>
#include <queue>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "tree/membership.h"
#include "tree/producer/version_round.h"
#include "tree/protocol.h"
#include "util/error.h"

// ---- the heap counter: every operator new/delete of the binary ----
namespace {
std::atomic<int64_t> g_heap_live{0};
void* counted_alloc(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  g_heap_live += static_cast<int64_t>(malloc_usable_size(p));
  return p;
}
void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  g_heap_live -= static_cast<int64_t>(malloc_usable_size(p));
  std::free(p);
}
}  // namespace
void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

namespace deltacast::fleet_sim {

int64_t heap_bytes_live() { return g_heap_live.load(); }

namespace {

using tree::Membership;
using tree::Message;
using tree::VersionRound;
using Clock = VersionRound::Clock;

constexpr double kRttSeconds = 0.05;  // what one simulated RTT stands for, for the state machines' clock
constexpr uint64_t kDigest = 0x5eed;  // every member verifies the same digest

std::string url_of(uint32_t rank) {
  return "tcp://10." + std::to_string(rank >> 16) + "." + std::to_string((rank >> 8) & 255) + "." +
         std::to_string(rank & 255) + ":29500";
}

// One simulation: the producer (Membership + VersionRound, real), members, an event queue.
class Sim {
 public:
  explicit Sim(const Options& o) : o_(o), rng_(o.seed) {
    if (o.members == 0 || o.clusters == 0 || o.clusters > o.members)
      throw Error(Errc::invalid_argument, "fleet_sim: members and clusters must be 1..members");
    for (uint32_t r = 1; r <= o.members; ++r)
      labels_.push_back("c" + std::to_string(static_cast<uint64_t>(r - 1) * o.clusters / o.members));
    report_.options = o;
  }

  Report run() {
    const auto wall = std::chrono::steady_clock::now();
    const int64_t heap0 = heap_bytes_live();
    membership_.emplace(o_.kind, labels_, "", o_.producers);
    {  // the producer's state for N members: its Membership and a round over every live member
      VersionRound probe(round_params(1));
      report_.producer_bytes_per_member = static_cast<double>(heap_bytes_live() - heap0) / o_.members;
    }
    members_.assign(o_.members + 1, MemberState{});
    link_free_.assign(o_.members + 1, 0.0);
    uplink_free_.assign(o_.members + 1, 0.0);
    report_.max_depth_epoch0 = max_depth();
    welcome_all();
    plan_failures();
    at(1.0, [this] { start_version(1); });
    while (!queue_.empty()) {
      Event e = queue_.top();
      queue_.pop();
      now_ = e.time;
      e.run();
    }
    if (!finished_) throw Error(Errc::internal, "fleet_sim: the run stopped before its last version");
    report_.max_depth = max_depth();
    report_.epochs = membership_->epoch();
    report_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
    return report_;
  }

 private:
  struct MemberState {
    bool alive = true;  // the process runs (not killed)
    bool frozen = false;
    uint64_t gen = 0;                // bumps when its data arrival is rescheduled (a repair above it)
    bool acked = false;              // in the current round
    double ready_at = 0;             // a moved member's READY (its new edges up)
    std::optional<Membership> copy;  // a checked member's own view
  };
  struct Event {
    double time;
    uint64_t seq;
    std::function<void()> run;
    bool operator>(const Event& other) const { return time != other.time ? time > other.time : seq > other.seq; }
  };
  struct PlannedFailure {
    uint64_t version;
    double offset;  // RTTs after the version's start
    bool frozen;
    bool rejoins;
  };

  // ---- the clock and the network ----
  void at(double time, std::function<void()> run) { queue_.push(Event{time, seq_++, std::move(run)}); }
  double one_way() { return 0.5 * (1.0 + std::uniform_real_distribution<double>(0, o_.jitter)(rng_)); }
  Clock::time_point clock_at(double t) const {
    return Clock::time_point{} +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t * kRttSeconds));
  }
  // A control message producer <-> member over its own link: in order per direction, counted.
  void count(const Message& m, uint64_t times = 1) {
    const uint64_t bytes = tree::encode_message(m, membership_->epoch()).size();
    control_messages_ += times;
    control_bytes_ += bytes * times;
  }
  void to_member(uint32_t rank, const Message& m, std::function<void()> deliver) {
    count(m);
    const double t = std::max(now_ + one_way(), link_free_[rank] + 1e-9);
    link_free_[rank] = t;
    at(t, std::move(deliver));
  }
  void to_producer(uint32_t rank, const Message& m, std::function<void()> deliver) {
    count(m);
    const double t = std::max(now_ + one_way(), uplink_free_[rank] + 1e-9);
    uplink_free_[rank] = t;
    at(t, std::move(deliver));
  }
  bool answering(uint32_t rank) const { return members_[rank].alive && !members_[rank].frozen; }

  // ---- epoch 0 ----
  void welcome_all() {
    tree::Welcome w;
    w.topology = o_.kind == tree::TopologyKind::binary  ? "binary"
                 : o_.kind == tree::TopologyKind::chain ? "chain"
                                                        : "double_binary";
    w.members.push_back(tree::Member{0, url_of(0), "", true});
    for (uint32_t r = 1; r <= o_.members; ++r) w.members.push_back(tree::Member{r, url_of(r), labels_[r - 1], true});
    w.forest = membership_->forest();
    report_.welcome_bytes = tree::encode_message(w, 0).size();
    // A sample of members keep their own Membership, as real members build it from WELCOME.
    std::vector<uint32_t> ranks(o_.members);
    for (uint32_t r = 1; r <= o_.members; ++r) ranks[r - 1] = r;
    std::shuffle(ranks.begin(), ranks.end(), rng_);
    ranks.resize(std::min<size_t>(ranks.size(), o_.check_members));
    for (uint32_t r : ranks) members_[r].copy = Membership::from_welcome(o_.kind, 0, w.members, w.forest, o_.producers);
    forests_[0] = w.forest;
  }

  void plan_failures() {
    std::uniform_int_distribution<uint64_t> version(std::min<uint64_t>(2, o_.versions), o_.versions);
    std::uniform_real_distribution<double> u(0, 1);
    for (uint32_t i = 0; i < o_.failures; ++i)
      planned_.push_back(
          PlannedFailure{version(rng_), u(rng_), u(rng_) < o_.freeze_share, u(rng_) * 100 < o_.rejoin_share_pct});
  }

  uint32_t hops(uint32_t rank) const {  // producer -> member, over its deepest tree
    int deepest = 0;
    for (int t = 0; t < membership_->trees(); ++t) deepest = std::max(deepest, membership_->depth(rank, t));
    return static_cast<uint32_t>(deepest) + 1;
  }
  uint32_t max_depth() const {
    uint32_t d = 0;
    for (uint32_t r : membership_->live_ranks()) d = std::max(d, hops(r) - 1);
    return d;
  }

  // ---- a version round ----
  VersionRound::Params round_params(uint64_t v) {
    VersionRound::Params p;
    p.version = v;
    p.attempt = 1;
    p.committed_version = v - 1;
    p.ranks = membership_->live_ranks();
    p.deadline = clock_at(now_ + 12000);  // a 600 s version timeout
    return p;
  }

  void start_version(uint64_t v) {
    version_ = v;
    admit_waiting();  // rejoined members enter at the version boundary (an EPOCH makes each a leaf)
    round_start_ = now_;
    control_messages_ = control_bytes_ = 0;
    lost_ = 0;
    faulted_ = !pending_admits_.empty();
    pending_admits_.clear();
    round_.emplace(round_params(v));
    // A producer group's coordinator starts its ranks (GROUP_BEGIN) and hears them sealed (GROUP_SENT).
    if (o_.producers > 1) {
      count(tree::GroupBegin{}, static_cast<uint64_t>(o_.producers - 1));
      count(tree::GroupSent{}, static_cast<uint64_t>(o_.producers - 1));
    }
    const double data_floor = now_;
    for (uint32_t r : membership_->live_ranks()) {
      members_[r].acked = false;
      schedule_data(r, data_floor + hops(r) * one_way());
    }
    execute(round_->sealed(kDigest, std::nullopt, clock_at(now_)));
    keep_ticking(v);
    // The failures planned for this version.
    for (const auto& f : planned_)
      if (f.version == v) at(now_ + f.offset * (max_depth() + 2) * 0.5, [this, f] { fail_someone(f); });
  }

  void schedule_data(uint32_t rank, double when) {
    const uint64_t gen = ++members_[rank].gen;
    at(when, [this, rank, gen, v = version_] {
      MemberState& m = members_[rank];
      if (m.gen != gen || v != version_ || m.acked || !answering(rank) || !membership_->live(rank)) return;
      m.acked = true;
      const tree::Ack ack{rank, v, kDigest, 0, 1};
      to_producer(rank, ack, [this, rank, ack] { producer_hears([&] { return round_->ack(rank, ack); }); });
    });
  }

  // An event at the producer: feed the round, then tick it, then act.
  void producer_hears(const std::function<VersionRound::Actions()>& event) {
    if (!round_ || round_->done()) return;
    execute(event());
    tick_round();
  }
  void tick_round() {
    if (!round_ || round_->done()) return;
    execute(round_->tick(clock_at(now_)));
    if (round_->done()) finish_round();
  }
  // The producer's own clock: deadlines and graces pass without a message too.
  void keep_ticking(uint64_t v) {
    at(now_ + 50, [this, v] {
      if (version_ != v || !round_) return;
      tick_round();
      keep_ticking(v);
    });
  }

  void execute(const VersionRound::Actions& actions) {
    for (const auto& action : actions) {
      if (const auto* b = std::get_if<VersionRound::Broadcast>(&action)) {
        for (uint32_t r : membership_->live_ranks()) deliver(r, b->message);
      } else if (const auto* s = std::get_if<VersionRound::SendTo>(&action)) {
        deliver(s->rank, s->message);
      } else if (const auto* f = std::get_if<VersionRound::FailMember>(&action)) {
        fail_member(f->rank, f->cause);
      }
    }
  }

  // COMMIT or ABORT at a member: it answers ACTIVE at the version it now holds.
  void deliver(uint32_t rank, const Message& m) {
    to_member(rank, m, [this, rank, m] {
      if (!answering(rank)) return;
      uint64_t holds = version_ - 1;
      if (const auto* c = std::get_if<tree::Commit>(&m)) holds = c->version;
      const tree::Active active{rank, holds, kDigest};
      to_producer(rank, active, [this, rank, active] { producer_hears([&] { return round_->active(rank, active); }); });
    });
  }

  void finish_round() {
    VersionRecord rec;
    rec.version = version_;
    rec.committed = round_->committed();
    rec.faulted = faulted_;
    rec.live = static_cast<uint32_t>(round_->params().ranks.size());
    rec.verified = round_->verified_receivers();
    rec.lost = lost_;
    rec.control_messages = control_messages_;
    rec.control_bytes = control_bytes_;
    rec.rtts = now_ - round_start_;
    report_.versions.push_back(rec);
    round_.reset();
    if (version_ >= o_.versions) {
      finished_ = true;
      // Failures still to be seen (a freeze near the end) change nothing now.
      while (!queue_.empty()) queue_.pop();
      return;
    }
    at(now_ + 1.0, [this, next = version_ + 1] { start_version(next); });
  }

  // ---- failures, repairs, rejoins ----
  void fail_someone(const PlannedFailure& f) {
    std::vector<uint32_t> candidates;
    for (uint32_t r : membership_->live_ranks())
      if (answering(r)) candidates.push_back(r);
    if (candidates.size() < 2) return;
    const uint32_t victim = candidates[std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(rng_)];
    faulted_ = true;
    FailureRecord rec;
    rec.rank = victim;
    rec.frozen = f.frozen;
    rec.version = version_;
    failure_at_[victim] = now_;
    open_failures_[victim] = report_.failures.size();
    report_.failures.push_back(rec);
    if (f.frozen) {
      members_[victim].frozen = true;
    } else {
      members_[victim].alive = false;
    }
    members_[victim].copy.reset();
    // Its tree neighbours see the edge fail (a closed link at once, a silent one after
    // timeouts.peer) and REPORT it; the producer sees its control link fail the same way.
    const double seen = f.frozen ? o_.peer_rtts : 0.5;
    std::set<uint32_t> neighbours;
    for (int t = 0; t < membership_->trees(); ++t) {
      if (const auto p = membership_->parent(victim, t); p && *p != tree::kProducerRank) neighbours.insert(*p);
      for (uint32_t c : membership_->children(victim, t)) neighbours.insert(c);
    }
    at(now_ + seen, [this, neighbours, victim, frozen = f.frozen] {
      faulted_ = true;
      for (uint32_t n : neighbours)
        if (answering(n) && membership_->live(n))
          to_producer(
              n, tree::Report{n, victim, 0, frozen ? tree::FailureCause::silent : tree::FailureCause::link_closed, ""},
              [] {});
    });
    at(now_ + seen, [this, victim, frozen = f.frozen] {
      fail_member(victim, frozen ? tree::FailureCause::silent : tree::FailureCause::link_closed);
    });
    if (f.rejoins) {
      const double back = now_ + seen + std::uniform_real_distribution<double>(5, 40)(rng_);
      at(back, [this, victim] { rejoin(victim); });
    }
  }

  void fail_member(uint32_t rank, tree::FailureCause cause) {
    if (!membership_->live(rank)) return;
    const double t_fail = failure_at_.count(rank) ? failure_at_[rank] : now_;
    count(tree::Fenced{});  // to the member (it may never read it)
    const uint32_t dead[] = {rank};
    const std::vector<tree::TreeEdge> moves = membership_->remove(dead);
    const bool in_round = round_ && !round_->done();
    faulted_ = true;
    if (in_round) {
      const auto& ranks = round_->params().ranks;
      if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) ++lost_;
      execute(round_->member_lost(rank));
    }
    const uint64_t epoch = membership_->epoch();
    forests_[epoch] = membership_->forest();
    tree::EpochUpdate update;
    update.dead.push_back(tree::DeadMember{rank, cause});
    update.moves = moves;
    const uint64_t before = control_messages_, before_bytes = control_bytes_;
    std::set<uint32_t> moved;
    for (const auto& e : moves) moved.insert(e.rank);
    auto pending_repairs = std::make_shared<size_t>(moved.size());
    auto done_at = std::make_shared<double>(now_);
    const size_t record = open_failures_.count(rank) ? open_failures_[rank] : SIZE_MAX;
    if (record != SIZE_MAX) {
      FailureRecord& f = report_.failures[record];
      f.moves = static_cast<uint32_t>(moves.size());
      f.orphaned = static_cast<uint32_t>(moved.size());
      f.detect_rtts = now_ - t_fail;
      f.repair_rtts = now_ - t_fail;
    }
    for (uint32_t r : membership_->live_ranks()) {
      to_member(r, update, [this, r, epoch, update, moved, pending_repairs, done_at, record, t_fail] {
        MemberState& m = members_[r];
        if (m.copy) check_copy(r, epoch, update);
        if (!moved.count(r) || !answering(r)) return;
        // JOIN + RESUME to the new parent, its retained data back, then READY to the producer.
        const double ready = now_ + 3 * one_way();
        m.ready_at = ready;
        at(ready, [this, pending_repairs, done_at, record, t_fail] {
          *done_at = std::max(*done_at, now_);
          if (--*pending_repairs == 0 && record != SIZE_MAX) report_.failures[record].repair_rtts = *done_at - t_fail;
        });
        count(tree::Ready{r, version_ - 1, kDigest});
      });
    }
    if (record != SIZE_MAX) {
      report_.failures[record].epoch_messages = control_messages_ - before;
      report_.failures[record].epoch_bytes = control_bytes_ - before_bytes;
    }
    if (round_ && !round_->done()) reschedule_below(moved);
    if (in_round) tick_round();  // it may have been the last one the round waited for
  }

  // A member whose path from its producer now runs through a moved member gets this version's
  // data only after that member's edges are up again: one more delay per hop below it.
  void reschedule_below(const std::set<uint32_t>& moved) {
    if (moved.empty()) return;
    const double epoch_lands = now_ + 0.5 * (1 + o_.jitter);
    for (uint32_t r : membership_->live_ranks()) {
      MemberState& m = members_[r];
      if (m.acked || !answering(r)) continue;
      double when = -1;
      for (int t = 0; t < membership_->trees(); ++t) {
        uint32_t hop = 0;
        for (std::optional<uint32_t> a = r; a && *a != tree::kProducerRank; a = membership_->parent(*a, t), ++hop)
          if (moved.count(*a)) {
            when = std::max(when, epoch_lands + 3 * 0.5 * (1 + o_.jitter) + hop * one_way());
            break;
          }
      }
      if (when >= 0) schedule_data(r, std::max(when, now_ + hops(r) * 0.5));
    }
  }

  // A checked member applied `update` (epoch `epoch`): its view must be the producer's.
  void check_copy(uint32_t rank, uint64_t epoch, const tree::EpochUpdate& update) {
    MemberState& m = members_[rank];
    m.copy->apply(epoch, update.dead, update.joined, update.moves);
    ++report_.copies_checked;
    if (m.copy->forest() != forests_.at(epoch)) ++report_.copies_diverged;
  }

  // A failed member comes back (a restart, or it woke up): HELLO, WELCOME and a catch-up, then it
  // waits for the next version boundary.
  void rejoin(uint32_t rank) {
    if (membership_->live(rank)) {  // a freeze not yet detected: it goes on as it was
      members_[rank].frozen = false;
      return;
    }
    members_[rank].alive = true;
    members_[rank].frozen = false;
    faulted_ = true;
    to_producer(rank, tree::Hello{}, [this, rank] {
      faulted_ = true;
      ++control_messages_;  // WELCOME: the whole membership
      control_bytes_ += report_.welcome_bytes;
      count(tree::Catchup{});
      at(now_ + 4.0, [this, rank] {  // the catch-up's transfer, then READY
        faulted_ = true;
        to_producer(rank, tree::Ready{rank, version_ - 1, kDigest}, [this, rank] { waiting_.push_back(rank); });
      });
    });
  }

  void admit_waiting() {
    if (waiting_.empty()) return;
    std::vector<uint32_t> admitted;
    tree::EpochUpdate update;
    for (uint32_t rank : waiting_) {
      if (membership_->live(rank) || !answering(rank)) continue;
      const auto edges = membership_->add(rank);
      forests_[membership_->epoch()] = membership_->forest();
      update = tree::EpochUpdate{};
      update.joined.push_back(tree::Member{rank, url_of(rank), labels_[rank - 1], true});
      update.moves = edges;
      const uint64_t epoch = membership_->epoch();
      for (uint32_t r : membership_->live_ranks())
        to_member(r, update, [this, r, epoch, update] {
          if (members_[r].copy) check_copy(r, epoch, update);
        });
      ++report_.rejoins;
      pending_admits_.push_back(rank);
      open_failures_.erase(rank);
      failure_at_.erase(rank);
    }
    waiting_.clear();
  }

  const Options o_;
  std::mt19937_64 rng_;
  std::vector<std::string> labels_;
  std::optional<Membership> membership_;
  std::optional<VersionRound> round_;
  std::vector<MemberState> members_;
  std::vector<double> link_free_, uplink_free_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  uint64_t seq_ = 0;
  double now_ = 0;
  uint64_t version_ = 0;
  double round_start_ = 0;
  bool faulted_ = false;
  uint32_t lost_ = 0;
  bool finished_ = false;
  uint64_t control_messages_ = 0, control_bytes_ = 0;
  std::vector<PlannedFailure> planned_;
  std::map<uint32_t, double> failure_at_;
  std::map<uint32_t, size_t> open_failures_;
  std::map<uint64_t, std::vector<tree::TreeEdge>> forests_;
  std::vector<uint32_t> waiting_, pending_admits_;
  Report report_;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(v.size() - 1, std::floor(q * (v.size() - 1) + 0.5)))];
}

}  // namespace

Report run(const Options& options) { return Sim(options).run(); }

std::string to_json(const Report& r) {
  std::vector<double> clean_msgs, clean_rtts, moves, repair, detect, epoch_bytes;
  uint32_t committed = 0;
  for (const auto& v : r.versions) {
    committed += v.committed ? 1 : 0;
    if (!v.faulted) {
      clean_msgs.push_back(static_cast<double>(v.control_messages) / std::max(1u, v.live));
      clean_rtts.push_back(v.rtts);
    }
  }
  for (const auto& f : r.failures) {
    moves.push_back(f.moves);
    repair.push_back(f.repair_rtts);
    detect.push_back(f.detect_rtts);
    epoch_bytes.push_back(static_cast<double>(f.epoch_bytes) / std::max(1.0, static_cast<double>(f.epoch_messages)));
  }
  const Options& o = r.options;
  nlohmann::json j{
      {"members", o.members},
      {"kind", o.kind == tree::TopologyKind::binary  ? "binary"
               : o.kind == tree::TopologyKind::chain ? "chain"
                                                     : "double_binary"},
      {"producers", o.producers},
      {"clusters", o.clusters},
      {"versions", r.versions.size()},
      {"committed", committed},
      {"failures", r.failures.size()},
      {"rejoins", r.rejoins},
      {"epochs", r.epochs},
      {"control_messages_per_member_clean_median", quantile(clean_msgs, 0.5)},
      {"control_messages_per_member_clean_max", quantile(clean_msgs, 1.0)},
      {"version_rtts_clean_median", quantile(clean_rtts, 0.5)},
      {"moves_per_failure_median", quantile(moves, 0.5)},
      {"moves_per_failure_max", quantile(moves, 1.0)},
      {"detect_rtts_median", quantile(detect, 0.5)},
      {"repair_rtts_median", quantile(repair, 0.5)},
      {"repair_rtts_p99", quantile(repair, 0.99)},
      {"repair_rtts_max", quantile(repair, 1.0)},
      {"epoch_message_bytes_median", quantile(epoch_bytes, 0.5)},
      {"welcome_bytes", r.welcome_bytes},
      {"max_depth_epoch0", r.max_depth_epoch0},
      {"max_depth_end", r.max_depth},
      {"log2_members", std::log2(static_cast<double>(o.members))},
      {"copies_checked", r.copies_checked},
      {"copies_diverged", r.copies_diverged},
      {"producer_bytes_per_member", r.producer_bytes_per_member},
      {"wall_seconds", r.wall_seconds},
  };
  return j.dump();
}

}  // namespace deltacast::fleet_sim
