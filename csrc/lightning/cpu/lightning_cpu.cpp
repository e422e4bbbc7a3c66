// CPU kernels of lightning_attention, lightning_attention_backward and lightning_attention_decode_: each one
// describes its operands as passes of the one recurrence (passes.h) and runs them over all streams.
#include "lightning/cpu/passes.h"
#include "lightning/entry.h"

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
cpu::TokenView<T> out_view(const at::Tensor& t, bool packed) {
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

void lightning_forward_cpu(const LightningProblem& p, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& slope, double scale,
                           const at::Tensor& initial_state, const std::optional<at::Tensor>& cu_seqlens,
                           const at::Tensor& out, const at::Tensor& final_state) {
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
    ps.init = state_view<acc_t>(initial_state, false);
    ps.final_ = state_view<acc_t>(final_state, false);
    ps.slope = slope.const_data_ptr<float>();
    ps.params.block = p.block_size;
    ps.params.out_scale = static_cast<acc_t>(scale);
    cpu::run_pass(ps);
  });
}

// The three passes of the backward (the formulas: lightning/entry.h).
void lightning_backward_cpu(const LightningProblem& p, const at::Tensor& dout, const at::Tensor& dfinal_state,
                            const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slope,
                            double scale, const at::Tensor& initial_state, const std::optional<at::Tensor>& cu_seqlens,
                            const at::Tensor& dq, const at::Tensor& dk_heads, const at::Tensor& dv_heads,
                            const at::Tensor& g1) {
  const int64_t heads = p.heads.expect_int(), heads_kv = p.heads_kv.expect_int();
  const int64_t dk_dim = p.head_dim.expect_int(), dv_dim = p.head_dim_v.expect_int();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "lightning_attention_backward_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    auto base = [&](auto& ps) {
      ps.heads = heads;
      ps.group = heads / heads_kv;
      fill_sequences(ps.start, ps.length, p, cu_seqlens);
      ps.slope = slope.const_data_ptr<float>();
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
      ps.init = state_view<acc_t>(initial_state, /*transposed=*/true);
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
      ps.out = out_view<acc_t>(dk_heads, p.varlen);
      ps.dk = dv_dim;
      ps.dv = dk_dim;
      ps.init = state_view<acc_t>(dfinal_state, /*transposed=*/true);
      cpu::run_pass(ps);
    }
    {  // dv: state G [Dk, Dv], ending at G_1
      PassSpec<scalar_t, acc_t, acc_t> ps;
      reversed(ps);
      ps.qq = in_view<scalar_t>(k, p.varlen, true);
      ps.kk = in_view<scalar_t>(q, p.varlen, false);
      ps.vv = in_view<scalar_t>(dout, p.varlen, false);
      ps.out = out_view<acc_t>(dv_heads, p.varlen);
      ps.dk = dk_dim;
      ps.dv = dv_dim;
      ps.init = state_view<acc_t>(dfinal_state, false);
      ps.final_ = state_view<acc_t>(g1, false);
      cpu::run_pass(ps);
    }
  });
}

void lightning_decode_cpu(const LightningProblem& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& state, const at::Tensor& slope, double scale, const at::Tensor& slots,
                          const at::Tensor& out) {
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
    ps.slope = slope.const_data_ptr<float>();
    ps.params.out_scale = static_cast<acc_t>(scale);
    cpu::run_pass(ps);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CPU, m) {
  m.impl("lightning_attention", &lightning_attention_on<lightning_forward_cpu>);
  m.impl("lightning_attention_backward", &lightning_attention_backward_on<lightning_backward_cpu>);
  m.impl("lightning_attention_decode_", &lightning_attention_decode_on<lightning_decode_cpu>);
}

}  // namespace attn_ops
