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
}
