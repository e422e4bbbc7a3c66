// Issue rate of the instructions the CPU decode kernel could spend on Q K^T, on this CPU: 24 independent
// accumulator chains each (enough to hide any latency), thread CPU time per instruction.
//   g++ -O2 -mavx512f -mavx512bf16 benchmarks/experiments/micro/cpu_dot_throughput.cpp -o /tmp/cpu_dot_throughput && /tmp/cpu_dot_throughput
// (needs AVX512-BF16; its results and what they decided were recorded in
// benchmarks/results/ at the time (git log -- benchmarks/results))
#include <immintrin.h>

#include <cstdio>
#include <ctime>

namespace {

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

constexpr long kSteps = 100000000;

}  // namespace

// The 24 accumulators are named registers (an array indexed in asm operands could live in memory).
#define ATTN_CHAINS(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
#define ATTN_DECLARE(k) __m512 a##k = _mm512_setzero_ps();
#define ATTN_SUM(k) sum = _mm512_add_ps(sum, a##k);
#define ATTN_TIME(name, INSTRUCTION)                 \
  double name;                                       \
  {                                                  \
    ATTN_CHAINS(ATTN_DECLARE)                        \
    const double t = cpu_seconds();                  \
    for (long i = 0; i < kSteps; ++i) {              \
      ATTN_CHAINS(INSTRUCTION)                       \
    }                                                \
    name = (cpu_seconds() - t) / kSteps / 24 * 1e9;  \
    ATTN_CHAINS(ATTN_SUM)                            \
  }
#define ATTN_FMA(k) asm volatile("vfmadd231ps %1, %2, %0" : "+v"(a##k) : "v"(x), "v"(y));
#define ATTN_DPBF16(k) asm volatile("vdpbf16ps %1, %2, %0" : "+v"(a##k) : "v"(x), "v"(y));

int main() {
  const __m512 x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.f);
  __m512 sum = _mm512_setzero_ps();
  ATTN_TIME(fma, ATTN_FMA)
  ATTN_TIME(dpbf16, ATTN_DPBF16)
  float sink[16];
  _mm512_storeu_ps(sink, sum);
  std::printf("ns per instruction: vfmadd231ps zmm %.3f (16 products), vdpbf16ps zmm %.3f (32 products)%s\n", fma,
              dpbf16, sink[0] == 12345.f ? " " : "");
  return 0;
}
