// CUDA host code of lightning_attention, lightning_attention_backward and lightning_attention_decode_: the
// same passes as the CPU backend (see lightning/cpu/lightning_cpu.cpp for the gradient formulas), each one
// launch of lightning_pass_kernel on the current stream, after the device-side value checks of slope, cu_seqlens
// and state_indices (the host checks of the shared validation for CPU inputs). On an H200 (2026-11-27) the
// forward's CUDA tests and one float32 backward test ran, before these device checks existed; the decode and
// the checks are compiled for sm_90 but not yet run on a GPU.
#include "common/cuda/index_checks.h"
#include "common/cuda/kernel_attributes.cuh"
#include "lightning/cuda/pass_kernel.cuh"
#include "lightning/entry.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>

namespace attn_ops::cuda {
namespace {

template <typename T>
DevRows<T> dev_rows(T* base, const at::Tensor& t, bool packed, bool per_kv_head) {
  return packed ? DevRows<T>{base, 0, t.stride(0), t.stride(1), per_kv_head}
                : DevRows<T>{base, t.stride(0), t.stride(1), t.stride(2), per_kv_head};
}

template <typename T>
DevRows<const T> in_rows(const at::Tensor& t, bool packed, bool per_kv_head) {
  return dev_rows<const T>(t.const_data_ptr<T>(), t, packed, per_kv_head);
}

template <typename T>
DevRows<T> out_rows(const at::Tensor& t, bool packed) {
  return dev_rows<T>(t.mutable_data_ptr<T>(), t, packed, false);
}

// `written`: the pass writes through it (a state updated in place, a final state, g1), so it takes the
// mutable pointer (a copy-on-write tensor is then materialised first); read-only states take the const one.
template <typename A>
DevState<A> dev_state(const at::Tensor& t, bool transposed, bool written) {
  if (!t.defined()) {
    return {};
  }
  A* base = written ? t.mutable_data_ptr<A>() : const_cast<A*>(t.const_data_ptr<A>());
  return transposed ? DevState<A>{base, t.stride(0), t.stride(1), t.stride(3), t.stride(2)}
                    : DevState<A>{base, t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// cu_seqlens as the kernel reads it (offset b at cu[b]: contiguous), or undefined for a dense batch. The caller
// keeps it alive until its launches are queued.
at::Tensor packed_offsets(const std::optional<at::Tensor>& cu_seqlens) {
  return cu_seqlens.has_value() ? cu_seqlens->contiguous() : at::Tensor();
}

// Shape fields shared by every pass of one problem; cu: packed_offsets.
template <typename Args>
void set_problem(Args& a, const LightningProblem& p, const at::Tensor& cu, const at::Tensor& slope) {
  a.batch = p.batch.expect_int();
  a.heads = p.heads.expect_int();
  a.group = a.heads / p.heads_kv.expect_int();
  a.seqlen = p.seqlen.expect_int();
  a.cu_seqlens = p.varlen ? cu.const_data_ptr<int32_t>() : nullptr;
  a.slope = slope.const_data_ptr<float>();
}

// state_dim: what sets the pass's state rows (a.dk), named in the error: "head_dim", or for the backward's dq
// pass, whose state is the transposed one, "head_dim_v".
template <typename in_t, typename out_t, typename A>
void launch(const PassArgs<in_t, out_t, A>& a, const char* op, const char* state_dim) {
  const int64_t blocks = a.batch * a.heads * ceil_div(a.dv, kLightningCols);
  if (blocks == 0) {
    return;
  }
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), op, ": batch x heads x ceil(head_dim_v / ",
              kLightningCols, ") = ", blocks, " blocks exceeds the CUDA grid limit of 2^31 - 1");
  const size_t smem = lightning_smem_bytes<A>(a.dk);
  const size_t max_smem = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
  TORCH_CHECK(smem <= max_smem, op, ": ", state_dim, " ", a.dk, " needs ", smem,
              " bytes of shared memory per block on CUDA (a [", state_dim, ", ", kLightningCols,
              "] state in shared memory), more than the device's ", max_smem);
  constexpr auto kernel = lightning_pass_kernel<in_t, out_t, A>;
  allow_dynamic_smem<kernel>(static_cast<int>(smem));
  kernel<<<static_cast<unsigned>(blocks), kLightningThreads, smem, at::cuda::getCurrentCUDAStream()>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The value checks that the shared validation makes on the host for CPU inputs: slope, and cu_seqlens with
// max_seqlen (out-of-range rows would be read and written out of bounds).
// cu: packed_offsets (one contiguous copy of a strided cu_seqlens serves the check and the kernels).
void check_values_on_device(const LightningProblem& p, const at::Tensor& q, const at::Tensor& slope,
                            const at::Tensor& cu) {
  check_slope_on_device(p.op, slope);
  if (cu.defined()) {
    check_cu_seqlens_on_device(p.op, "cu_seqlens", cu, q.size(0), "q", p.max_seqlen.value_or(-1), "max_seqlen");
  }
}

void lightning_forward_cuda(const LightningProblem& p, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& slope, double scale,
                            const at::Tensor& initial_state, const std::optional<at::Tensor>& cu_seqlens,
                            const at::Tensor& out, const at::Tensor& final_state) {
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor cu = packed_offsets(cu_seqlens);
  check_values_on_device(p, q, slope, cu);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "lightning_attention_cuda", [&] {
    using A = acc_type<scalar_t>;
    PassArgs<scalar_t, scalar_t, A> a;
    set_problem(a, p, cu, slope);
    a.qq = in_rows<scalar_t>(q, p.varlen, false);
    a.kk = in_rows<scalar_t>(k, p.varlen, true);
    a.vv = in_rows<scalar_t>(v, p.varlen, true);
    a.out = out_rows<scalar_t>(out, p.varlen);
    a.dk = p.head_dim.expect_int();
    a.dv = p.head_dim_v.expect_int();
    a.init = dev_state<A>(initial_state, false, /*written=*/false);
    a.fin = dev_state<A>(final_state, false, /*written=*/true);
    a.out_scale = static_cast<A>(scale);
    launch(a, p.op, "head_dim");
  });
}

// The three passes of the backward (the formulas: lightning/entry.h).
void lightning_backward_cuda(const LightningProblem& p, const at::Tensor& dout, const at::Tensor& dfinal_state,
                             const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slope,
                             double scale, const at::Tensor& initial_state,
                             const std::optional<at::Tensor>& cu_seqlens, const at::Tensor& dq,
                             const at::Tensor& dk_heads, const at::Tensor& dv_heads, const at::Tensor& g1) {
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor cu = packed_offsets(cu_seqlens);
  check_values_on_device(p, q, slope, cu);
  const int64_t dk_dim = p.head_dim.expect_int(), dv_dim = p.head_dim_v.expect_int();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "lightning_attention_backward_cuda", [&] {
    using A = acc_type<scalar_t>;
    {  // dq: forward in time from initial_state^T
      PassArgs<scalar_t, scalar_t, A> a;
      set_problem(a, p, cu, slope);
      a.qq = in_rows<scalar_t>(dout, p.varlen, false);
      a.kk = in_rows<scalar_t>(v, p.varlen, true);
      a.vv = in_rows<scalar_t>(k, p.varlen, true);
      a.out = out_rows<scalar_t>(dq, p.varlen);
      a.dk = dv_dim;
      a.dv = dk_dim;
      a.init = dev_state<A>(initial_state, true, /*written=*/false);
      a.out_scale = static_cast<A>(scale);
      launch(a, p.op, "head_dim_v");
    }
    // dk (state G^T) and dv (state G, ending at G_1): reversed in time from dfinal_state, entering undecayed.
    for (const bool is_dk : {true, false}) {
      PassArgs<scalar_t, A, A> a;
      set_problem(a, p, cu, slope);
      a.qq = in_rows<scalar_t>(is_dk ? v : k, p.varlen, true);
      a.kk = in_rows<scalar_t>(is_dk ? dout : q, p.varlen, false);
      a.vv = in_rows<scalar_t>(is_dk ? q : dout, p.varlen, false);
      a.out = out_rows<A>(is_dk ? dk_heads : dv_heads, p.varlen);
      a.dk = is_dk ? dv_dim : dk_dim;
      a.dv = is_dk ? dk_dim : dv_dim;
      a.init = dev_state<A>(dfinal_state, is_dk, /*written=*/false);
      a.fin = is_dk ? DevState<A>{} : dev_state<A>(g1, false, /*written=*/true);
      a.kv_scale = static_cast<A>(scale);
      a.reverse = true;
      a.decay_initial = false;
      launch(a, p.op, is_dk ? "head_dim_v" : "head_dim");
    }
  });
}

void lightning_decode_cuda(const LightningProblem& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& state, const at::Tensor& slope, double scale, const at::Tensor& slots,
                           const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(q.device());
  check_values_on_device(p, q, slope, at::Tensor());
  if (slots.defined()) {
    check_state_indices_on_device(p.op, slots, state.size(0));
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "lightning_attention_decode_cuda", [&] {
    using A = acc_type<scalar_t>;
    PassArgs<scalar_t, scalar_t, A> a;
    set_problem(a, p, at::Tensor(), slope);
    a.qq = in_rows<scalar_t>(q, false, false);
    a.kk = in_rows<scalar_t>(k, false, true);
    a.vv = in_rows<scalar_t>(v, false, true);
    a.out = out_rows<scalar_t>(out, false);
    a.dk = p.head_dim.expect_int();
    a.dv = p.head_dim_v.expect_int();
    a.slots = slots.defined() ? slots.const_data_ptr<int32_t>() : nullptr;
    a.num_slots = state.size(0);
    a.init = dev_state<A>(state, false, /*written=*/true);  // each block reads its tile of the slot and writes it back
    a.fin = a.init;
    a.out_scale = static_cast<A>(scale);
    launch(a, p.op, "head_dim");
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CUDA, m) {
  m.impl("lightning_attention", &lightning_attention_on<lightning_forward_cuda>);
  m.impl("lightning_attention_backward", &lightning_attention_backward_on<lightning_backward_cuda>);
  m.impl("lightning_attention_decode_", &lightning_attention_decode_on<lightning_decode_cuda>);
}

}  // namespace attn_ops::cuda
