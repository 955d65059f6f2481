#pragma once
// The placement of one tensor-parallel worker of a Llama-style model as vLLM and SGLang shard it
// (docs/embedding.md, "Placements for an engine"): checkpoint names in, placement out, so an
// engine integration is a few lines. Pure.
//
// For TP rank r of t, over a checkpoint whose tensors carry Hugging Face Llama names:
//  - `*.self_attn.{q,k,v}_proj.weight` fuse into `*.self_attn.qkv_proj.weight`: rank r's rows of
//    q, then of k, then of v (column-parallel: each split by rows, dim 0);
//  - `*.mlp.{gate,up}_proj.weight` fuse into `*.mlp.gate_up_proj.weight` the same way;
//  - `*.self_attn.o_proj.weight` and `*.mlp.down_proj.weight`: rank r's columns (row-parallel,
//    dim 1);
//  - `model.embed_tokens.weight` and `lm_head.weight`: rank r's vocabulary rows, the vocabulary
//    padded to a multiple of `vocab_pad` (vLLM: 64) and split evenly; the last ranks' buffers have
//    padding rows no checkpoint row fills (never written), a rank whose rows are all padding has
//    no buffer for it;
//  - every other tensor (norms, biases of replicated layers): whole, under its own name (a 0-d
//    tensor, which no slice names, is not held).
// A split dimension that t does not divide (other than the vocabulary) is refused with
// Error(invalid_argument) naming the tensor: the engine would refuse it too. Key/value heads
// fewer than t (replicated by vLLM) are not expressed by this helper.
#include <cstdint>
#include <vector>

#include "codec/manifest.h"
#include "codec/placement.h"

namespace deltacast::codec {

std::vector<BufferPlacement> llama_tp_placement(const Manifest& manifest, uint32_t rank, uint32_t size,
                                                uint64_t vocab_pad = 64);

}  // namespace deltacast::codec
