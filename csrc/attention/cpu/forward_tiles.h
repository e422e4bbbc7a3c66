// CPU forward of attention: flash-style tiling with an online softmax. Compiled once per instruction set
// (prefill_isa_*.cpp, which set CPU_CAPABILITY and ATTN_OPS_PREFILL_NS first); prefill_cpu.cpp
// picks the copy at run time.
//
// One work item is (sequence, KV head, block of query positions, key split). The query rows of all heads
// of the KV group are packed into one [rows, Dqk] tile, so each K/V tile is loaded once for the whole
// group and the two products per tile (Q K^T and P V) are single GEMMs. Scores live in a
// [rows, key_tile] buffer; nothing of size [Tq, Tk] is ever materialized.
//
// bfloat16 / float16 on a CPU with AMX (the AVX-512 copy, lowp_brgemm_available): both products run on
// brgemm in the input dtype with float32 accumulation, as SDPA's CPU kernel does (the probabilities are
// rounded to the input dtype for P V), over K and V packed once per call (packed_kv.h); elsewhere the
// tiles are converted to float32 for sgemm.
//
// float32 on the AVX-512 / AVX2 copies (kPanelGemm): both products run on gemm_kernels.h's register-blocked
// micro-kernel over K^T and V packed once per call in panels (panel_kv.h) instead of MKL's sgemm, which
// packs its operands again on every tile; elsewhere (and for a left window, whose key ranges do not start
// on a tile boundary) sgemm. bfloat16 on an AVX512-BF16 CPU without AMX takes the same micro-kernel on
// bfloat16 pairs (Bf16PairPanel: vdpbf16ps, float32 accumulation, P rounded to bfloat16 as on brgemm).
//
// When there are fewer (sequence, KV head, query block) items than twice the threads (decode: one query
// per sequence; long single sequences), each item's key range is cut into splits that run in parallel,
// and their partial results are merged by their log-sum-exp (flash-decoding).
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "common/cpu/blas.h"
#include "attention/cpu/gemm_kernels.h"
#include "attention/cpu/cache_8bit.h"
#include "attention/cpu/packed_kv.h"
#include "attention/cpu/panel_kv.h"
#include "common/cpu/parallel.h"
#include "attention/cpu/prefill_kernels.h"
#include "attention/cpu/row_ops.h"
#include "attention/cpu/split_merge.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {

constexpr int64_t kTargetRows = 256;  // query rows (positions x group heads) per tile
constexpr int64_t kKeyTile = 256;     // keys per tile
constexpr int64_t kPanelMinRows = 64;  // query rows per sequence (positions x group heads) for the panel path

struct WorkItem {
  int64_t batch, kv_head, q_begin, q_end;
};

template <typename scalar_t, typename acc_t>
struct ForwardScratch {
  std::vector<acc_t> q, scores, acc, row_max, row_sum, k, v;
  // The operands of the low-precision products (brgemm, bfloat16 pairs): Q [rows, Dqk], P [rows, kKeyTile].
  std::vector<scalar_t> q_lowp, p_lowp;
  ForwardScratch(int64_t rows, int64_t dqk, int64_t dv, bool lowp)
      : q(lowp ? 0 : rows * dqk), scores(rows * kKeyTile), acc(rows * dv), row_max(rows), row_sum(rows),
        k(lowp ? 0 : kKeyTile * dqk), v(lowp ? 0 : kKeyTile * dv), q_lowp(lowp ? rows * dqk : 0),
        p_lowp(lowp ? rows * kKeyTile : 0) {}
};

// A tile of n keys starting at key k0 of sequence b, head h, as a row-major [n, dim] acc_t matrix.
template <typename scalar_t, typename acc_t>
const acc_t* key_tile(const scalar_t* base, const KeyLayout& layout, int64_t b, int64_t k0, int64_t n, int64_t h,
                      int64_t dim, acc_t* buffer, int64_t* ld) {
  if (layout.uniform(k0, n)) {
    return load_key_tile(base + layout.at(b, k0, h), layout.rows.seq_stride, n, dim, buffer, ld);
  }
  for (int64_t j = 0; j < n; ++j) {  // the tile crosses blocks of a paged cache: gather its rows
    convert_row(base + layout.at(b, k0 + j, h), buffer + j * dim, dim);
  }
  *ld = dim;
  return buffer;
}

// The same tile of an 8-bit cache (p.cache_8bit), converted row by row (exact in acc_t, float32).
template <typename acc_t>
const acc_t* key_tile(Cache8Bit format, const uint8_t* base, const KeyLayout& layout, int64_t b, int64_t k0, int64_t n,
                      int64_t h, int64_t dim, acc_t* buffer, int64_t* ld) {
  for (int64_t j = 0; j < n; ++j) {
    dequantize_row(format, base + layout.at(b, k0 + j, h), buffer + j * dim, dim);
  }
  *ld = dim;
  return buffer;
}

// cache_t: scalar_t, or uint8_t for an 8-bit cache (p.cache_8bit), which takes the float32 path over tiles converted
// as they are read (key_tile), k_scale folded into q and v_scale into the output.
template <typename scalar_t, typename acc_t, typename cache_t = scalar_t>
void forward_tiles(const AttentionProblem& p, const scalar_t* q, const SeqLayout& q_layout, const cache_t* k,
                   const KeyLayout& k_layout, const cache_t* v, const KeyLayout& v_layout, scalar_t* out,
                   const SeqLayout& out_layout, acc_t* lse, const SeqLayout& lse_layout) {
  constexpr bool cache_8bit = !std::is_same_v<cache_t, scalar_t>;
  const int64_t G = p.group, Hq = p.heads_q, Dqk = p.dim_qk, Dv = p.dim_v;
  // The brgemm path (AMX) needs every item's keys to start at a tile boundary (no left window or
  // chunk: it reads whole packed tiles from key 0 on); packing needs Dqk even and Dv in whole blocks (packed_kv.h).
  bool brgemm_applies = false;
  if constexpr (kBrgemmCopy && !std::is_same_v<scalar_t, acc_t> && !cache_8bit) {
    brgemm_applies = !p.left_bounded() && Dqk % 2 == 0 && Dv % kPackBlock == 0 && lowp_brgemm_available<scalar_t>();
  }
  // The panel paths (below) where each packed key serves enough query rows to pay for its packing: float32,
  // and bfloat16 on AVX512-BF16 where brgemm does not apply; their query tiles hold whole kPanelRows-row
  // blocks where the group allows (252 rows for groups 1, 2, 4).
  const bool panel_shape = kPanelGemm && !cache_8bit && !p.left_bounded() && Dv % kPanelWidth == 0 &&
                           p.total_q * G >= kPanelMinRows * p.batch;
  const bool pair_path = std::is_same_v<scalar_t, c10::BFloat16> && panel_shape && Dqk % 2 == 0 &&
                         !brgemm_applies && pair_products_available();
  const bool panel_path = (std::is_same_v<scalar_t, float> && panel_shape) || pair_path;
  const int64_t target_rows = panel_path ? kTargetRows / kPanelRows * kPanelRows : kTargetRows;
  const int64_t block_positions = std::max<int64_t>(1, target_rows / G);
  const int64_t max_rows = block_positions * G;

  // Items of one (sequence, KV head) are consecutive, so the threads working on them share that head's
  // K/V in cache; within it the last query blocks (most visible keys under a causal mask) come first.
  std::vector<WorkItem> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t g = 0; g < p.heads_kv; ++g) {
      const int64_t blocks = (p.len_q[b] + block_positions - 1) / block_positions;
      for (int64_t blk = blocks - 1; blk >= 0; --blk) {
        const int64_t i0 = blk * block_positions;
        items.push_back({b, g, i0, std::min(p.len_q[b], i0 + block_positions)});
      }
    }
  }
  // Keys an item's rows see together: [first, last], empty when first > last.
  auto key_first = [&](const WorkItem& w) { return p.key_lo(w.batch, w.q_begin); };
  auto key_last = [&](const WorkItem& w) { return p.key_hi(w.batch, w.q_end - 1); };
  auto key_tiles = [&](const WorkItem& w) {
    return std::max<int64_t>(0, (key_last(w) - key_first(w) + kKeyTile) / kKeyTile);
  };
  const int64_t num_items = static_cast<int64_t>(items.size());
  const double flops = p.forward_flops();
  const int64_t threads = parallel_threads(flops);
  int64_t splits = 1;
  if (num_items > 0 && num_items < 2 * threads) {
    int64_t most_tiles = 0;
    for (const WorkItem& w : items) {
      most_tiles = std::max(most_tiles, key_tiles(w));
    }
    splits = std::max<int64_t>(1, std::min((2 * threads + num_items - 1) / num_items, most_tiles));
  }
  splits = p.capped_splits(splits);
  // Partial results of the splits: normalized output and lse per (split, query row); rows are
  // (token_q[b] + position) * Hq + head.
  const int64_t rows_total = p.total_q * Hq;
  std::vector<acc_t> part_out(splits > 1 ? splits * rows_total * Dv : 0);
  std::vector<acc_t> part_lse(splits > 1 ? splits * rows_total : 0);

  const acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();
  const acc_t scale = static_cast<acc_t>(p.scale), softcap = static_cast<acc_t>(p.softcap);

  std::optional<PackedKV<scalar_t>> packed;
  if constexpr (kBrgemmCopy && !std::is_same_v<scalar_t, acc_t> && !cache_8bit) {
    if (brgemm_applies && num_items > 0) {
      packed.emplace(p, kKeyTile, k, k_layout, v, v_layout);
    }
  }
  const bool brgemm = packed.has_value();
  std::optional<PanelKV<FloatPanel>> panels;
  if constexpr (std::is_same_v<scalar_t, float> && !cache_8bit) {
    if (panel_path && num_items > 0) {
      panels.emplace(p, kKeyTile, k, k_layout, v, v_layout);
    }
  }
  std::optional<PanelKV<Bf16PairPanel>> pair_panels;
  if constexpr (kBf16PairPanel && std::is_same_v<scalar_t, c10::BFloat16> && !cache_8bit) {
    if (pair_path && num_items > 0) {
      pair_panels.emplace(p, kKeyTile, k, k_layout, v, v_layout);
    }
  }
  const bool pairs = pair_panels.has_value(), lowp = brgemm || pairs;
  const bool native_bf16 = std::is_same_v<scalar_t, c10::BFloat16> && cpu_has_avx512bf16();

  parallel_items(
      num_items * splits, flops, [&] { return ForwardScratch<scalar_t, acc_t>(max_rows, Dqk, Dv, lowp); },
      [&](int64_t item_index, ForwardScratch<scalar_t, acc_t>& s) {
        const WorkItem& w = items[item_index / splits];
        const int64_t split = item_index % splits;
        const int64_t b = w.batch, g = w.kv_head, positions = w.q_end - w.q_begin, rows = positions * G;
        // This split's share of the item's key tiles.
        const int64_t tiles = key_tiles(w), per_split = (tiles + splits - 1) / splits;
        const int64_t k_begin = key_first(w) + split * per_split * kKeyTile;
        const int64_t k_end = std::min(key_last(w) + 1, k_begin + per_split * kKeyTile);

        // Row r is query position q_begin + r / G of head g * G + r % G.
        for (int64_t r = 0; r < rows; ++r) {
          const scalar_t* q_row = q + q_layout.at(b, w.q_begin + r / G, g * G + r % G);
          if (lowp) {
            std::copy_n(q_row, Dqk, s.q_lowp.data() + r * Dqk);
          } else {
            convert_row(q_row, s.q.data() + r * Dqk, Dqk);
            if constexpr (cache_8bit) {
              scale_row(s.q.data() + r * Dqk, Dqk, static_cast<acc_t>(p.k_scale[g]));
            }
          }
        }
        if (brgemm) {
          packed->prepare(b, g, k_begin, k_end);
        }
        if constexpr (std::is_same_v<scalar_t, float>) {
          if (panels) {
            panels->prepare(b, g, k_begin, k_end);
          }
        }
        if constexpr (kBf16PairPanel && std::is_same_v<scalar_t, c10::BFloat16>) {
          if (pairs) {
            pair_panels->prepare(b, g, k_begin, k_end);
          }
        }
        fill_row(s.row_max.data(), rows, neg_inf);
        fill_row(s.row_sum.data(), rows, acc_t(0));
        fill_row(s.acc.data(), rows * Dv, acc_t(0));

        for (int64_t k0 = k_begin; k0 < k_end; k0 += kKeyTile) {
          const int64_t n = std::min(kKeyTile, k_end - k0);
          acc_t* scores = s.scores.data();
          const acc_t* vt = nullptr;
          int64_t ldv = 0;
          if constexpr (!std::is_same_v<scalar_t, acc_t>) {
            if (brgemm) {  // scores[rows, n] = Q K^T per packed key block (n rounded up), scaled below
              const scalar_t* kp = packed->k_tile(b, g, k0);
              for (int64_t c = 0; c < n; c += kPackBlock) {
                lowp_brgemm(rows, kPackBlock, Dqk, s.q_lowp.data(), Dqk, kp + c * Dqk, kPackBlock, scores + c,
                            kKeyTile, false);
              }
            }
          }
          if constexpr (std::is_same_v<scalar_t, float>) {
            if (panels) {  // scores[rows, n rounded up to whole panels] = scale * Q K^T
              panel_gemm<false>(rows, (n + kPanelWidth - 1) / kPanelWidth, Dqk, s.q.data(), Dqk,
                                panels->k_tile(b, g, k0), kPanelWidth, panels->k_panel_stride(), scores, kKeyTile,
                                scale);
            }
          }
          if constexpr (kBf16PairPanel && std::is_same_v<scalar_t, c10::BFloat16>) {
            if (pairs) {  // scores[rows, n rounded up to whole panels] = Q K^T, scaled below
              panel_gemm<false, Bf16PairPanel>(rows, (n + kPanelWidth - 1) / kPanelWidth, Dqk / 2, s.q_lowp.data(),
                                               Dqk, pair_panels->k_tile(b, g, k0), 2 * kPanelWidth,
                                               pair_panels->k_panel_stride(), scores, kKeyTile, 1.f);
            }
          }
          if (!lowp && !panels) {  // scores[rows, n] = scale * Q K^T
            int64_t ldk = 0;
            const acc_t* kt = nullptr;
            if constexpr (cache_8bit) {
              kt = key_tile(p.cache_8bit, k, k_layout, b, k0, n, g, Dqk, s.k.data(), &ldk);
              vt = key_tile(p.cache_8bit, v, v_layout, b, k0, n, g, Dv, s.v.data(), &ldv);
            } else {
              kt = key_tile(k, k_layout, b, k0, n, g, Dqk, s.k.data(), &ldk);
              vt = key_tile(v, v_layout, b, k0, n, g, Dv, s.v.data(), &ldv);
            }
            gemm<acc_t>(false, true, rows, n, Dqk, scale, s.q.data(), Dqk, kt, ldk, acc_t(0), scores, kKeyTile);
          }
          // The low-precision paths' P: rounded to the input dtype, zero-padded to whole key blocks (brgemm:
          // few distinct shapes, as it compiles a kernel per shape) or to whole pairs.
          const int64_t keys = round_up(n, brgemm ? kPackBlock : 2);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t pos = w.q_begin + r / G;
            const int64_t lo = std::max<int64_t>(p.key_lo(b, pos) - k0, 0);
            const int64_t hi = std::min<int64_t>(p.key_hi(b, pos) - k0, n - 1);
            acc_t* srow = scores + r * kKeyTile;
            acc_t* acc_row = s.acc.data() + r * Dv;
            const AlibiRow alibi = p.alibi_row(b, g * G + r % G, pos, k0);
            if constexpr (!std::is_same_v<scalar_t, acc_t>) {
              if (lowp) {
                scalar_t* prow = s.p_lowp.data() + r * kKeyTile;
                if (softcap == 0 && scale > 0 && alibi.slope == 0) {
                  online_softmax_step_lowp(srow, prow, keys, lo, hi, scale, s.row_max[r], s.row_sum[r], acc_row, Dv,
                                           native_bf16);
                } else {
                  scale_row(srow, n, scale);
                  online_softmax_step(srow, n, lo, hi, softcap, alibi, s.row_max[r], s.row_sum[r], acc_row, Dv);
                  convert_row(srow, prow, n);
                  std::fill(prow + n, prow + keys, scalar_t(0));
                }
                continue;
              }
            }
            online_softmax_step(srow, n, lo, hi, softcap, alibi, s.row_max[r], s.row_sum[r], acc_row, Dv);
          }
          if constexpr (!std::is_same_v<scalar_t, acc_t>) {
            if (brgemm) {  // acc[rows, Dv] += P V per packed dim block
              const scalar_t* vp = packed->v_tile(b, g, k0);
              for (int64_t c = 0; c < Dv; c += kPackBlock) {
                lowp_brgemm(rows, kPackBlock, keys, s.p_lowp.data(), kKeyTile, vp + c * kKeyTile, kPackBlock,
                            s.acc.data() + c, Dv, true);
              }
            }
          }
          if constexpr (std::is_same_v<scalar_t, float>) {
            if (panels) {  // acc[rows, Dv] += P V
              panel_gemm<true>(rows, Dv / kPanelWidth, n, scores, kKeyTile, panels->v_tile(b, g, k0), kPanelWidth,
                               panels->v_panel_stride(), s.acc.data(), Dv, 1.f);
            }
          }
          if constexpr (kBf16PairPanel && std::is_same_v<scalar_t, c10::BFloat16>) {
            if (pairs) {  // acc[rows, Dv] += P V over the key pairs
              panel_gemm<true, Bf16PairPanel>(rows, Dv / kPanelWidth, keys / 2, s.p_lowp.data(), kKeyTile,
                                              pair_panels->v_tile(b, g, k0), 2 * kPanelWidth,
                                              pair_panels->v_panel_stride(), s.acc.data(), Dv, 1.f);
            }
          }
          if (!lowp && !panels) {  // acc[rows, Dv] += P V
            gemm<acc_t>(false, false, rows, Dv, n, acc_t(1), scores, kKeyTile, vt, ldv, acc_t(1), s.acc.data(), Dv);
          }
        }
        if (brgemm) {
          at::native::cpublas::brgemm_release();
        }

        for (int64_t r = 0; r < rows; ++r) {
          const int64_t pos = w.q_begin + r / G, h = g * G + r % G;
          acc_t* acc_row = s.acc.data() + r * Dv;
          const acc_t row_lse = finish_row(acc_row, Dv, s.row_max[r], s.row_sum[r]);
          if constexpr (cache_8bit) {
            scale_row(acc_row, Dv, static_cast<acc_t>(p.v_scale[g]));
          }
          if (splits == 1) {
            write_row(p, h, acc_row, row_lse, out + out_layout.at(b, pos, h), lse + lse_layout.at(b, pos, h));
          } else {
            const int64_t row = split * rows_total + (p.token_q[b] + pos) * Hq + h;
            std::copy(acc_row, acc_row + Dv, part_out.data() + row * Dv);
            part_lse[row] = row_lse;
          }
        }
      });
  if (splits == 1) {
    return;
  }

  merge_splits(p, splits, part_out.data(), part_lse.data(), out, out_layout, lse, lse_layout);
}

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
