#include "tree/producer/group_admission.h"

#include "codec/digest.h"
#include "util/bytes.h"

namespace deltacast::tree {
GroupAdmission::GroupAdmission(Params params)
    : params_(std::move(params)), in_(params_.size, false), records_(params_.size), previous_(params_.size) {
  if (params_.size == 0) throw Error(Errc::invalid_argument, "a producer group needs at least one rank");
  in_[0] = true;
  records_[0] = params_.own_digest;
}

GroupAdmission::Decision GroupAdmission::refuse(Errc errc, const GroupHello& hello, const std::string& why) const {
  return {errc, "producer rank " + std::to_string(hello.rank) + ": " + why};
}

GroupAdmission::Decision GroupAdmission::hello(const GroupHello& h) {
  const uint32_t m = params_.size;
  if (h.rank == 0 || h.rank >= m)
    return refuse(Errc::invalid_argument, h,
                  "outside the group of " + std::to_string(m) + " ranks (ranks 1.." + std::to_string(m - 1) +
                      " join rank 0, the coordinator)");
  if (h.size != m)
    return refuse(Errc::invalid_argument, h,
                  "counts a group of " + std::to_string(h.size) + " ranks; the coordinator's has " + std::to_string(m));
  if (h.manifest_digest != params_.manifest_digest)
    return refuse(Errc::version_mismatch, h,
                  "its manifest (digest " + hex64(h.manifest_digest) + ") differs from the coordinator's (" +
                      hex64(params_.manifest_digest) + ")");
  if (h.partition != params_.partition)
    return refuse(Errc::version_mismatch, h,
                  "its partition (fingerprint " + hex64(h.partition) + ") differs from the coordinator's (" +
                      hex64(params_.partition) + "): every rank must cut the same manifest into the same parts");
  if (h.held_digest.size() != params_.own_digest.size())
    return refuse(Errc::corrupt_frame, h,
                  "its part's digest has " + std::to_string(h.held_digest.size()) + " tensors, the manifest " +
                      std::to_string(params_.own_digest.size()));
  if (in_[h.rank]) return refuse(Errc::state, h, "already in the group: two processes claim its part");
  if (params_.previous_version != 0 && h.held_version == params_.previous_version) {
    in_[h.rank] = true;
    previous_[h.rank] = h.held_digest;
    return {};
  }
  if (h.held_version != params_.committed_version)
    return refuse(Errc::version_mismatch, h,
                  "holds version " + std::to_string(h.held_version) + ", the group's committed version is " +
                      std::to_string(params_.committed_version) +
                      " (a rank comes back holding its part of the committed version: run --resume)");
  if (records_[h.rank] && *records_[h.rank] != h.held_digest)
    return refuse(Errc::verify_failed, h,
                  "its part is not version " + std::to_string(params_.committed_version) +
                      "'s: its digest differs from the group's record of that part");
  in_[h.rank] = true;
  records_[h.rank] = h.held_digest;
  return {};
}

void GroupAdmission::lost(uint32_t rank) {
  if (rank == 0 || rank >= params_.size) return;
  in_[rank] = false;
  previous_[rank].reset();
}

std::vector<uint32_t> GroupAdmission::at_previous() const {
  std::vector<uint32_t> out;
  for (uint32_t r = 1; r < params_.size; ++r)
    if (in_[r] && previous_[r]) out.push_back(r);
  return out;
}

void GroupAdmission::step_back(uint64_t digest, std::vector<uint64_t> own) {
  if (params_.previous_version == 0) throw Error(Errc::state, "group: no previous version to step back to");
  for (uint32_t r = 1; r < params_.size; ++r)
    if (!in_[r] || !previous_[r])
      throw Error(Errc::state, "group: producer rank " + std::to_string(r) + " does not hold version " +
                                   std::to_string(params_.previous_version) + ": the group cannot step back to it");
  params_.committed_version = params_.previous_version;
  params_.committed_digest = digest;
  records_[0] = std::move(own);
  for (uint32_t r = 1; r < params_.size; ++r) {
    records_[r] = std::move(*previous_[r]);
    previous_[r].reset();
  }
  params_.previous_version = 0;
}

void GroupAdmission::settle() {
  params_.previous_version = 0;
  for (uint32_t r = 1; r < params_.size; ++r)
    if (previous_[r]) {
      in_[r] = false;
      previous_[r].reset();
    }
}

void GroupAdmission::committed(uint64_t version, uint64_t digest, std::vector<std::vector<uint64_t>> parts) {
  if (parts.size() != params_.size)
    throw Error(Errc::invalid_argument,
                "group: a commit needs the part digest of each of the " + std::to_string(params_.size) + " ranks");
  params_.committed_version = version;
  params_.committed_digest = digest;
  for (uint32_t r = 0; r < params_.size; ++r) records_[r] = std::move(parts[r]);
}

const std::vector<uint64_t>* GroupAdmission::record(uint32_t rank) const {
  return rank < params_.size && records_[rank] ? &*records_[rank] : nullptr;
}

bool GroupAdmission::in(uint32_t rank) const { return rank < params_.size && in_[rank]; }

bool GroupAdmission::complete() const { return missing().empty(); }

std::vector<uint32_t> GroupAdmission::missing() const {
  std::vector<uint32_t> out;
  for (uint32_t r = 1; r < params_.size; ++r)
    if (!in_[r]) out.push_back(r);
  return out;
}

std::string rank_list(const std::vector<uint32_t>& ranks) {
  std::string list;
  for (size_t i = 0; i < ranks.size(); ++i)
    list += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return (ranks.size() == 1 ? "rank " : "ranks ") + list;
}

std::string GroupAdmission::describe_missing() const {
  const auto gone = missing();
  if (gone.empty()) return "";
  return "producer " + rank_list(gone) + (gone.size() == 1 ? " has" : " have") + " not said GROUP_HELLO";
}

codec::StateDigest GroupAdmission::sum() const {
  if (!complete()) throw Error(Errc::state, "group: " + describe_missing());
  if (const auto behind = at_previous(); !behind.empty())
    throw Error(Errc::state, "group: producer " + rank_list(behind) + " hold the previous version");
  std::vector<uint64_t> sum(params_.own_digest.size(), 0);
  for (const auto& record : records_)
    for (size_t t = 0; t < sum.size(); ++t) sum[t] += (*record)[t];
  return codec::StateDigest(std::move(sum));
}

std::string GroupAdmission::check_sum() const {
  if (!complete()) return describe_missing();
  if (const auto behind = at_previous(); !behind.empty())
    return "producer " + rank_list(behind) + (behind.size() == 1 ? " holds" : " hold") + " version " +
           std::to_string(params_.previous_version) + ", not the committed version " +
           std::to_string(params_.committed_version);
  const uint64_t combined = sum().combined();
  if (combined == params_.committed_digest) return "";
  return "the " + std::to_string(params_.size) + " ranks' parts add up to digest " + hex64(combined) +
         ", not version " + std::to_string(params_.committed_version) + "'s " + hex64(params_.committed_digest) +
         ": some rank holds other bits";
}

}  // namespace deltacast::tree
