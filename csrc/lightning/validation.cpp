// Argument preparation of lightning_attention, its backward and lightning_attention_decode_ (one function per
// op, called by the Meta, CPU and CUDA kernels alike, so every backend rejects the same inputs the same way).
#include "lightning/validation.h"

#include "common/attention_checks.h"
#include "common/checks.h"
#include "common/index_checks.h"

#include <ATen/ATen.h>

#include <cmath>

namespace attn_ops {
namespace {

at::ScalarType state_dtype_for(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// slope float32 [H], every value finite and >= 0 (checked when the values are readable).
void check_slope(const char* op, const at::Tensor& slope, const at::Tensor& q, const c10::SymInt& heads) {
  TORCH_CHECK(slope.scalar_type() == at::kFloat && slope.dim() == 1 && slope.sym_size(0) == heads, op,
              ": slope must be a float32 tensor of shape [", heads, "] (one decay rate per query head), got ",
              dtype_name(slope.scalar_type()), " tensor of shape ", shape_str(slope));
  check_same_device(op, "slope", slope, "q", q);
  if (can_read_values(slope)) {
    const at::Tensor s = slope.to(at::kCPU).contiguous();
    const float* p = s.const_data_ptr<float>();
    for (int64_t h = 0; h < s.numel(); ++h) {
      TORCH_CHECK(std::isfinite(p[h]) && p[h] >= 0.0f, op, ": slope[", h, "] = ", p[h],
                  " must be finite and >= 0");
    }
  }
}

// A state-shaped tensor [B, H, Dk, Dv] of the state dtype on q's device.
void check_state_like(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q,
                      const std::vector<c10::SymInt>& sizes, at::ScalarType dtype, const char* what) {
  TORCH_CHECK(t.scalar_type() == dtype && t.sym_sizes() == c10::SymIntArrayRef(sizes), op, ": ", name, " must be a ",
              dtype_name(dtype), " tensor of shape ", shape_str(sizes), " ", what, ", got ",
              dtype_name(t.scalar_type()), " tensor of shape ", shape_str(t));
  check_same_device(op, name, t, "q", q);
}

// cu_seqlens int32 [B + 1]: starts at 0, non-decreasing, ends at the tokens of q; max_seqlen >= the longest
// sequence. The values are read here for CPU tensors; CUDA checks them on the device (lightning_cuda.cu).
void check_cu_seqlens(const char* op, const at::Tensor& cu, const at::Tensor& q, std::optional<int64_t> max_seqlen) {
  check_index_tensor(op, "cu_seqlens", cu, /*allow_int64=*/false, cu.dim() == 1 && cu.sym_size(0) >= 1,
                     [] { return std::string("[batch + 1]"); });
  check_same_device(op, "cu_seqlens", cu, "q", q);
  if (can_read_values(cu)) {
    const int64_t longest = check_cu_seqlens_values(op, "cu_seqlens", cu, q.size(0), "q");
    check_max_seqlen(op, "max_seqlen", "cu_seqlens", max_seqlen, longest);
  }
}

// q/k/v ranks, dtypes, devices, strides, shapes and head counts; fills the shape fields of `p`.
void check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool varlen,
               LightningProblem& p) {
  check_float_dtype(op, "q", q);
  if (varlen) {
    const char* when = " when cu_seqlens is given";
    check_rank(op, "q", q, 3, "[total_tokens, heads, head_dim]", when);
    check_rank(op, "k", k, 3, "[total_tokens, heads_kv, head_dim]", when);
    check_rank(op, "v", v, 3, "[total_tokens, heads_kv, head_dim_v]", when);
  } else {
    check_rank(op, "q", q, 4, "[batch, seqlen, heads, head_dim]");
    check_rank(op, "k", k, 4, "[batch, seqlen, heads_kv, head_dim]");
    check_rank(op, "v", v, 4, "[batch, seqlen, heads_kv, head_dim_v]");
  }
  check_same_dtype_device(op, "k", k, "q", q);
  check_same_dtype_device(op, "v", v, "q", q);
  check_last_dim_contiguous(op, "q", q);
  check_last_dim_contiguous(op, "k", k);
  check_last_dim_contiguous(op, "v", v);
  const int64_t lead = q.dim() - 2;  // tokens are indexed by the dims before [heads, head_dim]
  const auto qs = q.sym_sizes(), ks = k.sym_sizes(), vs = v.sym_sizes();
  TORCH_CHECK(ks.slice(0, lead) == qs.slice(0, lead) && ks[lead + 1] == qs[lead + 1], op, ": k must have shape ",
              shape_str(qs.slice(0, lead)), " + [heads_kv, ", qs[lead + 1], "] (the tokens and head_dim of q), got ",
              shape_str(k));
  TORCH_CHECK(vs.slice(0, lead + 1) == ks.slice(0, lead + 1), op, ": v must have shape ",
              shape_str(ks.slice(0, lead + 1)), " + [head_dim_v] (the tokens and heads of k), got ", shape_str(v));
  p.heads = qs[lead];
  p.heads_kv = ks[lead];
  TORCH_CHECK(p.heads >= 1 && p.heads_kv >= 1 && p.heads % p.heads_kv == 0, op, ": the query heads of q (", p.heads,
              ") must be a positive multiple of the key/value heads of k (", p.heads_kv, ")");
  p.head_dim = qs[lead + 1];
  p.head_dim_v = vs[lead + 1];
  check_head_dims(op, p.head_dim, p.head_dim_v);  // >= 1 (a zero-width state would divide by zero), <= 1024
  p.seqlen = varlen ? qs[0] : qs[1];
  p.state_dtype = state_dtype_for(q);
}

}  // namespace

LightningProblem prepare_lightning_attention(const char* op, const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& slope, double scale,
                                             const std::optional<at::Tensor>& initial_state,
                                             const std::optional<at::Tensor>& cu_seqlens,
                                             std::optional<int64_t> max_seqlen, std::optional<int64_t> block_size) {
  LightningProblem p;
  p.op = op;
  p.varlen = cu_seqlens.has_value();
  p.max_seqlen = max_seqlen;
  check_qkv(op, q, k, v, p.varlen, p);
  check_slope(op, slope, q, p.heads);
  check_score_options(op, q.scalar_type(), scale, -1, -1, 0.0);  // scale representable in the accumulation type
  TORCH_CHECK(p.varlen || !max_seqlen.has_value(), op, ": max_seqlen is only valid with cu_seqlens");
  TORCH_CHECK(!max_seqlen.has_value() || *max_seqlen >= 0, op, ": max_seqlen must be >= 0, got ", *max_seqlen);
  if (p.varlen) {
    check_cu_seqlens(op, *cu_seqlens, q, max_seqlen);
    p.batch = cu_seqlens->sym_size(0) - 1;
    p.out_sizes = {p.seqlen, p.heads, p.head_dim_v};
  } else {
    p.batch = q.sym_size(0);
    p.out_sizes = {p.batch, p.seqlen, p.heads, p.head_dim_v};
  }
  TORCH_CHECK(!block_size.has_value() || *block_size >= 1, op, ": block_size must be >= 1, got ", *block_size);
  p.block_size = block_size.value_or(kLightningDefaultBlock);
  p.state_sizes = {p.batch, p.heads, p.head_dim, p.head_dim_v};
  if (initial_state.has_value()) {
    check_state_like(op, "initial_state", *initial_state, q, p.state_sizes, p.state_dtype,
                     "[batch, heads, head_dim, head_dim_v]");
  }
  return p;
}

LightningProblem prepare_lightning_attention_backward(
    const at::Tensor& dout, const std::optional<at::Tensor>& dfinal_state, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& slope, double scale, const std::optional<at::Tensor>& initial_state,
    const std::optional<at::Tensor>& cu_seqlens, std::optional<int64_t> max_seqlen,
    std::optional<int64_t> block_size) {
  const char* op = "attn_ops.lightning_attention_backward";
  LightningProblem p =
      prepare_lightning_attention(op, q, k, v, slope, scale, initial_state, cu_seqlens, max_seqlen, block_size);
  TORCH_CHECK(dout.sym_sizes() == c10::SymIntArrayRef(p.out_sizes), op, ": dout must have the shape of out ",
              shape_str(p.out_sizes), ", got ", shape_str(dout));
  check_same_dtype_device(op, "dout", dout, "q", q);
  if (dfinal_state.has_value()) {
    check_state_like(op, "dfinal_state", *dfinal_state, q, p.state_sizes, p.state_dtype,
                     "[batch, heads, head_dim, head_dim_v]");
  }
  return p;
}

LightningProblem prepare_lightning_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& state, const at::Tensor& slope, double scale,
                                          const std::optional<at::Tensor>& state_indices) {
  const char* op = "attn_ops.lightning_attention_decode_";
  LightningProblem p;
  p.op = op;
  check_qkv(op, q, k, v, /*varlen=*/false, p);
  TORCH_CHECK(p.seqlen >= 1, op, ": q must hold at least one token per row (seqlen >= 1), got shape ", shape_str(q));
  check_slope(op, slope, q, p.heads);
  check_score_options(op, q.scalar_type(), scale, -1, -1, 0.0);  // scale representable in the accumulation type
  p.batch = q.sym_size(0);
  check_rank(op, "state", state, 4, "[num_slots, heads, head_dim, head_dim_v]");
  const c10::SymInt slots = state.sym_size(0);
  check_state_like(op, "state", state, q, {slots, p.heads, p.head_dim, p.head_dim_v}, p.state_dtype,
                   "[num_slots, heads, head_dim, head_dim_v]");
  check_last_dim_contiguous(op, "state", state);
  TORCH_CHECK(!state.requires_grad(), op,
              ": state must not require grad (it is updated in place, which autograd cannot track)");
  // memory layout, not values: CUDA tensors are checked here too
  check_in_place_target(op, {"state", state}, {{"q", q}, {"k", k}, {"v", v}, {"slope", slope}});
  if (state_indices.has_value()) {
    const at::Tensor& idx = *state_indices;
    check_index_tensor(op, "state_indices", idx, /*allow_int64=*/false, idx.dim() == 1 && idx.sym_size(0) == p.batch,
                       [&] { return shape_str({p.batch}); });
    check_same_device(op, "state_indices", idx, "q", q);
    if (can_read_values(idx)) {
      const at::Tensor ix = idx.to(at::kCPU).contiguous();
      const int32_t* s = ix.const_data_ptr<int32_t>();
      const int64_t n = state.size(0);
      std::vector<int64_t> row_of_slot(n, -1);
      for (int64_t b = 0; b < ix.numel(); ++b) {
        TORCH_CHECK(s[b] >= -1 && s[b] < n, op, ": state_indices[", b, "] = ", s[b], " is out of range [-1, ", n,
                    ") of the state pool; -1 skips a row");
        if (s[b] >= 0) {
          TORCH_CHECK(row_of_slot[s[b]] < 0, op, ": state_indices[", b, "] = ", s[b],
                      " repeats state_indices[", row_of_slot[s[b]], "]: two rows cannot update one slot");
          row_of_slot[s[b]] = b;
        }
      }
    }
  } else {
    TORCH_CHECK(slots == p.batch, op, ": state must have one slot per row (", p.batch,
                ") when state_indices is not given, got ", slots, " slots");
  }
  p.out_sizes = {p.batch, p.seqlen, p.heads, p.head_dim_v};
  p.state_sizes = {slots, p.heads, p.head_dim, p.head_dim_v};
  return p;
}

}  // namespace attn_ops
