#pragma once
// Who is in a producer group (docs/producer-group.md): the coordinator's decisions on its ranks'
// GROUP_HELLOs, at start and when a rank comes back after its link failed. Pure: no sockets, no
// threads, no clock; the coordinator answers WELCOME for an admitted rank and REFUSED (then
// closes the link) for a refused one, and waits (or gives up at its join timeout, naming
// missing()) until complete(). Unit tests: tests/unit/tree/test_group_admission.cpp.
//
// The rules, in one place. A GROUP_HELLO is refused, naming the rank, when:
//  * its rank is not one of 1..M-1, or it counts another group size;
//  * its manifest or its partition (fingerprint) differs from the coordinator's: the ranks would
//    send parts that overlap or leave units out;
//  * the rank is already in: two processes claim one part;
//  * it holds another version than the committed one, or (once the group has a record of the
//    rank's part at that version: from an earlier GROUP_HELLO or a commit) other bits.
//    A resumed coordinator that knows the version before its committed one (Params::previous)
//    admits ranks holding that one too, until settle(): it was lost after deciding its committed
//    version and before any rank heard so. Once every rank is in, the caller steps the group back
//    (step_back, when every rank holds the previous version and no receiver holds the committed
//    one) or gives up naming the ranks (at_previous()).
// Once every rank is in, the parts' digests (the coordinator's own included) must add up to the
// committed version's (check_sum): at the first start the coordinator has no per-rank records,
// only the sum.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codec/digest.h"
#include "tree/protocol.h"
#include "util/error.h"

namespace deltacast::tree {

// "rank 2" / "ranks 1, 3 and 5": ranks named in an error.
std::string rank_list(const std::vector<uint32_t>& ranks);

class GroupAdmission {
 public:
  struct Params {
    uint32_t size = 1;  // M: the coordinator is rank 0
    uint64_t manifest_digest = 0;
    uint64_t partition = 0;  // codec::Partition::fingerprint()
    uint64_t committed_version = 0;
    uint64_t committed_digest = 0;     // the committed version's combined digest (the coordinator's record)
    std::vector<uint64_t> own_digest;  // the coordinator's part at the committed version, per tensor
    uint64_t previous_version = 0;     // a resumed coordinator's version before the committed one (0: none)
  };
  struct Decision {
    Errc errc = Errc::ok;  // ok: admitted
    std::string reason;    // refused: why (the REFUSED's message)
    bool admitted() const noexcept { return errc == Errc::ok; }
  };

  explicit GroupAdmission(Params params);

  // A rank's GROUP_HELLO.
  Decision hello(const GroupHello& hello);
  // The rank's group link failed or it left: its part is missing until it says GROUP_HELLO again.
  void lost(uint32_t rank);
  // Version `version` committed with combined digest `digest`; parts[r] is rank r's part digest of
  // it (rank 0: the coordinator's; from the ranks' GROUP_SENT). The records a returning rank is
  // checked against.
  void committed(uint64_t version, uint64_t digest, std::vector<std::vector<uint64_t>> parts);

  // The ranks in that hold the previous version (Params::previous_version), ascending.
  std::vector<uint32_t> at_previous() const;
  // The group goes back to the previous version: every rank in holds it (else Error(state)),
  // `digest` is its combined digest and `own` the coordinator's part of it. The ranks' parts are
  // checked against it by check_sum(), as at any start; from then on only it is admitted.
  void step_back(uint64_t digest, std::vector<uint64_t> own);
  // From now on a rank holding the previous version is refused, as one holding any other; those
  // in holding it are out again (the caller refuses them).
  void settle();

  bool in(uint32_t rank) const;
  // The group's record of rank `rank`'s part at the committed version (per tensor; null when it has
  // none: a rank not yet seen at this version).
  const std::vector<uint64_t>* record(uint32_t rank) const;
  bool complete() const;                  // every rank is in
  std::vector<uint32_t> missing() const;  // ranks not in, ascending
  // "ranks 2 and 5 have not said GROUP_HELLO": for the coordinator's error at its join timeout.
  std::string describe_missing() const;
  // Once complete(): empty when the ranks' part digests add up to the committed version's digest,
  // else why not (nothing may be sent: some rank holds other bits, or the previous version).
  std::string check_sum() const;
  // Once complete(): the sum of the ranks' part digests, per tensor (at version 0, the all-zero
  // version's digest: no rank holds the whole model to take it). Error(state) while a rank is in
  // at the previous version.
  codec::StateDigest sum() const;
  uint64_t committed_version() const noexcept { return params_.committed_version; }

 private:
  Decision refuse(Errc errc, const GroupHello& hello, const std::string& why) const;

  Params params_;
  std::vector<bool> in_;                                        // [rank]
  std::vector<std::optional<std::vector<uint64_t>>> records_;   // [rank]: its part at the committed version
  std::vector<std::optional<std::vector<uint64_t>>> previous_;  // [rank]: its part at the previous version
};

}  // namespace deltacast::tree
