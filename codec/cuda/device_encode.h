#pragma once
// Encoding a version whose new weights live in CUDA memory (the producer's device diff): the
// device tensors are pulled into a DeviceDiffMirror (only the change bitmap and the changed values
// cross PCIe) and the host encoder encodes the mirror, so the frames are byte-identical to
// encode_delta over the same bits in host memory.
//
// What still runs on the host: the encoder scans the mirror against its base (both host memory)
// to place and code the changes (the location coder's classes rank changes among all of a
// segment's base elements, so it reads the whole base anyway); a device-resident encoder that
// feeds it the device's change lists instead is not built (docs/embedding.md, "CUDA buffers").
#include "codec/cuda/device_mirror.h"
#include "codec/encoder.h"

namespace deltacast::codec::cuda {

// The host view of a mirror whose tensors are, in order, every tensor of `manifest` (each of
// manifest.at(i).nbytes() bytes). Error(invalid_argument) otherwise.
ConstWeights mirror_weights(const Manifest& manifest, const DeviceDiffMirror& mirror);

// Pulls `next` (a mirror of every tensor of base.manifest, in order) and encodes base -> next.
// Frames as encode_delta(base, <the device bits>, base_digest, ids, options). `pull`, when given,
// receives what crossed PCIe.
EncodedDelta encode_from_device(const ConstWeights& base, DeviceDiffMirror& next, const StateDigest& base_digest,
                                VersionIds ids, const EncodeOptions& options, PullStats* pull = nullptr);

}  // namespace deltacast::codec::cuda
