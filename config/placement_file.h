#pragma once
// A receiver's placement as a file (docs/placement.md, "Placement files"): YAML, or JSON (the same
// fields), read into codec::BufferPlacement and written back. The file is a mapping, in buffer
// order, from each buffer's name to its parts, or to a mapping with its parts and options:
//
//   model.layers.0.self_attn.qkv_proj.weight:          # parts, as [tensor, dim, start, stop(, at)]
//     - [model.layers.0.self_attn.q_proj.weight, 0, 0, 2048]
//     - [model.layers.0.self_attn.k_proj.weight, 0, 0, 256]
//   model.embed_tokens.weight:                          # or with options
//     parts: [{tensor: model.embed_tokens.weight, dim: 0, start: 64, stop: 100}]
//     shape: [64, 4096]                                 # larger than the parts: padding
//     stack: false                                      # parts along a new leading dimension
//     bytes: 524288                                     # checked against the shape
//
// Python's `{buffer: [(tensor, dim, start, stop), ...]}` dumped as JSON is such a file. Reading
// checks the file's form (with FILE:LINE:COL); Placement::compile then checks it against a manifest.
#include <string>
#include <string_view>
#include <vector>

#include "codec/placement.h"

namespace deltacast::config {

// Parses a placement document. Throws Error(config) "SOURCE:LINE:COL: ..." for malformed YAML or
// JSON, a document that is not a mapping, an empty buffer, a part that is not [tensor, dim, start,
// stop(, at)] or {tensor, dim, start, stop(, at)}, a number that is not a non-negative integer,
// an unknown or duplicate key, or a buffer named twice.
std::vector<codec::BufferPlacement> parse_placement(std::string_view text, const std::string& source);

// Reads and parses the placement file at `path`. Throws Error(io) when it cannot be read, else as
// parse_placement.
std::vector<codec::BufferPlacement> load_placement_file(const std::string& path);

// The placement as a YAML document that parse_placement reads back equal: names double-quoted,
// parts in flow form, options (shape, stack, bytes) only where set.
std::string placement_yaml(const std::vector<codec::BufferPlacement>& buffers);

}  // namespace deltacast::config
