// The public C++ API (attn_ops.h): typed calls through the dispatcher, so LibTorch programs get the
// same backend selection and autograd as torch.ops.attn_ops.* in Python.
#include "attn_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace attn_ops {

std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             std::optional<double> scale, bool causal, int64_t window_left,
                                             int64_t window_right, double softcap,
                                             const std::optional<at::Tensor>& cu_seqlens_q,
                                             const std::optional<at::Tensor>& cu_seqlens_k,
                                             std::optional<c10::SymInt> max_seqlen_q,
                                             std::optional<c10::SymInt> max_seqlen_k,
                                             const std::optional<at::Tensor>& sinks, int64_t attention_chunk,
                                             const std::optional<at::Tensor>& alibi_slopes, bool deterministic) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::attention", "")
                             .typed<decltype(attention)>();
  return op.call(q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, sinks, attention_chunk, alibi_slopes, deterministic);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& dlse, std::optional<double> scale, bool causal,
    int64_t window_left, int64_t window_right, double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
    const std::optional<at::Tensor>& cu_seqlens_k, std::optional<c10::SymInt> max_seqlen_q,
    std::optional<c10::SymInt> max_seqlen_k, int64_t attention_chunk, const std::optional<at::Tensor>& alibi_slopes,
    bool deterministic) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::attention_backward", "")
                             .typed<decltype(attention_backward)>();
  return op.call(dout, q, k, v, out, lse, dlse, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                 cu_seqlens_k, max_seqlen_q, max_seqlen_k, attention_chunk, alibi_slopes, deterministic);
}

void kv_cache_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& cache_batch_idx,
                     const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::kv_cache_append", "")
                             .typed<decltype(kv_cache_append)>();
  op.call(k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, k_scale, v_scale);
}

void paged_kv_cache_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& slot_mapping, const std::optional<at::Tensor>& k_scale,
                           const std::optional<at::Tensor>& v_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::paged_kv_cache_append", "")
                             .typed<decltype(paged_kv_cache_append)>();
  op.call(k_cache, v_cache, k, v, slot_mapping, k_scale, v_scale);
}

std::tuple<at::Tensor, at::Tensor> attention_with_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                                                          const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                          const std::optional<at::Tensor>& block_table,
                                                          std::optional<double> scale, bool causal,
                                                          int64_t window_left, int64_t window_right, double softcap,
                                                          const std::optional<at::Tensor>& cu_seqlens_q,
                                                          std::optional<c10::SymInt> max_seqlen_q,
                                                          const std::optional<at::Tensor>& cache_batch_idx,
                                                          const std::optional<at::Tensor>& cache_leftpad,
                                                          const std::optional<at::Tensor>& sinks,
                                                          int64_t attention_chunk,
                                                          const std::optional<at::Tensor>& alibi_slopes,
                                                          int64_t num_splits,
                                                          const std::optional<at::Tensor>& k_scale,
                                                          const std::optional<at::Tensor>& v_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::attention_with_kvcache", "")
                             .typed<decltype(attention_with_kvcache)>();
  return op.call(q, k_cache, v_cache, cache_seqlens, block_table, scale, causal, window_left, window_right, softcap,
                 cu_seqlens_q, max_seqlen_q, cache_batch_idx, cache_leftpad, sinks, attention_chunk, alibi_slopes,
                 num_splits, k_scale, v_scale);
}

at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& positions, bool interleaved, bool inverse) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::rotary_embedding", "")
                             .typed<decltype(rotary_embedding)>();
  return op.call(x, cos, sin, positions, interleaved, inverse);
}

void rotary_embedding_(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions,
                       bool interleaved, bool inverse) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::rotary_embedding_", "")
                             .typed<decltype(rotary_embedding_)>();
  op.call(x, cos, sin, positions, interleaved, inverse);
}

void mla_cache_append(const at::Tensor& latent_cache, const at::Tensor& c_kv, const at::Tensor& k_pe,
                      const std::optional<at::Tensor>& cache_seqlens, const std::optional<at::Tensor>& slot_mapping,
                      const std::optional<at::Tensor>& cache_batch_idx, const std::optional<at::Tensor>& kv_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::mla_cache_append", "")
                             .typed<decltype(mla_cache_append)>();
  op.call(latent_cache, c_kv, k_pe, cache_seqlens, slot_mapping, cache_batch_idx, kv_scale);
}

std::tuple<at::Tensor, at::Tensor> mla_decode(const at::Tensor& q_latent, const at::Tensor& q_rope,
                                              const at::Tensor& latent_cache, const at::Tensor& cache_seqlens,
                                              double scale, const std::optional<at::Tensor>& block_table,
                                              bool causal, const std::optional<at::Tensor>& cu_seqlens_q,
                                              std::optional<c10::SymInt> max_seqlen_q,
                                              const std::optional<at::Tensor>& cache_batch_idx,
                                              const std::optional<at::Tensor>& cache_leftpad,
                                              const std::optional<at::Tensor>& kv_scale) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::mla_decode", "")
                             .typed<decltype(mla_decode)>();
  return op.call(q_latent, q_rope, latent_cache, cache_seqlens, scale, block_table, causal, cu_seqlens_q, max_seqlen_q,
                 cache_batch_idx, cache_leftpad, kv_scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> additive_attention(const at::Tensor& qp, const at::Tensor& kp,
                                                                  const at::Tensor& w, const at::Tensor& v,
                                                                  const std::optional<at::Tensor>& key_padding_mask,
                                                                  bool return_weights) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::additive_attention", "")
                             .typed<decltype(additive_attention)>();
  return op.call(qp, kp, w, v, key_padding_mask, return_weights);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> additive_attention_backward(
    const at::Tensor& dout, const std::optional<at::Tensor>& dlse, const at::Tensor& qp, const at::Tensor& kp,
    const at::Tensor& w, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const std::optional<at::Tensor>& key_padding_mask) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::additive_attention_backward", "")
                             .typed<decltype(additive_attention_backward)>();
  return op.call(dout, dlse, qp, kp, w, v, out, lse, key_padding_mask);
}

std::tuple<at::Tensor, at::Tensor> lightning_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& slope, double scale,
                                                       const std::optional<at::Tensor>& initial_state,
                                                       const std::optional<at::Tensor>& cu_seqlens,
                                                       std::optional<c10::SymInt> max_seqlen,
                                                       std::optional<int64_t> block_size) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::lightning_attention", "")
                             .typed<decltype(lightning_attention)>();
  return op.call(q, k, v, slope, scale, initial_state, cu_seqlens, max_seqlen, block_size);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lightning_attention_backward(
    const at::Tensor& dout, const std::optional<at::Tensor>& dfinal_state, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& slope, double scale, const std::optional<at::Tensor>& initial_state,
    const std::optional<at::Tensor>& cu_seqlens, std::optional<c10::SymInt> max_seqlen,
    std::optional<int64_t> block_size) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::lightning_attention_backward", "")
                             .typed<decltype(lightning_attention_backward)>();
  return op.call(dout, dfinal_state, q, k, v, slope, scale, initial_state, cu_seqlens, max_seqlen, block_size);
}

at::Tensor lightning_attention_decode_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& state, const at::Tensor& slope, double scale,
                                       const std::optional<at::Tensor>& state_indices) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("attn_ops::lightning_attention_decode_", "")
                             .typed<decltype(lightning_attention_decode_)>();
  return op.call(q, k, v, state, slope, scale, state_indices);
}

}  // namespace attn_ops
