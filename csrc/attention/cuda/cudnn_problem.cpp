// sdpa_forward_problem / sdpa_backward_problem: our [batch, seq, heads, dim] views as cuDNN's [batch, heads, seq,
// dim] (the same memory: only the dims' order changes), our windows as cuDNN's band.
#include "attention/cuda/cudnn_problem.h"

#include <c10/core/ScalarType.h>

namespace attn_ops::cuda {
namespace {

// [B, S, H, D] (a token tensor: q, k, v, out, dout, a contiguous cache) as [B, H, S, D]. A paged pool
// [num_blocks, block_size, H, D] becomes [num_blocks, H, block_size, D] the same way.
SdpaTensor heads_major(const at::Tensor& t) {
  return {{t.size(0), t.size(2), t.size(1), t.size(3)}, {t.stride(0), t.stride(2), t.stride(1), t.stride(3)}};
}

// lse [B, Hq, Tq] as cuDNN's stats [B, Hq, Sq, 1].
SdpaTensor stats_of(const at::Tensor& lse) {
  return {{lse.size(0), lse.size(1), lse.size(2), 1}, {lse.stride(0), lse.stride(1), lse.stride(2), 1}};
}

// The fields a forward and a backward share: sizes, scale and the band of the call's window.
SdpaProblem common_problem(const AttentionCall& call) {
  SdpaProblem p;
  p.bf16 = call.q.scalar_type() == at::kBFloat16;
  p.batch = call.batch.expect_int();
  p.heads_q = call.heads_q.expect_int();
  p.heads_kv = call.heads_kv.expect_int();
  p.seqlen_q = call.seqlen_q.expect_int();
  p.seqlen_k = call.seqlen_k.expect_int();
  p.dim_qk = call.head_dim_qk.expect_int();
  p.dim_v = call.head_dim_v.expect_int();
  p.scale = call.scale();
  if (call.window_left >= 0) {
    p.left_bound = call.window_left + 1;
  }
  if (call.effective_window_right() >= 0) {
    p.right_bound = call.effective_window_right();
  }
  p.q = heads_major(call.q);
  p.k = heads_major(call.k);
  p.v = heads_major(call.v);
  return p;
}

}  // namespace

SdpaProblem sdpa_forward_problem(const AttentionCall& call, const at::Tensor& out, const at::Tensor& lse) {
  SdpaProblem p = common_problem(call);
  p.o = heads_major(out);
  p.stats = stats_of(lse);
  if (call.over_cache()) {
    p.padding_mask = true;  // each row's own length: seq_len_q = Tq, seq_len_kv = cache_seqlens[b]
    if (p.seqlen_q == 1) {
      // One query sits at the row's last key: causal hides nothing. cuDNN 9.18.1 lists a causal decode with
      // GQA as wrong, so no right bound is sent.
      p.right_bound.reset();
    }
    if (call.paged()) {
      const at::Tensor& table = *call.block_table;
      p.paged = true;
      p.block_size = call.k.size(1);
      // [B, max_blocks_per_seq] viewed as [B, 1, max_blocks_per_seq, 1]; the size-1 dims get packed strides
      p.page_table = {{table.size(0), 1, table.size(1), 1},
                      {table.stride(0), table.size(1) * table.stride(1), table.stride(1), 1}};
    }
  }
  return p;
}

SdpaProblem sdpa_backward_problem(const AttentionBackwardCall& call, const at::Tensor& dq, const at::Tensor& dk,
                                  const at::Tensor& dv) {
  SdpaProblem p = common_problem(call);
  p.backward = true;
  p.o = heads_major(call.out);
  p.dout = heads_major(call.dout);
  p.stats = stats_of(call.lse);
  p.dq = heads_major(dq);
  p.dk = heads_major(dk);
  p.dv = heads_major(dv);
  return p;
}

}  // namespace attn_ops::cuda
