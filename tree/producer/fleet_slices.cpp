#include "tree/producer/fleet_slices.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "util/error.h"

namespace deltacast::tree {
namespace {

auto key(const codec::SliceDigest& s) { return std::tuple(s.tensor, s.dim, s.start, s.stop); }

// One placement per member: each slice its own buffer (only which canonical units are held
// matters to the encoder; buffers, fusing and padding are the member's business).
codec::Placement placement_of(const codec::Manifest& manifest, const std::vector<codec::SliceDigest>& slices) {
  std::vector<codec::BufferPlacement> buffers;
  for (const auto& s : slices) {
    codec::BufferPlacement b;
    b.name = "slice " + std::to_string(buffers.size());
    b.parts.push_back(codec::PlacementPart{manifest.at(s.tensor).name, s.dim, s.start, s.stop, std::nullopt});
    buffers.push_back(std::move(b));
  }
  return codec::Placement::compile(manifest, std::move(buffers));
}

}  // namespace

void FleetSlices::state(uint32_t rank, const std::vector<HeldSlice>& slices) {
  std::vector<codec::SliceDigest> resolved;
  std::set<std::tuple<uint32_t, uint32_t, uint64_t, uint64_t>> seen;
  for (size_t i = 0; i < slices.size(); ++i) {
    const HeldSlice& s = slices[i];
    const std::string what = "slice " + std::to_string(i) + " (" + s.tensor + " dim " + std::to_string(s.dim) + " " +
                             std::to_string(s.start) + ":" + std::to_string(s.stop) + ")";
    const auto index = manifest_.find(s.tensor);
    if (!index) throw Error(Errc::invalid_argument, what + ": no such tensor in the producer's checkpoint");
    codec::SliceDigest d{*index, s.dim, s.start, s.stop, 0};
    if (s.start >= s.stop) throw Error(Errc::invalid_argument, what + ": an empty range");
    try {
      codec::slice_stripes(manifest_, d);
    } catch (const Error& e) {
      throw Error(Errc::invalid_argument, what + ": " + e.what());
    }
    if (!seen.insert(key(d)).second) throw Error(Errc::invalid_argument, what + ": stated twice");
    resolved.push_back(d);
  }
  if (resolved.empty()) {
    if (by_rank_.erase(rank)) held_.reset();
    return;
  }
  placement_of(manifest_, resolved);  // the encoder's check, before anything is recorded
  auto& mine = by_rank_[rank];
  if (mine != resolved) held_.reset();
  mine = std::move(resolved);
}

void FleetSlices::prepare(codec::EncodeOptions& options, uint64_t version, const codec::ConstWeights& base) {
  if (by_rank_.empty()) return;
  if (!held_) {
    // One placement per distinct slice set.
    std::set<std::vector<std::tuple<uint32_t, uint32_t, uint64_t, uint64_t>>> sets;
    auto held = std::make_shared<codec::HeldSlices>();
    for (const auto& [rank, slices] : by_rank_) {
      std::vector<std::tuple<uint32_t, uint32_t, uint64_t, uint64_t>> k;
      for (const auto& s : slices) k.push_back(key(s));
      std::sort(k.begin(), k.end());
      if (sets.insert(k).second) held->add(placement_of(manifest_, slices));
    }
    held_ = std::move(held);
  }
  if (table_version_ != version) table_.clear();
  std::vector<codec::SliceDigest> wanted = held_->slices();
  for (auto& s : wanted) {
    const auto it = std::find_if(table_.begin(), table_.end(), [&](const auto& t) { return t.same_slice(s); });
    s.digest = it != table_.end() ? it->digest : codec::canonical_slice_digest(manifest_, s, base.tensors.at(s.tensor));
  }
  table_ = wanted;
  table_version_ = version;
  options.held_slices = held_;
  options.base_slice_digests = std::move(wanted);
}

FleetSlices::GroupPlan FleetSlices::group_plan(uint64_t version) const {
  GroupPlan plan;
  std::set<std::vector<std::tuple<uint32_t, uint32_t, uint64_t, uint64_t>>> sets;
  auto index_of = [&](const codec::SliceDigest& s) {
    for (uint32_t i = 0; i < plan.table.size(); ++i)
      if (plan.table[i].same_slice(s)) return i;
    codec::SliceDigest entry = s;
    entry.digest = 0;
    bool known = false;
    if (table_version_ == version)
      for (const auto& t : table_)
        if (t.same_slice(s)) {
          entry.digest = t.digest;
          known = true;
        }
    if (!known) plan.scan.push_back(static_cast<uint32_t>(plan.table.size()));
    plan.table.push_back(entry);
    return static_cast<uint32_t>(plan.table.size() - 1);
  };
  for (const auto& [rank, slices] : by_rank_) {
    std::vector<std::tuple<uint32_t, uint32_t, uint64_t, uint64_t>> k;
    for (const auto& s : slices) k.push_back(key(s));
    std::sort(k.begin(), k.end());
    if (!sets.insert(k).second) continue;
    for (const auto& s : slices) plan.set_slices.push_back(index_of(s));
    plan.set_ends.push_back(static_cast<uint32_t>(plan.set_slices.size()));
  }
  return plan;
}

std::shared_ptr<const codec::HeldSlices> FleetSlices::held_of(const codec::Manifest& manifest,
                                                              const std::vector<codec::SliceDigest>& table,
                                                              const std::vector<uint32_t>& set_slices,
                                                              const std::vector<uint32_t>& set_ends) {
  auto held = std::make_shared<codec::HeldSlices>();
  uint32_t begin = 0;
  for (const uint32_t end : set_ends) {
    if (end < begin || end > set_slices.size())
      throw Error(Errc::corrupt_frame, "group begin: a slice set outside the list of sets");
    std::vector<codec::SliceDigest> slices;
    for (uint32_t i = begin; i < end; ++i) {
      if (set_slices[i] >= table.size())
        throw Error(Errc::corrupt_frame, "group begin: a slice index outside the table");
      slices.push_back(table[set_slices[i]]);
    }
    held->add(placement_of(manifest, slices));
    begin = end;
  }
  return held;
}

void FleetSlices::committed(uint64_t version, std::vector<codec::SliceDigest> table) {
  if (table.empty()) return;
  table_ = std::move(table);
  table_version_ = version;
}

}  // namespace deltacast::tree
