// Every operator schema of attn_ops, in one place. Kernels are registered per backend next to their
// code (TORCH_LIBRARY_IMPL in <family>/cpu, <family>/cuda, <family>/autograd.cpp, Meta in <family>/meta.cpp).
#include <torch/library.h>

TORCH_LIBRARY(attn_ops, m) {
  // Attention over dense [batch, seqlen, heads, head_dim] or packed varlen [total, heads, head_dim]
  // inputs (cu_seqlens_q / cu_seqlens_k). Semantics: docs/attention_api.md.
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, *, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
      "SymInt? max_seqlen_q=None, SymInt? max_seqlen_k=None, Tensor? sinks=None, int attention_chunk=0, "
      "Tensor? alibi_slopes=None, bool deterministic=False) -> (Tensor out, Tensor lse)");
  m.def(
      "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, *, "
      "Tensor? dlse=None, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, float softcap=0.0, "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
      "SymInt? max_seqlen_q=None, SymInt? max_seqlen_k=None, int attention_chunk=0, "
      "Tensor? alibi_slopes=None, bool deterministic=False) "
      "-> (Tensor dq, Tensor dk, Tensor dv)");

  // KV-cache writes: in place, every mutated tensor declared, nothing returned. Semantics:
  // docs/kvcache_api.md.
  m.def(
      "kv_cache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor cache_seqlens, *, "
      "Tensor? cache_batch_idx=None, Tensor? k_scale=None, Tensor? v_scale=None) -> ()");
  m.def(
      "paged_kv_cache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
      "Tensor slot_mapping, *, Tensor? k_scale=None, Tensor? v_scale=None) -> ()");
  // Attention of the last seqlen_q positions of each row over its contiguous or paged KV cache.
  m.def(
      "attention_with_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, *, "
      "Tensor? block_table=None, float? scale=None, bool causal=True, int window_left=-1, "
      "int window_right=-1, float softcap=0.0, Tensor? cu_seqlens_q=None, SymInt? max_seqlen_q=None, "
      "Tensor? cache_batch_idx=None, Tensor? cache_leftpad=None, Tensor? sinks=None, int attention_chunk=0, "
      "Tensor? alibi_slopes=None, int num_splits=0, Tensor? k_scale=None, Tensor? v_scale=None) "
      "-> (Tensor out, Tensor lse)");

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
      "Tensor? slot_mapping=None, Tensor? cache_batch_idx=None, Tensor? kv_scale=None) -> ()");
  m.def(
      "mla_decode(Tensor q_latent, Tensor q_rope, Tensor latent_cache, Tensor cache_seqlens, *, float scale, "
      "Tensor? block_table=None, bool causal=True, Tensor? cu_seqlens_q=None, SymInt? max_seqlen_q=None, "
      "Tensor? cache_batch_idx=None, Tensor? cache_leftpad=None, Tensor? kv_scale=None) "
      "-> (Tensor out_latent, Tensor lse)");

  // Additive (Bahdanau) attention, w . tanh(qp_i + kp_j), streamed over keys. Always three outputs
  // (fixed arity for torch.compile): weights is [batch, query_len, key_len] when return_weights, else
  // an empty [0] tensor. Semantics: docs/additive_api.md.
  m.def(
      "additive_attention(Tensor qp, Tensor kp, Tensor w, Tensor v, *, Tensor? key_padding_mask=None, "
      "bool return_weights=False) -> (Tensor out, Tensor lse, Tensor weights)");
  m.def(
      "additive_attention_backward(Tensor dout, Tensor? dlse, Tensor qp, Tensor kp, Tensor w, Tensor v, "
      "Tensor out, Tensor lse, *, Tensor? key_padding_mask=None) -> (Tensor dqp, Tensor dkp, Tensor dw, Tensor dv)");

  // Lightning attention (linear attention with a per-head decay, MiniMax-Text-01's form): chunked prefill
  // with a float32 running state, its backward, and the in-place state update of decoding.
  // Semantics: docs/lightning_api.md.
  m.def(
      "lightning_attention(Tensor q, Tensor k, Tensor v, Tensor slope, *, float scale=1.0, "
      "Tensor? initial_state=None, Tensor? cu_seqlens=None, SymInt? max_seqlen=None, int? block_size=None) "
      "-> (Tensor out, Tensor final_state)");
  m.def(
      "lightning_attention_backward(Tensor dout, Tensor? dfinal_state, Tensor q, Tensor k, Tensor v, Tensor slope, "
      "*, float scale=1.0, Tensor? initial_state=None, Tensor? cu_seqlens=None, SymInt? max_seqlen=None, "
      "int? block_size=None) -> (Tensor dq, Tensor dk, Tensor dv, Tensor dinitial_state)");
  m.def(
      "lightning_attention_decode_(Tensor q, Tensor k, Tensor v, Tensor(a!) state, Tensor slope, *, "
      "float scale=1.0, Tensor? state_indices=None) -> Tensor");

  // Internal: the gradient that a backward through a non-differentiable op's outputs would give `input`.
  // Running it raises `message`; its Meta kernel returns an empty tensor like `input`, so torch.compile can
  // trace that backward (it traces it ahead whenever an output requires grad) and the error comes only if a
  // backward actually runs (common/no_autograd.cpp).
  m.def("_not_differentiable_grad(Tensor grad, Tensor input, str message) -> Tensor");
  // Test hook of CUDA builds: the launch parameters the last call of a CUDA kernel recorded (kernel
  // attention/cuda/launch_record.cu; a CPU-only build has none, and calling it raises).
  m.def("_cuda_last_launch(Tensor device, str kernel) -> int[]");
  // Test hook of CUDA builds: where the last attention `stage` ("forward", "backward") ran and why,
  // "<cudnn|native>: <reason>" ("" before the first; attention/cuda/backend_route.h).
  m.def("_cuda_last_route(Tensor device, str stage) -> str");
  // Test hook of builds with the cuDNN backend: validates, for compute capability `sm`, the cuDNN graph of the
  // attention call these (meta) tensors and options describe: "" when cuDNN takes it, else cuDNN's message.
  // Needs no GPU (kernel attention/cuda/cudnn_hooks.cpp).
  m.def(
      "_cudnn_validate_attention(Tensor q, Tensor k, Tensor v, *, bool causal=False, int window_left=-1, "
      "int window_right=-1, bool backward=False, Tensor? cache_seqlens=None, Tensor? block_table=None, int sm=90) "
      "-> str");
}
