// The tensor-core backward of attention for float16 / bfloat16: FlashAttention-2 style, mma.sync.m16n8k16
// with fp32 accumulators (sm_80+; the H100, sm_90, is the target). It computes what the row kernels of
// backward_rows.cuh compute: with p = exp(logit - lse) and delta = rowsum(dout * out) - dlse (from
// backward_delta_kernel, run first), ds = p * (dout.v - delta) * logit'; dV = P^T dO, dK = dS^T Q,
// dQ = dS K. Rows with lse = -inf, rows past len_q and keys past len_k or outside a row's window get p = 0.
//
// Blocks. A block owns kBlockN = 64 keys of one (batch b, KV head) and loops over the query tiles (kBlockM
// rows of one query head) of its query heads of the KV group that can see one of its keys (the queries
// of Window::queries_of, whose bounds are non-decreasing in the key: causal and sliding windows skip whole
// tiles). The group's query heads are split over gridDim.y = head_splits blocks when the (key tile, KV
// head, batch) blocks alone would not fill the GPU twice (MQA: Hq = 32, Hkv = 1 gave 256 serial blocks
// for 132 SMs). dK and dV stay in registers for the whole loop and are stored once; with one head split
// no other block touches these keys (no atomics), with more each block adds its share by fp32 atomics
// into dk_accum / dv_accum, converted to dk / dv afterwards (then dK and dV are not bitwise
// deterministic either). dQ is summed over the key tiles by fp32 atomicAdd into dq_accum (zeroed by the
// caller), converted to dq by convert_rows_kernel afterwards; so dq, unlike the row kernels' dq (and
// unlike dK and dV without head splits), is not bitwise deterministic: the fp32 summation order varies
// between runs. On sm_90 the atomics add pairs of floats (float2 atomicAdd).
//
// Warps. 4 warps; warp w owns keys 16 w .. 16 w + 15 of the tile and computes, per query tile, the
// transposed products (keys as MMA rows) dP^T = V dO^T and S^T = K Q^T, then P^T and dS^T element-wise in
// fp32, re-packed from the accumulators into A fragments in registers: dV += P^T dO, dK += dS^T Q (dO and Q
// read by ldmatrix.trans). dS^T goes through smem for dQ = dS K, where warp w computes query slice
// w % (kBlockM / 16) against column slice w / (kBlockM / 16) and adds each 16-column chunk with atomics
// (no dQ registers kept across chunks).
//
// Pipeline. K and V are copied once; Q, dO (and lse * log2e, delta) tiles are double-buffered with cp.async:
// tile t + 1 is in flight while tile t is computed. Rows past len_q / keys past len_k are zero-filled
// (never read). Three barriers per query tile (buffer reuse, tile visible, dS^T complete).
//
// Configurations (smem: lse/delta + K + V + 2 Q + 2 dO + dS^T, rows padded by 16 bytes so that the 8 rows of
// an ldmatrix hit 8 different bank quads; registers from ptxas for sm_90, no spills; dK + dV accumulators
// take (dim_qk + dim_v) / 2 fp32 registers per thread, S^T and dP^T kBlockM / 2 each, so kBlockM shrinks as
// the head dims grow; blocks per SM on an H100 (228 KB smem, 64K registers) as limited by smem / by
// registers):
//   dim_qk/dim_v  kBlockM  kBlockN  smem      registers  blocks/SM
//   64/64         64       64       64.0 KB   239        3 / 2
//   96/96         64       64       88.0 KB   255        2 / 2
//   128/128       32       64       73.5 KB   248        3 / 2
//   192/128       16       64       66.3 KB   254        3 / 2   (kBlockM 32 spills)
// 256/256 is not covered: dK + dV alone would take 256 registers per thread (mma_backward_supported says
// false, the row kernels run).
//
// Expected limits: below FlashAttention-2 (4 warps with 16 keys each; K/V fragments re-read from smem per
// query tile; dQ by atomics per 16 columns; one block per key tile and KV head, so a short sequence with few
// KV heads gives few blocks) and well below Hopper-native kernels (wgmma/TMA).
#include "attention/cuda/attention_cuda.h"
#include "attention/cuda/forward_rows.cuh"
#include "attention/cuda/launch_record.h"
#include "attention/cuda/mma_fragments.cuh"
#include "common/cuda/kernel_attributes.cuh"

#include <c10/util/Exception.h>
#include <nv/target>

#include <climits>
#include <cstdint>
#include <tuple>

namespace attn_ops::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Tile shape of one (dim_qk, dim_v) pair.
template <int Dqk, int Dv, int BlockM>
struct BackwardTile {
  static constexpr int kDqk = Dqk, kDv = Dv, kBlockM = BlockM;
  static constexpr int kWarps = 4, kThreads = kWarps * kWarpSize;
  static constexpr int kBlockN = 16 * kWarps;  // keys of a block: one m16 slice per warp
  // smem row pitches in elements: 8 more than a row, an odd number of 16-byte units.
  static constexpr int kKPitch = kDqk + 8, kVPitch = kDv + 8, kSPitch = kBlockM + 8;
  // dQ = dS K: query slices of 16 rows, and the dim_qk columns split between the warps of one slice.
  static constexpr int kQSlices = kBlockM / 16, kColSplit = kWarps / kQSlices, kDqCols = kDqk / kColSplit;
  static_assert(kDqk % 16 == 0 && kDv % 16 == 0 && kBlockM % 16 == 0, "whole m16n8k16 steps");
  static_assert(kWarps % kQSlices == 0 && kDqCols % 16 == 0, "dQ columns split evenly in 16-column chunks");
  static_assert(kBlockM <= kThreads, "one thread per query row loads its lse and delta");
  static_assert(kBlockN == kBackwardKeyTile, "attention_cuda.cu sizes head_splits with kBackwardKeyTile");

  // Bytes of the smem regions, in order: [2][2][kBlockM] lse * log2e and delta, K, V, [2] Q, [2] dO, dS^T.
  static constexpr int kStatBytes = 4 * kBlockM * int(sizeof(float));
  static constexpr int kKBytes = kBlockN * kKPitch * kElemBytes, kVBytes = kBlockN * kVPitch * kElemBytes;
  static constexpr int kQBuf = kBlockM * kKPitch * kElemBytes, kDoBuf = kBlockM * kVPitch * kElemBytes;
  static constexpr int kDsBytes = kBlockN * kSPitch * kElemBytes;
  static constexpr int kSmemBytes = kStatBytes + kKBytes + kVBytes + 2 * kQBuf + 2 * kDoBuf + kDsBytes;
};

using BackwardTiles = std::tuple<BackwardTile<64, 64, 64>, BackwardTile<96, 96, 64>, BackwardTile<128, 128, 32>,
                                 BackwardTile<192, 128, 16>>;

// acc += A B^T for the 16 rows of this warp: A = kDim columns of 16 smem rows, B = kN smem rows of kDim
// columns (pitch kPitch), from this lane's ldmatrix addresses a_addr (A, not transposed) and b_addr (B, not
// transposed). acc n-tile n holds A rows g, g + 8 x B rows 8 n + c + {0, 1}.
template <typename T, int kDim, int kN, int kPitch>
__device__ __forceinline__ void mma_abt(float (&acc)[kN / 8][4], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk) {
    uint32_t af[4];
    ldmatrix_x4<false>(af, a_addr + kk * 16 * kElemBytes);
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      uint32_t bf[4];
      ldmatrix_x4<false>(bf, b_addr + (np * 16 * kPitch + kk * 16) * kElemBytes);
      mma_16816<T>(acc[2 * np], af, bf[0], bf[1]);
      mma_16816<T>(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
}

// acc += A B for one k step of 16: A fragment a, B = 16 smem rows of kN columns (pitch kPitch) read
// transposed from this lane's ldmatrix address b_addr. acc n-tile n holds columns 8 n + c + {0, 1}.
template <typename T, int kN, int kPitch>
__device__ __forceinline__ void mma_ab_step(float (&acc)[kN / 8][4], const uint32_t (&a)[4], uint32_t b_addr) {
#pragma unroll
  for (int np = 0; np < kN / 16; ++np) {
    uint32_t bf[4];
    ldmatrix_x4<true>(bf, b_addr + np * 16 * kElemBytes);
    mma_16816<T>(acc[2 * np], a, bf[0], bf[1]);
    mma_16816<T>(acc[2 * np + 1], a, bf[2], bf[3]);
  }
}

// Adds the pair (x, y) to p[0], p[1] (8-byte aligned): one vector atomic on sm_90, two scalar ones before.
__device__ __forceinline__ void atomic_add_pair(float* p, float x, float y) {
  NV_IF_ELSE_TARGET(NV_PROVIDES_SM_90, (atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));),
                    (atomicAdd(p, x); atomicAdd(p + 1, y);))
}

// dK or dV rows g, g + 8 of this warp's key slice (keys j0 + 16 warp + g + 8 r): stored as pairs of T, or
// with query-head splits summed into the fp32 accumulator.
template <typename T, int kDim>
__device__ __forceinline__ void store_key_rows(const float (&acc)[kDim / 8][4], T* dst, const TokenLayout& dst_layout,
                                               float* accum, const TokenLayout& accum_layout, int b, int64_t k0,
                                               int j, int len_k, int kv_head) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, c = 2 * (lane % 4);
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = j + warp * 16 + g + 8 * r;
    if (key >= len_k) {
      continue;
    }
    if (accum != nullptr) {
      float* row = accum + accum_layout.at(b, k0, key, kv_head) + c;
#pragma unroll
      for (int n = 0; n < kDim / 8; ++n) {
        atomic_add_pair(row + 8 * n, acc[n][2 * r], acc[n][2 * r + 1]);
      }
    } else {
      T* row = dst + dst_layout.at(b, k0, key, kv_head) + c;
#pragma unroll
      for (int n = 0; n < kDim / 8; ++n) {
        *reinterpret_cast<uint32_t*>(row + 8 * n) = pack2<T>(acc[n][2 * r], acc[n][2 * r + 1]);
      }
    }
  }
}

// One block: the keys of tile blockIdx.x % key_tiles of one (batch, KV head), over every query tile of the
// query heads of split blockIdx.y of the group that sees them.
template <typename T, typename C>
__device__ __forceinline__ void backward_mma_block(const BackwardArgs<T>& a, int64_t key_tiles) {
  static_assert(sizeof(T) == kElemBytes);
  constexpr int BM = C::kBlockM, BN = C::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  float* stats = reinterpret_cast<float*>(smem);  // [2 buffers][lse * log2e, delta][BM]
  const uint32_t sk = smem_u32(smem + C::kStatBytes);  // [BN][kKPitch] K
  const uint32_t sv = sk + C::kKBytes;                 // [BN][kVPitch] V
  const uint32_t sq = sv + C::kVBytes;                 // [2][BM][kKPitch] double-buffered Q
  const uint32_t sdo = sq + 2 * C::kQBuf;              // [2][BM][kVPitch] double-buffered dO
  const uint32_t sds = sdo + 2 * C::kDoBuf;            // [BN][kSPitch] dS^T
  // dS^T as 32-bit words (pairs of queries), for the stores from the accumulators.
  uint32_t* ds_words = reinterpret_cast<uint32_t*>(smem + (sds - smem_u32(smem)));

  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int g = lane / 4, c = 2 * (lane % 4);  // fragment row and column (mma_16816)

  // Positions and counts in int from here on (fewer registers; sequence lengths are int32, and the
  // clamps keep even unchecked lengths from overflowing).
  const int kt = static_cast<int>(blockIdx.x % key_tiles);
  const int kv_head = static_cast<int>(blockIdx.x / key_tiles % a.heads_kv);
  const int b = static_cast<int>(blockIdx.x / key_tiles / a.heads_kv);
  const Seq s = a.seqs.at(b);
  const int len_q = static_cast<int>(min(min(s.len_q, a.max_len_q), int64_t(INT_MAX / 2)));
  const int len_k = static_cast<int>(min(min(s.len_k, a.max_len_k), int64_t(INT_MAX / 2)));
  const int j0 = kt * BN;  // first key of the block
  if (j0 >= len_k) {
    return;  // the whole tile is past the sequence: no key to write
  }
  // Queries that see key j (none past len_k), as ints in [0, len_q - 1] (empty: first > last).
  const auto queries_of = [&](int j, int& first, int& last) {
    first = 1;
    last = 0;
    if (j < len_k) {
      int64_t lo, hi;
      a.window.queries_of(s, j, &lo, &hi);
      first = static_cast<int>(min(lo, int64_t(len_q)));
      last = static_cast<int>(min(hi, int64_t(len_q - 1)));
    }
  };
  // The query tiles (of BM positions) covering the queries that see a key of the tile.
  int q_first, q_last, unused;
  queries_of(j0, q_first, unused);
  queries_of(min(j0 + BN - 1, len_k - 1), unused, q_last);
  const int qt_first = q_first / BM;
  const int n_qt = q_first <= q_last ? q_last / BM - qt_first + 1 : 0;
  // This block's query heads of the group: [head0, head0 + n_heads).
  const int head0 = static_cast<int>(blockIdx.y * a.heads_per_split);
  const int n_heads = min(static_cast<int>(a.heads_per_split), static_cast<int>(a.group) - head0);
  if (n_heads <= 0) {
    return;
  }
  const int n_iter = n_qt * n_heads;  // (query head, query tile) pairs, head-major

  // Queries that see this thread's keys g and g + 8 of its warp's slice.
  int vis_first[2], vis_last[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    queries_of(j0 + warp * 16 + g + 8 * r, vis_first[r], vis_last[r]);
  }

  // head0 re-read from blockIdx.y and the arguments, not kept in a register (the 96/96 tile is at 255).
  const auto head_of = [&](int it) {
    return kv_head * static_cast<int>(a.group) + static_cast<int>(blockIdx.y * a.heads_per_split) + it / n_qt;
  };
  const auto first_query_of = [&](int it) { return (qt_first + it % n_qt) * BM; };

  // Q, dO, lse and delta of iteration `it` into buffer it % 2. lse is stored in log2 units, +inf for rows
  // past len_q or with lse = -inf (then p = exp2(x - inf) = 0, and delta 0 keeps ds = 0).
  auto load_queries = [&](int it) {
    const int buf = it % 2;
    const int h = head_of(it), i0 = first_query_of(it);
    copy_tile<T, BM, C::kDqk, C::kKPitch, C::kThreads>(sq + buf * C::kQBuf, a.q, [&](int r) {
      return i0 + r < len_q ? a.q_layout.at(b, s.q0, i0 + r, h) : int64_t(-1);
    });
    copy_tile<T, BM, C::kDv, C::kVPitch, C::kThreads>(sdo + buf * C::kDoBuf, a.dout, [&](int r) {
      return i0 + r < len_q ? a.dout_layout.at(b, s.q0, i0 + r, h) : int64_t(-1);
    });
    if (tid < BM) {
      float lse = -neg_inf<float>(), delta = 0.f;
      if (i0 + tid < len_q) {
        const int64_t at = a.lse_layout.at(b, s.q0, i0 + tid, h);
        const float row_lse = a.lse[at];
        if (row_lse != neg_inf<float>()) {
          lse = row_lse * kLog2e;
          delta = a.delta[at];
        }
      }
      stats[2 * buf * BM + tid] = lse;
      stats[(2 * buf + 1) * BM + tid] = delta;
    }
  };

  // ldmatrix row addresses of this lane (ldmatrix_x4), at step 0 (see forward_mma.cu for the fragments):
  //   K / V rows of this warp, A of S^T = K Q^T and dP^T = V dO^T: (keys 0-7 | 8-15) x (k 0-7 | 8-15).
  //   Q / dO, B of S^T and dP^T (stored queries x k): b0, b1 of query n-tile 0, then of n-tile 1.
  //   Q / dO read transposed, B of dK += dS^T Q and dV += P^T dO (stored queries x columns): b0, b1 of
  //     column n-tile 0, then of n-tile 1; K read transposed likewise, B of dQ = dS K.
  //   dS^T read transposed, A of dQ = dS K (stored keys x queries): (queries 0-7 | 8-15) x (keys 0-7 | 8-15).
  const int a_row = lane % 16, a_col = lane / 16 * 8;                        // A, not transposed
  const int b_row = lane % 8 + lane / 16 * 8, b_col = lane / 8 % 2 * 8;      // B, not transposed
  const int bt_row = lane % 8 + lane / 8 % 2 * 8, bt_col = lane / 16 * 8;    // B, transposed
  const uint32_t k_addr = sk + ((warp * 16 + a_row) * C::kKPitch + a_col) * kElemBytes;
  const uint32_t v_addr = sv + ((warp * 16 + a_row) * C::kVPitch + a_col) * kElemBytes;
  const int q_slice = warp % C::kQSlices, col_slice = warp / C::kQSlices;  // of dQ = dS K
  const uint32_t ds_addr = sds + (b_row * C::kSPitch + q_slice * 16 + b_col) * kElemBytes;
  const uint32_t k_bt = sk + (bt_row * C::kKPitch + bt_col) * kElemBytes;

  const float scale = a.logit.scale, cap = a.logit.softcap;
  const float dot_mul = cap > 0.f ? scale / cap : scale * kLog2e;  // logit (log2 units) = dot * dot_mul
  const float cap_log2 = cap * kLog2e;

  float dk[C::kDqk / 8][4] = {};  // dK: n-tile n holds keys g, g + 8 x columns 8 n + c + {0, 1}
  float dv[C::kDv / 8][4] = {};   // dV, likewise

  auto compute = [&](int it) {
    const int buf = it % 2;
    const int h = head_of(it), i0 = first_query_of(it);
    const uint32_t q_buf = sq + buf * C::kQBuf, do_buf = sdo + buf * C::kDoBuf;
    const float* lse_s = stats + 2 * buf * BM;
    const float* delta_s = lse_s + BM;

    // dP^T = V dO^T and S^T = K Q^T: n-tile n holds keys g, g + 8 x queries i0 + 8 n + c + {0, 1}.
    float dp[BM / 8][4] = {};
    mma_abt<T, C::kDv, BM, C::kVPitch>(dp, v_addr, do_buf + (b_row * C::kVPitch + b_col) * kElemBytes);
    float st[BM / 8][4] = {};
    mma_abt<T, C::kDqk, BM, C::kKPitch>(st, k_addr, q_buf + (b_row * C::kKPitch + b_col) * kElemBytes);

    // P^T and dS^T in place of S^T and dP^T. Per-element window mask only when a key of this thread does
    // not see the whole query tile (rows past len_q are outside every key's queries).
    int first[2], last[2];  // queries of keys g, g + 8 relative to i0, clamped into [-1, BM]
    bool masked = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      first[r] = min(max(vis_first[r] - i0, -1), BM);
      last[r] = min(max(vis_last[r] - i0, -1), BM);
      masked |= first[r] > 0 || last[r] < BM - 1;
    }
#pragma unroll
    for (int n = 0; n < BM / 8; ++n) {
      const float2 lse = *reinterpret_cast<const float2*>(lse_s + 8 * n + c);
      const float2 delta = *reinterpret_cast<const float2*>(delta_s + 8 * n + c);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, col = 8 * n + c + e % 2;
        float p, derivative;
        if (cap > 0.f) {
          const float t = tanhf(dot_mul * st[n][e]);  // logit / cap
          p = exp2f(cap_log2 * t - (e % 2 ? lse.y : lse.x));
          derivative = scale * (1.f - t * t);
        } else {
          p = exp2f(dot_mul * st[n][e] - (e % 2 ? lse.y : lse.x));
          derivative = scale;
        }
        if (masked && (col < first[r] || col > last[r])) {
          p = 0.f;
        }
        st[n][e] = p;
        dp[n][e] = p * (dp[n][e] - (e % 2 ? delta.y : delta.x)) * derivative;
      }
    }
    // The accumulators of query n-tiles 2 kk, 2 kk + 1 are the A fragment of query step kk.
    uint32_t pa[BM / 16][4], dsa[BM / 16][4];
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = 2 * kk + e / 2, half = 2 * (e % 2);
        pa[kk][e] = pack2<T>(st[n][half], st[n][half + 1]);
        dsa[kk][e] = pack2<T>(dp[n][half], dp[n][half + 1]);
      }
      // dS^T rows g, g + 8 of this warp, query pairs 16 kk + c and 16 kk + 8 + c.
      const int row = (warp * 16 + g) * C::kSPitch + 16 * kk + c;
      ds_words[row / 2] = dsa[kk][0];
      ds_words[(row + 8 * C::kSPitch) / 2] = dsa[kk][1];
      ds_words[(row + 8) / 2] = dsa[kk][2];
      ds_words[(row + 8 * C::kSPitch + 8) / 2] = dsa[kk][3];
    }
    // dV += P^T dO, dK += dS^T Q.
    const uint32_t do_bt = do_buf + (bt_row * C::kVPitch + bt_col) * kElemBytes;
    const uint32_t q_bt = q_buf + (bt_row * C::kKPitch + bt_col) * kElemBytes;
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      mma_ab_step<T, C::kDv, C::kVPitch>(dv, pa[kk], do_bt + kk * 16 * C::kVPitch * kElemBytes);
      mma_ab_step<T, C::kDqk, C::kKPitch>(dk, dsa[kk], q_bt + kk * 16 * C::kKPitch * kElemBytes);
    }
    __syncthreads();  // dS^T of every warp in smem

    // dQ rows q_slice * 16 + g, + 8 of the tile += dS K over this warp's columns, 16 at a time.
    uint32_t da[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      ldmatrix_x4<true>(da[kk], ds_addr + kk * 16 * C::kSPitch * kElemBytes);
    }
    float* dq_row[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + q_slice * 16 + g + 8 * r;
      dq_row[r] = i < len_q ? a.dq_accum + a.dq_accum_layout.at(b, s.q0, i, h) : nullptr;
    }
#pragma unroll
    for (int np = 0; np < C::kDqCols / 16; ++np) {
      const int col0 = col_slice * C::kDqCols + np * 16;
      float acc[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        mma_ab_step<T, 16, C::kKPitch>(acc, da[kk], k_bt + (kk * 16 * C::kKPitch + col0) * kElemBytes);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (dq_row[r] != nullptr) {
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            atomic_add_pair(dq_row[r] + col0 + 8 * n + c, acc[n][2 * r], acc[n][2 * r + 1]);
          }
        }
      }
    }
  };

  if (n_iter > 0) {
    copy_tile<T, BN, C::kDqk, C::kKPitch, C::kThreads>(sk, a.k, [&](int r) {
      return j0 + r < len_k ? a.k_layout.at(b, s.k0, j0 + r, kv_head) : int64_t(-1);
    });
    copy_tile<T, BN, C::kDv, C::kVPitch, C::kThreads>(sv, a.v, [&](int r) {
      return j0 + r < len_k ? a.v_layout.at(b, s.k0, j0 + r, kv_head) : int64_t(-1);
    });
    load_queries(0);
    cp_async_commit();
    for (int it = 0; it < n_iter; ++it) {
      // Every warp is done with iteration it - 1: its Q/dO/stats buffer (reused for it + 1) and dS^T.
      __syncthreads();
      if (it + 1 < n_iter) {
        load_queries(it + 1);
      }
      cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning "up to iteration it"
      cp_async_wait_all_but_newest();
      __syncthreads();  // Q, dO and stats of iteration it (and K, V) visible to every warp
      compute(it);
    }
  }

  // dK and dV of keys g, g + 8 of this warp's slice (zero for keys that no query sees).
  store_key_rows<T, C::kDqk>(dk, a.dk, a.dk_layout, a.dk_accum, a.dk_accum_layout, b, s.k0, j0, len_k, kv_head);
  store_key_rows<T, C::kDv>(dv, a.dv, a.dv_layout, a.dv_accum, a.dv_accum_layout, b, s.k0, j0, len_k, kv_head);
}

// grid (key_tiles * heads_kv * batch, head_splits), block C::kThreads, dynamic smem C::kSmemBytes.
template <typename T, typename C>
__global__ void __launch_bounds__(C::kThreads) backward_mma_kernel(const BackwardArgs<T> a, const int64_t key_tiles) {
  // cp.async, ldmatrix and bf16 mma need sm_80; mma_backward_supported() sends older GPUs to the row kernels.
  NV_IF_TARGET(NV_PROVIDES_SM_80, (backward_mma_block<T, C>(a, key_tiles);))
}

// fp32 sums to convert into rows of T: dq from dq_accum (query rows), dk / dv from their accumulators (key
// rows).
template <typename T>
struct AccumRows {
  const float* src;  // [batch, len, heads, dim] / [total, heads, dim]
  T* dst;            // likewise
  TokenLayout src_layout, dst_layout;
  SeqInfo seqs;
  int64_t heads, max_len, dim;
  bool keys;  // rows of keys (len_k, k0), else of queries
};

// dst = src for every (b, position, head) row. grid row_grid(max_len * heads, batch).
template <typename T>
__global__ void __launch_bounds__(kRowWarps* kWarpSize) convert_rows_kernel(const AccumRows<T> a) {
  const int lane = threadIdx.x % kWarpSize;
  WarpRow r;
  if (!warp_row(a.seqs, a.heads, a.max_len, a.keys, &r)) {
    return;
  }
  const int64_t first = a.keys ? r.s.k0 : r.s.q0;
  const float* src = a.src + a.src_layout.at(r.b, first, r.pos, r.head);
  T* dst = a.dst + a.dst_layout.at(r.b, first, r.pos, r.head);
  for (int64_t d = lane; d < a.dim; d += kWarpSize) {
    dst[d] = static_cast<T>(src[d]);
  }
}

template <typename T>
void launch_convert_rows(const AccumRows<T>& rows, int64_t batch) {
  if (rows.max_len == 0 || rows.heads == 0) {
    return;
  }
  convert_rows_kernel<T><<<row_grid(rows.max_len * rows.heads, batch), kRowWarps * kWarpSize, 0,
                           at::cuda::getCurrentCUDAStream()>>>(rows);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename C>
void launch_backward_tile(const BackwardArgs<T>& a) {
  const int64_t key_tiles = ceil_div(a.max_len_k, C::kBlockN);
  const int64_t blocks = key_tiles * a.heads_kv * a.batch;
  if (blocks == 0) {
    return;
  }
  TORCH_CHECK(blocks <= INT32_MAX, "attn_ops: attention backward too large for one launch (", blocks,
              " key blocks)");
  TORCH_INTERNAL_ASSERT(a.head_splits == 1 || (a.dk_accum != nullptr && a.dv_accum != nullptr),
                        "launch_backward_mma: dk_accum / dv_accum not allocated");
  TORCH_INTERNAL_ASSERT(a.heads_per_split * a.head_splits >= a.group, "launch_backward_mma: heads_per_split not set");
  allow_dynamic_smem<backward_mma_kernel<T, C>>(C::kSmemBytes);
  record_launch("backward_mma", {C::kDqk, C::kDv, a.head_splits});
  backward_mma_kernel<T, C><<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.head_splits)), C::kThreads,
                              C::kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(a, key_tiles);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// sm_80+ with room for the tile's smem (all fit the 99 KB per block of sm_86 / sm_89).
bool mma_backward_supported(c10::ScalarType dtype, int64_t dim_qk, int64_t dim_v) {
  int64_t smem = -1;
  return (dtype == c10::kHalf || dtype == c10::kBFloat16) &&
         with_tile<BackwardTiles>(dim_qk, dim_v, [&](auto tile) { smem = decltype(tile)::kSmemBytes; }) &&
         mma_smem_fits(smem);
}

// Q, K, V and dO rows are copied in 16-byte chunks; dK and dV are stored in pairs of T.
template <typename T>
bool mma_backward_aligned(const BackwardArgs<T>& a) {
  constexpr int64_t kChunk = 16 / sizeof(T);
  return pointer_aligned(a.q, 16) && pointer_aligned(a.k, 16) && pointer_aligned(a.v, 16) &&
         pointer_aligned(a.dout, 16) && strides_divisible(a.q_layout, kChunk) &&
         strides_divisible(a.k_layout, kChunk) && strides_divisible(a.v_layout, kChunk) &&
         strides_divisible(a.dout_layout, kChunk) && pointer_aligned(a.dk, 2 * sizeof(T)) &&
         pointer_aligned(a.dv, 2 * sizeof(T)) && strides_divisible(a.dk_layout, 2) &&
         strides_divisible(a.dv_layout, 2);
}

// Expects a.delta filled (backward_delta_kernel) and a.dq_accum zeroed.
template <typename T>
void launch_backward_mma(const BackwardArgs<T>& a) {
  TORCH_INTERNAL_ASSERT(a.dq_accum != nullptr, "launch_backward_mma: dq_accum not allocated");
  const bool found =
      with_tile<BackwardTiles>(a.dim_qk, a.dim_v, [&](auto tile) { launch_backward_tile<T, decltype(tile)>(a); });
  TORCH_INTERNAL_ASSERT(found, "launch_backward_mma: no tile for head dims ", a.dim_qk, "/", a.dim_v);
  launch_convert_rows(AccumRows<T>{a.dq_accum, a.dq, a.dq_accum_layout, a.dq_layout, a.seqs, a.heads_q, a.max_len_q,
                                   a.dim_qk, /*keys=*/false},
                      a.batch);
  if (a.head_splits > 1) {
    launch_convert_rows(AccumRows<T>{a.dk_accum, a.dk, a.dk_accum_layout, a.dk_layout, a.seqs, a.heads_kv,
                                     a.max_len_k, a.dim_qk, /*keys=*/true},
                        a.batch);
    launch_convert_rows(AccumRows<T>{a.dv_accum, a.dv, a.dv_accum_layout, a.dv_layout, a.seqs, a.heads_kv,
                                     a.max_len_k, a.dim_v, /*keys=*/true},
                        a.batch);
  }
}

template bool mma_backward_aligned<c10::Half>(const BackwardArgs<c10::Half>& a);
template bool mma_backward_aligned<c10::BFloat16>(const BackwardArgs<c10::BFloat16>& a);
template void launch_backward_mma<c10::Half>(const BackwardArgs<c10::Half>& a);
template void launch_backward_mma<c10::BFloat16>(const BackwardArgs<c10::BFloat16>& a);

}  // namespace attn_ops::cuda
