// The device-side description of an attention problem, shared by every CUDA attention kernel (forward,
// backward, attention over a KV cache, MLA decode).
//
// Sequence lengths are read on the device from cu_seqlens / cache_seqlens, never copied to the host: the
// kernels stay sync-free and capturable in a CUDA graph. The host validation (attention/validation.h)
// checks those values whenever it may read them; under graph capture it cannot, so every index read here
// is clamped or bounds-checked: invalid inputs then give wrong numbers for that row, never an
// out-of-range access.
#pragma once

#include "attention/cuda/launch_plan.h"
#include "common/cuda/device_utils.cuh"

#include <cstdint>

namespace attn_ops::cuda {

// Lengths and first tokens of one sequence (varlen: index of its first packed token; dense: 0).
struct Seq {
  int64_t len_q, len_k, q0, k0;
};

// Where the sequence lengths come from: dense sizes, packed cu_seqlens, or a cache's cache_seqlens.
struct SeqInfo {
  const int32_t* cu_q = nullptr;       // [batch + 1] or null
  const int32_t* cu_k = nullptr;       // [batch + 1] or null
  const int32_t* cache_len = nullptr;  // [batch] keys in each cache row, or null
  int64_t len_q = 0;  // dense: query length; varlen: total query tokens (clamp bound)
  int64_t len_k = 0;  // dense: key length; varlen: total key tokens; cache: capacity of a row
  const int32_t* first_key = nullptr;  // [batch] cache_leftpad (with cache_len): row b's keys start there, or null

  __device__ __forceinline__ Seq at(int64_t b) const {
    Seq s{len_q, len_k, 0, 0};
    if (cu_q != nullptr) {
      s.q0 = clamp(cu_q[b], len_q);
      s.len_q = max_zero(clamp(cu_q[b + 1], len_q) - s.q0);
      s.k0 = clamp(cu_k[b], len_k);
      s.len_k = max_zero(clamp(cu_k[b + 1], len_k) - s.k0);
    }
    if (cache_len != nullptr) {
      s.len_k = clamp(cache_len[b], len_k);
    }
    if (first_key != nullptr) {  // keys first_key[b] .. cache_len[b] - 1: k0 shifts every key position
      s.k0 = clamp(first_key[b], s.len_k);
      s.len_k -= s.k0;
    }
    return s;
  }

 private:
  __device__ __forceinline__ static int64_t clamp(int64_t x, int64_t hi) { return x < 0 ? 0 : (x > hi ? hi : x); }
  __device__ __forceinline__ static int64_t max_zero(int64_t x) { return x < 0 ? 0 : x; }
};

// Element offsets into [batch, seqlen, heads, dim] (batch_stride > 0) or packed [total, heads, dim]
// (batch_stride = 0, tokens counted from the sequence's first packed token).
struct TokenLayout {
  int64_t batch_stride = 0, token_stride = 0, head_stride = 0;

  __device__ __forceinline__ int64_t at(int64_t b, int64_t first, int64_t i, int64_t h) const {
    return b * batch_stride + (first + i) * token_stride + h * head_stride;
  }
};

// Keys / values: token rows as TokenLayout, or spread over the blocks of a paged cache
// ([num_blocks, block_size, heads, dim]) through a block table ([table rows, max_blocks_per_seq]).
// With cache_row (cache_batch_idx), sequence b reads cache row (paged: block-table row) cache_row[b].
struct KeyLayout {
  TokenLayout rows;
  const int32_t* block_table = nullptr;
  int64_t table_stride = 0, block_stride = 0;
  int64_t block_size = 0, num_blocks = 0, table_width = 0;
  int block_shift = -1;  // log2(block_size) when it is a power of two, else -1
  const int32_t* cache_row = nullptr;  // [batch] or null (row b)
  int64_t num_rows = 0;                // rows cache_row may select (of the cache, or paged of the block table)

  // Offset of key j of sequence b (first key k0: packed, or a cache's left padding), head h; -1 when its
  // cache row or block-table entry is out of range (possible only for inputs that could not be checked:
  // CUDA-graph capture). The key is skipped.
  __device__ __forceinline__ int64_t at(int64_t b, int64_t k0, int64_t j, int64_t h) const {
    if (cache_row != nullptr) {
      b = cache_row[b];
      if (b < 0 || b >= num_rows) {
        return -1;
      }
    }
    if (block_table == nullptr) {
      return rows.at(b, k0, j, h);
    }
    // 0 <= k0 + j < 2^31 (cache positions are int32): a shift for power-of-two block sizes, else a 32-bit
    // division, never a 64-bit one (tens of instructions per key).
    const uint32_t key = static_cast<uint32_t>(k0 + j);
    const uint32_t slot = block_shift >= 0 ? key >> block_shift : key / static_cast<uint32_t>(block_size);
    const uint32_t within = block_shift >= 0 ? key & static_cast<uint32_t>(block_size - 1)
                                             : key - slot * static_cast<uint32_t>(block_size);
    const int64_t block = slot < table_width ? block_table[b * table_stride + slot] : -1;
    if (block < 0 || block >= num_blocks) {
      return -1;
    }
    return block * block_stride + within * rows.token_stride + h * rows.head_stride;
  }
};

// lse: [batch, heads, seqlen] (dense) or [heads, total] (varlen).
struct LseLayout {
  int64_t batch_stride = 0, head_stride = 0;

  __device__ __forceinline__ int64_t at(int64_t b, int64_t first, int64_t i, int64_t h) const {
    return b * batch_stride + h * head_stride + first + i;
  }
};

// The visible keys of query i: [lo, hi] (empty when lo > hi), bottom-right aligned (query i sits at key
// position i + len_k - len_q). -1 windows are unbounded; causal is folded into window_right = 0.
struct Window {
  int64_t left = -1, right = -1;
  int64_t chunk = 0;  // attention_chunk (0: none): position p sees only keys in [chunk_start(p), + chunk)

  __device__ __forceinline__ int64_t chunk_start(int64_t pos) const {
    return (pos >= 0 ? pos / chunk : -((chunk - 1 - pos) / chunk)) * chunk;
  }
  __device__ __forceinline__ void keys_of(const Seq& s, int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t pos = i + s.len_k - s.len_q;
    *lo = left < 0 ? 0 : (pos - left > 0 ? pos - left : 0);
    *hi = right < 0 ? s.len_k - 1 : (pos + right < s.len_k - 1 ? pos + right : s.len_k - 1);
    if (chunk > 0) {
      const int64_t start = chunk_start(pos);
      *lo = *lo > start ? *lo : start;
      *hi = *hi < start + chunk - 1 ? *hi : start + chunk - 1;
    }
  }
  // The queries that see key j: [first, last] (empty when first > last).
  __device__ __forceinline__ void queries_of(const Seq& s, int64_t j, int64_t* first, int64_t* last) const {
    const int64_t shift = s.len_k - s.len_q;
    *first = right < 0 ? 0 : (j - shift - right > 0 ? j - shift - right : 0);
    *last = left < 0 ? s.len_q - 1 : (j - shift + left < s.len_q - 1 ? j - shift + left : s.len_q - 1);
    if (chunk > 0) {
      const int64_t start = chunk_start(j);
      *first = *first > start - shift ? *first : start - shift;
      *last = *last < start + chunk - 1 - shift ? *last : start + chunk - 1 - shift;
    }
  }
};

// logit = scale * q.k, soft-capped to cap * tanh(logit / cap) when cap > 0.
template <typename A>
struct Logit {
  A scale, softcap;

  __device__ __forceinline__ A operator()(A dot) const {
    const A x = dot * scale;
    return softcap > A(0) ? softcap * tanh(x / softcap) : x;
  }
  // d logit / d dot, given the logit.
  __device__ __forceinline__ A derivative(A logit) const {
    if (softcap > A(0)) {
      const A t = logit / softcap;
      return scale * (A(1) - t * t);
    }
    return scale;
  }
};

// ALiBi: the logit of query position p and key position j gains -slope * |p - j| (after the cap). Slopes
// float32 [heads_q] (batch_stride 0) or [batch, heads_q]; null: none.
struct Alibi {
  const float* slopes = nullptr;
  int64_t batch_stride = 0, head_stride = 0;

  __device__ __forceinline__ float slope(int64_t b, int64_t h) const {
    return slopes == nullptr ? 0.f : slopes[b * batch_stride + h * head_stride];
  }
  // The bias of query i of sequence s (at key position i + len_k - len_q) and key j.
  template <typename A>
  __device__ __forceinline__ static A bias(A slope, const Seq& s, int64_t i, int64_t j) {
    const int64_t d = i + s.len_k - s.len_q - j;
    return -slope * static_cast<A>(d < 0 ? -d : d);
  }
};

// Everything a forward kernel reads and writes. Rows are (query position, query head); query head h reads
// key/value head h / group.
template <typename T>
struct ForwardArgs {
  using A = acc_type<T>;
  const T* q;  // [batch, len_q, heads_q, dim_qk] / [total_q, heads_q, dim_qk]
  const T* k;  // [batch, len_k, heads_kv, dim_qk] / [total_k, ...] / [num_blocks, block_size, heads_kv, dim_qk]
  const T* v;  // like k, with dim_v
  T* out;      // like q, with dim_v
  A* lse;      // LseLayout
  TokenLayout q_layout, out_layout;
  KeyLayout k_layout, v_layout;
  LseLayout lse_layout;
  SeqInfo seqs;
  Window window;
  Logit<A> logit;
  Alibi alibi;
  int64_t batch, heads_q, group, dim_qk, dim_v;
  int64_t max_len_q;  // grid bound on query positions per sequence (rows past a sequence's length exit)
  // Split-KV: the visible keys of every row are cut at multiples of keys_per_split(len_k), decided on the
  // device from the sequence's own key count (a cache row's cache_seqlens): no host sync, graph-safe, and a
  // short row in a large cache gets few splits, each with work. Split s < splits_used(len_k) writes its
  // normalised partial output and its lse to partial_out [splits, batch, max_len_q, heads_q, dim_v] and
  // partial_lse [splits, batch, max_len_q, heads_q], merged afterwards; the other splits exit at once.
  // splits == 1: written to out/lse.
  int64_t splits = 1;
  int64_t split_min_keys = kSplitTile;  // a multiple of kSplitTile (host: split_min_keys())
  A* partial_out = nullptr;
  A* partial_lse = nullptr;

  // Keys per split of a sequence of len_k keys: an even share of the splits, rounded up to kSplitTile (no
  // key tile is loaded by two splits) and at least split_min_keys (fewer keys would cost more partial
  // traffic than key traffic).
  __device__ __forceinline__ int64_t keys_per_split(int64_t len_k) const {
    const int64_t keys = ceil_div(ceil_div(len_k, splits), kSplitTile) * kSplitTile;
    return keys > split_min_keys ? keys : split_min_keys;
  }
  // Splits with keys of a sequence of len_k keys (at least 1: split 0 also stores the empty result).
  __device__ __forceinline__ int64_t splits_used(int64_t len_k) const {
    const int64_t used = splits == 1 ? 1 : ceil_div(len_k, keys_per_split(len_k));
    return used > 1 ? used : 1;
  }
};

}  // namespace attn_ops::cuda

namespace attn_ops::cuda {

// Everything the backward kernels read and write (dense or varlen; no paged keys).
template <typename T>
struct BackwardArgs {
  using A = acc_type<T>;
  const T *q, *k, *v, *out, *dout;  // as in ForwardArgs (dout like out)
  const A* lse;                      // LseLayout
  const A* dlse;                     // LseLayout, or null
  A* delta;                          // LseLayout scratch: rowsum(dout * out) - dlse
  T *dq, *dk, *dv;                   // like q, k, v
  TokenLayout q_layout, k_layout, v_layout, out_layout, dout_layout, dq_layout, dk_layout, dv_layout;
  LseLayout lse_layout;
  SeqInfo seqs;
  Window window;
  Logit<A> logit;
  Alibi alibi;  // the row kernels only (backward_uses_mma)
  // A fixed summation order: the row kernels, which sum dQ and dK / dV per row without atomics
  bool deterministic = false;
  int64_t batch, heads_q, heads_kv, group, dim_qk, dim_v;
  int64_t max_len_q, max_len_k;  // grid bounds
  // Tensor-core backward only (backward_mma.cu), else null: fp32 dQ summed over key tiles by atomics, then
  // converted to dq. Laid out like q ([batch, len_q, heads_q, dim_qk] / [total_q, heads_q, dim_qk]).
  float* dq_accum = nullptr;
  TokenLayout dq_accum_layout;
  // Tensor-core backward only: the group's query heads are split over head_splits blocks per key tile
  // (launch_plan.h, query_head_splits); with more than one, dK and dV are summed by fp32 atomics into
  // dk_accum / dv_accum (zeroed, laid out like k / v), then converted to dk / dv.
  int64_t head_splits = 1;
  int64_t heads_per_split = 0;  // ceil(group / head_splits), set with head_splits
  float* dk_accum = nullptr;
  float* dv_accum = nullptr;
  TokenLayout dk_accum_layout, dv_accum_layout;
};

}  // namespace attn_ops::cuda
