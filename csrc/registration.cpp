// Every operator schema of attn_ops, in one place. Kernels are registered per backend next to their
// code (TORCH_LIBRARY_IMPL in <family>/cpu, <family>/cuda, <family>/autograd.cpp, Meta in <family>.cpp).
#include <torch/library.h>

TORCH_LIBRARY(attn_ops, m) {
  // Attention over dense [batch, seqlen, heads, head_dim] or packed varlen [total, heads, head_dim]
  // inputs (cu_seqlens_q / cu_seqlens_k). Semantics: docs/attention_api.md.
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, *, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
      "int? max_seqlen_q=None, int? max_seqlen_k=None) -> (Tensor out, Tensor lse)");
  m.def(
      "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, *, "
      "Tensor? dlse=None, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
      "int? max_seqlen_q=None, int? max_seqlen_k=None) -> (Tensor dq, Tensor dk, Tensor dv)");

  // KV-cache writes: in place, every mutated tensor declared, nothing returned. Semantics:
  // docs/kvcache_api.md.
  m.def(
      "kv_cache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor cache_seqlens, *, "
      "Tensor? cache_batch_idx=None) -> ()");
  m.def(
      "paged_kv_cache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
      "Tensor slot_mapping) -> ()");
  // Attention of the last seqlen_q positions of each row over its contiguous or paged KV cache.
  m.def(
      "attention_with_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, *, "
      "Tensor? block_table=None, float? scale=None, bool causal=True, int window_left=-1, "
      "int window_right=-1, float softcap=0.0, Tensor? cu_seqlens_q=None, int? max_seqlen_q=None, "
      "Tensor? cache_batch_idx=None, Tensor? cache_leftpad=None) -> (Tensor out, Tensor lse)");

  // Rotary position embedding (half-split or interleaved pairs), out of place (differentiable) or in
  // place. Semantics: docs/rotary_api.md.
  m.def(
      "rotary_embedding(Tensor x, Tensor cos, Tensor sin, Tensor positions, *, bool interleaved=False, "
      "bool inverse=False) -> Tensor");
  m.def(
      "rotary_embedding_(Tensor(a!) x, Tensor cos, Tensor sin, Tensor positions, *, bool interleaved=False, "
      "bool inverse=False) -> ()");

  // MLA (DeepSeek-V2/V3): one latent cache row [c_kv ; k_pe] per token, and the absorbed decode over it.
  // Semantics: docs/mla_api.md.
  m.def(
      "mla_cache_append(Tensor(a!) latent_cache, Tensor c_kv, Tensor k_pe, *, Tensor? cache_seqlens=None, "
      "Tensor? slot_mapping=None, Tensor? cache_batch_idx=None) -> ()");
  m.def(
      "mla_decode(Tensor q_latent, Tensor q_rope, Tensor latent_cache, Tensor cache_seqlens, *, float scale, "
      "Tensor? block_table=None, bool causal=True, Tensor? cu_seqlens_q=None, int? max_seqlen_q=None, "
      "Tensor? cache_batch_idx=None, Tensor? cache_leftpad=None) -> (Tensor out_latent, Tensor lse)");
}
