// The lightning attention ops on top of a backend's passes: the shared preparation (lightning/validation.h),
// the output allocation, the backend, and for the backward the reduction of the per-query-head key and value
// gradients over each GQA group. CPU and CUDA instantiate these templates with their own functions, so a
// backend file holds only its passes and their launch; instantiated with nullptr they are the Meta kernels
// (the preparation and outputs of its SymInt shapes).
#pragma once

#include "common/checks.h"  // size_hint
#include "lightning/validation.h"

#include <ATen/ATen.h>

#include <optional>
#include <tuple>
#include <vector>

namespace attn_ops {

// An optional tensor argument as a possibly undefined tensor (the backends read undefined as "none": zeros).
inline at::Tensor undefined_if_none(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// A backend's forward of a prepared call: writes out [B, T, H, Dv] (or [total, H, Dv]) and final_state
// [B, H, Dk, Dv]. slope is contiguous; initial_state may be undefined.
using LightningForwardFn = void (*)(const LightningProblem& p, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const at::Tensor& slope, double scale,
                                    const at::Tensor& initial_state, const std::optional<at::Tensor>& cu_seqlens,
                                    const at::Tensor& out, const at::Tensor& final_state);

// A backend's backward of a prepared call: writes dq (q's shape and dtype), dk_heads / dv_heads (per QUERY
// head, in the state dtype: [B, T, H, Dk] / [B, T, H, Dv] or packed) and g1 = dL/dS_1 [B, H, Dk, Dv].
// dout has a stride-1 last dim; dfinal_state and initial_state may be undefined.
using LightningBackwardFn = void (*)(const LightningProblem& p, const at::Tensor& dout,
                                     const at::Tensor& dfinal_state, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& slope, double scale,
                                     const at::Tensor& initial_state, const std::optional<at::Tensor>& cu_seqlens,
                                     const at::Tensor& dq, const at::Tensor& dk_heads, const at::Tensor& dv_heads,
                                     const at::Tensor& g1);

// A backend's decode step of a prepared call: writes out [B, Tq, H, Dv] and advances the state pool
// [N, H, Dk, Dv] in place (slots: int32 [B] contiguous, or undefined for row b -> slot b).
using LightningDecodeFn = void (*)(const LightningProblem& p, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& state, const at::Tensor& slope,
                                   double scale, const at::Tensor& slots, const at::Tensor& out);

template <LightningForwardFn forward>
std::tuple<at::Tensor, at::Tensor> lightning_attention_on(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& v, const at::Tensor& slope, double scale,
                                                          const std::optional<at::Tensor>& initial_state,
                                                          const std::optional<at::Tensor>& cu_seqlens,
                                                          std::optional<c10::SymInt> max_seqlen,
                                                          std::optional<int64_t> block_size) {
  const LightningProblem p = prepare_lightning_attention("attn_ops.lightning_attention", q, k, v, slope, scale,
                                                         initial_state, cu_seqlens, size_hint(max_seqlen), block_size);
  at::Tensor out = at::empty_symint(p.out_sizes, q.options());                                // [B, T, H, Dv]
  at::Tensor final_state = at::empty_symint(p.state_sizes, q.options().dtype(p.state_dtype));  // [B, H, Dk, Dv]
  if constexpr (forward != nullptr) {
    forward(p, q, k, v, slope.contiguous(), scale, undefined_if_none(initial_state), cu_seqlens, out, final_state);
  }
  return {out, final_state};
}

// Gradients, with G_t = dL/dS_t = a^(T-t) dfinal_state + scale * sum_{j >= t} a^(j-t) q_j^T dout_j:
//   dq_t = scale * dout_t S_t^T       (the forward recurrence on (dout, v, k) from initial_state^T)
//   dk_t = v_t G_t^T, dv_t = k_t G_t  (the recurrence reversed in time, on (v, dout, q) and (k, q, dout))
//   dinitial_state = a * G_1          (the final state of the dv pass, decayed one step; an empty sequence
//                                      takes no step: its final state is its initial state, so G_1 itself)
// dk and dv are computed per query head and summed over each group here.
template <LightningBackwardFn backward>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lightning_attention_backward_on(
    const at::Tensor& dout, const std::optional<at::Tensor>& dfinal_state, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& slope, double scale, const std::optional<at::Tensor>& initial_state,
    const std::optional<at::Tensor>& cu_seqlens, std::optional<c10::SymInt> max_seqlen,
    std::optional<int64_t> block_size) {
  const LightningProblem p = prepare_lightning_attention_backward(dout, dfinal_state, q, k, v, slope, scale,
                                                                  initial_state, cu_seqlens, size_hint(max_seqlen),
                                                                  block_size);
  const auto acc_options = q.options().dtype(p.state_dtype);
  // [B, T] or [total], then the given trailing sizes.
  auto token_sizes = [&](std::initializer_list<c10::SymInt> tail) {
    std::vector<c10::SymInt> sizes(q.sym_sizes().begin(), q.sym_sizes().end() - 2);
    sizes.insert(sizes.end(), tail);
    return sizes;
  };
  at::Tensor dq = at::empty_symint(q.sym_sizes(), q.options());
  at::Tensor dk_heads = at::empty_symint(token_sizes({p.heads, p.head_dim}), acc_options);
  at::Tensor dv_heads = at::empty_symint(token_sizes({p.heads, p.head_dim_v}), acc_options);
  at::Tensor g1 = at::empty_symint(p.state_sizes, acc_options);  // G_1 [B, H, Dk, Dv]
  const at::Tensor slope_c = slope.contiguous();
  if constexpr (backward != nullptr) {
    // Gradients may arrive expanded (out.sum() gives stride 0); the passes read rows with stride 1.
    const at::Tensor dout_rows = dout.stride(-1) == 1 ? dout : dout.contiguous();
    backward(p, dout_rows, undefined_if_none(dfinal_state), q, k, v, slope_c, scale, undefined_if_none(initial_state),
             cu_seqlens, dq, dk_heads, dv_heads, g1);
  }
  const c10::SymInt group = p.heads / p.heads_kv;
  auto group_sum = [&](const at::Tensor& per_head, const c10::SymInt& width) {
    return per_head.view_symint(token_sizes({p.heads_kv, group, width})).sum(-2).to(q.scalar_type());
  };
  const at::Tensor decayed = g1 * at::exp(-slope_c.to(p.state_dtype)).view({1, -1, 1, 1});
  at::Tensor dinit;
  if (p.varlen) {  // per sequence, on the device of cu_seqlens (no host read)
    const at::Tensor lengths = cu_seqlens->slice(0, 1) - cu_seqlens->slice(0, 0, -1);
    dinit = at::where(lengths.gt(0).view({-1, 1, 1, 1}), decayed, g1);
  } else {
    dinit = p.seqlen == 0 ? g1 : decayed;
  }
  return {dq, group_sum(dk_heads, p.head_dim), group_sum(dv_heads, p.head_dim_v), dinit};
}

template <LightningDecodeFn decode>
at::Tensor lightning_attention_decode_on(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& state, const at::Tensor& slope, double scale,
                                         const std::optional<at::Tensor>& state_indices) {
  const LightningProblem p = prepare_lightning_decode(q, k, v, state, slope, scale, state_indices);
  at::Tensor out = at::empty_symint(p.out_sizes, q.options());  // [B, Tq, H, Dv]
  if constexpr (decode != nullptr) {
    const at::Tensor slots = state_indices.has_value() ? state_indices->contiguous() : at::Tensor();
    decode(p, q, k, v, state, slope.contiguous(), scale, slots, out);
  }
  return out;
}

}  // namespace attn_ops
