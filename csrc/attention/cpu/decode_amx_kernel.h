// decode_rows_gemm on AMX (bfloat16 caches on a CPU with AMX-BF16: cpu_has_amx_bf16()): both products of a
// key tile on the tile registers (amx_tiles.h), in bfloat16 with float32 accumulation, as the prefill
// forward does. Per tile of keys and KV head:
//   scores^T[keys, rows] = K[keys, Dqk] Q^T[Dqk, rows]: 16 keys at a time as the A operand, read where they
//       lie (a paged block edge or the tile's end: gathered, zero-padded); Q^T packed once per call (B);
//   the online softmax per row (row_ops.h) on the scores transposed back;
//   out[rows, Dv] += P[rows, keys] V[keys, Dv]: P in bfloat16 as A, V interleaved by pairs of keys (VNNI)
//       into a packed tile (an L2 pass over rows the scores just read); out stays in float32 memory
//       (16 x 16 tiles loaded and stored once per key tile).
// Query rows are padded to multiples of 16 with zeros. Q (scaled) and P are rounded to bfloat16 for the
// products, as SDPA's CPU kernel does. One tile configuration for the whole call, no library calls inside
// the loop.
//
// Included by decode_gemm_kernel.h; the AVX-512 copy alone has it (ATTN_OPS_DECODE_AMX; AMX exists only on
// AVX-512 CPUs).
#pragma once

#include "attention/cpu/amx_tiles.h"
#include "attention/cpu/decode_kernel.h"

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
#define ATTN_OPS_DECODE_AMX 1
#else
#define ATTN_OPS_DECODE_AMX 0
#endif

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {
namespace {

// Whether the values of this tile are the first dim_v features of its key rows (MLA's latent rows).
template <typename scalar_t, typename acc_t>
bool values_in_keys(const DecodeRows<scalar_t, acc_t>& a, int64_t n) {
  return a.dim_v <= a.dim_qk && std::equal(a.value_rows, a.value_rows + n, a.key_rows);
}

#if ATTN_OPS_DECODE_AMX

// Whether decode_rows_amx takes this call: bfloat16, whole tile depths of both products (32 features, 32
// keys per tile), on a CPU that runs AMX-BF16.
template <typename scalar_t, typename acc_t>
bool amx_applies(const DecodeRows<scalar_t, acc_t>& a) {
  return std::is_same_v<scalar_t, c10::BFloat16> && a.dim_qk % kAmxK == 0 && a.dim_v % kAmxK == 0 &&
         a.tile % kAmxK == 0 && cpu_has_amx_bf16();
}

// Calls f(std::integral_constant<int, i>) for i = 0 .. N - 1 (tile numbers must be constants).
template <int N, typename F>
inline void unroll(const F& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }
  (std::make_integer_sequence<int, N>{});
}

// Up to 4 accumulator tiles (0-3) at a time; A in tile 4; B alternating in tiles 5 and 6 so a load overlaps
// the previous product.
constexpr int kAmxAcc = 4;
constexpr int kTileA = 4;
template <int I>
constexpr int tile_b() {
  return 5 + I % 2;
}

// The count <= 16 rows at rows[j] as one A operand of 16 rows: in place when there are 16 equally spaced
// ones (returns the first row, *ld = their spacing in values), else copied into buffer [16, dim], zero rows
// past count.
inline const c10::BFloat16* amx_key_block(const c10::BFloat16* const* rows, int64_t count, int64_t dim,
                                          c10::BFloat16* buffer, int64_t* ld) {
  const int64_t stride = count > 1 ? rows[1] - rows[0] : dim;
  bool even = count == kAmxRows && stride >= dim;
  for (int64_t j = 2; even && j < count; ++j) {
    even = rows[j] - rows[j - 1] == stride;
  }
  if (even) {
    *ld = stride;
    return rows[0];
  }
  for (int64_t j = 0; j < count; ++j) {
    std::copy_n(rows[j], dim, buffer + j * dim);
  }
  std::fill(buffer + count * dim, buffer + kAmxRows * dim, c10::BFloat16(0));
  *ld = dim;
  return buffer;
}

// B operands of out += P V for the n value rows at values[j] (zero rows up to whole steps of 32 keys):
// packed[(step * (dv / 16) + col_block) * 512 + pair * 32 + 2 * col + e] = values[32 step + 2 pair + e]
// [16 col_block + col], i.e. two keys' rows interleaved value by value, 32 columns per two permutes.
inline void amx_pack_values(const c10::BFloat16* const* values, int64_t n, int64_t dv, c10::BFloat16* packed) {
  alignas(64) static constexpr uint16_t kLow[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i low = _mm512_load_si512(kLow), high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  const int64_t blocks = dv / 16, steps = (n + kAmxK - 1) / kAmxK;
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t pair = 0; pair < kAmxRows; ++pair) {
      const int64_t j = step * kAmxK + 2 * pair;
      const c10::BFloat16* v0 = j < n ? values[j] : nullptr;
      const c10::BFloat16* v1 = j + 1 < n ? values[j + 1] : nullptr;
      c10::BFloat16* dst = packed + step * blocks * 512 + pair * 32;
      for (int64_t c = 0; c < dv; c += 32, dst += 2 * 512) {
        const __m512i x0 = v0 ? _mm512_loadu_si512(v0 + c) : _mm512_setzero_si512();
        const __m512i x1 = v1 ? _mm512_loadu_si512(v1 + c) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(x0, low, x1));
        _mm512_storeu_si512(dst + 512, _mm512_permutex2var_epi16(x0, high, x1));
      }
    }
  }
}

template <typename scalar_t>
void decode_rows_amx(const DecodeRows<scalar_t, float>& a) {
  using bf16 = c10::BFloat16;
  static_assert(std::is_same_v<scalar_t, bf16>);
  const int64_t rows = a.rows, Dqk = a.dim_qk, Dv = a.dim_v, tile = a.tile;
  const int64_t np = gemm_rows_padded(rows), row_blocks = np / kAmxRows, steps_qk = Dqk / kAmxK;
  const int64_t col_blocks = Dv / 16, all_rows = a.heads * rows;
  // Scratch (DecodeScratch sizes it): bfloat16 Q^T packed [heads, row_blocks, steps_qk][16 pairs, 16 rows, 2],
  // a gathered key block [16, Dqk], packed V [tile / 32, Dv / 16][16 pairs, 16, 2], P [np, tile]; float32
  // scores^T [tile, np] and the padded output [heads, np, Dv].
  bf16* q_packed = a.lowp;
  bf16* key_buf = q_packed + a.heads * np * Dqk;
  bf16* v_packed = key_buf + kAmxRows * Dqk;
  bf16* p = v_packed + tile * Dv;
  float* scores_t = a.q_t;
  float* out = scores_t + tile * np;
  for (int64_t head = 0; head < a.heads; ++head) {
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
      for (int64_t s = 0; s < steps_qk; ++s) {
        bf16* dst = q_packed + ((head * row_blocks + rb) * steps_qk + s) * 512;
        for (int64_t i = 0; i < 512; ++i) {  // i = pair * 32 + row * 2 + e
          const int64_t r = rb * kAmxRows + i % 32 / 2, d = s * kAmxK + i / 32 * 2 + i % 2;
          dst[i] = r < rows ? static_cast<bf16>(a.q[(head * rows + r) * Dqk + d]) : bf16(0);
        }
      }
    }
  }
  fill_row(a.row_max, all_rows, -std::numeric_limits<float>::infinity());
  fill_row(a.row_sum, all_rows, 0.f);
  fill_row(out, a.heads * np * Dv, 0.f);
  std::fill(p, p + np * tile, bf16(0));  // rows past `rows` stay zero
  // PyTorch's brgemm caches which configuration the tiles hold: make it forget, ours replaces it.
  at::native::cpublas::brgemm_release();
  amx_configure();
  for (int64_t k0 = a.k_begin; k0 < a.k_end; k0 += tile) {
    const int64_t n = std::min(tile, a.k_end - k0), n_next = std::min(tile, a.k_end - k0 - n);
    const int64_t n_pad = (n + kAmxK - 1) / kAmxK * kAmxK;
    for (int64_t head = 0; head < a.heads; ++head) {
      a.locate(a, a.kv_head + head, k0, n + n_next, a.key_rows, a.value_rows);
      const bf16* const* keys = reinterpret_cast<const bf16* const*>(a.key_rows);
      const bf16* const* values = reinterpret_cast<const bf16* const*>(a.value_rows);
      const bf16* qh = q_packed + head * row_blocks * steps_qk * 512;
      // scores^T, 16 keys by up to 4 x 16 rows at a time; meanwhile the next tile's rows are requested into L2
      for (int64_t j0 = 0; j0 < n; j0 += kAmxRows) {
        for (int64_t j = n + j0; j < std::min(n + j0 + kAmxRows, n + n_next); ++j) {
          prefetch_row<1>(keys[j], Dqk);
          if (values[j] != keys[j]) {
            prefetch_row<1>(values[j], Dv);
          }
        }
        int64_t ldk = 0;
        const bf16* kt = amx_key_block(keys + j0, std::min(kAmxRows, n - j0), Dqk, key_buf, &ldk);
        for (int64_t g0 = 0; g0 < row_blocks; g0 += kAmxAcc) {
          with_block<kAmxAcc>(row_blocks - g0, [&](auto gb) {
            constexpr int G = decltype(gb)::value;
            unroll<G>([&](auto i) { tile_zero<decltype(i)::value>(); });
            for (int64_t s = 0; s < steps_qk; ++s) {
              tile_load<kTileA>(kt + s * kAmxK, ldk * 2);
              unroll<G>([&](auto i) {
                constexpr int I = decltype(i)::value;
                tile_load<tile_b<I>()>(qh + ((g0 + I) * steps_qk + s) * 512, kAmxRowBytes);
                tile_dot_bf16<I, kTileA, tile_b<I>()>();
              });
            }
            unroll<G>([&](auto i) {
              constexpr int I = decltype(i)::value;
              tile_store<I>(scores_t + j0 * np + (g0 + I) * kAmxRows, np * 4);
            });
          });
        }
      }
      // Softmax per row on the scores transposed back; P in bfloat16 (columns n .. n_pad zero).
      for (int64_t r = 0; r < rows; ++r) {
        float* srow = a.scores + r * tile;
        for (int64_t j = 0; j < n; ++j) {
          srow[j] = scores_t[j * np + r];
        }
        const int64_t lo = std::max<int64_t>(a.key_lo[r] - k0, 0);
        const int64_t hi = std::min<int64_t>(a.key_hi[r] - k0, n - 1);
        online_softmax_step(srow, n, lo, hi, a.softcap, a.row_max[head * rows + r], a.row_sum[head * rows + r],
                            out + (head * np + r) * Dv, Dv);
        convert_row(srow, p + r * tile, n);
        std::fill(p + r * tile + n, p + r * tile + n_pad, bf16(0));
      }
      amx_pack_values(values, n, Dv, v_packed);
      // out += P V: 16 rows by up to 4 x 16 columns at a time, over the tile's steps of 32 keys
      for (int64_t rb = 0; rb < row_blocks; ++rb) {
        for (int64_t c0 = 0; c0 < col_blocks; c0 += kAmxAcc) {
          with_block<kAmxAcc>(col_blocks - c0, [&](auto cb) {
            constexpr int G = decltype(cb)::value;
            float* o = out + (head * np + rb * kAmxRows) * Dv + c0 * 16;
            unroll<G>([&](auto i) { tile_load<decltype(i)::value>(o + decltype(i)::value * 16, Dv * 4); });
            for (int64_t s = 0; s < n_pad / kAmxK; ++s) {
              tile_load<kTileA>(p + rb * kAmxRows * tile + s * kAmxK, tile * 2);
              unroll<G>([&](auto i) {
                constexpr int I = decltype(i)::value;
                tile_load<tile_b<I>()>(v_packed + (s * col_blocks + c0 + I) * 512, kAmxRowBytes);
                tile_dot_bf16<I, kTileA, tile_b<I>()>();
              });
            }
            unroll<G>([&](auto i) { tile_store<decltype(i)::value>(o + decltype(i)::value * 16, Dv * 4); });
          });
        }
      }
    }
  }
  amx_release();
  for (int64_t head = 0; head < a.heads; ++head) {
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = a.out + (head * rows + r) * Dv;
      std::copy_n(out + (head * np + r) * Dv, Dv, dst);
      a.lse[head * rows + r] = finish_row(dst, Dv, a.row_max[head * rows + r], a.row_sum[head * rows + r]);
    }
  }
}

#endif  // ATTN_OPS_DECODE_AMX

}  // namespace
}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS
