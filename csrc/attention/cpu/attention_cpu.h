// The CPU attention problem: the validated arguments turned into plain integers and element offsets, so
// the forward and backward kernels address any BSHD or varlen layout (any strides but the last dim).
#pragma once

#include "attention/cpu/alibi_row.h"
#include "common/attention_call.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace attn_ops::cpu {

// Addressing of a [sequence, token, head, dim] tensor: element offset of (token i, head h) of sequence b.
struct SeqLayout {
  std::vector<int64_t> base;  // [batch]: offset of token 0, head 0
  int64_t seq_stride = 0;
  int64_t head_stride = 0;
  int64_t at(int64_t b, int64_t i, int64_t h) const { return base[b] + i * seq_stride + h * head_stride; }
};

// Addressing of keys or values: strided rows (as SeqLayout), or rows spread over fixed-size blocks of a
// paged cache ([num_blocks, block_size, heads, dim]) through a block table.
struct KeyLayout {
  SeqLayout rows;                        // strides within a sequence (or a block); `base` unused when paged
  const int32_t* block_table = nullptr;  // [table_rows, max_blocks_per_seq] when paged
  int64_t block_table_stride = 0;
  int64_t block_size = 0;
  int64_t block_stride = 0;
  std::vector<int64_t> table_row;  // [batch] when paged: the block-table row of sequence b (cache_batch_idx)
  std::vector<int64_t> first_key;  // [batch] when paged with cache_leftpad: the cache position of key 0, else empty

  int64_t at(int64_t b, int64_t j, int64_t h) const {
    if (block_table == nullptr) {
      return rows.at(b, j, h);
    }
    if (!first_key.empty()) {
      j += first_key[b];
    }
    const int64_t block = block_table[table_row[b] * block_table_stride + j / block_size];
    return block * block_stride + (j % block_size) * rows.seq_stride + h * rows.head_stride;
  }
  // Whether keys j .. j + n - 1 are equally spaced (rows.seq_stride apart), i.e. within one block. With a
  // left-padded paged cache the block boundaries depend on the sequence, so such tiles are gathered.
  bool uniform(int64_t j, int64_t n) const {
    return block_table == nullptr || (first_key.empty() && j % block_size + n <= block_size);
  }
};

// The format of an 8-bit KV cache (none: the cache has q's dtype).
enum class Cache8Bit : uint8_t { none, e4m3fn, e5m2 };

struct AttentionProblem {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, group = 0, dim_qk = 0, dim_v = 0;
  double scale = 1.0, softcap = 0.0;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded; causal already folded into window_right
  int64_t chunk = 0;                            // attention_chunk (0: none), at most the longest sequence + 1
  std::vector<double> sinks;                    // [heads_q] sink logits, or empty
  std::vector<float> alibi;                     // [batch, heads_q] ALiBi slopes, or empty
  std::vector<int64_t> len_q, len_k;            // [batch]
  std::vector<int64_t> token_q;                 // [batch]: index of the sequence's first query token
  int64_t total_q = 0;                          // query tokens over all sequences
  int64_t max_splits = 0;                       // the most key splits of a row (num_splits; 0: automatic)
  // An 8-bit cache (read as const uint8_t*): its format and each KV head's dequantization scales [heads_kv],
  // which the kernels fold into q (k_scale) and into the normalized output (v_scale), so the rows convert exactly.
  Cache8Bit cache_8bit = Cache8Bit::none;
  std::vector<float> k_scale, v_scale;

  // The key splits a forward uses: its own choice, capped by max_splits.
  int64_t capped_splits(int64_t chosen) const { return max_splits > 0 ? std::min(chosen, max_splits) : chosen; }

  // Sets the windows (-1: unbounded) and the chunk (0: none); windows longer than every sequence become
  // unbounded and chunks longer than every sequence the same chunk of length longest + 1 (every query's chunk
  // then holds every key at its side of position 0), which keeps the index arithmetic below far from overflow.
  void set_windows(int64_t left, int64_t right, int64_t chunk_len = 0) {
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; ++b) {
      longest = std::max({longest, len_q[b], len_k[b]});
    }
    window_left = left > longest ? -1 : left;
    window_right = right > longest ? -1 : right;
    chunk = std::min(chunk_len, longest + 1);
  }
  // Whether some query sees no key left of a bound other than 0 (a left window or chunks).
  bool left_bounded() const { return window_left >= 0 || chunk > 0; }
  // The first position of the chunk of position pos (pos < 0 when Tq > Tk): floor(pos / chunk) * chunk.
  int64_t chunk_start(int64_t pos) const {
    return (pos >= 0 ? pos / chunk : -((chunk - 1 - pos) / chunk)) * chunk;
  }
  // The sequence of every packed query token: [total_q].
  std::vector<int64_t> token_batches() const {
    std::vector<int64_t> out(total_q);
    for (int64_t b = 0; b < batch; ++b) {
      std::fill_n(out.begin() + token_q[b], len_q[b], b);
    }
    return out;
  }
  // The keys query i of sequence b sees: [key_lo, key_hi], empty when key_lo > key_hi.
  int64_t key_lo(int64_t b, int64_t i) const {
    const int64_t pos = i + len_k[b] - len_q[b];
    const int64_t lo = window_left < 0 ? 0 : std::max<int64_t>(0, pos - window_left);
    return chunk > 0 ? std::max(lo, chunk_start(pos)) : lo;
  }
  int64_t key_hi(int64_t b, int64_t i) const {
    const int64_t pos = i + len_k[b] - len_q[b];
    const int64_t hi = window_right < 0 ? len_k[b] - 1 : std::min<int64_t>(len_k[b] - 1, pos + window_right);
    return chunk > 0 ? std::min(hi, chunk_start(pos) + chunk - 1) : hi;
  }
  // The queries of sequence b that see any key in [k_first, k_last]: [first, last], empty when first > last.
  int64_t query_first(int64_t b, int64_t k_first) const {
    const int64_t shift = len_k[b] - len_q[b];
    const int64_t first = window_right < 0 ? 0 : std::max<int64_t>(0, k_first - shift - window_right);
    return chunk > 0 ? std::max(first, chunk_start(k_first) - shift) : first;
  }
  int64_t query_last(int64_t b, int64_t k_last) const {
    const int64_t shift = len_k[b] - len_q[b];
    const int64_t last = window_left < 0 ? len_q[b] - 1 : std::min<int64_t>(len_q[b] - 1, k_last - shift + window_left);
    return chunk > 0 ? std::min(last, chunk_start(k_last) + chunk - 1 - shift) : last;
  }
  // The ALiBi of query i of sequence b, head h over the tile of keys from k0 on.
  AlibiRow alibi_row(int64_t b, int64_t h, int64_t i, int64_t k0) const {
    if (alibi.empty()) {
      return {};
    }
    return {alibi[b * heads_q + h], i + len_k[b] - len_q[b] - k0};
  }
  // Floating-point operations of the forward without masks (an upper bound, for thread decisions).
  double forward_flops() const {
    double flops = 0;
    for (int64_t b = 0; b < batch; ++b) {
      flops += 2.0 * heads_q * len_q[b] * len_k[b] * (dim_qk + dim_v);
    }
    return flops;
  }
};

// The kernels' problem of a prepared call (any key source); reads the index tensors' values.
AttentionProblem make_problem(const AttentionCall& call);

// Forward of attention (and of attention over a KV cache, whose keys come through a paged KeyLayout). cache_t:
// scalar_t, or uint8_t for an 8-bit cache (p.cache_8bit).
template <typename scalar_t, typename acc_t, typename cache_t = scalar_t>
void attention_forward_kernel(const AttentionProblem& p,
                              const scalar_t* q, const SeqLayout& q_layout,  // [b, Tq, Hq, Dqk]
                              const cache_t* k, const KeyLayout& k_layout,   // [b, Tk, Hkv, Dqk]
                              const cache_t* v, const KeyLayout& v_layout,   // [b, Tk, Hkv, Dv]
                              scalar_t* out, const SeqLayout& out_layout,    // [b, Tq, Hq, Dv]
                              acc_t* lse, const SeqLayout& lse_layout);      // [b, Hq, Tq]

template <typename scalar_t, typename acc_t>
void attention_backward_kernel(const AttentionProblem& p,
                               const scalar_t* dout, const SeqLayout& dout_layout,  // [b, Tq, Hq, Dv]
                               const scalar_t* q, const SeqLayout& q_layout,        // [b, Tq, Hq, Dqk]
                               const scalar_t* k, const SeqLayout& k_layout,        // [b, Tk, Hkv, Dqk]
                               const scalar_t* v, const SeqLayout& v_layout,        // [b, Tk, Hkv, Dv]
                               const scalar_t* out, const SeqLayout& out_layout,    // [b, Tq, Hq, Dv]
                               const acc_t* lse, const acc_t* dlse, const SeqLayout& lse_layout,  // [b, Hq, Tq]
                               scalar_t* dq, const SeqLayout& dq_layout,            // [b, Tq, Hq, Dqk]
                               scalar_t* dk, const SeqLayout& dk_layout,            // [b, Tk, Hkv, Dqk]
                               scalar_t* dv, const SeqLayout& dv_layout);           // [b, Tk, Hkv, Dv]

}  // namespace attn_ops::cpu
