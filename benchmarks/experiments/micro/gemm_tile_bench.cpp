// One thread, best of many calls: the forward's two float32 tile products (scores = scale * Q K^T over a
// [rows, 128] x [128, 256] tile, acc += P V over [rows, 256] x [256, 128]) on MKL's sgemm (libtorch_cpu's)
// against gemm_kernels.h's panel_gemm over K^T packed in panels, and Q K^T on bfloat16 pairs (Bf16PairPanel)
// where the CPU has AVX512-BF16. Build and run (from the repo root):
//   T=$(python -c "import torch,os;print(os.path.dirname(torch.__file__))")
//   g++ -O3 -std=c++20 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c -DCPU_CAPABILITY=AVX512 \
//     -DCPU_CAPABILITY_AVX512 -I csrc -I $T/include benchmarks/experiments/micro/gemm_tile_bench.cpp -L $T/lib -ltorch_cpu \
//     -lc10 -Wl,-rpath,$T/lib -o /tmp/gemm_tile_bench && OMP_NUM_THREADS=1 /tmp/gemm_tile_bench
#include "common/cpu/blas.h"
#include "attention/cpu/gemm_kernels.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace attn_ops::cpu;

template <typename F>
double best_seconds(F&& f, int calls) {
  double best = 1e9;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

int main() {
  const int64_t rows = 256, keys = 256, d = 128, ld_kv = 8 * d;  // K/V rows of one head inside [T, 8, 128]
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  auto fill = [&](std::vector<float>& x) { for (float& v : x) v = normal(gen); };
  std::vector<float> q(rows * d), k(keys * ld_kv), v(keys * ld_kv), p(rows * keys), kt(d * keys);
  std::vector<float> s_mkl(rows * keys), s_ours(rows * keys), acc_mkl(rows * d), acc_ours(rows * d);
  fill(q), fill(k), fill(v), fill(p);
  for (int64_t j = 0; j < keys; ++j)  // K^T in panels [d, kPanelWidth]
    for (int64_t e = 0; e < d; ++e)
      kt[(j / kPanelWidth) * d * kPanelWidth + e * kPanelWidth + j % kPanelWidth] = k[j * ld_kv + e];
  std::vector<float> vp(keys * d);  // V in column panels [keys, kPanelWidth]
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t e = 0; e < d; ++e) vp[(e / kPanelWidth) * keys * kPanelWidth + j * kPanelWidth + e % kPanelWidth] = v[j * ld_kv + e];
  const float scale = 0.088f;
  const int calls = 200;
  const double qk_flop = 2.0 * rows * keys * d, pv_flop = 2.0 * rows * d * keys;
  for (int rep = 0; rep < 2; ++rep) {
    const double t_mkl = best_seconds([&] {
      gemm<float>(false, true, rows, keys, d, scale, q.data(), d, k.data(), ld_kv, 0.f, s_mkl.data(), keys);
    }, calls);
    const double t_ours = best_seconds([&] {
      panel_gemm<false>(rows, keys / kPanelWidth, d, q.data(), d, kt.data(), kPanelWidth, d * kPanelWidth,
                        s_ours.data(), keys, scale);
    }, calls);
    const double t_pv_mkl = best_seconds([&] {
      gemm<float>(false, false, rows, d, keys, 1.f, p.data(), keys, v.data(), ld_kv, 1.f, acc_mkl.data(), d);
    }, calls);
    const double t_pv_ours = best_seconds([&] {
      panel_gemm<true>(rows, d / kPanelWidth, keys, p.data(), keys, v.data(), ld_kv, kPanelWidth, acc_ours.data(),
                       d, 1.f);
    }, calls);
    const double t_pv_panels = best_seconds([&] {
      panel_gemm<true>(rows, d / kPanelWidth, keys, p.data(), keys, vp.data(), kPanelWidth, keys * kPanelWidth,
                       acc_ours.data(), d, 1.f);
    }, calls);
    std::printf("Q K^T %ldx%ldx%ld: sgemm %.1f GFLOP/s, panel_gemm %.1f GFLOP/s\n", rows, keys, d,
                qk_flop / t_mkl * 1e-9, qk_flop / t_ours * 1e-9);
    std::printf("P V   %ldx%ldx%ld: sgemm %.1f GFLOP/s, panel_gemm %.1f GFLOP/s\n", rows, d, keys,
                pv_flop / t_pv_mkl * 1e-9, pv_flop / t_pv_ours * 1e-9);
    std::printf("P V   with V packed in panels [%ld, %ld]: panel_gemm %.1f GFLOP/s\n", keys, kPanelWidth,
                pv_flop / t_pv_panels * 1e-9);
  }
  // Correctness: one fresh call of each.
  std::fill(acc_mkl.begin(), acc_mkl.end(), 0.f), std::fill(acc_ours.begin(), acc_ours.end(), 0.f);
  gemm<float>(false, false, rows, d, keys, 1.f, p.data(), keys, v.data(), ld_kv, 1.f, acc_mkl.data(), d);
  panel_gemm<true>(rows, d / kPanelWidth, keys, p.data(), keys, v.data(), ld_kv, kPanelWidth, acc_ours.data(), d, 1.f);
  float e1 = 0, e2 = 0;
  for (size_t i = 0; i < s_mkl.size(); ++i) e1 = std::max(e1, std::abs(s_mkl[i] - s_ours[i]));
  for (size_t i = 0; i < acc_mkl.size(); ++i) e2 = std::max(e2, std::abs(acc_mkl[i] - acc_ours[i]));
  std::printf("max |diff|: scores %.2e, P V %.2e\n", e1, e2);

  // The bfloat16 pair kernel (Bf16PairPanel, vdpbf16ps) on the same Q K^T tile, where the CPU has
  // AVX512-BF16: Q in bfloat16 read in place, K^T in pair panels [d / 2][kPanelWidth][2].
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::printf("bfloat16 pairs: this CPU lacks AVX512-BF16\n");
    return 0;
  }
  std::vector<c10::BFloat16> q16(rows * d), kp16(keys * d);
  for (size_t i = 0; i < q16.size(); ++i) q16[i] = c10::BFloat16(q[i]);
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t e = 0; e < d; ++e)
      kp16[(j / kPanelWidth) * d * kPanelWidth + (e / 2 * kPanelWidth + j % kPanelWidth) * 2 + e % 2] =
          c10::BFloat16(k[j * ld_kv + e]);
  std::vector<float> s16(rows * keys);
  for (int rep = 0; rep < 2; ++rep) {
    const double t_pairs = best_seconds([&] {
      panel_gemm<false, Bf16PairPanel>(rows, keys / kPanelWidth, d / 2, q16.data(), d, kp16.data(), 2 * kPanelWidth,
                                       d * kPanelWidth, s16.data(), keys, scale);
    }, calls);
    std::printf("Q K^T %ldx%ldx%ld on bfloat16 pairs: panel_gemm %.1f GFLOP/s\n", rows, keys, d,
                qk_flop / t_pairs * 1e-9);
  }
  float e3 = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < keys; ++j) {
      double ref = 0;
      for (int64_t e = 0; e < d; ++e) {
        ref += double(float(q16[r * d + e])) * double(float(c10::BFloat16(k[j * ld_kv + e])));
      }
      e3 = std::max(e3, float(std::abs(scale * ref - s16[r * keys + j])));
    }
  std::printf("max |diff| against float64 on the rounded inputs: %.2e\n", e3);
  return 0;
}
