// The one contract between the preparation of a softmax-attention call and the backends that run it.
// attention, attention_backward, attention_with_kvcache and mla_decode each prepare (validate, size, resolve
// defaults) into an AttentionCall, and every backend (CPU, CUDA, Meta) takes it as is: a new option is one
// more field here, set by the preparations and read by the kernels.
#pragma once

#include "common/attention_checks.h"
#include "common/cache_dtype.h"
#include "common/serving.h"

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <optional>

namespace attn_ops {

// Where a call's keys and values come from.
enum class KeySource {
  dense,   // k, v: [batch, seqlen_k, heads_kv, dim]
  varlen,  // k, v: packed [total_k, heads_kv, dim], sequences by cu_seqlens_k
  cache,   // k, v: a contiguous cache [cache_rows, capacity, heads_kv, dim], lengths in cache_seqlens
  paged,   // k, v: a paged cache [num_blocks, block_size, heads_kv, dim] through block_table
};

// One validated softmax-attention call.
struct AttentionCall {
  const char* op = "";               // the op's name, for the checks a backend makes later (on the device)
  const char* cache_name = "k_cache";  // the cache argument's name in those messages
  KeySource keys = KeySource::dense;

  // The views the kernels read. q: [batch, seqlen_q, heads_q, dim_qk], or packed [total_q, heads_q, dim_qk]
  // when cu_seqlens_q is given; k / v as `keys` says (dim_qk / dim_v). MLA's absorbed decode: q is
  // [q_latent, q_rope] and k, v are views of one latent cache with one KV head.
  at::Tensor q, k, v;

  // Sequences: int32 [batch + 1] offsets of packed queries (varlen, or ragged queries over a cache) and keys
  // (varlen only), with optional bounds on their longest runs.
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k;
  std::optional<int64_t> max_seqlen_q, max_seqlen_k;

  // Cache rows (cache / paged), each int32: lengths [batch]; block table [table_rows, max_blocks_per_seq];
  // the cache (or block-table) row of each sequence [batch] (default: b); the cache position of each
  // sequence's first key [batch] (default: 0). Semantics: docs/kvcache_api.md.
  std::optional<at::Tensor> cache_seqlens, block_table, cache_batch_idx, cache_leftpad;

  // Options, as given.
  std::optional<double> given_scale;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded
  double softcap = 0.0;
  PatternOptions patterns;  // sinks, ALiBi, chunks
  // An 8-bit cache's dequantization scales (keys: k; values: v), as given; the cache dtype says whether k and v
  // are 8-bit (is_8bit_cache_dtype), q and the outputs stay in the model's dtype.
  CacheScales cache_scales;
  // How to run, not what: the most key splits of a forward (0: automatic; 1: none, so that a row's result does not
  // depend on the rest of the batch), and a backward in a fixed summation order.
  int64_t num_splits = 0;
  bool deterministic = false;

  // Sizes (SymInts, so the Meta kernels size outputs under dynamic shapes). batch: sequences; seqlen_q:
  // queries per sequence (dense) or total_q (packed); seqlen_k: keys per sequence (dense), total_k (varlen),
  // or the keys one cache row can hold (cache: capacity; paged: max_blocks_per_seq * block_size).
  c10::SymInt batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v;

  // out: [batch, seqlen_q, heads_q, dim_v] and lse: [batch, heads_q, seqlen_q], or packed [total_q, heads_q,
  // dim_v] and [heads_q, total_q].
  OutLseSizes outputs;

  bool packed_q() const { return cu_seqlens_q.has_value(); }
  bool varlen() const { return keys == KeySource::varlen; }
  bool over_cache() const { return keys == KeySource::cache || keys == KeySource::paged; }
  bool paged() const { return keys == KeySource::paged; }
  bool cache_8bit() const { return is_8bit_cache_dtype(k.scalar_type()); }
  // The resolved softmax scale (guards head_dim_qk: call it only in a kernel that runs).
  double scale() const { return resolve_scale(given_scale, head_dim_qk); }
  // causal is the window (window_left, 0).
  int64_t effective_window_right() const { return causal ? 0 : window_right; }
  // Sets the key source (paged when a block table is given) and the sequences and cache rows of a call over a
  // cache.
  void set_cache_rows(const at::Tensor& lengths, const std::optional<at::Tensor>& table, const KvCacheRows& rows) {
    keys = table.has_value() ? KeySource::paged : KeySource::cache;
    cache_seqlens = lengths;
    block_table = table;
    cu_seqlens_q = rows.cu_seqlens_q;
    max_seqlen_q = rows.max_seqlen_q;
    cache_batch_idx = rows.cache_batch_idx;
    cache_leftpad = rows.cache_leftpad;
  }
  // The serving-step arguments over a cache, as their shared checks take them.
  KvCacheRows cache_rows() const { return KvCacheRows{cu_seqlens_q, max_seqlen_q, cache_batch_idx, cache_leftpad}; }
};

// One validated call of attention_backward: the forward's call plus the tensors of its gradient.
struct AttentionBackwardCall : AttentionCall {
  at::Tensor dout, out;            // as the forward's out
  at::Tensor lse;                  // as the forward's lse
  std::optional<at::Tensor> dlse;  // lse's gradient, when lse was used
};

// A backend's attention forward of a prepared call, any key source: writes out and lse (allocated by the caller
// from call.outputs).
using AttentionForwardFn = void (*)(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse);

// A backend's attention backward of a prepared call (dense or varlen): writes dq, dk and dv (shaped as q, k, v).
using AttentionBackwardFn = void (*)(const AttentionBackwardCall& call, const at::Tensor& dq, const at::Tensor& dk,
                                     const at::Tensor& dv);

// The attention forward of each backend, which the other softmax families (MLA's absorbed decode) run on.
namespace cpu {
void attention_forward(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse);
}  // namespace cpu
namespace cuda {
void attention_forward(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse);
}  // namespace cuda

}  // namespace attn_ops
