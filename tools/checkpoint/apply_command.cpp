// `deltacast apply`: applies a .dcx delta to a checkpoint (a .safetensors file or a sharded
// directory), bit-exactly or not at all. Everything that can be checked before writing is checked
// first (all frames parsed, model and base digest matched); the result is verified against the
// seal's digests and audited by a full scan before it is published. On any error the target is
// byte-identical to before:
//   --out: the delta goes into a private copy, written to OUT in the target's layout (the same
//          shard files with the same tensors; a directory is written whole and swapped in, so an
//          OUT that a server loads from goes from the old model to the new one, never a mix, and
//          keeps its config and tokenizer files; a mounted volume's root is written file by file,
//          the index last: checkpoint::write_checkpoint);
//   --in-place: the delta goes into the mapped target files, and any failure rolls it back.
#include <cstdio>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "codec/applier.h"
#include "codec/owned_weights.h"
#include "tools/checkpoint/delta_file.h"
#include "tools/cli.h"
#include "util/error.h"
#include "util/log.h"

namespace deltacast::tools::apply_command {  // its own namespace: unity builds batch the commands together
namespace {

struct ApplyOptions {
  std::string target;
  std::string delta;
  std::string out;
  bool in_place = false;
  std::optional<uint64_t> base_version;
  unsigned threads = 2;
};

struct ApplyOutcome {
  uint64_t changes = 0;
  uint64_t new_version = 0;
};

// Applies every frame, requires completeness, verifies against the seal and audits the bytes.
ApplyOutcome apply_all(codec::DeltaApplier& applier, const DeltaFile& delta, unsigned threads) {
  ApplyOutcome outcome;
  for (const auto& f : delta.frames) outcome.changes += applier.apply(f.bytes).changes;
  if (!applier.complete()) throw Error(Errc::corrupt_frame, "delta is incomplete after applying every frame");
  applier.verify();
  applier.audit(threads);
  outcome.new_version = *applier.pending_version();
  applier.commit();
  return outcome;
}

void check_base(const checkpoint::Checkpoint& target, const DeltaFile& delta, const codec::StateDigest& digest) {
  const auto& h = delta.first_header();
  if (target.manifest().digest() != h.manifest_digest) {
    throw Error(Errc::version_mismatch,
                "delta was made for another model than " + target.path().string() + " (manifest digest differs)");
  }
  if (digest.combined() != h.base_digest) {
    char msg[160];
    std::snprintf(msg, sizeof msg,
                  " is not the delta's base version %llu (state digest %016llx, delta expects %016llx)",
                  static_cast<unsigned long long>(h.base_version), static_cast<unsigned long long>(digest.combined()),
                  static_cast<unsigned long long>(h.base_digest));
    throw Error(Errc::version_mismatch, target.path().string() + msg);
  }
}

void run_apply(const ApplyOptions& o) {
  if (o.in_place == !o.out.empty())
    throw Error(Errc::invalid_argument, "apply needs exactly one of --out FILE or --in-place");
  const DeltaFile delta = read_delta_file(o.delta);  // all frames parsed before the target is opened
  const uint64_t version = o.base_version.value_or(delta.first_header().base_version);
  ApplyOutcome outcome;
  if (!o.in_place) {
    const auto target = checkpoint::Checkpoint::open(o.target);
    const auto digest = codec::StateDigest::full_scan(target.weights(), o.threads);
    check_base(target, delta, digest);
    codec::OwnedWeights copy(target.weights());
    codec::DeltaApplier applier(copy.manifest(), copy.mutable_view(), version, digest);
    outcome = apply_all(applier, delta, o.threads);
    checkpoint::write_checkpoint(o.out, copy.view(), target.layout());
  } else {
    auto target = checkpoint::Checkpoint::open_for_update(o.target);
    const auto digest = codec::StateDigest::full_scan(target.weights(), o.threads);
    check_base(target, delta, digest);
    codec::DeltaApplier applier(target.manifest(), target.mutable_weights(), version, digest);
    try {
      outcome = apply_all(applier, delta, o.threads);
    } catch (...) {
      applier.rollback();
      target.flush();
      logger("cli")->warn("apply --in-place failed; {} rolled back to version {}", o.target, version);
      throw;
    }
    target.flush();
  }
  std::printf("applied %zu frames (%llu changes): %s version %llu -> %llu, verified bit-exact; wrote %s\n",
              delta.frames.size(), static_cast<unsigned long long>(outcome.changes), o.target.c_str(),
              static_cast<unsigned long long>(version), static_cast<unsigned long long>(outcome.new_version),
              o.in_place ? o.target.c_str() : o.out.c_str());
}

void setup(CLI::App& parent) {
  auto o = std::make_shared<ApplyOptions>();
  auto* cmd = parent.add_subcommand("apply", "apply a .dcx delta to a checkpoint (verified, all or nothing)");
  cmd->add_option("--target", o->target, "checkpoint holding the delta's base (a file or a sharded directory)")
      ->required();
  cmd->add_option("--delta", o->delta, ".dcx file from `deltacast diff`")->required();
  auto* out = cmd->add_option("--out", o->out,
                              "write the result here in the target's layout (a file, or a directory for shards)");
  auto* in_place = cmd->add_flag("--in-place", o->in_place, "apply into the target itself (rolled back on failure)");
  out->excludes(in_place);
  cmd->add_option("--base-version", o->base_version, "version the target holds (default: the delta's base version)");
  cmd->add_option("--threads", o->threads, "threads for digest scans")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->callback([o] { run_apply(*o); });
}

const CommandRegistrar registrar{"apply", &setup};

}  // namespace
}  // namespace deltacast::tools::apply_command
