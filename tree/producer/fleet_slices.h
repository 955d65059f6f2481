#pragma once
// What the producer knows of its placed members (docs/placement.md, "Placed members in the tree"):
// the canonical slices each member stated at HELLO, what the encoder needs of them (the members'
// placements: no segment a member holds partly is coded by class), and the slice table the seals
// carry, kept from version to version (each seal's table advanced from the changes; a slice first
// stated later costs one scan of that slice of the committed version).
//
// A member's slices stay recorded until it states others (a member that left keeps its slices in
// the cuts: a cut costs bytes, never correctness; the next HELLO of that rank replaces them).
//
// Threads: the producer's driving thread only. Unit tests: tests/unit/tree/test_fleet_slices.cpp.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "codec/encoder.h"
#include "codec/manifest.h"
#include "codec/placement.h"
#include "tree/protocol.h"

namespace deltacast::tree {

class FleetSlices {
 public:
  explicit FleetSlices(const codec::Manifest& manifest) : manifest_(manifest) {}

  // Member `rank` holds `slices` (empty: every tensor whole). Checked against the manifest first:
  // Error(invalid_argument) naming the slice (an unknown tensor, a dim or range outside it, an
  // empty range, a slice stated twice); nothing is recorded then.
  void state(uint32_t rank, const std::vector<HeldSlice>& slices);
  // Whether member `rank` stated slices (a placed member).
  bool placed(uint32_t rank) const { return by_rank_.count(rank) != 0; }
  bool empty() const noexcept { return by_rank_.empty(); }

  // Fills `options` for a delta from committed version `version`, whose bits are `base`:
  // held_slices (every recorded member's placement) and base_slice_digests (the table at
  // `version`, every recorded slice; a slice the table lacks is scanned from `base`). Nothing
  // when no member is placed.
  void prepare(codec::EncodeOptions& options, uint64_t version, const codec::ConstWeights& base);
  // Version `version` committed with slice table `table` (the encoder's new_slice_digests(), or a
  // group's sum of its parts').
  void committed(uint64_t version, std::vector<codec::SliceDigest> table);

  // A producer group's delta from committed version `version` (docs/producer-group.md): the
  // slice table in the seal's order (digest: the base's where the table at `version` has it),
  // which of them no table knows (`scan`: each rank scans its part of them), and the members'
  // distinct slice sets as indices into the table (set k: set_slices[set_ends[k-1] ..
  // set_ends[k])). What GROUP_BEGIN carries; empty when no member is placed.
  struct GroupPlan {
    std::vector<codec::SliceDigest> table;
    std::vector<uint32_t> scan;
    std::vector<uint32_t> set_slices;
    std::vector<uint32_t> set_ends;
  };
  GroupPlan group_plan(uint64_t version) const;
  // The encoder's view of the sets of a GROUP_BEGIN (at every rank). Throws Error(corrupt_frame)
  // for indices outside the table, Error(invalid_argument) for a slice outside the manifest.
  static std::shared_ptr<const codec::HeldSlices> held_of(const codec::Manifest& manifest,
                                                          const std::vector<codec::SliceDigest>& table,
                                                          const std::vector<uint32_t>& set_slices,
                                                          const std::vector<uint32_t>& set_ends);

 private:
  const codec::Manifest& manifest_;
  std::map<uint32_t, std::vector<codec::SliceDigest>> by_rank_;  // digest fields 0
  std::shared_ptr<const codec::HeldSlices> held_;                // built from by_rank_ (null: stale)
  std::vector<codec::SliceDigest> table_;                        // at table_version_
  uint64_t table_version_ = 0;
};

}  // namespace deltacast::tree
