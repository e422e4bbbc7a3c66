// Does one core overlap streaming a cache from memory with the decode kernel's arithmetic, and what stops it?
// One thread reads 512 MiB of bfloat16 rows of 128 values in address order and, per row, widens them to
// float32 and runs 64 vector FMAs (what decode_kernel.h spends per key row per KV head at group 4: Q K^T and
// P V) against "q" vectors cycled through a hot array of H bytes (the kernel's q rows, output accumulators,
// scores and row pointers). Compared with the same loop over 64 rows that stay in L1 ("resident"): if the
// streamed time matches it, the memory reads hide behind the arithmetic.
//   g++ -O3 -mavx512f -mavx512bw benchmarks/experiments/micro/decode_hot_set.cpp -o /tmp/decode_hot_set
//   /tmp/decode_hot_set            (hot arrays of 1, 8, 16, 32, 64 KiB)
// Its results and what they decided were recorded in
// benchmarks/results/ at the time (git log -- benchmarks/results).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kRowValues = 128;            // one KV head's row, bfloat16
constexpr int64_t kValues = int64_t(256) << 20;  // 512 MiB
constexpr int kAccumulators = 16;

// ns per row: the median of 5 passes over kValues values, rows (resident ? r % 64 : r), hot array of
// hot_vectors float32 vectors (a power of two).
double ns_per_row(const uint16_t* cache, const float* hot, int64_t hot_vectors, bool resident) {
  const int64_t rows = kValues / kRowValues;
  std::vector<double> seconds;
  for (int pass = 0; pass < 5; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    __m512 acc[kAccumulators];
    for (auto& a : acc) {
      a = _mm512_setzero_ps();
    }
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* row = cache + (resident ? r % 64 : r) * kRowValues;
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {  // 32 values: even and odd elements widened by shift and mask
        const __m512i raw = _mm512_loadu_si512(row + 32 * c);
        const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(int(0xffff0000u))));
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {  // 16 FMAs per chunk, 64 per row
          const __m512 q = _mm512_loadu_ps(hot + 16 * ((r * 32 + c * 8 + i) & (hot_vectors - 1)));
          acc[2 * i] = _mm512_fmadd_ps(q, even, acc[2 * i]);
          acc[2 * i + 1] = _mm512_fmadd_ps(q, odd, acc[2 * i + 1]);
        }
      }
    }
    float sum = 0;
    for (auto& a : acc) {
      sum += _mm512_reduce_add_ps(a);
    }
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (sum == 42.f) {  // keeps the loop
      std::printf(" ");
    }
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2] / rows * 1e9;
}

}  // namespace

int main() {
  auto* cache = static_cast<uint16_t*>(std::aligned_alloc(4096, kValues * 2));
  std::memset(cache, 1, kValues * 2);
  std::vector<float> hot(64 * 1024 / 4);
  for (size_t i = 0; i < hot.size(); ++i) {
    hot[i] = 1e-3f * static_cast<float>(i % 977);
  }
  for (int64_t kib : {1, 8, 16, 32, 64}) {
    const int64_t vectors = kib * 1024 / 64;
    const double in_l1 = ns_per_row(cache, hot.data(), vectors, true);
    const double streamed = ns_per_row(cache, hot.data(), vectors, false);
    std::printf("hot %2lld KiB: resident %5.1f ns/row, streamed %5.1f ns/row (%4.1f GB/s), streamed / resident %.2f\n",
                static_cast<long long>(kib), in_l1, streamed, 2.0 * kRowValues / streamed, streamed / in_l1);
  }
  std::free(cache);
}
