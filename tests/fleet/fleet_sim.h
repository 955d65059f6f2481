#pragma once
// The control plane of a large fleet, simulated in one process on the real state machines
// (issue 35 §3; docs/reliability.md, "Control plane at 10,000 members"): the producer's
// tree::Membership and tree::VersionRound decide everything, every control message is encoded by
// tree::encode_message (its bytes are counted), and a sample of members keep their own Membership
// built from WELCOME and moved by each EPOCH, as real members do. Only the transports and the clock
// are simulated: every message takes one one-way delay (half an RTT, with jitter), a member's data
// comes down its trees one delay per hop, and a killed member's control link closes (seen after
// one delay) while a frozen one is seen after timeouts.peer.
//
// What a run measures: control messages and bytes per version (clean and faulted), members moved
// per failure, tree depth, the time from a failure to a repaired tree (the last moved member's
// READY) in RTTs, and the producer state's heap bytes per member.
//
// Thread-safety: none; one simulation per thread.
#include <cstdint>
#include <string>
#include <vector>

#include "tree/topology.h"

namespace deltacast::fleet_sim {

struct Options {
  uint32_t members = 1000;
  tree::TopologyKind kind = tree::TopologyKind::double_binary;
  uint32_t clusters = 1;           // labels c0.. in contiguous rank blocks
  int producers = 1;               // a producer group's ranks M (each feeds its share of the trees)
  uint32_t versions = 20;          // version rounds after the bootstrap
  uint32_t failures = 10;          // members killed or frozen, at random moments of random versions
  double freeze_share = 0.3;       // of the failures, frozen (detected after peer_rtts) not killed
  uint32_t rejoin_share_pct = 50;  // of the failed members, this many percent come back later
  double peer_rtts = 20;           // timeouts.peer in RTTs (a frozen member is seen after it)
  double jitter = 0.1;             // each one-way delay is 0.5 RTT x (1 + U[0, jitter])
  uint32_t check_members = 32;     // members whose own Membership copy is kept and compared
  uint64_t seed = 1;
};

struct FailureRecord {
  uint32_t rank = 0;
  bool frozen = false;
  uint64_t version = 0;         // the version in flight when it failed
  uint32_t moves = 0;           // edges the repair changed (members moved, over every tree)
  uint32_t orphaned = 0;        // members that lost a parent
  double detect_rtts = 0;       // failure to the producer's verdict
  double repair_rtts = 0;       // failure to the last moved member's READY (detection included)
  uint64_t epoch_messages = 0;  // the EPOCH that announced it
  uint64_t epoch_bytes = 0;
};

struct VersionRecord {
  uint64_t version = 0;
  bool committed = false;
  bool faulted = false;           // a failure or a rejoin happened during it
  uint32_t live = 0;              // live members when it started
  uint32_t verified = 0;          // members that verified it
  uint32_t lost = 0;              // members of the round failed during it
  uint64_t control_messages = 0;  // every control message sent during the round (both ways)
  uint64_t control_bytes = 0;
  double rtts = 0;  // start to the last ACTIVE
};

struct Report {
  Options options;
  std::vector<VersionRecord> versions;
  std::vector<FailureRecord> failures;
  uint32_t rejoins = 0;
  uint32_t max_depth = 0;  // deepest live member over every tree, at the end
  uint32_t max_depth_epoch0 = 0;
  uint64_t epochs = 0;
  uint64_t copies_checked = 0;           // (member copy, epoch) pairs compared with the producer's forest
  uint64_t copies_diverged = 0;          // of them, different (must be 0)
  uint64_t welcome_bytes = 0;            // one WELCOME at epoch 0 (it lists every member)
  double producer_bytes_per_member = 0;  // heap held by Membership + VersionRound, per member
  double wall_seconds = 0;
};

// Runs one simulation. Throws Error when the state machines refuse what the producer feeds them.
Report run(const Options& options);

// The report as one JSON object (its summary figures and every record).
std::string to_json(const Report& report);

// Heap bytes live right now, as counted by the simulator's operator new/delete (fleet_sim.cpp
// replaces them for the whole binary).
int64_t heap_bytes_live();

}  // namespace deltacast::fleet_sim
