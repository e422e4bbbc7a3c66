// Argument preparation of the lightning attention ops, shared by every backend (CPU, CUDA, Meta): one
// function per op validates every argument, resolves the defaults and computes the output shapes on SymInts.
// Everything is checked before anything is written: a rejected decode leaves the state pool untouched.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <optional>
#include <vector>

namespace attn_ops {

// Default block length of the chunked algorithm: the intra-block part costs O(T * block * D) and the
// inter-block part O(T * D^2), so a block well below D keeps the quadratic part small.
constexpr int64_t kLightningDefaultBlock = 64;
// Up to this many tokens a stream is run as the plain token recurrence (one pass over the state per token).
constexpr int64_t kLightningTokenLoopMax = 8;

// The resolved problem of lightning_attention (and of its backward, which shares it).
struct LightningProblem {
  const char* op = nullptr;  // "attn_ops.<op>", for the backends' device-side checks
  bool varlen = false;
  std::optional<int64_t> max_seqlen;  // as given with cu_seqlens
  c10::SymInt batch;      // number of sequences (B, or cu_seqlens.size(0) - 1)
  c10::SymInt seqlen;     // T of a dense batch; total tokens when varlen
  c10::SymInt heads;      // H (query heads; the state is per query head)
  c10::SymInt heads_kv;   // Hk, H % Hk == 0
  c10::SymInt head_dim;   // Dk
  c10::SymInt head_dim_v; // Dv
  int64_t block_size = kLightningDefaultBlock;
  at::ScalarType state_dtype = at::kFloat;  // float32, float64 for float64 inputs
  std::vector<c10::SymInt> out_sizes;       // [B, T, H, Dv] or [total, H, Dv]
  std::vector<c10::SymInt> state_sizes;     // [B, H, Dk, Dv]
};

// lightning_attention: q [B, T, H, Dk] (or [total, H, Dk] with cu_seqlens int32 [B + 1]), k [.., Hk, Dk],
// v [.., Hk, Dv], slope float32 [H] (finite, >= 0), initial_state [B, H, Dk, Dv] in the state dtype.
LightningProblem prepare_lightning_attention(const char* op, const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& slope, double scale,
                                             const std::optional<at::Tensor>& initial_state,
                                             const std::optional<at::Tensor>& cu_seqlens,
                                             std::optional<int64_t> max_seqlen, std::optional<int64_t> block_size);

// lightning_attention_backward: the forward's arguments plus dout (out's shape, q's dtype) and
// dfinal_state (the state's shape and dtype, optional).
LightningProblem prepare_lightning_attention_backward(
    const at::Tensor& dout, const std::optional<at::Tensor>& dfinal_state, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& slope, double scale, const std::optional<at::Tensor>& initial_state,
    const std::optional<at::Tensor>& cu_seqlens, std::optional<int64_t> max_seqlen,
    std::optional<int64_t> block_size);

// lightning_attention_decode_: q [B, Tq, H, Dk], k/v [B, Tq, Hk, Dk/Dv], state [N, H, Dk, Dv] (the pool,
// updated in place), slope [H], state_indices int32 [B] with values in [-1, N) and no slot twice (without
// it, N == B and row b uses slot b). Returns the problem (seqlen = Tq, batch = B).
LightningProblem prepare_lightning_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& state, const at::Tensor& slope, double scale,
                                          const std::optional<at::Tensor>& state_indices);

}  // namespace attn_ops
