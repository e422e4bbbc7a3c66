// The bfloat16 backward's tile products on PyTorch's brgemm (oneDNN's AMX kernels) with float32
// accumulation, as SDPA's CPU backward; backward_tiles.h takes this path in the AVX-512 copy where the
// CPU has AMX-BF16, or AVX512-BF16, whose products run the same packed operands on bfloat16 pairs
// (gemm_kernels.h: pair_block_product / pair_block_pack) (BrgemmBackward::supports). float16 keeps the
// float32 path: its brgemm needs AMX-FP16.
//
// Work: one item is (sequence, KV head, split); a split owns every `splits`-th query chunk of its sequence
// (kChunkRows rows = positions x group heads). Per chunk the worker holds the chunk's Q and dO rows, their
// transposes per query tile, and the chunk's dQ in float32; the chunk's dQ is complete once its key blocks
// are done and is rounded into dq then. dK^T / dV^T accumulate in float32 over the item's chunks
// ([Dqk + Dv, Tk]: in the worker's scratch with one split, rounded into dk / dv when the item ends; else in
// one buffer per split, summed in split order at the end). So the memory beyond the outputs is per worker
// (one chunk, ~3 MiB at D = 128, and one sequence's dK / dV in float32), never a float32 copy of dq, and
// every sum runs in a fixed order (bit-identical reruns whatever the thread schedule).
//
// Per key block (n keys, padded with zero keys to `width` = n rounded up to kPackBlock) and query tile
// (`rows` rows; the row dimension of Q^T / dO^T / P / dS is padded to rows_pad, even):
//   S    [rows, width] = Q  [rows, Dqk] . K^T            K^T, V^T and K packed once per key block and chunk
//   dP   [rows, width] = dO [rows, Dv]  . V^T
//   P, scale * dS rounded to bfloat16, written row by row: as rows (dS) and in brgemm's packed layout
//   dV^T [Dv, width]  += dO^T [Dv, rows]  . P            Q^T and dO^T transposed once per chunk
//   dK^T [Dqk, width] += Q^T  [Dqk, rows] . dS
//   dQ   [rows, Dqk]  += dS [rows, width] . K
// dK and dV accumulate transposed: brgemm's A operand is row-major and P / dS come out row by row, so
// P^T / dS^T would cost two transposes per tile; Q^T / dO^T cost one per chunk and the accumulators one
// per item.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "common/cpu/blas.h"
#include "attention/cpu/gemm_kernels.h"
#include "attention/cpu/packed_kv.h"
#include "common/cpu/parallel.h"
#include "attention/cpu/row_ops.h"
#include "common/cpu_isa.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {

constexpr int64_t kBrgemmKeyBlock = 256;      // keys per block: few passes over a chunk's dQ
constexpr int64_t kBrgemmTileRows = 128;      // query rows per tile
constexpr int64_t kChunkRows = 2048;          // query rows per chunk: its dQ is 1 MiB at Dqk = 128
constexpr int64_t kMaxKeyGradBytes = int64_t(1) << 30;  // the per-split dK / dV buffers at most
constexpr int64_t kAccumulatorPad = 16;                 // values added to the dK^T / dV^T row stride

// The bits of c10::BFloat16(x) (round to nearest even, NaN stays NaN), written so that loops vectorize.
inline uint32_t bfloat16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// dst[0, n) = bfloat16(mult * src), n a multiple of 2 x Vectorized<float>::size(); native_bf16: store_lowp's.
template <bool native_bf16>
inline void round_row(const float* src, float mult, int64_t n, c10::BFloat16* dst) {
  using V = at::vec::Vectorized<float>;
  const V m(mult);
  for (int64_t j = 0; j < n; j += 2 * V::size()) {
    store_lowp<native_bf16>(V::loadu(src + j) * m, V::loadu(src + j + V::size()) * m, dst + j);
  }
}

// Rows r and r + 1 (r even) of a [k, width] brgemm B operand, bfloat16(mult * a) and bfloat16(mult * b)
// (b == nullptr: zeros; a == nullptr too: both zeros), into its packed layout: column blocks of
// kPackBlock, each [k / 2, kPackBlock, 2] (lowp_brgemm_pack's), i.e. 32-bit pairs (row r, row r + 1) at
// pair-row r / 2.
inline void pack_row_pair(const float* a, const float* b, float mult, int64_t r, int64_t k, int64_t width,
                          c10::BFloat16* packed) {
  uint32_t* out = reinterpret_cast<uint32_t*>(packed);
  for (int64_t c = 0; c < width; c += kPackBlock) {
    uint32_t* dst = out + c * (k / 2) + (r / 2) * kPackBlock;
    if (a == nullptr) {
      std::fill(dst, dst + kPackBlock, 0u);
    } else if (b != nullptr) {
      for (int64_t j = 0; j < kPackBlock; ++j) {
        dst[j] = bfloat16_bits(mult * a[c + j]) | (bfloat16_bits(mult * b[c + j]) << 16);
      }
    } else {
      for (int64_t j = 0; j < kPackBlock; ++j) {
        dst[j] = bfloat16_bits(mult * a[c + j]);
      }
    }
  }
}

// dst[d * ld_dst + j] = src[j * ld_src + d] for j < n, d < dim: n rows as columns, in 32 x 32 blocks.
inline void transpose_rows(const c10::BFloat16* src, int64_t ld_src, int64_t n, int64_t dim, c10::BFloat16* dst,
                           int64_t ld_dst) {
  for (int64_t j = 0; j < n; j += 32) {
    for (int64_t d = 0; d < dim; d += 32) {
      at::vec::transpose_mxn<c10::BFloat16>(src + j * ld_src + d, ld_src, dst + d * ld_dst + j, ld_dst,
                                            std::min<int64_t>(32, n - j), std::min<int64_t>(32, dim - d));
    }
  }
}

// One worker's buffers: a key block's packed operands, a query chunk's rows, transposes, lse / delta and dQ,
// one tile's scores, gradients and their bfloat16 forms, and (one split) an item's dK^T / dV^T.
struct BrgemmBackwardScratch {
  std::vector<c10::BFloat16> unpacked, k_t, v_t, k;    // [max(Dqk, Dv), KB], [Dqk, KB], [Dv, KB], [KB, Dqk]
  std::vector<c10::BFloat16> q, dout, q_t, dout_t;     // [chunk, Dqk], [chunk, Dv], [tiles, Dqk | Dv, rows_pad]
  std::vector<float> lse, delta, dq;                   // [chunk], [chunk], [chunk, Dqk]
  std::vector<c10::BFloat16> p_packed, ds_packed, ds;  // [rows_pad, KB]
  std::vector<float> scores, probs, dscores;           // [rows_pad, KB]
  std::vector<float> key_grads;                        // [Dqk + Dv, ld]: dK^T then dV^T (one split), else empty
};

// The bfloat16 backward on brgemm for one call: its inputs, the work split, and the work of one item.
class BrgemmBackward {
 public:
  // Dqk in whole pack blocks (dQ = dS K packs K in dim blocks), Dv even, and a CPU with AMX-BF16 or
  // AVX512-BF16.
  static bool supports(const AttentionProblem& p) {
    return p.dim_qk % kPackBlock == 0 && p.dim_v % 2 == 0 &&
           (lowp_brgemm_available<c10::BFloat16>() || pair_products_available());
  }

  // delta [total_q * Hq] is the rows' softmax-Jacobian term (backward_tiles.h).
  BrgemmBackward(const AttentionProblem& p, const c10::BFloat16* dout, const SeqLayout& dout_layout,
                 const c10::BFloat16* q, const SeqLayout& q_layout, const c10::BFloat16* k, const SeqLayout& k_layout,
                 const c10::BFloat16* v, const SeqLayout& v_layout, const float* lse, const SeqLayout& lse_layout,
                 const float* delta, c10::BFloat16* dq, const SeqLayout& dq_layout, c10::BFloat16* dk,
                 const SeqLayout& dk_layout, c10::BFloat16* dv, const SeqLayout& dv_layout)
      : p_(p), dout_(dout), dout_layout_(dout_layout), q_(q), q_layout_(q_layout), k_(k), k_layout_(k_layout),
        v_(v), v_layout_(v_layout), lse_(lse), lse_layout_(lse_layout), delta_(delta), dq_(dq), dq_layout_(dq_layout),
        dk_(dk), dk_layout_(dk_layout), dv_(dv), dv_layout_(dv_layout),
        native_bf16_(cpu_has_avx512bf16()),
        pairs_(!lowp_brgemm_available<c10::BFloat16>()) {
    const int64_t G = p.group;
    tile_positions_ = std::max<int64_t>(1, kBrgemmTileRows / G);
    rows_pad_ = round_up(tile_positions_ * G, 2);
    chunk_positions_ = tile_positions_ * std::max<int64_t>(1, kChunkRows / (tile_positions_ * G));
    int64_t max_len_k = 0, max_chunks = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      max_len_k = std::max(max_len_k, p.len_k[b]);
      max_chunks = std::max(max_chunks, (p.len_q[b] + chunk_positions_ - 1) / chunk_positions_);
    }
    // Not a power of two: the accumulators' rows would share cache sets (T = 2048 floats apart).
    ld_ = round_up(std::max<int64_t>(max_len_k, 1), kBrgemmKeyBlock) + kAccumulatorPad;
    // Splits fill the threads when there are few (sequence, KV head) pairs (MQA, batch 1); each keeps
    // its own dK / dV in float32.
    const int64_t pairs = std::max<int64_t>(1, p.batch * p.heads_kv);
    const int64_t item_bytes = (p.dim_qk + p.dim_v) * ld_ * static_cast<int64_t>(sizeof(float));
    splits_ = std::max<int64_t>(1, std::min({(2 * parallel_threads(flops()) + pairs - 1) / pairs, max_chunks,
                                             kMaxKeyGradBytes / (pairs * item_bytes)}));
  }

  // Computes dq, dk and dv.
  void run() const {
    const int64_t items = p_.batch * p_.heads_kv * splits_, acc_size = (p_.dim_qk + p_.dim_v) * ld_;
    std::vector<float> split_grads(splits_ > 1 ? items * acc_size : 0);
    parallel_items(
        items, flops(), [&] { return scratch(); },
        [&](int64_t item, BrgemmBackwardScratch& s) {
          const int64_t split = item % splits_, g = (item / splits_) % p_.heads_kv, b = item / (splits_ * p_.heads_kv);
          float* key_grads = splits_ > 1 ? split_grads.data() + item * acc_size : s.key_grads.data();
          const int64_t width = round_up(p_.len_k[b], kBrgemmKeyBlock);
          for (int64_t d = 0; d < p_.dim_qk + p_.dim_v; ++d) {
            fill_row(key_grads + d * ld_, width, 0.f);
          }
          for (int64_t c0 = split * chunk_positions_; c0 < p_.len_q[b]; c0 += splits_ * chunk_positions_) {
            chunk(b, g, c0, key_grads, s);
          }
          if (splits_ == 1) {
            write_key_grads(b, g, key_grads, 1, 0);
          }
        });
    if (splits_ > 1) {  // dK / dV of (b, g) = the sum of its splits' accumulators, in split order
      at::parallel_for(0, p_.batch * p_.heads_kv, 1, [&](int64_t begin, int64_t end) {
        for (int64_t pair = begin; pair < end; ++pair) {
          write_key_grads(pair / p_.heads_kv, pair % p_.heads_kv, split_grads.data() + pair * splits_ * acc_size,
                          splits_, acc_size);
        }
      });
    }
  }

 private:
  double flops() const { return 2.5 * p_.forward_flops(); }

  BrgemmBackwardScratch scratch() const {
    const int64_t Dqk = p_.dim_qk, Dv = p_.dim_v, KB = kBrgemmKeyBlock, chunk_rows = chunk_positions_ * p_.group;
    const int64_t tiles = chunk_positions_ / tile_positions_;
    BrgemmBackwardScratch s;
    s.unpacked.resize(std::max(Dqk, Dv) * KB);
    s.k_t.resize(Dqk * KB);
    s.v_t.resize(Dv * KB);
    s.k.resize(KB * Dqk);
    s.q.resize(chunk_rows * Dqk);
    s.dout.resize(chunk_rows * Dv);
    s.q_t.resize(tiles * Dqk * rows_pad_);
    s.dout_t.resize(tiles * Dv * rows_pad_);
    s.lse.resize(chunk_rows);
    s.delta.resize(chunk_rows);
    s.dq.resize(chunk_rows * Dqk);
    for (auto* buffer : {&s.p_packed, &s.ds_packed, &s.ds}) {
      buffer->resize(rows_pad_ * KB);
    }
    for (auto* buffer : {&s.scores, &s.probs, &s.dscores}) {
      buffer->resize(rows_pad_ * KB);
    }
    s.key_grads.resize(splits_ == 1 ? (Dqk + Dv) * ld_ : 0);
    return s;
  }

  // Query positions [c0, c0 + chunk_positions_) of (sequence b, KV head g): their dQ into dq, their
  // dK^T / dV^T contributions added to key_grads [Dqk + Dv, ld_].
  void chunk(int64_t b, int64_t g, int64_t c0, float* key_grads, BrgemmBackwardScratch& s) const {
    const int64_t G = p_.group, Hq = p_.heads_q, Dqk = p_.dim_qk, Dv = p_.dim_v, KB = kBrgemmKeyBlock;
    const int64_t c_last = std::min(c0 + chunk_positions_, p_.len_q[b]) - 1, rows = (c_last + 1 - c0) * G;
    // Row r is query position c0 + r / G of head g * G + r % G; tile t is rows [t, t + 1) * tile rows.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = c0 + r / G, h = g * G + r % G;
      std::copy_n(q_ + q_layout_.at(b, pos, h), Dqk, s.q.data() + r * Dqk);
      std::copy_n(dout_ + dout_layout_.at(b, pos, h), Dv, s.dout.data() + r * Dv);
      s.lse[r] = lse_[lse_layout_.at(b, pos, h)];
      s.delta[r] = delta_[(p_.token_q[b] + pos) * Hq + h];
    }
    const int64_t tile_rows = tile_positions_ * G;
    for (int64_t r0 = 0, t = 0; r0 < rows; r0 += tile_rows, ++t) {
      const int64_t n = std::min(tile_rows, rows - r0);
      c10::BFloat16* q_t = s.q_t.data() + t * Dqk * rows_pad_;
      c10::BFloat16* dout_t = s.dout_t.data() + t * Dv * rows_pad_;
      if (n < rows_pad_) {  // columns past the rows meet zero rows of P / dS: zeros, never stale NaNs
        std::fill_n(q_t, Dqk * rows_pad_, c10::BFloat16(0));
        std::fill_n(dout_t, Dv * rows_pad_, c10::BFloat16(0));
      }
      transpose_rows(s.q.data() + r0 * Dqk, Dqk, n, Dqk, q_t, rows_pad_);
      transpose_rows(s.dout.data() + r0 * Dv, Dv, n, Dv, dout_t, rows_pad_);
    }
    fill_row(s.dq.data(), rows * Dqk, 0.f);

    // The key blocks that any of the chunk's queries sees (key_lo / key_hi grow with the position).
    const int64_t k_first = p_.key_lo(b, c0), k_last = p_.key_hi(b, c_last);
    for (int64_t k0 = k_first / KB * KB; k0 <= k_last; k0 += KB) {
      key_block(b, g, c0, c_last, k0, key_grads, s);
    }
    for (int64_t r = 0; r < rows; ++r) {
      convert_row(s.dq.data() + r * Dqk, dq_ + dq_layout_.at(b, c0 + r / G, g * G + r % G), Dqk);
    }
  }

  // The key block [k0, k0 + KB) against the chunk's query positions [c0, c_last].
  void key_block(int64_t b, int64_t g, int64_t c0, int64_t c_last, int64_t k0, float* key_grads,
                 BrgemmBackwardScratch& s) const {
    const int64_t G = p_.group, Dqk = p_.dim_qk, Dv = p_.dim_v, KB = kBrgemmKeyBlock, P = tile_positions_;
    const int64_t n = std::min(KB, p_.len_k[b] - k0), width = round_up(n, kPackBlock);
    const float scale = static_cast<float>(p_.scale), softcap = static_cast<float>(p_.softcap);
    pack_key_block(k_ + k_layout_.at(b, k0, g), k_layout_.seq_stride, v_ + v_layout_.at(b, k0, g),
                   v_layout_.seq_stride, n, width, s);
    float* dk_t = key_grads + k0;            // [Dqk, width], row stride ld_
    float* dv_t = key_grads + Dqk * ld_ + k0;  // [Dv, width], row stride ld_

    const int64_t i_first = std::max(c0, p_.query_first(b, k0));
    const int64_t i_last = std::min(c_last, p_.query_last(b, k0 + n - 1));
    for (int64_t i0 = c0 + (i_first - c0) / P * P; i0 <= i_last; i0 += P) {
      const int64_t rows = std::min(P, c_last + 1 - i0) * G, r0 = (i0 - c0) * G, t = (i0 - c0) / P;
      const c10::BFloat16* q_rows = s.q.data() + r0 * Dqk;
      const c10::BFloat16* dout_rows = s.dout.data() + r0 * Dv;
      // scores = Q K^T (the scale is applied per row), dscores = dP = dO V^T.
      for (int64_t c = 0; c < width; c += kPackBlock) {
        product(rows, Dqk, q_rows, Dqk, s.k_t.data() + c * Dqk, s.scores.data() + c, KB, false);
        product(rows, Dv, dout_rows, Dv, s.v_t.data() + c * Dv, s.dscores.data() + c, KB, false);
      }
      for (int64_t r = 0; r < rows_pad_; r += 2) {
        for (int64_t rr = r; rr < std::min(r + 2, rows); ++rr) {
          const int64_t pos = i0 + rr / G;
          row_gradients(s.scores.data() + rr * KB, s.probs.data() + rr * KB, s.dscores.data() + rr * KB, n, width,
                        std::max<int64_t>(p_.key_lo(b, pos) - k0, 0), std::min(p_.key_hi(b, pos) - k0, n - 1),
                        s.lse[r0 + rr], s.delta[r0 + rr], scale, softcap, p_.alibi_row(b, g * G + rr % G, pos, k0));
          if (native_bf16_) {
            round_row<true>(s.dscores.data() + rr * KB, scale, width, s.ds.data() + rr * KB);
          } else {
            round_row<false>(s.dscores.data() + rr * KB, scale, width, s.ds.data() + rr * KB);
          }
        }
        const float* p0 = r < rows ? s.probs.data() + r * KB : nullptr;
        const float* p1 = r + 1 < rows ? s.probs.data() + (r + 1) * KB : nullptr;
        const float* ds0 = r < rows ? s.dscores.data() + r * KB : nullptr;
        const float* ds1 = r + 1 < rows ? s.dscores.data() + (r + 1) * KB : nullptr;
        pack_row_pair(p0, p1, 1.f, r, rows_pad_, width, s.p_packed.data());
        pack_row_pair(ds0, ds1, scale, r, rows_pad_, width, s.ds_packed.data());
      }
      // dV^T += dO^T P ; dK^T += Q^T (scale dS) ; dQ += (scale dS) K
      const c10::BFloat16* dout_t = s.dout_t.data() + t * Dv * rows_pad_;
      const c10::BFloat16* q_t = s.q_t.data() + t * Dqk * rows_pad_;
      for (int64_t c = 0; c < width; c += kPackBlock) {
        product(Dv, rows_pad_, dout_t, rows_pad_, s.p_packed.data() + c * rows_pad_, dv_t + c, ld_, true);
        product(Dqk, rows_pad_, q_t, rows_pad_, s.ds_packed.data() + c * rows_pad_, dk_t + c, ld_, true);
      }
      float* dq = s.dq.data() + r0 * Dqk;
      for (int64_t c = 0; c < Dqk; c += kPackBlock) {
        product(rows, width, s.ds.data(), KB, s.k.data() + c * width, dq + c, Dqk, true);
      }
    }
    if (!pairs_) {
      at::native::cpublas::brgemm_release();
    }
  }

  // C[m, kPackBlock] (row stride ldc, float32) = (accumulate ? C : 0) + A[m, k] B, B packed by pack():
  // brgemm, or the same product on bfloat16 pairs.
  void product(int64_t m, int64_t k, const c10::BFloat16* a, int64_t lda, const c10::BFloat16* b, float* c,
               int64_t ldc, bool accumulate) const {
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
    static_assert(kBrgemmBlock == kPackBlock);
    if (pairs_) {
      return pair_block_product(m, k, a, lda, b, c, ldc, accumulate);
    }
#endif
    lowp_brgemm(m, kPackBlock, k, a, lda, b, kPackBlock, c, ldc, accumulate);
  }

  // B[k, kPackBlock] (row stride ld_in, k even) into brgemm's packed layout, which both products read.
  void pack(int64_t k, int64_t ld_in, const c10::BFloat16* in, c10::BFloat16* out) const {
#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__)
    if (pairs_) {
      return pair_block_pack(k, ld_in, in, out);
    }
#endif
    lowp_brgemm_pack(k, kPackBlock, ld_in, in, out);
  }

  // Packs the key block [k0, k0 + n) of one KV head (rows k_rows / v_rows, row strides ldk / ldv) for the
  // three products that read it: K^T [Dqk, width] and V^T [Dv, width] in key blocks of kPackBlock, K
  // [width, Dqk] in dim blocks of kPackBlock (block c at k + c * width); keys past n are zero.
  void pack_key_block(const c10::BFloat16* k_rows, int64_t ldk, const c10::BFloat16* v_rows, int64_t ldv, int64_t n,
                      int64_t width, BrgemmBackwardScratch& s) const {
    const int64_t Dqk = p_.dim_qk;
    auto pack_transposed = [&](const c10::BFloat16* src, int64_t ld, int64_t dim, c10::BFloat16* out) {
      c10::BFloat16* t = s.unpacked.data();  // [dim, width]
      for (int64_t d = 0; d < dim; ++d) {
        std::fill(t + d * width + n, t + (d + 1) * width, c10::BFloat16(0));
      }
      transpose_rows(src, ld, n, dim, t, width);
      for (int64_t c = 0; c < width; c += kPackBlock) {
        pack(dim, width, t + c, out + c * dim);
      }
    };
    pack_transposed(k_rows, ldk, Dqk, s.k_t.data());
    pack_transposed(v_rows, ldv, p_.dim_v, s.v_t.data());
    c10::BFloat16* t = s.unpacked.data();  // [width, Dqk]
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(k_rows + j * ldk, Dqk, t + j * Dqk);
    }
    std::fill(t + n * Dqk, t + width * Dqk, c10::BFloat16(0));
    for (int64_t c = 0; c < Dqk; c += kPackBlock) {
      pack(width, Dqk, t + c, s.k.data() + c * width);
    }
  }

  // dk / dv of (sequence b, KV head g) = the sum, in order, of `count` accumulators [Dqk + Dv, ld_] (dK^T
  // then dV^T) `stride` floats apart, transposed and rounded; 32 keys at a time, so the reads stay
  // contiguous and the written rows in cache.
  void write_key_grads(int64_t b, int64_t g, const float* acc, int64_t count, int64_t stride) const {
    constexpr int64_t kKeys = 32;
    const int64_t Dqk = p_.dim_qk, Dv = p_.dim_v;
    float sum[kKeys];
    for (int64_t j0 = 0; j0 < p_.len_k[b]; j0 += kKeys) {
      const int64_t n = std::min(kKeys, p_.len_k[b] - j0);
      for (int64_t d = 0; d < Dqk + Dv; ++d) {
        std::copy_n(acc + d * ld_ + j0, n, sum);
        for (int64_t i = 1; i < count; ++i) {
          add_row(sum, acc + i * stride + d * ld_ + j0, n);
        }
        for (int64_t j = 0; j < n; ++j) {
          if (d < Dqk) {
            dk_[dk_layout_.at(b, j0 + j, g) + d] = c10::BFloat16(sum[j]);
          } else {
            dv_[dv_layout_.at(b, j0 + j, g) + d - Dqk] = c10::BFloat16(sum[j]);
          }
        }
      }
    }
  }

  // One query row: raw scores s (before the scale) and dp = dO V^T over `width` keys in; keys [lo, hi]
  // visible (lo > hi: none), the first n real. Leaves the probabilities in prob and the logit gradients
  // in dp (zero past n), as the float32 path computes them (ALiBi in the probabilities only).
  static void row_gradients(float* s, float* prob, float* dp, int64_t n, int64_t width, int64_t lo, int64_t hi,
                            float lse, float delta, float scale, float softcap, const AlibiRow& alibi) {
    fill_row(prob, width, 0.f);
    if (lo <= hi && lse != -std::numeric_limits<float>::infinity()) {
      scale_row(s + lo, hi - lo + 1, scale);
      if (softcap > 0) {
        softcap_row(s + lo, hi - lo + 1, softcap);
      }
      std::copy(s + lo, s + hi + 1, prob + lo);
      if (alibi.slope != 0) {
        add_alibi_row(prob + lo, hi - lo + 1, alibi.from(lo));
      }
      exp_shift_sum(prob + lo, hi - lo + 1, lse);
    }
    logit_grad_row(prob, s, dp, n, delta, softcap);
    fill_row(dp + n, width - n, 0.f);
  }

  const AttentionProblem& p_;
  const c10::BFloat16* dout_;
  const SeqLayout& dout_layout_;
  const c10::BFloat16* q_;
  const SeqLayout& q_layout_;
  const c10::BFloat16* k_;
  const SeqLayout& k_layout_;
  const c10::BFloat16* v_;
  const SeqLayout& v_layout_;
  const float* lse_;
  const SeqLayout& lse_layout_;
  const float* delta_;
  c10::BFloat16* dq_;
  const SeqLayout& dq_layout_;
  c10::BFloat16* dk_;
  const SeqLayout& dk_layout_;
  c10::BFloat16* dv_;
  const SeqLayout& dv_layout_;
  bool native_bf16_;                   // round dS with AVX512-BF16 (store_lowp)
  bool pairs_;                         // the products on bfloat16 pairs (no AMX), else on brgemm
  int64_t tile_positions_, rows_pad_;  // query positions per tile; its rows, padded to even
  int64_t chunk_positions_;            // query positions per chunk (whole tiles)
  int64_t ld_;                         // row stride of the dK^T / dV^T accumulators: the longest Tk, padded
  int64_t splits_;                     // query-chunk splits per (sequence, KV head)
};

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
