// Preparation of the attention ops (attention, attention_backward, attention_with_kvcache), shared by every
// backend: one function per op validates every argument, resolves the defaults (the scale) and computes the
// output shapes. The Meta, CPU and CUDA kernels all call it first, so all backends reject the same inputs with
// the same message, and a fake-tensor trace rejects them too. Sizes are SymInts so the Meta kernels work
// under torch.compile's dynamic shapes.
#pragma once

#include "common/checks.h"
#include "common/serving.h"

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

namespace attn_ops {

// The keyword arguments that attention and attention_backward share.
struct AttentionOptions {
  std::optional<double> scale;
  bool causal = false;
  int64_t window_left = -1;
  int64_t window_right = -1;
  double softcap = 0.0;
  std::optional<at::Tensor> cu_seqlens_q;
  std::optional<at::Tensor> cu_seqlens_k;
  std::optional<int64_t> max_seqlen_q;
  std::optional<int64_t> max_seqlen_k;

  bool varlen() const { return cu_seqlens_q.has_value(); }
  // causal is the window (window_left, 0).
  int64_t effective_window_right() const { return causal ? 0 : window_right; }
};

// Sizes of one validated problem. In varlen mode `batch` is the number of sequences and seqlen_q /
// seqlen_k are the packed token totals.
struct AttentionShape {
  bool varlen = false;
  c10::SymInt batch, seqlen_q, seqlen_k;
  c10::SymInt heads_q, heads_kv, head_dim_qk, head_dim_v;
};

// The output shapes of an op that returns (out, lse), and lse's dtype.
struct OutLseSizes {
  std::vector<c10::SymInt> out;
  std::vector<c10::SymInt> lse;
  c10::ScalarType lse_dtype = c10::ScalarType::Float;
};

// Empty (out, lse) of these shapes: out in the dtype of `options`, lse in lse_dtype (Meta tensors too).
std::tuple<at::Tensor, at::Tensor> empty_out_lse(const OutLseSizes& sizes, const at::TensorOptions& options);

// The softmax scale of every attention-like op: `scale` when given, else 1 / sqrt(head_dim). It guards the
// head dim to an integer, so only kernels that run call it (Meta kernels never need the scale).
double resolve_scale(std::optional<double> scale, const c10::SymInt& head_dim);

// One validated call of attention or attention_backward: its options, sizes and output shapes.
struct AttentionPrep {
  AttentionOptions opts;
  AttentionShape shape;
  // out: [batch, seqlen_q, heads_q, head_dim_v] (dense) or [total_q, heads_q, head_dim_v] (varlen);
  // lse: [batch, heads_q, seqlen_q] (dense) or [heads_q, total_q] (varlen).
  OutLseSizes outputs;

  double scale() const { return resolve_scale(opts.scale, shape.head_dim_qk); }
};

// attention: checks q, k, v and the options (values of cu_seqlens when they hold data); throws c10::Error
// naming the argument, what was expected and what came.
AttentionPrep prepare_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
                                double softcap, const std::optional<at::Tensor>& cu_seqlens_q,
                                const std::optional<at::Tensor>& cu_seqlens_k, std::optional<int64_t> max_seqlen_q,
                                std::optional<int64_t> max_seqlen_k);

// attention_backward: the forward's checks, plus dout and out (out's shape, q's dtype), lse and dlse (lse's
// shape and dtype).
AttentionPrep prepare_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                         const std::optional<at::Tensor>& dlse, std::optional<double> scale,
                                         bool causal, int64_t window_left, int64_t window_right, double softcap,
                                         const std::optional<at::Tensor>& cu_seqlens_q,
                                         const std::optional<at::Tensor>& cu_seqlens_k,
                                         std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k);

// Empty (dq, dk, dv) shaped as (q, k, v) (Meta tensors too).
std::tuple<at::Tensor, at::Tensor, at::Tensor> empty_attention_grads(const at::Tensor& q, const at::Tensor& k,
                                                                     const at::Tensor& v);

// The largest head dim of any attention op (the CUDA row kernels hold 32 features per lane).
constexpr int64_t kMaxHeadDim = 1024;

// Shared by every attention-like op: the floating-point operands, checked in this order: the first float16,
// bfloat16, float32 or float64; every other one of its dtype and on its device; each with stride 1 in its
// last dim.
void check_float_operands(const char* op, std::initializer_list<NamedTensor> operands);

// Shared by every attention-like op: head dims in [1, kMaxHeadDim].
void check_head_dims(const char* op, const c10::SymInt& head_dim_qk, const c10::SymInt& head_dim_v);

// Shared by every attention-like op: head counts (heads_q a multiple of heads_kv >= 1) and the score options.
void check_head_counts(const char* op, const c10::SymInt& heads_q, const c10::SymInt& heads_kv);
// scale and softcap must be representable in the kernels' accumulation type (float32 for every input dtype
// but float64): a scale that overflows, or a softcap that overflows or rounds to 0, would change the result.
void check_score_options(const char* op, c10::ScalarType dtype, std::optional<double> scale, int64_t window_left,
                         int64_t window_right, double softcap);

// float32, or float64 for float64 inputs.
c10::ScalarType attention_lse_dtype(c10::ScalarType input_dtype);

// One validated call of attention_with_kvcache: q [B, Tq, Hq, D] (or packed [total_q, Hq, D] with
// cu_seqlens_q) over a contiguous cache [B, capacity, Hkv, D] or, with block_table [B, max_blocks_per_seq], a
// paged one [num_blocks, block_size, Hkv, D] (with cache_batch_idx, any number of cache / block-table rows).
struct WithKvCachePrep {
  bool paged = false;
  bool packed = false;  // q packed: seqlen_q is then total_q
  c10::SymInt batch, seqlen_q, heads_q, heads_kv, head_dim, head_dim_v;
  c10::SymInt capacity;  // keys one row can hold: cache dim 1, or max_blocks_per_seq * block_size
  std::optional<double> given_scale;
  // out: [B, Tq, Hq, Dv] and lse: [B, Hq, Tq], or packed [total_q, Hq, Dv] and [Hq, total_q].
  OutLseSizes outputs;

  double scale() const { return resolve_scale(given_scale, head_dim); }
};

// Checks the inputs of attention_with_kvcache (values of cache_seqlens / block_table when they hold data).
WithKvCachePrep prepare_attention_with_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                                               const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                               const std::optional<at::Tensor>& block_table,
                                               std::optional<double> scale, int64_t window_left,
                                               int64_t window_right, double softcap, const KvCacheRows& rows);

}  // namespace attn_ops
