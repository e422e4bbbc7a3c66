// Argument checks and shape rules shared by every backend of attention / attention_backward.
// Every kernel (CPU, CUDA, Meta) calls these first, so all backends reject the same inputs with the
// same message, and a fake-tensor trace rejects them too. Sizes are SymInts so the Meta kernel works
// under torch.compile's dynamic shapes.
#pragma once

#include "attention/serving.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>
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

// The largest head dim of any attention op (the CUDA row kernels hold 32 features per lane).
constexpr int64_t kMaxHeadDim = 1024;

// Shared by every attention-like op: head dims in [1, kMaxHeadDim].
void check_head_dims(const char* op, const c10::SymInt& head_dim_qk, const c10::SymInt& head_dim_v);

// Shared by every attention-like op: head counts (heads_q a multiple of heads_kv >= 1) and the score options.
void check_head_counts(const char* op, const c10::SymInt& heads_q, const c10::SymInt& heads_kv);
// scale and softcap must be representable in the kernels' accumulation type (float32 for every input dtype
// but float64): a scale that overflows, or a softcap that overflows or rounds to 0, would change the result.
void check_score_options(const char* op, c10::ScalarType dtype, std::optional<double> scale, int64_t window_left,
                         int64_t window_right, double softcap);

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

// attention_with_kvcache: q [B, Tq, Hq, D] (or packed [total_q, Hq, D] with cu_seqlens_q) over a contiguous
// cache [B, capacity, Hkv, D] or, with block_table [B, max_blocks_per_seq], a paged one
// [num_blocks, block_size, Hkv, D] (with cache_batch_idx, any number of cache / block-table rows).
struct KvCacheAttentionShape {
  bool paged = false;
  bool packed = false;  // q packed: seqlen_q is then total_q
  c10::SymInt batch, seqlen_q, heads_q, heads_kv, head_dim, head_dim_v;
  c10::SymInt capacity;  // keys one row can hold: cache dim 1, or max_blocks_per_seq * block_size
};

// Checks the inputs of attention_with_kvcache (values of cache_seqlens / block_table when they hold data).
KvCacheAttentionShape check_attention_with_kvcache_inputs(const at::Tensor& q, const at::Tensor& k_cache,
                                                          const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                          const std::optional<at::Tensor>& block_table,
                                                          std::optional<double> scale, int64_t window_left,
                                                          int64_t window_right, double softcap,
                                                          const KvCacheRows& rows);

// (out, lse) shapes: [B, Tq, Hq, Dv] and [B, Hq, Tq], or packed [total_q, Hq, Dv] and [Hq, total_q].
std::pair<std::vector<c10::SymInt>, std::vector<c10::SymInt>> kvcache_output_shapes(const KvCacheAttentionShape& s);

// Values of cache_seqlens (0 <= len <= capacity) and, for a paged cache, of the block-table entries each
// row uses (in [0, num_blocks)). Call it only on tensors that hold data (not meta / fake ones);
// block_table is undefined (and block_size, num_blocks unused) for a contiguous cache. `table_rows`
// (host int32 [B], checked in range) picks the block-table row of each batch row, `first_key` (host int32
// [B]) the cache position of its first key (cache_leftpad); either may be undefined (row b, position 0).
void check_cache_lengths_and_blocks(const char* op, const at::Tensor& cache_seqlens, const at::Tensor& block_table,
                                    int64_t capacity, int64_t block_size, int64_t num_blocks,
                                    const at::Tensor& table_rows = at::Tensor(),
                                    const at::Tensor& first_key = at::Tensor());

// Reads cu_seqlens (copying it to the host if needed) and checks its values (starts at 0, non-decreasing,
// ends at `total`, the token count of `tensor_name`); returns the longest sequence.
int64_t check_cu_seqlens_values(const char* op, const char* name, const at::Tensor& cu, int64_t total,
                                const char* tensor_name);
// max_seqlen (when given) is at least `longest`, the longest sequence of `cu_name`.
void check_max_seqlen(const char* op, const char* name, const char* cu_name, std::optional<int64_t> max_seqlen,
                      int64_t longest);

}  // namespace attn_ops
