#include "codec/cuda/device_encode.h"

#include <string>

#include "util/error.h"

namespace deltacast::codec::cuda {

ConstWeights mirror_weights(const Manifest& manifest, const DeviceDiffMirror& mirror) {
  if (mirror.size() != manifest.size())
    throw Error(Errc::invalid_argument, "cuda: the mirror has " + std::to_string(mirror.size()) +
                                            " tensors, the manifest " + std::to_string(manifest.size()));
  ConstWeights w{&manifest, {}};
  for (uint32_t i = 0; i < manifest.size(); ++i) {
    if (mirror.bytes(i) != manifest.at(i).nbytes())
      throw Error(Errc::invalid_argument, "cuda: mirrored tensor " + std::to_string(i) + " has " +
                                              std::to_string(mirror.bytes(i)) + " bytes; '" + manifest.at(i).name +
                                              "' has " + std::to_string(manifest.at(i).nbytes()));
    w.tensors.emplace_back(mirror.host(i), mirror.bytes(i));
  }
  return w;
}

EncodedDelta encode_from_device(const ConstWeights& base, DeviceDiffMirror& next, const StateDigest& base_digest,
                                VersionIds ids, const EncodeOptions& options, PullStats* pull) {
  check_weights(base);
  const PullStats stats = next.pull();
  if (pull) *pull = stats;
  return encode_delta(base, mirror_weights(*base.manifest, next), base_digest, ids, options);
}

}  // namespace deltacast::codec::cuda
