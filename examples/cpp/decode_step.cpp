// One prefill and one decode step of a grouped-query attention layer, with attn_ops from C++ (LibTorch).
//
//   1. prefill: causal GQA attention over the prompt          attn_ops::attention            (attn_ops.h)
//   2. cache:   write the prompt's K/V into a preallocated     attn_ops::kv_cache_append      (attn_ops.h)
//               KV cache, then the K/V of one new token
//   3. decode:  the new token's query attends to the cache     attn_ops::attention_with_kvcache (attn_ops.h)
// Each output is checked against plain tensor math in float64; the program prints the max abs errors and
// "OK", or exits with status 1 on a mismatch.
//
//   decode_step [cpu|cuda]     (cuda needs a build with -DATTN_OPS_CUDA=ON)
// Build and link: see README.md in this directory.
#include "attn_ops.h"  // the C++ API of attn_ops (csrc/attn_ops.h)

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <tuple>

namespace {

// Reference attention in float64: q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D] -> [B, Tq, Hq, D]. Repeats each KV
// head for its Hq / Hkv query heads; causal is aligned bottom-right (query i sees keys j <= i + Tk - Tq).
torch::Tensor reference_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
  q = q.to(torch::kCPU, torch::kDouble).permute({0, 2, 1, 3});  // [B, Hq, Tq, D]
  const int64_t group = q.size(1) / k.size(2);
  k = k.to(torch::kCPU, torch::kDouble).repeat_interleave(group, /*dim=*/2).permute({0, 2, 1, 3});
  v = v.to(torch::kCPU, torch::kDouble).repeat_interleave(group, /*dim=*/2).permute({0, 2, 1, 3});
  const int64_t Tq = q.size(2), Tk = k.size(2);
  torch::Tensor logits = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(3)));
  const torch::Tensor hidden = torch::ones({Tq, Tk}, torch::kBool).triu(/*diagonal=*/Tk - Tq + 1);
  logits = logits.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(logits, /*dim=*/-1), v).permute({0, 2, 1, 3});
}

double max_abs_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  return (actual.to(torch::kCPU, torch::kDouble) - expected).abs().max().item<double>();
}

int run(const torch::Device& device) {
  torch::manual_seed(0);

  // A GQA layer: 8 query heads share 2 KV heads. Batch of 2 prompts of 11 tokens, cache room for 32.
  const int64_t batch = 2, prompt_len = 11, heads_q = 8, heads_kv = 2, head_dim = 64, capacity = 32;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const auto int32 = torch::TensorOptions().dtype(torch::kInt32).device(device);

  // ---- 1. Prefill: causal attention over the prompt (layout [batch, seqlen, heads, head_dim]). ----------
  const torch::Tensor q = torch::randn({batch, prompt_len, heads_q, head_dim}, opts);
  const torch::Tensor k = torch::randn({batch, prompt_len, heads_kv, head_dim}, opts);
  const torch::Tensor v = torch::randn({batch, prompt_len, heads_kv, head_dim}, opts);
  const auto [prefill_out, prefill_lse] = attn_ops::attention(q, k, v, /*scale=*/std::nullopt, /*causal=*/true);

  // ---- 2. KV cache: preallocate, append the prompt, then the new token. ---------------------------------
  // kv_cache_append writes at each row's current length cache_seqlens[b]; the caller advances the lengths.
  const torch::Tensor k_cache = torch::zeros({batch, capacity, heads_kv, head_dim}, opts);
  const torch::Tensor v_cache = torch::zeros({batch, capacity, heads_kv, head_dim}, opts);
  torch::Tensor cache_seqlens = torch::zeros({batch}, int32);
  attn_ops::kv_cache_append(k_cache, v_cache, k, v, cache_seqlens);
  cache_seqlens += prompt_len;

  const torch::Tensor q_new = torch::randn({batch, 1, heads_q, head_dim}, opts);
  const torch::Tensor k_new = torch::randn({batch, 1, heads_kv, head_dim}, opts);
  const torch::Tensor v_new = torch::randn({batch, 1, heads_kv, head_dim}, opts);
  attn_ops::kv_cache_append(k_cache, v_cache, k_new, v_new, cache_seqlens);
  cache_seqlens += 1;  // the cache now holds prompt_len + 1 keys per row, the new token's included

  // ---- 3. Decode: attention of the new token over the cache (the C++ API calls the dispatcher, so the
  // CPU or CUDA kernel runs; its defaults keep this call valid as the schema gains optional arguments).
  const auto [decode_out, decode_lse] = attn_ops::attention_with_kvcache(q_new, k_cache, v_cache, cache_seqlens);

  // ---- Check against plain tensor math in float64. ------------------------------------------------------
  // The decode query is the last position of the sequence prompt + new token, so it sees every key.
  const double prefill_err = max_abs_error(prefill_out, reference_attention(q, k, v));
  const double decode_err = max_abs_error(
      decode_out, reference_attention(q_new, torch::cat({k, k_new}, /*dim=*/1), torch::cat({v, v_new}, 1)));
  std::printf("device %s: prefill out %s, max abs error %.3g; decode out %s, max abs error %.3g\n",
              device.str().c_str(), c10::str(prefill_out.sizes()).c_str(), prefill_err,
              c10::str(decode_out.sizes()).c_str(), decode_err);

  const double tolerance = 1e-4;  // float32 kernels vs a float64 reference
  if (!(prefill_err <= tolerance && decode_err <= tolerance)) {  // also fails on NaN
    std::printf("MISMATCH: error above the tolerance %g\n", tolerance);
    return 1;
  }
  std::printf("OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(torch::Device(argc > 1 ? argv[1] : "cpu"));
  } catch (const c10::Error& e) {  // a rejected argument, an operator missing from the dispatcher, ...
    std::fprintf(stderr, "error: %s\n", e.what_without_backtrace());
    return 1;
  }
}
