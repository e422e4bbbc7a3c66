// decode_rows_gemm on AMX (bfloat16 caches on a CPU with AMX-BF16: cpu_has_amx_bf16()): both products of a
// key tile on the tile registers (amx_tiles.h), in bfloat16 with float32 accumulation, as the prefill
// forward does. Per tile of keys and KV head:
//   scores^T[keys, rows] = K[keys, Dqk] Q^T[Dqk, rows]: 16 keys at a time as the A operand, read where they
//       lie (a paged block edge or the tile's end: gathered, zero-padded); Q^T packed once per call (B);
//   the online softmax per row (row_ops.h) on the scores transposed back;
//   out[rows, Dv] += P[rows, keys] V[keys, Dv]: P in bfloat16 as A, V interleaved by pairs of keys (VNNI)
//       into a packed tile (an L2 pass over rows the scores just read); out stays in float32 memory
//       (16 x 16 tiles loaded and stored once per key tile).
// Query rows are padded to multiples of 16 with zeros. Q is packed as the caller gave it (bfloat16: exact) and
// the scale applied to the float32 scores (multiply_unscaled_q: rounding the scaled q to bfloat16 cost up to
// 2^-9 of every logit); P is rounded to bfloat16 for the products, as SDPA's CPU kernel does. One tile
// configuration for the whole call, no library calls inside the loop.
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

// One operand tile in memory: 16 rows of 64 bytes, `ld` bytes apart.
struct TileAt {
  const void* p;
  int64_t ld;
};

// C(m, n) (+)= sum over s < steps of A(m, s) B(n, s) for an MB x NB block of output tiles from (m0, n0);
// One step of a 1 x N or N x 1 block, whose N products share one operand: C(i) += A B for i < N, with the
// shared operand (A when kSharedIsA, else B) loaded once and other(i) the tile of the other one. Tiles: the
// shared A in 4 and the B operands alternating in 5 and 6, or the shared B in 6 and the A operands
// alternating in 4 and 5 (a load overlaps the previous product); C(i) in i.
template <int N, bool kSharedIsA, typename FO>
inline void shared_operand_step(const TileAt& shared, const FO& other) {
  constexpr int kShared = kSharedIsA ? 4 : 6, kFirstOther = kSharedIsA ? 5 : 4;
  tile_load<kShared>(shared.p, shared.ld);
  unroll<N>([&](auto i) {
    constexpr int I = decltype(i)::value, kOther = kFirstOther + I % 2;
    const TileAt t = other(I);
    tile_load<kOther>(t.p, t.ld);
    if constexpr (kSharedIsA) {
      tile_dot_bf16<I, kShared, kOther>();
    } else {
      tile_dot_bf16<I, kOther, kShared>();
    }
  });
}

// a(m, s) / b(n, s) / c(m, n) locate the tiles (TileAt), accumulate: C starts from memory, else from zero.
// Tile registers: C(m, n) in m * NB + n (at most 4); 1 x NB and MB x 1: shared_operand_step's; 2 x 2: A in
// 4, 5, B in 6, 7 (each operand load feeds two products).
template <int MB, int NB, typename FA, typename FB, typename FC>
inline void tile_block(int64_t m0, int64_t n0, int64_t steps, const FA& a, const FB& b, const FC& c,
                       bool accumulate) {
  static_assert(MB * NB <= 4 && (MB == 1 || NB == 1 || (MB == 2 && NB == 2)));
  unroll<MB * NB>([&](auto i) {
    constexpr int I = decltype(i)::value;
    if (accumulate) {
      const TileAt t = c(m0 + I / NB, n0 + I % NB);
      tile_load<I>(t.p, t.ld);
    } else {
      tile_zero<I>();
    }
  });
  for (int64_t s = 0; s < steps; ++s) {
    if constexpr (MB == 1) {
      shared_operand_step<NB, true>(a(m0, s), [&](int n) { return b(n0 + n, s); });
    } else if constexpr (NB == 1) {
      shared_operand_step<MB, false>(b(n0, s), [&](int m) { return a(m0 + m, s); });
    } else {
      const TileAt a0 = a(m0, s), a1 = a(m0 + 1, s), b0 = b(n0, s), b1 = b(n0 + 1, s);
      tile_load<4>(a0.p, a0.ld);
      tile_load<6>(b0.p, b0.ld);
      tile_dot_bf16<0, 4, 6>();
      tile_load<7>(b1.p, b1.ld);
      tile_dot_bf16<1, 4, 7>();
      tile_load<5>(a1.p, a1.ld);
      tile_dot_bf16<2, 5, 6>();
      tile_dot_bf16<3, 5, 7>();
    }
  }
  unroll<MB * NB>([&](auto i) {
    constexpr int I = decltype(i)::value;
    const TileAt t = c(m0 + I / NB, n0 + I % NB);
    tile_store<I>(const_cast<void*>(t.p), t.ld);
  });
}

// tile_block over all m_tiles x n_tiles output tiles: 4 x 1 or 1 x 4 blocks when one side is a single tile
// (MLA's 16 heads), else 2 x 2.
template <typename FA, typename FB, typename FC>
inline void tile_grid(int64_t m_tiles, int64_t n_tiles, int64_t steps, const FA& a, const FB& b, const FC& c,
                      bool accumulate) {
  if (n_tiles == 1) {
    for (int64_t m0 = 0; m0 < m_tiles; m0 += 4) {
      with_block<4>(m_tiles - m0, [&](auto mb) {
        tile_block<decltype(mb)::value, 1>(m0, 0, steps, a, b, c, accumulate);
      });
    }
  } else if (m_tiles == 1) {
    for (int64_t n0 = 0; n0 < n_tiles; n0 += 4) {
      with_block<4>(n_tiles - n0, [&](auto nb) {
        tile_block<1, decltype(nb)::value>(0, n0, steps, a, b, c, accumulate);
      });
    }
  } else {
    for (int64_t m0 = 0; m0 < m_tiles; m0 += 2) {
      for (int64_t n0 = 0; n0 < n_tiles; n0 += 2) {
        with_block<2>(m_tiles - m0, [&](auto mb) {
          with_block<2>(n_tiles - n0, [&](auto nb) {
            tile_block<decltype(mb)::value, decltype(nb)::value>(m0, n0, steps, a, b, c, accumulate);
          });
        });
      }
    }
  }
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

// The low / high 64-bit halves of each 128-bit lane of x and y, interleaved (functions, not lambdas: a
// lambda's function-pointer thunk is compiled without the file's target, and GCC warned of its __m512 ABI).
inline __m512 unpack_lo64(__m512 x, __m512 y) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
}
inline __m512 unpack_hi64(__m512 x, __m512 y) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
}

// dst[c * ldd + i] = src[i * lds + c] for i < 16 and the first min(16, count) rows c of dst: a 16 x 16
// block of floats transposed in registers (pairs of rows, then pairs of pairs, then 128-bit lanes twice).
inline void transpose_16x16(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t count) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) {
    r[i] = _mm512_loadu_ps(src + i * lds);
  }
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + k], 128-bit lane L: rows 4i .. 4i + 3 of column 4L + k
    r[4 * i] = unpack_lo64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = unpack_hi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = unpack_lo64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = unpack_hi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int k = 0; k < 4; ++k) {  // t[k]: lanes 0 / 2 of rows 0-7, t[4 + k]: lanes 1 / 3; t[8 ..]: rows 8-15
    t[k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
    t[4 + k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xdd);
    t[8 + k] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xdd);
  }
  for (int k = 0; k < 4; ++k) {  // column 4L + k of src: lane L of r[k], r[4 + k], r[8 + k], r[12 + k]
    const __m512 column[4] = {
        _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88), _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88),
        _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd), _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xdd)};
    for (int lane = 0; lane < 4; ++lane) {
      if (4 * lane + k < count) {
        _mm512_storeu_ps(dst + (4 * lane + k) * ldd, column[lane]);
      }
    }
  }
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
  TORCH_INTERNAL_ASSERT(tile <= kGemmDecodeTile);
  const bf16* key_block[kGemmDecodeTile / kAmxRows];  // this tile's key blocks (A operands), ld in values
  int64_t key_ld[kGemmDecodeTile / kAmxRows];
  // Scratch (DecodeScratch sizes it): bfloat16 Q^T packed [heads, row_blocks, steps_qk][16 pairs, 16 rows, 2],
  // gathered key blocks [tile, Dqk], packed V [tile / 32, Dv / 16][16 pairs, 16, 2], P [np, tile]; float32
  // scores^T [tile, np] and the padded output [heads, np, Dv].
  bf16* q_packed = a.lowp;
  bf16* key_buf = q_packed + a.heads * np * Dqk;
  bf16* v_packed = key_buf + tile * Dqk;
  bf16* p = v_packed + tile * Dv;
  float* scores_t = a.q_t;
  float* out = scores_t + tile * np;
  const bool unscaled = multiply_unscaled_q(a.scale);
  for (int64_t head = 0; head < a.heads; ++head) {
    const float q_factor = unscaled ? 1.f / a.q_factor(head) : 1.f;  // a.q holds q * a.q_factor(head)
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
      for (int64_t s = 0; s < steps_qk; ++s) {
        bf16* dst = q_packed + ((head * row_blocks + rb) * steps_qk + s) * 512;
        for (int64_t i = 0; i < 512; ++i) {  // i = pair * 32 + row * 2 + e
          const int64_t r = rb * kAmxRows + i % 32 / 2, d = s * kAmxK + i / 32 * 2 + i % 2;
          dst[i] = r < rows ? static_cast<bf16>(a.q[(head * rows + r) * Dqk + d] * q_factor) : bf16(0);
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
    const int64_t n = std::min(tile, a.k_end - k0);
    const int64_t n_pad = (n + kAmxK - 1) / kAmxK * kAmxK;
    for (int64_t head = 0; head < a.heads; ++head) {
      a.locate(a, a.kv_head + head, k0, n, a.key_rows, a.value_rows);
      const bf16* const* keys = reinterpret_cast<const bf16* const*>(a.key_rows);
      const bf16* const* values = reinterpret_cast<const bf16* const*>(a.value_rows);
      const bf16* qh = q_packed + head * row_blocks * steps_qk * 512;
      // scores^T [n, np] = K Q^T over the tile's key blocks (in place or gathered). No software prefetch: the
      // hardware streams a cache's runs of rows (measured: requesting the next tile into L2 gained nothing).
      const int64_t key_blocks = (n + kAmxRows - 1) / kAmxRows;
      for (int64_t kb = 0; kb < key_blocks; ++kb) {
        const int64_t j0 = kb * kAmxRows;
        key_block[kb] = amx_key_block(keys + j0, std::min(kAmxRows, n - j0), Dqk, key_buf + j0 * Dqk,
                                      &key_ld[kb]);
      }
      tile_grid(
          key_blocks, row_blocks, steps_qk,
          [&](int64_t kb, int64_t s) { return TileAt{key_block[kb] + s * kAmxK, key_ld[kb] * 2}; },
          [&](int64_t rb, int64_t s) { return TileAt{qh + (rb * steps_qk + s) * 512, kAmxRowBytes}; },
          [&](int64_t kb, int64_t rb) { return TileAt{scores_t + kb * kAmxRows * np + rb * kAmxRows, np * 4}; },
          false);
      // Softmax per row on the scores transposed back (16 x 16 blocks; scores_t holds whole key blocks, its
      // columns past n are never read); P in bfloat16 (columns n .. n_pad zero).
      for (int64_t r0 = 0; r0 < rows; r0 += kAmxRows) {
        for (int64_t j0 = 0; j0 < n; j0 += kAmxRows) {
          transpose_16x16(scores_t + j0 * np + r0, np, a.scores + r0 * tile + j0, tile, rows - r0);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* srow = a.scores + r * tile;
        if (unscaled) {
          scale_row(srow, n, a.q_factor(head));
        }
        const int64_t lo = std::max<int64_t>(a.key_lo[r] - k0, 0);
        const int64_t hi = std::min<int64_t>(a.key_hi[r] - k0, n - 1);
        online_softmax_step(srow, n, lo, hi, a.softcap, a.alibi_row(head, r, k0), a.row_max[head * rows + r],
                            a.row_sum[head * rows + r], out + (head * np + r) * Dv, Dv);
        convert_row(srow, p + r * tile, n);
        std::fill(p + r * tile + n, p + r * tile + n_pad, bf16(0));
      }
      amx_pack_values(values, n, Dv, v_packed);
      // out += P V over the tile's steps of 32 keys
      tile_grid(
          row_blocks, col_blocks, n_pad / kAmxK,
          [&](int64_t rb, int64_t s) { return TileAt{p + rb * kAmxRows * tile + s * kAmxK, tile * 2}; },
          [&](int64_t cb, int64_t s) { return TileAt{v_packed + (s * col_blocks + cb) * 512, kAmxRowBytes}; },
          [&](int64_t rb, int64_t cb) { return TileAt{out + (head * np + rb * kAmxRows) * Dv + cb * 16, Dv * 4}; },
          true);
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
