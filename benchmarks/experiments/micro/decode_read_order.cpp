// Read bandwidth of a decode cache (B = 32, context 4096, 8 KV heads, D = 128, bfloat16: 512 MiB of K and V)
// in the orders the CPU decode kernel could read it, by AVX-512 loads alone (plus, with a work argument W, W
// rounds of 4 independent FMAs per 256-byte row, a stand-in for the kernel's compute):
//   token-major   [B, T, Hkv, D], each 64-key tile's K then V in address order;
//   head-major    [B, Hkv, T, D], each tile head by head;
//   kernel order  [B, T, Hkv, D] as decode_kernel.h's stream_tiles walks it: K by blocks of 4 keys, every head
//                 of a block before the next block; then V head by head (rows Hkv * D apart);
//   kernel + pf   the same, with V's rows requested into L2 (prefetcht1) during K, as stream_tiles does.
//   g++ -O2 -mavx512f -fopenmp benchmarks/experiments/micro/decode_read_order.cpp -o /tmp/decode_read_order
//   OMP_NUM_THREADS=2 /tmp/decode_read_order [W]
// (its results and what they decided were recorded in
// benchmarks/results/ at the time (git log -- benchmarks/results))
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBatch = 32, kContext = 4096, kHeads = 8, kDim = 128, kTile = 64, kBlock = 4;
int g_work = 0;

// Folds one row of kDim bfloat16 values into acc, then g_work rounds of FMAs on its first 64 values.
inline __m512i read_row(const uint16_t* row, __m512i acc) {
  __m512 f[4];
  for (int i = 0; i < 4; ++i) {
    f[i] = _mm512_castsi512_ps(_mm512_loadu_si512(row + 32 * i));
  }
  for (int64_t i = 0; i < kDim; i += 32) {
    acc = _mm512_add_epi32(acc, _mm512_loadu_si512(row + i));
  }
  const __m512 m = _mm512_set1_ps(0.999f);
  for (int r = 0; r < g_work; ++r) {
    for (int i = 0; i < 4; ++i) {
      f[i] = _mm512_fmadd_ps(f[i], m, m);
    }
  }
  return _mm512_add_epi32(acc, _mm512_castps_si512(_mm512_add_ps(_mm512_add_ps(f[0], f[1]), _mm512_add_ps(f[2], f[3]))));
}

enum Order { kTokenMajor, kHeadMajor, kKernel, kKernelPrefetch };
const char* const kNames[] = {"token-major", "head-major", "kernel order", "kernel + pf"};

// One sequence's tile [t0, t0 + kTile) of K and V.
__m512i read_tile(Order order, const uint16_t* k, const uint16_t* v, int64_t b, int64_t t0, __m512i acc) {
  if (order == kHeadMajor) {
    for (const uint16_t* cache : {k, v}) {
      for (int64_t h = 0; h < kHeads; ++h) {
        const uint16_t* rows = cache + ((b * kHeads + h) * kContext + t0) * kDim;
        for (int64_t j = 0; j < kTile; ++j) {
          acc = read_row(rows + j * kDim, acc);
        }
      }
    }
    return acc;
  }
  const int64_t base = (b * kContext + t0) * kHeads * kDim;
  if (order == kTokenMajor) {
    for (const uint16_t* cache : {k, v}) {
      for (int64_t r = 0; r < kTile * kHeads; ++r) {
        acc = read_row(cache + base + r * kDim, acc);
      }
    }
    return acc;
  }
  for (int64_t j0 = 0; j0 < kTile; j0 += kBlock) {
    if (order == kKernelPrefetch) {
      const char* next = reinterpret_cast<const char*>(v + base + j0 * kHeads * kDim);
      for (int64_t off = 0; off < kBlock * kHeads * kDim * 2; off += 64) {
        asm volatile("prefetcht1 %0" : : "m"(next[off]));
      }
    }
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t j = j0; j < j0 + kBlock; ++j) {
        acc = read_row(k + base + (j * kHeads + h) * kDim, acc);
      }
    }
  }
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t j = 0; j < kTile; ++j) {
      acc = read_row(v + base + (j * kHeads + h) * kDim, acc);
    }
  }
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  g_work = argc > 1 ? std::atoi(argv[1]) : 0;
  const int64_t n = kBatch * kContext * kHeads * kDim;
  auto* k = static_cast<uint16_t*>(std::aligned_alloc(2 << 20, n * 2));
  auto* v = static_cast<uint16_t*>(std::aligned_alloc(2 << 20, n * 2));
  std::memset(k, 1, n * 2);
  std::memset(v, 2, n * 2);
  for (Order order : {kTokenMajor, kHeadMajor, kKernel, kKernelPrefetch}) {
    std::vector<double> seconds;
    for (int rep = 0; rep < 9; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      int64_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
      for (int64_t b = 0; b < kBatch; ++b) {
        __m512i acc = _mm512_setzero_si512();
        for (int64_t t0 = 0; t0 < kContext; t0 += kTile) {
          acc = read_tile(order, k, v, b, t0, acc);
        }
        total += _mm512_reduce_add_epi32(acc);
      }
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (total == 42) {  // keeps the loads
        std::printf(" ");
      }
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    std::printf("%-12s threads %d, work %d: %.2f ms, %.1f GB/s\n", kNames[order], omp_get_max_threads(), g_work,
                median * 1e3, 2.0 * n * 2 / median / 1e9);
  }
  std::free(k);
  std::free(v);
}
