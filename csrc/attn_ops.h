// Public C++ API of attn_ops for LibTorch programs: one typed function per operator of the library, with the
// defaults of its schema (csrc/registration.cpp).
//
// Each function calls the registered operator through the PyTorch dispatcher, so it runs the CPU or
// CUDA kernel that matches the inputs and records autograd history when the inputs require grad.
// Link the attn_ops library (CMake target `attn_ops`) so its operators are registered.
// Shapes and semantics: docs/<family>_api.md (attention, kvcache, rotary, mla, additive, lightning).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <optional>
#include <tuple>

namespace attn_ops {

// Scaled dot-product attention with grouped / multi-query heads.
//   dense : q [batch, seqlen_q, heads_q, head_dim_qk], k [batch, seqlen_k, heads_kv, head_dim_qk],
//           v [batch, seqlen_k, heads_kv, head_dim_v]
//           -> out [batch, seqlen_q, heads_q, head_dim_v], lse [batch, heads_q, seqlen_q]
//   varlen: q [total_q, heads_q, head_dim_qk] ... with cu_seqlens_q / cu_seqlens_k (int32 [batch + 1])
//           -> out [total_q, heads_q, head_dim_v], lse [heads_q, total_q]
std::tuple<at::Tensor, at::Tensor> attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    std::optional<double> scale = std::nullopt,
    bool causal = false,
    int64_t window_left = -1,
    int64_t window_right = -1,
    double softcap = 0.0,
    const std::optional<at::Tensor>& cu_seqlens_q = std::nullopt,
    const std::optional<at::Tensor>& cu_seqlens_k = std::nullopt,
    std::optional<c10::SymInt> max_seqlen_q = std::nullopt,
    std::optional<c10::SymInt> max_seqlen_k = std::nullopt,
    // Attention sinks (float32 or q's dtype [heads_q], docs/attention_api.md): exp(sinks[h]) joins every row's
    // softmax denominator; lse includes it. Differentiable.
    const std::optional<at::Tensor>& sinks = std::nullopt,
    // Chunked-local attention: with C > 0, position p sees only the keys of its chunk [p / C * C, p / C * C + C).
    int64_t attention_chunk = 0,
    // ALiBi (float32 [heads_q] or [batch, heads_q]): the score of query position p and key position j gains
    // -slope * |p - j| after soft-capping (positions bottom-right aligned). Not differentiable.
    const std::optional<at::Tensor>& alibi_slopes = std::nullopt,
    // The backward in a fixed summation order (also when torch.are_deterministic_algorithms_enabled()): on CUDA
    // the kernels without atomics; the CPU's is always deterministic.
    bool deterministic = false);

// Gradients of `attention` with respect to q, k and v (dk/dv summed over each KV group's query heads).
// `dlse`, when given, is the gradient flowing into the lse output.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout,
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& out,
    const at::Tensor& lse,
    const std::optional<at::Tensor>& dlse = std::nullopt,
    std::optional<double> scale = std::nullopt,
    bool causal = false,
    int64_t window_left = -1,
    int64_t window_right = -1,
    double softcap = 0.0,
    const std::optional<at::Tensor>& cu_seqlens_q = std::nullopt,
    const std::optional<at::Tensor>& cu_seqlens_k = std::nullopt,
    std::optional<c10::SymInt> max_seqlen_q = std::nullopt,
    std::optional<c10::SymInt> max_seqlen_k = std::nullopt,
    // As the forward's; the forward's sinks need nothing here (lse and out already include them).
    int64_t attention_chunk = 0,
    const std::optional<at::Tensor>& alibi_slopes = std::nullopt,
    bool deterministic = false);

// Writes k [batch, seqlen_new, heads_kv, head_dim] (and v) into the contiguous cache
// k_cache [batch, capacity, heads_kv, head_dim] at each row's current length cache_seqlens[b] (int32).
// With cache_batch_idx (int32 [batch]), row b goes to cache row cache_batch_idx[b] of a cache with any number of
// rows; repeated rows are allowed: where two batch rows write one position, the higher batch row's token lands.
// 8-bit caches (float8_e4m3fn / float8_e5m2, CPU) store saturate(k / k_scale) (v / v_scale): float32 scales of
// shape [] / [1] / [heads_kv], default 1 (docs/kvcache_api.md).
void kv_cache_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& cache_seqlens,
                     const std::optional<at::Tensor>& cache_batch_idx = std::nullopt,
                     const std::optional<at::Tensor>& k_scale = std::nullopt,
                     const std::optional<at::Tensor>& v_scale = std::nullopt);

// Writes k [num_tokens, heads_kv, head_dim] (and v) into the paged cache [num_blocks, block_size, heads_kv,
// head_dim] at slot_mapping[i] (block * block_size + offset; -1 skips the token).
void paged_kv_cache_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& slot_mapping, const std::optional<at::Tensor>& k_scale = std::nullopt,
                           const std::optional<at::Tensor>& v_scale = std::nullopt);

// Attention of q [batch, seqlen_q, heads_q, head_dim] (the last seqlen_q positions of each row) over the
// first cache_seqlens[b] keys of a contiguous cache, or of a paged one when block_table is given.
// -> out [batch, seqlen_q, heads_q, head_dim_v], lse [batch, heads_q, seqlen_q]
std::tuple<at::Tensor, at::Tensor> attention_with_kvcache(
    const at::Tensor& q,
    const at::Tensor& k_cache,
    const at::Tensor& v_cache,
    const at::Tensor& cache_seqlens,
    const std::optional<at::Tensor>& block_table = std::nullopt,
    std::optional<double> scale = std::nullopt,
    bool causal = true,
    int64_t window_left = -1,
    int64_t window_right = -1,
    double softcap = 0.0,
    // Serving batches (docs/kvcache_api.md): q packed [total_q, heads_q, head_dim] with cu_seqlens_q
    // (int32 [batch + 1]) -> out [total_q, heads_q, head_dim_v], lse [heads_q, total_q]; cache_batch_idx
    // (int32 [batch]) picks each row's cache (or block-table) row; cache_leftpad (int32 [batch]) the cache
    // position of each row's first key.
    const std::optional<at::Tensor>& cu_seqlens_q = std::nullopt,
    std::optional<c10::SymInt> max_seqlen_q = std::nullopt,
    const std::optional<at::Tensor>& cache_batch_idx = std::nullopt,
    const std::optional<at::Tensor>& cache_leftpad = std::nullopt,
    // As attention's; chunk and ALiBi positions are cache positions (from cache_leftpad[b]).
    const std::optional<at::Tensor>& sinks = std::nullopt,
    int64_t attention_chunk = 0,
    const std::optional<at::Tensor>& alibi_slopes = std::nullopt,
    // The most key splits a row's keys are cut into (0: automatic; 1: none, so that a row's result does not
    // depend on the other rows of the batch).
    int64_t num_splits = 0,
    // An 8-bit cache's dequantization scales (float32 [] / [1] / [heads_kv]): keys read as k_cache * k_scale.
    const std::optional<at::Tensor>& k_scale = std::nullopt,
    const std::optional<at::Tensor>& v_scale = std::nullopt);

// Rotary position embedding (docs/rotary_api.md): x [..., heads, head_dim] rotated at positions (int32 /
// int64 [...], x's leading dims) by the tables cos / sin [max_positions, rotary_dim / 2] (float32 or x's
// dtype); the first rotary_dim features rotate as half-split pairs (i, i + rotary_dim / 2), or as adjacent
// pairs when interleaved; inverse rotates by -angle. -> a new tensor of x's shape. Differentiable in x.
at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions, bool interleaved = false, bool inverse = false);

// The same rotation, written into x (in place; x may not overlap cos, sin or positions).
void rotary_embedding_(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                       bool interleaved = false, bool inverse = false);

// MLA: writes [c_kv ; k_pe] rows into a latent cache, contiguous [batch, capacity, d_c + d_rope] (with
// cache_seqlens) or paged [num_blocks, block_size, d_c + d_rope] (with slot_mapping). Exactly one of the two.
void mla_cache_append(const at::Tensor& latent_cache, const at::Tensor& c_kv, const at::Tensor& k_pe,
                      const std::optional<at::Tensor>& cache_seqlens = std::nullopt,
                      const std::optional<at::Tensor>& slot_mapping = std::nullopt,
                      const std::optional<at::Tensor>& cache_batch_idx = std::nullopt,
                      const std::optional<at::Tensor>& kv_scale = std::nullopt);

// MLA absorbed decode: q_latent [batch, seqlen_q, heads, d_c], q_rope [batch, seqlen_q, heads, d_rope] over
// the latent cache -> out_latent [batch, seqlen_q, heads, d_c], lse [batch, heads, seqlen_q].
std::tuple<at::Tensor, at::Tensor> mla_decode(const at::Tensor& q_latent, const at::Tensor& q_rope,
                                              const at::Tensor& latent_cache, const at::Tensor& cache_seqlens,
                                              double scale, const std::optional<at::Tensor>& block_table = std::nullopt,
                                              bool causal = true,
                                              const std::optional<at::Tensor>& cu_seqlens_q = std::nullopt,
                                              std::optional<c10::SymInt> max_seqlen_q = std::nullopt,
                                              const std::optional<at::Tensor>& cache_batch_idx = std::nullopt,
                                              const std::optional<at::Tensor>& cache_leftpad = std::nullopt,
                                              const std::optional<at::Tensor>& kv_scale = std::nullopt);

// Additive (Bahdanau) attention, score_ij = w . tanh(qp_i + kp_j), streamed over keys (never
// [batch, query_len, key_len, hidden]): qp [batch, query_len, hidden], kp [batch, key_len, hidden], w [hidden],
// v [batch, key_len, value_dim], key_padding_mask bool [batch, key_len] (true = padded) -> out
// [batch, query_len, value_dim], lse [batch, query_len], weights [batch, query_len, key_len] (empty [0]
// unless return_weights). Semantics: docs/additive_api.md.
std::tuple<at::Tensor, at::Tensor, at::Tensor> additive_attention(
    const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& w, const at::Tensor& v,
    const std::optional<at::Tensor>& key_padding_mask = std::nullopt, bool return_weights = false);

// Gradients of additive_attention for qp, kp, w and v (dlse optional).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> additive_attention_backward(
    const at::Tensor& dout, const std::optional<at::Tensor>& dlse, const at::Tensor& qp, const at::Tensor& kp,
    const at::Tensor& w, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& key_padding_mask = std::nullopt);

// Lightning attention (linear attention with a per-head decay, docs/lightning_api.md): q [batch, seqlen, heads,
// head_dim], k [.., heads_kv, head_dim], v [.., heads_kv, head_dim_v] (or packed [total, ...] with cu_seqlens),
// slope float32 [heads] -> out [batch, seqlen, heads, head_dim_v], final_state [batch, heads, head_dim,
// head_dim_v] (float32; float64 for float64 inputs). Differentiable in q, k, v and initial_state.
std::tuple<at::Tensor, at::Tensor> lightning_attention(
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& slope,
    double scale = 1.0,
    const std::optional<at::Tensor>& initial_state = std::nullopt,
    const std::optional<at::Tensor>& cu_seqlens = std::nullopt,
    std::optional<c10::SymInt> max_seqlen = std::nullopt,
    std::optional<int64_t> block_size = std::nullopt);

// Its backward: -> dq, dk, dv, dinitial_state.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lightning_attention_backward(
    const at::Tensor& dout,
    const std::optional<at::Tensor>& dfinal_state,
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const at::Tensor& slope,
    double scale = 1.0,
    const std::optional<at::Tensor>& initial_state = std::nullopt,
    const std::optional<at::Tensor>& cu_seqlens = std::nullopt,
    std::optional<c10::SymInt> max_seqlen = std::nullopt,
    std::optional<int64_t> block_size = std::nullopt);

// Advances the state pool [num_slots, heads, head_dim, head_dim_v] in place over the seqlen_q new tokens of
// each row (slot state_indices[b], -1 skips) -> out [batch, seqlen_q, heads, head_dim_v].
at::Tensor lightning_attention_decode_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& state, const at::Tensor& slope, double scale = 1.0,
                                       const std::optional<at::Tensor>& state_indices = std::nullopt);

}  // namespace attn_ops
