#pragma once
// A producer group's parts as the trainer has them (ProducerGroupOptions::parts,
// codec::Partition::from_parts), from what a user can write: the C API's and the config's
// `group_parts` (docs/producer-group.md, "Parts"). The partition rules themselves (every element
// exactly once) are codec::Partition's; these only translate.
#include <cstdint>
#include <string>
#include <vector>

#include "codec/manifest.h"
#include "codec/partition.h"
#include "tree/protocol.h"

namespace deltacast::tree {

// A JSON array with one entry per rank, each an array of tensor names (the whole tensor) or
// [name, first, end] (its elements [first, end)). Throws Error(config) "group_parts: ..." naming
// what is wrong (not JSON, not one entry per rank, an unknown tensor, elements out of range).
std::vector<std::vector<codec::PartRange>> parse_group_parts(const std::string& text, const codec::Manifest& manifest,
                                                             uint32_t ranks);

// The shard files a sharded checkpoint lies in (layout.shards, in the index's sorted order: a
// trainer's model-0000k-of-0000n files) dealt to `ranks` ranks in consecutive blocks: file i goes
// to rank i * ranks / files, so with one file per rank, rank r sends the file it wrote. Each rank's
// part is the whole tensors of its files. Throws Error(config) when the layout is not sharded
// (the synthetic trainer, one model.safetensors) or has fewer files than ranks (a rank would send
// nothing), naming the counts.
std::vector<std::vector<codec::PartRange>> shard_parts(const CheckpointLayout& layout, const codec::Manifest& manifest,
                                                       uint32_t ranks);

}  // namespace deltacast::tree
