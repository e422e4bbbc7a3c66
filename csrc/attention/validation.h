// Argument checks and shape rules shared by every backend of attention / attention_backward.
// Every kernel (CPU, CUDA, Meta) calls these first, so all backends reject the same inputs with the
// same message, and a fake-tensor trace rejects them too. Sizes are SymInts so the Meta kernel works
// under torch.compile's dynamic shapes.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
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

// Bundles the schema's keyword arguments (in schema order).
AttentionOptions make_attention_options(std::optional<double> scale, bool causal, int64_t window_left,
                                        int64_t window_right, double softcap,
                                        const std::optional<at::Tensor>& cu_seqlens_q,
                                        const std::optional<at::Tensor>& cu_seqlens_k,
                                        std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k);

// Sizes of one validated problem. In varlen mode `batch` is the number of sequences and seqlen_q /
// seqlen_k are the packed token totals.
struct AttentionShape {
  bool varlen = false;
  c10::SymInt batch, seqlen_q, seqlen_k;
  c10::SymInt heads_q, heads_kv, head_dim_qk, head_dim_v;
};

// Checks q, k, v and the options; throws c10::Error naming the argument, what was expected and what
// came. `op` prefixes the message ("attn_ops.attention").
AttentionShape check_attention_inputs(
    const char* op,
    const at::Tensor& q,
    const at::Tensor& k,
    const at::Tensor& v,
    const AttentionOptions& opts);

// The extra checks of attention_backward (dout, out, lse, dlse against the forward shape).
void check_attention_backward_inputs(
    const char* op,
    const AttentionShape& shape,
    const at::Tensor& q,
    const at::Tensor& dout,
    const at::Tensor& out,
    const at::Tensor& lse,
    const std::optional<at::Tensor>& dlse);

// out: [batch, seqlen_q, heads_q, head_dim_v] (dense) or [total_q, heads_q, head_dim_v] (varlen).
std::vector<c10::SymInt> attention_out_shape(const AttentionShape& shape);
// lse: [batch, heads_q, seqlen_q] (dense) or [heads_q, total_q] (varlen).
std::vector<c10::SymInt> attention_lse_shape(const AttentionShape& shape);
// float32, or float64 for float64 inputs.
c10::ScalarType attention_lse_dtype(c10::ScalarType input_dtype);

double attention_scale(const AttentionShape& shape, const AttentionOptions& opts);

}  // namespace attn_ops
