// C++ (LibTorch) tests of the ops beyond attention: the KV-cache appends and attention over the cache
// (contiguous and paged), MLA's latent cache and absorbed decode, lightning attention (forward, backward
// through autograd, the in-place decode) and additive attention (forward, backward), each against plain
// tensor math in float64, and one bad input per op with the message the Python tests assert too.
// Contracts: docs/kvcache_api.md, docs/mla_api.md, docs/lightning_api.md, docs/additive_api.md.
#include "attn_ops.h"
#include "reference.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace {

using attn_ops_test::expect_close;
using attn_ops_test::reference_attention;

constexpr double kTol = 1e-10;  // float64 against float64: summation order only

const torch::TensorOptions f64 = torch::TensorOptions().dtype(torch::kDouble);
const torch::TensorOptions i32 = torch::TensorOptions().dtype(torch::kInt);

at::Tensor int32s(const std::vector<int32_t>& values) {
  return torch::tensor(values, i32);
}

// Runs f, expects a c10::Error whose message contains `expected`.
void expect_error(const std::function<void()>& f, const std::string& expected) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing: " << expected;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << expected;
  }
}

// attention_with_kvcache's reference: row b's queries are the last Tq positions over its first lens[b] keys
// (causal, bottom-right aligned). keys / values [B, >= lens[b], Hkv, D] dense per row.
std::tuple<at::Tensor, at::Tensor> cache_reference(const at::Tensor& q, const at::Tensor& keys,
                                                   const at::Tensor& values, const std::vector<int32_t>& lens) {
  std::vector<at::Tensor> outs, lses;
  for (int64_t b = 0; b < q.size(0); ++b) {
    const auto [o, l] = reference_attention(q.narrow(0, b, 1), keys.narrow(0, b, 1).narrow(1, 0, lens[b]),
                                            values.narrow(0, b, 1).narrow(1, 0, lens[b]), std::nullopt,
                                            /*causal=*/true, -1, -1);
    outs.push_back(o);
    lses.push_back(l);
  }
  return {torch::cat(outs), torch::cat(lses)};
}

TEST(KvCache, AppendThenAttendContiguous) {
  torch::manual_seed(11);
  const int64_t B = 3, capacity = 40, Hkv = 2, Hq = 4, D = 16, Tnew = 4;
  const std::vector<int32_t> before = {5, 0, 17}, after = {9, 4, 21};
  const at::Tensor k_cache = torch::randn({B, capacity, Hkv, D}, f64), v_cache = torch::randn_like(k_cache);
  const at::Tensor k_old = k_cache.clone(), v_old = v_cache.clone();
  const at::Tensor k = torch::randn({B, Tnew, Hkv, D}, f64), v = torch::randn_like(k);
  attn_ops::kv_cache_append(k_cache, v_cache, k, v, int32s(before));
  for (int64_t b = 0; b < B; ++b) {  // the new rows at [before, after), nothing else touched
    EXPECT_TRUE(torch::equal(k_cache[b].narrow(0, before[b], Tnew), k[b]));
    EXPECT_TRUE(torch::equal(v_cache[b].narrow(0, before[b], Tnew), v[b]));
    EXPECT_TRUE(torch::equal(k_cache[b].narrow(0, 0, before[b]), k_old[b].narrow(0, 0, before[b])));
    EXPECT_TRUE(torch::equal(k_cache[b].narrow(0, after[b], capacity - after[b]),
                             k_old[b].narrow(0, after[b], capacity - after[b])));
  }
  const at::Tensor q = torch::randn({B, Tnew, Hq, D}, f64);
  const auto [out, lse] = attn_ops::attention_with_kvcache(q, k_cache, v_cache, int32s(after));
  const auto [ref_out, ref_lse] = cache_reference(q, k_cache, v_cache, after);
  expect_close(out, ref_out, kTol, kTol, "out");
  expect_close(lse, ref_lse, kTol, kTol, "lse");
}

TEST(KvCache, PagedAppendAndAttendEqualContiguous) {
  torch::manual_seed(12);
  const int64_t B = 2, block = 4, blocks_per_row = 5, Hkv = 1, Hq = 3, D = 8, Tnew = 3;
  const int64_t num_blocks = B * blocks_per_row + 2;
  const std::vector<int32_t> before = {6, 13}, after = {9, 16};
  // blocks in shuffled order: row b's block j is table[b][j]
  const at::Tensor table = torch::randperm(num_blocks, torch::TensorOptions().dtype(torch::kLong))
                               .narrow(0, 0, B * blocks_per_row)
                               .view({B, blocks_per_row})
                               .to(torch::kInt);
  const at::Tensor k_pool = torch::randn({num_blocks, block, Hkv, D}, f64), v_pool = torch::randn_like(k_pool);
  // the dense view of every row: gather its blocks
  const auto dense = [&](const at::Tensor& pool) {
    return pool.index_select(0, table.view(-1).to(torch::kLong)).view({B, blocks_per_row * block, Hkv, D});
  };
  const at::Tensor k = torch::randn({B * Tnew, Hkv, D}, f64), v = torch::randn_like(k);
  std::vector<int64_t> slots;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tnew; ++t) {
      const int64_t p = before[b] + t;
      slots.push_back(table[b][p / block].item<int64_t>() * block + p % block);
    }
  }
  slots[1] = -1;  // -1 skips that token
  const at::Tensor k_skipped = dense(k_pool)[0][before[0] + 1].clone();
  attn_ops::paged_kv_cache_append(k_pool, v_pool, k, v,
                                  torch::tensor(slots, torch::TensorOptions().dtype(torch::kLong)));
  const at::Tensor k_dense = dense(k_pool), v_dense = dense(v_pool);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tnew; ++t) {
      const at::Tensor expected = b == 0 && t == 1 ? k_skipped : k[b * Tnew + t];
      EXPECT_TRUE(torch::equal(k_dense[b][before[b] + t], expected)) << "row " << b << " token " << t;
    }
  }
  const at::Tensor q = torch::randn({B, 2, Hq, D}, f64);
  const auto [out, lse] = attn_ops::attention_with_kvcache(q, k_pool, v_pool, int32s(after), table);
  const auto [ref_out, ref_lse] = cache_reference(q, k_dense, v_dense, after);
  expect_close(out, ref_out, kTol, kTol, "out");
  expect_close(lse, ref_lse, kTol, kTol, "lse");
}

TEST(Mla, AppendThenAbsorbedDecode) {
  torch::manual_seed(13);
  const int64_t B = 2, capacity = 30, H = 4, dc = 20, dr = 8, Tnew = 3;
  const double scale = 0.3;
  const std::vector<int32_t> before = {4, 10};
  const at::Tensor cache = torch::randn({B, capacity, dc + dr}, f64);
  const at::Tensor c_kv = torch::randn({B, Tnew, dc}, f64), k_pe = torch::randn({B, Tnew, dr}, f64);
  attn_ops::mla_cache_append(cache, c_kv, k_pe, int32s(before));
  for (int64_t b = 0; b < B; ++b) {
    EXPECT_TRUE(torch::equal(cache[b].narrow(0, before[b], Tnew), torch::cat({c_kv[b], k_pe[b]}, -1)));
  }
  const at::Tensor q_latent = torch::randn({B, 1, H, dc}, f64), q_rope = torch::randn({B, 1, H, dr}, f64);
  const std::vector<int32_t> lens = {before[0] + static_cast<int32_t>(Tnew), before[1] + static_cast<int32_t>(Tnew)};
  const auto [out, lse] = attn_ops::mla_decode(q_latent, q_rope, cache, int32s(lens), scale);
  ASSERT_EQ(out.sizes(), (c10::IntArrayRef{B, 1, H, dc}));
  for (int64_t b = 0; b < B; ++b) {  // scores over [c_kv ; k_pe] rows, values the c_kv part
    const at::Tensor rows = cache[b].narrow(0, 0, lens[b]);                                   // [L, dc + dr]
    const at::Tensor s = (torch::matmul(q_latent[b][0], rows.narrow(1, 0, dc).t()) +
                          torch::matmul(q_rope[b][0], rows.narrow(1, dc, dr).t())) * scale;  // [H, L]
    const at::Tensor ref_lse = torch::logsumexp(s, -1);
    const at::Tensor ref_out = torch::matmul(torch::softmax(s, -1), rows.narrow(1, 0, dc));  // [H, dc]
    expect_close(out[b][0], ref_out, kTol, kTol, "out_latent");
    expect_close(lse[b].select(1, 0), ref_lse, kTol, kTol, "lse");
  }
}

// Lightning's recurrence, token by token: S_t = exp(-slope) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.
// q [B, T, H, Dk], k [B, T, Hk, Dk], v [B, T, Hk, Dv], state [B, H, Dk, Dv] -> (out, final state).
std::tuple<at::Tensor, at::Tensor> lightning_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& slope, double scale, at::Tensor state) {
  const int64_t T = q.size(1), group = q.size(2) / k.size(2);
  const at::Tensor kh = k.repeat_interleave(group, 2), vh = v.repeat_interleave(group, 2);
  const at::Tensor decay = torch::exp(-slope.to(torch::kDouble)).view({1, -1, 1, 1});
  std::vector<at::Tensor> outs;
  for (int64_t t = 0; t < T; ++t) {
    state = decay * state + kh.select(1, t).unsqueeze(-1) * vh.select(1, t).unsqueeze(-2);
    outs.push_back(scale * torch::matmul(q.select(1, t).unsqueeze(-2), state).squeeze(-2));  // [B, H, Dv]
  }
  return {torch::stack(outs, 1), state};
}

TEST(Lightning, ForwardBackwardAndDecode) {
  torch::manual_seed(14);
  const int64_t B = 2, T = 21, H = 4, Hk = 2, Dk = 8, Dv = 6;
  const double scale = 0.4;
  const at::Tensor slope = torch::rand({H}) * 0.5;  // float32, one rate per query head
  const at::Tensor q = torch::randn({B, T, H, Dk}, f64).requires_grad_(true);
  const at::Tensor k = torch::randn({B, T, Hk, Dk}, f64).requires_grad_(true);
  const at::Tensor v = torch::randn({B, T, Hk, Dv}, f64).requires_grad_(true);
  const at::Tensor init = torch::randn({B, H, Dk, Dv}, f64).requires_grad_(true);
  const auto [out, final_state] = attn_ops::lightning_attention(q, k, v, slope, scale, init, std::nullopt,
                                                                std::nullopt, /*block_size=*/8);
  const auto [ref_out, ref_final] = lightning_reference(q, k, v, slope, scale, init);
  expect_close(out, ref_out, kTol, kTol, "out");
  expect_close(final_state, ref_final, kTol, kTol, "final_state");

  const at::Tensor w_out = torch::randn_like(ref_out), w_final = torch::randn_like(ref_final);
  const auto grads = torch::autograd::grad({(out * w_out).sum() + (final_state * w_final).sum()}, {q, k, v, init});
  const auto ref_grads =
      torch::autograd::grad({(ref_out * w_out).sum() + (ref_final * w_final).sum()}, {q, k, v, init});
  const char* names[] = {"dq", "dk", "dv", "dinitial_state"};
  for (size_t i = 0; i < grads.size(); ++i) {
    expect_close(grads[i], ref_grads[i], 1e-9, 1e-9, names[i]);
  }

  // Two more tokens through the in-place decode, slot 1 of a pool of 3 for row 0, row 1 skipped (-1).
  const at::Tensor pool = torch::randn({3, H, Dk, Dv}, f64);
  pool[1].copy_(final_state.detach()[0]);
  const at::Tensor untouched = pool.clone();
  const at::Tensor q2 = torch::randn({B, 2, H, Dk}, f64), k2 = torch::randn({B, 2, Hk, Dk}, f64);
  const at::Tensor v2 = torch::randn({B, 2, Hk, Dv}, f64);
  const at::Tensor out2 = attn_ops::lightning_attention_decode_(q2, k2, v2, pool, slope, scale, int32s({1, -1}));
  const auto [ref_out2, ref_state2] =
      lightning_reference(q2.narrow(0, 0, 1), k2.narrow(0, 0, 1), v2.narrow(0, 0, 1), slope, scale,
                          final_state.detach().narrow(0, 0, 1));
  expect_close(out2.narrow(0, 0, 1), ref_out2, kTol, kTol, "decode out");
  expect_close(pool[1], ref_state2[0], kTol, kTol, "decoded state");
  EXPECT_TRUE(out2[1].eq(0).all().item<bool>()) << "a skipped row outputs zeros";
  EXPECT_TRUE(torch::equal(pool[0], untouched[0]) && torch::equal(pool[2], untouched[2]));
}

TEST(Additive, ForwardAndBackward) {
  torch::manual_seed(15);
  const int64_t B = 2, Tq = 5, Tk = 9, A = 7, Dv = 3;
  const at::Tensor qp = torch::randn({B, Tq, A}, f64).requires_grad_(true);
  const at::Tensor kp = torch::randn({B, Tk, A}, f64).requires_grad_(true);
  const at::Tensor w = torch::randn({A}, f64).requires_grad_(true);
  const at::Tensor v = torch::randn({B, Tk, Dv}, f64).requires_grad_(true);
  at::Tensor mask = torch::zeros({B, Tk}, torch::TensorOptions().dtype(torch::kBool));
  mask[1].narrow(0, 6, 3).fill_(true);  // the last 3 keys of row 1 are padding
  const auto [out, lse, weights] = attn_ops::additive_attention(qp, kp, w, v, mask, /*return_weights=*/true);

  at::Tensor scores = (torch::tanh(qp.unsqueeze(2) + kp.unsqueeze(1)) * w).sum(-1);  // [B, Tq, Tk]
  scores = scores.masked_fill(mask.unsqueeze(1), -std::numeric_limits<double>::infinity());
  const at::Tensor ref_lse = torch::logsumexp(scores, -1);
  const at::Tensor ref_weights = torch::exp(scores - ref_lse.unsqueeze(-1));
  const at::Tensor ref_out = torch::matmul(ref_weights, v);
  expect_close(out, ref_out, kTol, kTol, "out");
  expect_close(lse, ref_lse, kTol, kTol, "lse");
  expect_close(weights, ref_weights, kTol, kTol, "weights");

  const at::Tensor w_out = torch::randn_like(ref_out), w_lse = torch::randn_like(ref_lse);
  const auto grads = torch::autograd::grad({(out * w_out).sum() + (lse * w_lse).sum()}, {qp, kp, w, v});
  const auto ref_grads = torch::autograd::grad({(ref_out * w_out).sum() + (ref_lse * w_lse).sum()}, {qp, kp, w, v});
  const char* names[] = {"dqp", "dkp", "dw", "dv"};
  for (size_t i = 0; i < grads.size(); ++i) {
    expect_close(grads[i], ref_grads[i], 1e-9, 1e-9, names[i]);
  }
}

TEST(OpErrors, NameTheArgumentExpectedAndActual) {
  const at::Tensor kc = torch::zeros({2, 8, 1, 4}, f64), vc = torch::zeros({2, 8, 1, 4}, f64);
  const at::Tensor k = torch::randn({2, 1, 1, 4}, f64);
  expect_error([&] { attn_ops::kv_cache_append(kc, vc, k, k.clone(), torch::tensor({1.0f, 2.0f})); },
               "attn_ops.kv_cache_append: cache_seqlens must be an int32 tensor of shape [2], got float32 tensor of "
               "shape [2]");
  const at::Tensor kc_before = kc.clone();
  expect_error([&] { attn_ops::kv_cache_append(kc, vc, k, k.clone(), int32s({8, 2})); },
               "attn_ops.kv_cache_append: cache_seqlens[0] = 8 plus 1 new tokens exceeds the cache capacity 8");
  EXPECT_TRUE(torch::equal(kc, kc_before)) << "a rejected append wrote into the cache";
  expect_error(
      [&] {
        attn_ops::paged_kv_cache_append(kc, vc, torch::randn({2, 1, 4}, f64), torch::randn({2, 1, 4}, f64),
                                        torch::tensor({0, 16}, torch::TensorOptions().dtype(torch::kLong)));
      },
      "attn_ops.paged_kv_cache_append: slot_mapping[1] = 16 is out of range: the cache has 16 slots (num_blocks 2 "
      "x block_size 8); -1 skips a token");
  expect_error(
      [&] {
        attn_ops::attention_with_kvcache(torch::randn({2, 1, 2, 4}, f64), kc, vc, int32s({3, 2}),
                                         torch::zeros({2, 2}, torch::TensorOptions().dtype(torch::kLong)));
      },
      "attn_ops.attention_with_kvcache: block_table must be an int32 tensor of shape [2, max_blocks_per_seq], got "
      "int64 tensor of shape [2, 2]");
  expect_error(
      [&] {
        attn_ops::mla_decode(torch::randn({2, 1, 2, 8}, f64), torch::randn({2, 1, 2, 3}, f64),
                             torch::zeros({2, 8, 12}, f64), int32s({3, 2}), 0.5);
      },
      "attn_ops.mla_decode: latent_cache must have last dim kv_lora_rank + rope_dim = 8 + 3 = 11 (from q_latent and "
      "q_rope), got 12");
  const at::Tensor x = torch::randn({1, 3, 2, 4}, f64);
  expect_error([&] { attn_ops::lightning_attention(x, x, x, torch::ones({3})); },
               "attn_ops.lightning_attention: slope must be a float32 tensor of shape [2] (one decay rate per query "
               "head), got float32 tensor of shape [3]");
  expect_error(
      [&] {
        attn_ops::additive_attention(torch::randn({1, 3, 5}, f64), torch::randn({1, 4, 6}, f64),
                                     torch::randn({5}, f64), torch::randn({1, 4, 2}, f64));
      },
      "attn_ops.additive_attention: kp must have hidden = 5 (as qp), got shape [1, 4, 6]");
}

}  // namespace
