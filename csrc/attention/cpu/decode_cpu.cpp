// Driver of the CPU decode kernel: work items (sequence, KV heads, key split), the instruction set's row
// kernel, and the merge of the splits.
//
// Work is split over sequences (and over KV heads where each head's rows are contiguous:
// decode_heads_per_item) and, when those are too few to keep every thread busy (B = 1 with a long
// context), over chunks of the keys, whose partial results are merged by their log-sum-exp.
#include "attention/cpu/decode_cpu.h"
#include "attention/cpu/batch_subset.h"
#include "common/cpu/parallel.h"
#include "attention/cpu/row_ops.h"
#include "attention/cpu/split_merge.h"
#include "common/cpu_isa.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

namespace attn_ops::cpu {
namespace {

constexpr int64_t kMinSplitKeys = 512;  // below this a key split costs more to merge than it saves

// The row kernels of the copy cpu_isa() picks (common/cpu_isa.h): streaming and GEMM.
template <typename scalar_t, typename acc_t>
std::pair<DecodeRowsFn<scalar_t, acc_t>, DecodeRowsFn<scalar_t, acc_t>> decode_rows_for_this_cpu() {
  return {ATTN_OPS_FOR_THIS_CPU(decode, decode_rows<scalar_t, acc_t>),
          ATTN_OPS_FOR_THIS_CPU(decode, decode_rows_gemm<scalar_t, acc_t>)};
}

template <typename scalar_t, typename acc_t>
struct DecodeScratch {
  std::vector<acc_t> q, scores, key_tile, value_tile, q_t, row_max, row_sum, out, lse;
  std::vector<int64_t> key_lo, key_hi, position;
  std::vector<double> alibi;  // [heads, rows] when the call has ALiBi
  std::vector<const scalar_t*> key_rows, value_rows;
  std::vector<scalar_t> lowp;
  std::vector<acc_t> stream;  // DecodeRows::stream_scratch (bfloat16 only)
  std::vector<scalar_t> converted_keys, converted_values;  // DecodeRows' (8-bit caches only)
  // gemm_tile: decode_rows_gemm's keys per tile, 0 where it does not run (it needs the converted tiles, Q^T
  // or scores^T, and for low-precision caches the AMX operands: decode_amx_kernel.h).
  DecodeScratch(int64_t heads, int64_t rows, int64_t dqk, int64_t dv, int64_t gemm_tile, bool alibi_slopes,
                bool cache_8bit)
      : q(heads * rows * dqk), scores(std::max(heads * rows * kDecodeChunk, rows * gemm_tile)),
        key_tile(gemm_tile * dqk), value_tile(gemm_tile * dv),
        q_t(gemm_tile > 0 ? std::max(heads * dqk, gemm_tile + heads * dv) * gemm_rows_padded(rows) : 0),
        row_max(heads * rows), row_sum(heads * rows), out(heads * rows * dv), lse(heads * rows), key_lo(rows),
        key_hi(rows), position(rows), alibi(alibi_slopes ? heads * rows : 0),
        key_rows(2 * std::max(heads * kDecodeChunk, gemm_tile)),
        value_rows(2 * std::max(heads * kDecodeChunk, gemm_tile)),
        lowp(gemm_tile > 0 && !std::is_same_v<scalar_t, acc_t>
                 ? heads * dqk * gemm_rows_padded(rows) + gemm_tile * (dqk + dv + gemm_rows_padded(rows))
                 : 0),
        stream(std::is_same_v<scalar_t, c10::BFloat16> ? heads * rows * (padded_to_chunks(dqk) + padded_to_chunks(dv))
                                                       : 0),
        converted_keys(cache_8bit ? key_rows.size() * dqk : 0),
        converted_values(cache_8bit ? value_rows.size() * dv : 0) {}
};

// What locate reads: the caches (of scalar_t, or 8-bit: cache_t uint8_t) and their layouts.
template <typename scalar_t, typename cache_t>
struct CacheRows {
  const cache_t* k;
  const KeyLayout* k_layout;
  const cache_t* v;
  const KeyLayout* v_layout;
  Cache8Bit format = Cache8Bit::none;
  // the instruction set's conversion of an 8-bit row (decode_cpu.h)
  void (*dequantize)(Cache8Bit, const uint8_t*, scalar_t*, int64_t) = nullptr;
};

// Points keys[j] / values[j] at the cache rows of keys k0 + j of KV head `head`; an 8-bit cache's rows are
// converted into the scratch rows of those slots of key_rows / value_rows, which the kernel reads instead (a
// tile at a time, in L1/L2: no copy of the cache), unless the kernel converts them in registers.
template <typename scalar_t, typename acc_t, typename cache_t>
void locate_rows(const DecodeRows<scalar_t, acc_t>& a, int64_t head, int64_t k0, int64_t n, const scalar_t** keys,
                 const scalar_t** values) {
  const auto& c = *static_cast<const CacheRows<scalar_t, cache_t>*>(a.layouts);
  if constexpr (std::is_same_v<cache_t, scalar_t>) {
    for (int64_t j = 0; j < n; ++j) {
      keys[j] = c.k + c.k_layout->at(a.batch, k0 + j, head);
      values[j] = c.v + c.v_layout->at(a.batch, k0 + j, head);
    }
  } else if (a.converted_keys == nullptr) {  // a kernel that converts in registers (DecodeRows::rows_8bit)
    for (int64_t j = 0; j < n; ++j) {
      keys[j] = reinterpret_cast<const scalar_t*>(c.k + c.k_layout->at(a.batch, k0 + j, head));
      values[j] = reinterpret_cast<const scalar_t*>(c.v + c.v_layout->at(a.batch, k0 + j, head));
    }
  } else {
    // Rows past a tile (the GEMM kernels ask for the next tile's with this one's, to prefetch them) are pointed at,
    // not converted: the next call converts them. Values that are a prefix of their key's row (MLA's latent cache)
    // share its converted row.
    const int64_t slot = keys - a.key_rows;  // also values - a.value_rows
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* key_row = c.k + c.k_layout->at(a.batch, k0 + j, head);
      const uint8_t* value_row = c.v + c.v_layout->at(a.batch, k0 + j, head);
      if (j >= a.tile) {
        keys[j] = reinterpret_cast<const scalar_t*>(key_row);
        values[j] = reinterpret_cast<const scalar_t*>(value_row);
        continue;
      }
      scalar_t* key = a.converted_keys + (slot + j) * a.dim_qk;
      c.dequantize(c.format, key_row, key, a.dim_qk);
      keys[j] = key;
      if (value_row == key_row && a.dim_v <= a.dim_qk) {
        values[j] = key;
      } else {
        scalar_t* value = a.converted_values + (slot + j) * a.dim_v;
        c.dequantize(c.format, value_row, value, a.dim_v);
        values[j] = value;
      }
    }
  }
}

// The instruction set's conversion of 8-bit cache rows into scalar_t.
template <typename scalar_t>
auto dequantize_for_this_cpu() {
  return ATTN_OPS_FOR_THIS_CPU(decode, dequantize_cache_row<scalar_t>);
}

// The KV heads per work item: one where each head's keys and values are contiguous rows (a [B, Hkv, T, D] cache,
// such as HF's passed as a transposed view, or a paged pool of [num_blocks, Hkv, block_size, D] blocks), else all
// of them. decode_rows keeps each head's q rows, output accumulators and tile scores hot while the cache streams
// past; a core overlaps those reads with the arithmetic only while that hot set is well inside L1 (~16 KiB) and
// the reads run in address order (benchmarks/experiments/micro/decode_hot_set.cpp). One head per item gives both where a
// head's rows are contiguous (B=32 bfloat16 measured 1.3x; paged pools 1.05-1.37x at block sizes 4-256); where
// the heads of a key sit side by side (BSHD), address order needs all heads in one item, and one head per item
// measured up to 1.4x slower (zen4_decode_overlap.md).
int64_t decode_heads_per_item(const AttentionProblem& p, const KeyLayout& k_layout, const KeyLayout& v_layout,
                              int64_t max_rows) {
  const bool head_contiguous = k_layout.rows.seq_stride == p.dim_qk && v_layout.rows.seq_stride == p.dim_v;
  return head_contiguous && max_rows < kGemmDecodeRows ? 1 : p.heads_kv;
}

// Keys per tile of decode_rows (at most kDecodeChunk, which sizes the scratch). 16-bit caches read one KV head per
// item take 32: a tile's scores and row pointers are then half as much of the hot set that must stay in L1 while
// the cache streams past (decode_heads_per_item), and bfloat16 decode ran 10-15% faster over a [B, Hkv, T, D]
// cache (B=32 ctx 4096: 23.0-23.6 -> 24.1-28.3 GB/s; B=1 ctx 32768: 22.3-24.7 -> 26.5-26.8). Items of several
// heads (BSHD) read each tile before computing on it (stream_tiles' staged reads) and take 64 in every dtype:
// bfloat16 measured 2-7% faster than with 32. float32 keeps 64 everywhere: 32 measured no faster, and each
// tile's softmax and setup cost 15% more per key (L1).
template <typename scalar_t>
int64_t decode_tile(int64_t heads_per_item) {
  return sizeof(scalar_t) == 2 && !staged_tile_reads(heads_per_item) ? kDecodeChunk / 2 : kDecodeChunk;
}

// Whether a sequence of len_q queries runs on the decode kernel: few query rows per KV head, or with one
// KV head (MQA, MLA's latent row) up to kMaxGemmDecodeRows on its GEMM path.
bool takes_decode_kernel(const AttentionProblem& p, int64_t len_q) {
  const int64_t rows = len_q * p.group;
  return rows <= kMaxDecodeRows || (p.heads_kv == 1 && rows <= kMaxGemmDecodeRows);
}

}  // namespace

template <typename scalar_t, typename acc_t, typename cache_t>
void decode_forward_kernel(const AttentionProblem& p, const scalar_t* q, const SeqLayout& q_layout,
                           const cache_t* k, const KeyLayout& k_layout, const cache_t* v, const KeyLayout& v_layout,
                           scalar_t* out, const SeqLayout& out_layout, acc_t* lse, const SeqLayout& lse_layout) {
  constexpr bool cache_8bit = !std::is_same_v<cache_t, scalar_t>;
  const int64_t G = p.group, Hq = p.heads_q, Dqk = p.dim_qk, Dv = p.dim_v;
  int64_t longest_k = 0, max_rows = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    longest_k = std::max(longest_k, p.len_k[b]);
    max_rows = std::max(max_rows, p.len_q[b] * G);
  }
  const int64_t heads_per_item = decode_heads_per_item(p, k_layout, v_layout, max_rows);
  const int64_t head_groups = p.heads_kv / heads_per_item;
  const int64_t items = p.batch * head_groups;
  const double flops = p.forward_flops();
  // Split the keys when the items alone leave threads idle (or unbalanced), never below kMinSplitKeys.
  const int64_t threads = parallel_threads(flops);
  int64_t splits = 1;
  if (items > 0 && items < 4 * threads) {
    splits = std::max<int64_t>(1, std::min((4 * threads + items - 1) / items, longest_k / kMinSplitKeys));
  }
  splits = p.capped_splits(splits);
  const int64_t rows_total = p.total_q * Hq;
  std::vector<acc_t> part_out(splits > 1 ? splits * rows_total * Dv : 0);
  std::vector<acc_t> part_lse(splits > 1 ? splits * rows_total : 0);
  const auto [stream_rows, gemm_rows] = decode_rows_for_this_cpu<scalar_t, acc_t>();
  const acc_t scale = static_cast<acc_t>(p.scale);
  CacheRows<scalar_t, cache_t> cache{k, &k_layout, v, &v_layout};
  if constexpr (cache_8bit) {
    cache.format = p.cache_8bit;
    cache.dequantize = dequantize_for_this_cpu<scalar_t>();
  }

  parallel_items(
      items * splits, flops, [&] {
        return DecodeScratch<scalar_t, acc_t>(heads_per_item, max_rows, Dqk, Dv,
                                              max_rows >= kGemmDecodeRows ? kGemmDecodeTile : 0, !p.alibi.empty(),
                                              cache_8bit);
      },
      [&](int64_t item, DecodeScratch<scalar_t, acc_t>& s) {
        const int64_t split = item % splits, b = item / splits / head_groups;
        // KV heads [h0, h0 + Hkv) of sequence b
        const int64_t Hkv = heads_per_item, h0 = item / splits % head_groups * Hkv;
        const int64_t positions = p.len_q[b], rows = positions * G;
        // The keys any row sees, cut into `splits` equal chunks.
        const int64_t first = positions == 0 ? 0 : p.key_lo(b, 0);
        const int64_t last = positions == 0 ? -1 : p.key_hi(b, positions - 1);
        const int64_t per_split = (std::max<int64_t>(0, last - first + 1) + splits - 1) / splits;
        const int64_t k_begin = first + split * per_split, k_end = std::min(last + 1, k_begin + per_split);
        for (int64_t r = 0; r < rows; ++r) {  // row r of KV head g: position r / G of head g * G + r % G
          const int64_t pos = r / G;
          for (int64_t g = 0; g < Hkv; ++g) {
            acc_t* q_row = s.q.data() + (g * rows + r) * Dqk;
            convert_row(q + q_layout.at(b, pos, (h0 + g) * G + r % G), q_row, Dqk);
            scale_row(q_row, Dqk, cache_8bit ? static_cast<acc_t>(p.scale * p.k_scale[h0 + g]) : scale);
          }
          s.key_lo[r] = p.key_lo(b, pos);
          s.key_hi[r] = p.key_hi(b, pos);
          s.position[r] = pos + p.len_k[b] - p.len_q[b];
          for (int64_t g = 0; g < Hkv && !p.alibi.empty(); ++g) {
            s.alibi[g * rows + r] = p.alibi[b * Hq + (h0 + g) * G + r % G];
          }
        }
        DecodeRows<scalar_t, acc_t> a;
        a.heads = Hkv;
        a.rows = rows;
        a.dim_qk = Dqk;
        a.dim_v = Dv;
        a.q = s.q.data();
        a.scale = scale;
        if constexpr (cache_8bit) {  // acc_t float: 8-bit caches hold float16 / bfloat16 / float32 models' keys
          a.key_scale = p.k_scale.data() + h0;
        }
        a.key_lo = s.key_lo.data();
        a.key_hi = s.key_hi.data();
        a.alibi = s.alibi.empty() ? nullptr : s.alibi.data();
        a.position = s.position.data();
        a.locate = &locate_rows<scalar_t, acc_t, cache_t>;
        a.layouts = &cache;
        a.converted_keys = s.converted_keys.empty() ? nullptr : s.converted_keys.data();
        a.converted_values = s.converted_values.empty() ? nullptr : s.converted_values.data();
        a.rows_8bit = p.cache_8bit;
        a.batch = b;
        a.kv_head = h0;
        a.k_begin = k_begin;
        a.k_end = k_end;
        a.softcap = static_cast<acc_t>(p.softcap);
        const bool use_gemm = rows >= kGemmDecodeRows;
        // Without splits (num_splits = 1) a row's result must not depend on the batch: heads_per_item does (through
        // max_rows), so the streaming tile, which orders the row's sums, is then fixed.
        a.tile = use_gemm ? kGemmDecodeTile : p.max_splits == 1 ? kDecodeChunk : decode_tile<scalar_t>(Hkv);
        a.scores = s.scores.data();
        a.key_tile = s.key_tile.data();
        a.value_tile = s.value_tile.data();
        a.q_t = s.q_t.data();
        a.lowp = s.lowp.empty() ? nullptr : s.lowp.data();
        a.key_rows = s.key_rows.data();
        a.value_rows = s.value_rows.data();
        a.stream_scratch = s.stream.empty() ? nullptr : s.stream.data();
        a.row_max = s.row_max.data();
        a.row_sum = s.row_sum.data();
        a.out = s.out.data();
        a.lse = s.lse.data();
        (use_gemm ? gemm_rows : stream_rows)(a);
        for (int64_t gr = 0; gr < Hkv * rows; ++gr) {
          const int64_t r = gr % rows, pos = r / G, h = (h0 + gr / rows) * G + r % G;
          if constexpr (cache_8bit) {
            scale_row(s.out.data() + gr * Dv, Dv, static_cast<acc_t>(p.v_scale[h0 + gr / rows]));
          }
          if (splits == 1) {
            write_row(p, h, s.out.data() + gr * Dv, s.lse[gr], out + out_layout.at(b, pos, h),
                      lse + lse_layout.at(b, pos, h));
          } else {
            const int64_t row = split * rows_total + (p.token_q[b] + pos) * Hq + h;
            std::copy_n(s.out.data() + gr * Dv, Dv, part_out.data() + row * Dv);
            part_lse[row] = s.lse[gr];
          }
        }
      });
  if (splits > 1) {
    merge_splits(p, splits, part_out.data(), part_lse.data(), out, out_layout, lse, lse_layout);
  }
}

template <typename scalar_t, typename acc_t, typename cache_t>
void routed_forward_kernel(const AttentionProblem& p, const scalar_t* q, const SeqLayout& q_layout,
                           const cache_t* k, const KeyLayout& k_layout, const cache_t* v, const KeyLayout& v_layout,
                           scalar_t* out, const SeqLayout& out_layout, acc_t* lse, const SeqLayout& lse_layout) {
  std::vector<int64_t> decode_seqs, tiled_seqs;
  for (int64_t b = 0; b < p.batch; ++b) {
    (takes_decode_kernel(p, p.len_q[b]) ? decode_seqs : tiled_seqs).push_back(b);
  }
  if (tiled_seqs.empty()) {
    return decode_forward_kernel(p, q, q_layout, k, k_layout, v, v_layout, out, out_layout, lse, lse_layout);
  }
  if (decode_seqs.empty()) {
    return attention_forward_kernel(p, q, q_layout, k, k_layout, v, v_layout, out, out_layout, lse, lse_layout);
  }
  // A mixed batch: the tiled kernel would run each decode row as a tile of its own.
  const BatchSubset dec(p, decode_seqs), tiled(p, tiled_seqs);
  decode_forward_kernel(dec.problem, q, dec.of(q_layout), k, dec.of(k_layout), v, dec.of(v_layout), out,
                        dec.of(out_layout), lse, dec.of(lse_layout));
  attention_forward_kernel(tiled.problem, q, tiled.of(q_layout), k, tiled.of(k_layout), v, tiled.of(v_layout), out,
                           tiled.of(out_layout), lse, tiled.of(lse_layout));
}

#define ATTN_OPS_INSTANTIATE_DECODE(scalar_t)                                                                         \
  template void decode_forward_kernel<scalar_t, acc_type<scalar_t>>(                                                \
      const AttentionProblem&, const scalar_t*, const SeqLayout&, const scalar_t*, const KeyLayout&, const scalar_t*, \
      const KeyLayout&, scalar_t*, const SeqLayout&, acc_type<scalar_t>*, const SeqLayout&);                       \
  template void routed_forward_kernel<scalar_t, acc_type<scalar_t>>(                                                \
      const AttentionProblem&, const scalar_t*, const SeqLayout&, const scalar_t*, const KeyLayout&, const scalar_t*, \
      const KeyLayout&, scalar_t*, const SeqLayout&, acc_type<scalar_t>*, const SeqLayout&);
ATTN_OPS_INSTANTIATE_DECODE(float)
ATTN_OPS_INSTANTIATE_DECODE(double)
ATTN_OPS_INSTANTIATE_DECODE(c10::Half)
ATTN_OPS_INSTANTIATE_DECODE(c10::BFloat16)
#undef ATTN_OPS_INSTANTIATE_DECODE

// Over 8-bit caches (float16, bfloat16 and float32 queries).
#define ATTN_OPS_INSTANTIATE_DECODE_8BIT(scalar_t)                                                                 \
  template void routed_forward_kernel<scalar_t, acc_type<scalar_t>, uint8_t>(                                     \
      const AttentionProblem&, const scalar_t*, const SeqLayout&, const uint8_t*, const KeyLayout&, const uint8_t*, \
      const KeyLayout&, scalar_t*, const SeqLayout&, acc_type<scalar_t>*, const SeqLayout&);
ATTN_OPS_INSTANTIATE_DECODE_8BIT(float)
ATTN_OPS_INSTANTIATE_DECODE_8BIT(c10::Half)
ATTN_OPS_INSTANTIATE_DECODE_8BIT(c10::BFloat16)
#undef ATTN_OPS_INSTANTIATE_DECODE_8BIT

}  // namespace attn_ops::cpu
