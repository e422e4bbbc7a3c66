// CPU kernels of lightning_attention, lightning_attention_backward and lightning_attention_decode_: each one
// describes its operands as passes of the one recurrence (passes.h) and runs them over all streams.
#include "lightning/cpu/passes.h"
#include "lightning/validation.h"

#include "common/acc_type.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <type_traits>

namespace attn_ops {
namespace {

using cpu::PassSpec;
using cpu::state_view;
using cpu::token_view;

template <typename T>
cpu::TokenView<const T> in_view(const at::Tensor& t, bool packed, bool per_kv_head) {
  return token_view<const T>(t.const_data_ptr<T>(), t, packed, per_kv_head);
}

template <typename T>
cpu::TokenView<T> out_view(at::Tensor& t, bool packed) {
  return token_view<T>(t.mutable_data_ptr<T>(), t, packed, false);
}

// Per-sequence first token and length: all of T for a dense batch, from cu_seqlens for a packed one.
void fill_sequences(std::vector<int64_t>& start, std::vector<int64_t>& length, const LightningProblem& p,
                    const std::optional<at::Tensor>& cu_seqlens) {
  const int64_t batch = p.batch.expect_int();
  start.assign(batch, 0);
  length.assign(batch, p.seqlen.expect_int());
  if (p.varlen) {
    const at::Tensor cu = cu_seqlens->contiguous();
    const int32_t* c = cu.const_data_ptr<int32_t>();
    for (int64_t b = 0; b < batch; ++b) {
      start[b] = c[b];
      length[b] = c[b + 1] - c[b];
    }
  }
}

at::Tensor optional_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor> lightning_attention_cpu(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, const at::Tensor& slope, double scale,
                                                           const std::optional<at::Tensor>& initial_state,
                                                           const std::optional<at::Tensor>& cu_seqlens,
                                                           std::optional<int64_t> max_seqlen,
                                                           std::optional<int64_t> block_size) {
  const LightningProblem p = prepare_lightning_attention("attn_ops.lightning_attention", q, k, v, slope, scale,
                                                         initial_state, cu_seqlens, max_seqlen, block_size);
  at::Tensor out = at::empty_symint(p.out_sizes, q.options());                                // [B, T, H, Dv]
  at::Tensor final_state = at::empty_symint(p.state_sizes, q.options().dtype(p.state_dtype));  // [B, H, Dk, Dv]
  const at::Tensor slope_c = slope.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "lightning_attention_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    PassSpec<scalar_t, scalar_t, acc_t> ps;
    ps.qq = in_view<scalar_t>(q, p.varlen, false);
    ps.kk = in_view<scalar_t>(k, p.varlen, true);
    ps.vv = in_view<scalar_t>(v, p.varlen, true);
    ps.out = out_view<scalar_t>(out, p.varlen);
    ps.heads = p.heads.expect_int();
    ps.group = ps.heads / p.heads_kv.expect_int();
    ps.dk = p.head_dim.expect_int();
    ps.dv = p.head_dim_v.expect_int();
    fill_sequences(ps.start, ps.length, p, cu_seqlens);
    ps.init = state_view<acc_t>(optional_or_undefined(initial_state), false);
    ps.final_ = state_view<acc_t>(final_state, false);
    ps.slope = slope_c.const_data_ptr<float>();
    ps.params.block = p.block_size;
    ps.params.out_scale = static_cast<acc_t>(scale);
    cpu::run_pass(ps);
  });
  return {out, final_state};
}

// Gradients, with G_t = dL/dS_t = a^(T-t) dfinal_state + scale * sum_{j >= t} a^(j-t) q_j^T dout_j:
//   dq_t = scale * dout_t S_t^T       (the forward recurrence on (dout, v, k) from initial_state^T)
//   dk_t = v_t G_t^T, dv_t = k_t G_t  (the recurrence reversed in time, on (v, dout, q) and (k, q, dout))
//   dinitial_state = a * G_1          (the final state of the dv pass, decayed one step)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lightning_attention_backward_cpu(
    const at::Tensor& dout_in, const std::optional<at::Tensor>& dfinal_state, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& slope, double scale,
    const std::optional<at::Tensor>& initial_state, const std::optional<at::Tensor>& cu_seqlens,
    std::optional<int64_t> max_seqlen, std::optional<int64_t> block_size) {
  const LightningProblem p = prepare_lightning_attention_backward(dout_in, dfinal_state, q, k, v, slope, scale, initial_state,
                                                                  cu_seqlens, max_seqlen, block_size);
  // Gradients may arrive expanded (out.sum() gives stride 0); the passes read rows with stride 1.
  const at::Tensor dout = dout_in.stride(-1) == 1 ? dout_in : dout_in.contiguous();
  const int64_t heads = p.heads.expect_int(), heads_kv = p.heads_kv.expect_int();
  const int64_t dk_dim = p.head_dim.expect_int(), dv_dim = p.head_dim_v.expect_int();
  const auto acc_options = q.options().dtype(p.state_dtype);
  std::vector<int64_t> tokens(q.sizes().begin(), q.sizes().end() - 2);  // [B, T] or [total]
  auto per_query_head = [&](int64_t width) {
    std::vector<int64_t> sizes = tokens;
    sizes.push_back(heads);
    sizes.push_back(width);
    return at::empty(sizes, acc_options);
  };
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk_h = per_query_head(dk_dim), dv_h = per_query_head(dv_dim);  // reduced over each group below
  at::Tensor g1 = at::empty_symint(p.state_sizes, acc_options);                 // G_1 [B, H, Dk, Dv]
  const at::Tensor slope_c = slope.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "lightning_attention_backward_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    auto base = [&](auto& ps) {
      ps.heads = heads;
      ps.group = heads / heads_kv;
      fill_sequences(ps.start, ps.length, p, cu_seqlens);
      ps.slope = slope_c.const_data_ptr<float>();
      ps.params.block = p.block_size;
    };
    {  // dq: forward in time, state [Dv, Dk] from initial_state^T
      PassSpec<scalar_t, scalar_t, acc_t> ps;
      base(ps);
      ps.qq = in_view<scalar_t>(dout, p.varlen, false);
      ps.kk = in_view<scalar_t>(v, p.varlen, true);
      ps.vv = in_view<scalar_t>(k, p.varlen, true);
      ps.out = out_view<scalar_t>(dq, p.varlen);
      ps.dk = dv_dim;
      ps.dv = dk_dim;
      ps.init = state_view<acc_t>(optional_or_undefined(initial_state), /*transposed=*/true);
      ps.params.out_scale = static_cast<acc_t>(scale);
      cpu::run_pass(ps);
    }
    // dk and dv: reversed in time from dfinal_state, which enters undecayed (G_T = dfinal_state + ...).
    auto reversed = [&](auto& ps) {
      base(ps);
      ps.params.kv_scale = static_cast<acc_t>(scale);
      ps.params.reverse = true;
      ps.params.decay_initial = false;
    };
    {  // dk: state G^T [Dv, Dk]
      PassSpec<scalar_t, acc_t, acc_t> ps;
      reversed(ps);
      ps.qq = in_view<scalar_t>(v, p.varlen, true);
      ps.kk = in_view<scalar_t>(dout, p.varlen, false);
      ps.vv = in_view<scalar_t>(q, p.varlen, false);
      ps.out = out_view<acc_t>(dk_h, p.varlen);
      ps.dk = dv_dim;
      ps.dv = dk_dim;
      ps.init = state_view<acc_t>(optional_or_undefined(dfinal_state), /*transposed=*/true);
      cpu::run_pass(ps);
    }
    {  // dv: state G [Dk, Dv], ending at G_1
      PassSpec<scalar_t, acc_t, acc_t> ps;
      reversed(ps);
      ps.qq = in_view<scalar_t>(k, p.varlen, true);
      ps.kk = in_view<scalar_t>(q, p.varlen, false);
      ps.vv = in_view<scalar_t>(dout, p.varlen, false);
      ps.out = out_view<acc_t>(dv_h, p.varlen);
      ps.dk = dk_dim;
      ps.dv = dv_dim;
      ps.init = state_view<acc_t>(optional_or_undefined(dfinal_state), false);
      ps.final_ = state_view<acc_t>(g1, false);
      cpu::run_pass(ps);
    }
  });
  auto group_sum = [&](const at::Tensor& per_head, int64_t width) {
    std::vector<int64_t> sizes = tokens;
    sizes.insert(sizes.end(), {heads_kv, heads / heads_kv, width});
    return per_head.view(sizes).sum(-2).to(q.scalar_type());
  };
  at::Tensor dinit = g1 * at::exp(-slope_c.to(p.state_dtype)).view({1, heads, 1, 1});
  return {dq, group_sum(dk_h, dk_dim), group_sum(dv_h, dv_dim), dinit};
}

at::Tensor lightning_attention_decode__cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& state, const at::Tensor& slope, double scale,
                                           const std::optional<at::Tensor>& state_indices) {
  const LightningProblem p = prepare_lightning_decode(q, k, v, state, slope, scale, state_indices);
  at::Tensor out = at::empty_symint(p.out_sizes, q.options());  // [B, Tq, H, Dv]
  const at::Tensor slope_c = slope.contiguous();
  const at::Tensor slots = state_indices.has_value() ? state_indices->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "lightning_attention_decode_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    PassSpec<scalar_t, scalar_t, acc_t> ps;
    ps.qq = in_view<scalar_t>(q, false, false);
    ps.kk = in_view<scalar_t>(k, false, true);
    ps.vv = in_view<scalar_t>(v, false, true);
    ps.out = out_view<scalar_t>(out, false);
    ps.heads = p.heads.expect_int();
    ps.group = ps.heads / p.heads_kv.expect_int();
    ps.dk = p.head_dim.expect_int();
    ps.dv = p.head_dim_v.expect_int();
    fill_sequences(ps.start, ps.length, p, std::nullopt);
    ps.slots = slots.defined() ? slots.const_data_ptr<int32_t>() : nullptr;
    ps.init = state_view<acc_t>(state, false);  // read and written in place, slot by slot
    ps.final_ = ps.init;
    ps.slope = slope_c.const_data_ptr<float>();
    ps.params.out_scale = static_cast<acc_t>(scale);
    cpu::run_pass(ps);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("lightning_attention", &lightning_attention_cpu);
  m.impl("lightning_attention_backward", &lightning_attention_backward_cpu);
  m.impl("lightning_attention_decode_", &lightning_attention_decode__cpu);
}

}  // namespace attn_ops
