// decode_rows_gemm on AMX (bfloat16 / float16 caches on a CPU whose brgemm runs them: lowp_brgemm_available):
// both products of a key tile in the cache's dtype with float32 accumulation, as the prefill forward does.
//   scores^T[keys, rows] = K_tile[keys, Dqk] Q^T[Dqk, rows]: the key tile is brgemm's A operand, read in
//       place (no packing: only B is packed, and Q^T is packed once per call);
//   out[rows, Dv] += P[rows, keys] V_tile[keys, Dv]: V packed per tile in 64-wide column blocks (an L2 pass
//       over a tile the scores just read).
// Q (scaled) and P are rounded to the cache's dtype for the products, as SDPA's CPU kernel does. Partial
// tiles and tiles whose rows are not equally spaced (paged caches) are gathered into a zero-padded full tile
// first, so every brgemm call has one of a few shapes (brgemm compiles a kernel per shape).
//
// Included by decode_gemm_kernel.h; the AVX-512 copy alone calls it (AMX exists only on AVX-512 CPUs).
#pragma once

#include "attention/cpu/decode_kernel.h"

namespace attn_ops::cpu::ATTN_OPS_DECODE_NS {
namespace {

constexpr int64_t kAmxValueBlock = 64;  // packed column blocks of V and of Q^T (lowp_brgemm_pack's most)
// Both AVX-512 kernels request the next tile's rows into L2 (prefetch_row<1>) while they multiply this one:
// into L1, a 576-wide tile (144 KiB in bfloat16, 288 KiB in float32) evicts its own first rows and Q.

// Whether the values of this tile are the first dim_v features of its key rows (MLA's latent rows).
template <typename scalar_t, typename acc_t>
bool values_in_keys(const DecodeRows<scalar_t, acc_t>& a, int64_t n) {
  return a.dim_v <= a.dim_qk && std::equal(a.value_rows, a.value_rows + n, a.key_rows);
}

// Whether decode_rows_amx takes this call: the shapes brgemm's packing needs, on a CPU that runs it.
template <typename scalar_t, typename acc_t>
bool amx_applies(const DecodeRows<scalar_t, acc_t>& a) {
  return a.dim_qk % 2 == 0 && a.dim_v % kAmxValueBlock == 0 && a.tile % 2 == 0 && lowp_brgemm_available<scalar_t>();
}

// The n rows at rows[j] as one matrix of `tile` rows: in place when n == tile and they are equally spaced
// (returns the first row, *ld = their spacing), else copied into buffer [tile, dim] with zero rows past n.
template <typename scalar_t>
const scalar_t* amx_tile(const scalar_t* const* rows, int64_t n, int64_t tile, int64_t dim, scalar_t* buffer,
                         int64_t* ld) {
  const int64_t stride = n > 1 ? rows[1] - rows[0] : dim;
  bool even = n == tile && stride >= dim;
  for (int64_t j = 2; even && j < n; ++j) {
    even = rows[j] - rows[j - 1] == stride;
  }
  if (even) {
    *ld = stride;
    return rows[0];
  }
  for (int64_t j = 0; j < n; ++j) {
    std::copy_n(rows[j], dim, buffer + j * dim);
  }
  std::fill(buffer + n * dim, buffer + tile * dim, scalar_t(0));
  *ld = dim;
  return buffer;
}

template <typename scalar_t>
void decode_rows_amx(const DecodeRows<scalar_t, float>& a) {
  const int64_t rows = a.rows, Dqk = a.dim_qk, Dv = a.dim_v, tile = a.tile;
  const int64_t np = gemm_rows_padded(rows);
  // Scratch in the cache's dtype (DecodeScratch sizes it): packed Q^T [heads][Dqk, np], Q^T unpacked [Dqk, np], a gathered key tile
  // [tile, Dqk], a gathered value tile [tile, Dv], the packed value tile [Dv / 64][tile, 64], P [rows, tile].
  scalar_t* q_packed = a.lowp;
  scalar_t* q_plain = q_packed + a.heads * Dqk * np;
  scalar_t* key_buf = q_plain + Dqk * np;
  scalar_t* value_buf = key_buf + tile * Dqk;
  scalar_t* value_packed = value_buf + tile * Dv;
  scalar_t* p_lowp = value_packed + tile * Dv;
  float* scores_t = a.q_t;  // [tile, np]
  for (int64_t head = 0; head < a.heads; ++head) {
    std::fill(q_plain, q_plain + Dqk * np, scalar_t(0));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t d = 0; d < Dqk; ++d) {
        q_plain[d * np + r] = static_cast<scalar_t>(a.q[(head * rows + r) * Dqk + d]);
      }
    }
    // In blocks of up to 64 query rows (brgemm packs at most 64 columns): block c at + c * Dqk.
    for (int64_t c = 0; c < np; c += kAmxValueBlock) {
      lowp_brgemm_pack(Dqk, std::min(kAmxValueBlock, np - c), np, q_plain + c, q_packed + head * Dqk * np + c * Dqk);
    }
  }
  const scalar_t* key_tile = nullptr;  // this tile's keys [tile, Dqk] (row stride ldk)
  int64_t ldk = 0;
  const auto scores = [&](int64_t head, int64_t k0, int64_t n) {
    const int64_t n_next = std::min(tile, a.k_end - k0 - n);
    a.locate(a, a.kv_head + head, k0, n + n_next, a.key_rows, a.value_rows);
    for (int64_t j = n; j < n + n_next; ++j) {  // the next tile, requested while this one computes
      prefetch_row<1>(a.key_rows[j], Dqk);
      if (a.value_rows[j] != a.key_rows[j]) {
        prefetch_row<1>(a.value_rows[j], Dv);
      }
    }
    key_tile = amx_tile(a.key_rows, n, tile, Dqk, key_buf, &ldk);
    for (int64_t c = 0; c < np; c += kAmxValueBlock) {
      const int64_t width = std::min(kAmxValueBlock, np - c);
      lowp_brgemm(tile, width, Dqk, key_tile, ldk, q_packed + head * Dqk * np + c * Dqk, width, scores_t + c, np,
                  false);
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        a.scores[r * tile + j] = scores_t[j * np + r];
      }
    }
  };
  const auto values = [&](int64_t head, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {  // P in the cache's dtype, zero past n
      convert_row(a.scores + r * tile, p_lowp + r * tile, n);
      std::fill(p_lowp + r * tile + n, p_lowp + (r + 1) * tile, scalar_t(0));
    }
    // MLA: the values are the first Dv features of the key rows.
    int64_t ldv = ldk;
    const scalar_t* value_tile =
        values_in_keys(a, n) ? key_tile : amx_tile(a.value_rows, n, tile, Dv, value_buf, &ldv);
    float* out = a.out + head * rows * Dv;
    for (int64_t c = 0; c < Dv; c += kAmxValueBlock) {
      lowp_brgemm_pack(tile, kAmxValueBlock, ldv, value_tile + c, value_packed + c * tile);
      lowp_brgemm(rows, kAmxValueBlock, tile, p_lowp, tile, value_packed + c * tile, kAmxValueBlock, out + c, Dv,
                  true);
    }
  };
  decode_tiles(a, scores, values);
  at::native::cpublas::brgemm_release();
}

}  // namespace
}  // namespace attn_ops::cpu::ATTN_OPS_DECODE_NS
