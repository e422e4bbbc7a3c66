// CPU decode kernel (few query rows per KV head, a long cache): the interface between the driver
// (decode_cpu.cpp: work split, threads, merge) and the per-ISA row kernels (decode_kernel.h,
// decode_gemm_kernel.h; compiled once per instruction set in decode_isa_*.cpp and picked at run time).
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "common/cpu_isa.h"

#include <cstdint>

namespace attn_ops::cpu {

constexpr int64_t kDecodeChunk = 64;     // keys per tile of decode_rows at most (decode_cpu.cpp: decode_tile)
constexpr int64_t kMaxDecodeRows = 32;   // query rows per KV head (positions x group) the kernel takes
// From this many query rows per KV head on, a key tile is worth two matrix products (decode_rows_gemm,
// decode_gemm_kernel.h): each key feeds enough FLOPs that decode is compute-bound (MLA: 16+ heads per row).
// Measured on MLA decode (16 heads, 576 / 512, B 16, 4096 keys, 2 threads): 128-key GEMM tiles 5-20% faster
// than streaming in float32, a tie in bfloat16; 64- and 256-key GEMM tiles no better. The 8 is not tuned.
constexpr int64_t kGemmDecodeRows = 8;
constexpr int64_t kGemmDecodeTile = 128;  // keys per tile of decode_rows_gemm
// MQA (one KV head, as MLA's latent row): decode_rows_gemm takes up to this many rows (DeepSeek-V3's 128 heads),
// one read of the cache for all of them instead of the prefill kernel's tiles.
constexpr int64_t kMaxGemmDecodeRows = 128;
// A head dim rounded up to whole chunks of 32: the bfloat16 streaming kernel's rows (decode_bf16_kernel.h).
inline int64_t padded_to_chunks(int64_t dim) { return (dim + 31) / 32 * 32; }
// decode_rows_gemm's query rows rounded up to whole AVX-512 vectors / AMX tile rows (16).
inline int64_t gemm_rows_padded(int64_t rows) { return (rows + 15) / 16 * 16; }

// Whether the streaming kernel reads each key tile before computing on it (stream_tiles' staged reads): items of
// several KV heads (BSHD), where a tile is one run of every head's row per key. Items of one KV head (its rows
// contiguous, decode_heads_per_item) prefetch while they compute instead. The driver sizes tiles by the same rule
// (decode_cpu.cpp: decode_tile).
inline bool staged_tile_reads(int64_t heads_per_item) { return heads_per_item > 1; }

// One work item of the decode kernel: all query rows of `heads` KV heads from kv_head on, of one sequence,
// over keys [k_begin, k_end). Row r of a KV head g is query position r / group of head g * group + r % group;
// the per-row arrays hold the heads one after another ([heads, rows, ...]).
template <typename scalar_t, typename acc_t>
struct DecodeRows {
  int64_t heads = 1, rows = 0, dim_qk = 0, dim_v = 0;  // rows: per KV head
  const acc_t* q = nullptr;           // [heads, rows, dim_qk], already multiplied by q_factor(head)
  acc_t scale = 1;                    // the softmax scale
  const acc_t* key_scale = nullptr;   // [heads]: an 8-bit cache's k_scale of each KV head (folded into q), or null
  // What q's rows of KV head `head` carry beyond the caller's q (a kernel that multiplies the caller's q divides it
  // out and applies it to the sums): the softmax scale, times k_scale over an 8-bit cache.
  acc_t q_factor(int64_t head) const { return key_scale == nullptr ? scale : scale * key_scale[head]; }
  const int64_t* key_lo = nullptr;    // [rows]: first visible key of each row
  const int64_t* key_hi = nullptr;    // [rows]: last visible key of each row
  // Sets keys[i] / values[i] to the cache rows of keys k0 + i, i < n, of KV head `head`. Compiled with the
  // build's flags (in decode_cpu.cpp), so the per-ISA kernels share no layout code with the rest of the library.
  void (*locate)(const DecodeRows& a, int64_t head, int64_t k0, int64_t n, const scalar_t** keys,
                 const scalar_t** values) = nullptr;
  const void* layouts = nullptr;      // what locate reads (the caches and their KeyLayouts)
  // An 8-bit cache's rows converted by locate into scalar_t: row i of each for key_rows[i] / value_rows[i]
  // ([key_rows' length, dim_qk] and [.., dim_v]); null for a cache of scalar_t, whose rows locate points at.
  scalar_t* converted_keys = nullptr;
  scalar_t* converted_values = nullptr;
  // An 8-bit cache's format. A kernel that converts its rows in registers copies this struct with converted_keys /
  // converted_values null: locate then points key_rows / value_rows at the cache's rows (their byte addresses).
  Cache8Bit rows_8bit = Cache8Bit::none;
  int64_t batch = 0, kv_head = 0, k_begin = 0, k_end = 0;
  acc_t softcap = 0;
  const double* alibi = nullptr;      // [heads, rows]: each row's ALiBi slope, or null
  const int64_t* position = nullptr;  // [rows]: each row's query position (the key position it sits at)
  // The ALiBi of row r of head `head` over the tile of keys from k0 on.
  AlibiRow alibi_row(int64_t head, int64_t r, int64_t k0) const {
    return alibi == nullptr ? AlibiRow{} : AlibiRow{alibi[head * rows + r], position[r] - k0};
  }
  // Scratch.
  int64_t tile = kDecodeChunk;            // keys per tile
  acc_t* scores = nullptr;                // [heads, rows, tile] (decode_rows_gemm: [rows, tile])
  // [2, heads, tile]: this tile's rows and the next tile's (decode_rows_gemm: [tile], one head at a time)
  const scalar_t** key_rows = nullptr;
  const scalar_t** value_rows = nullptr;  // as key_rows
  acc_t* key_tile = nullptr;              // [tile, dim_qk]: decode_rows_gemm's converted keys
  acc_t* value_tile = nullptr;            // [tile, dim_v]: and values
  // decode_rows_gemm's float32 scratch, rows rounded up to hp = 16: Q^T [heads, dim_qk, hp] (FMA kernels) or
  // scores^T [tile, hp] and out [heads, hp, dim_v] (AMX); and the AMX kernel's operands in the cache's dtype
  // (nullptr: no AMX path).
  acc_t* q_t = nullptr;
  scalar_t* lowp = nullptr;
  // The bfloat16 streaming kernel's (decode_bf16_kernel.h): its output accumulators [heads, rows,
  // padded_to_chunks(dim_v)] and its rearranged q [heads, rows, padded_to_chunks(dim_qk)].
  acc_t* stream_scratch = nullptr;
  acc_t* row_max = nullptr;               // [heads, rows]
  acc_t* row_sum = nullptr;               // [heads, rows]
  // Results.
  acc_t* out = nullptr;  // [heads, rows, dim_v]: the normalized output
  acc_t* lse = nullptr;  // [heads, rows]
};

template <typename scalar_t, typename acc_t>
using DecodeRowsFn = void (*)(const DecodeRows<scalar_t, acc_t>&);

// The row kernels of each instruction set (x86-64 builds also compile AVX2 and AVX-512 versions):
// decode_rows streams K/V through register-blocked dot products (few rows: memory-bound), decode_rows_gemm
// multiplies each key tile as two GEMMs (kGemmDecodeRows rows or more: compute-bound); dequantize_cache_row
// converts a row of an 8-bit cache to the kernels' dtype (cache_8bit.h).
#define ATTN_OPS_DECLARE_DECODE_ROWS(ns)                                                     \
  namespace ns {                                                                             \
  template <typename scalar_t, typename acc_t>                                               \
  void decode_rows(const DecodeRows<scalar_t, acc_t>& a);                                    \
  template <typename scalar_t, typename acc_t>                                               \
  void decode_rows_gemm(const DecodeRows<scalar_t, acc_t>& a);                               \
  template <typename scalar_t>                                                               \
  void dequantize_cache_row(Cache8Bit format, const uint8_t* src, scalar_t* dst, int64_t n); \
  }
ATTN_OPS_DECLARE_DECODE_ROWS(decode_default)
#ifdef ATTN_OPS_X86_ISA_COPIES
ATTN_OPS_DECLARE_DECODE_ROWS(decode_avx2)
ATTN_OPS_DECLARE_DECODE_ROWS(decode_avx512)
#endif
#undef ATTN_OPS_DECLARE_DECODE_ROWS

// Forward of attention over a (paged) cache with the decode kernel; arguments as attention_forward_kernel.
// cache_t: scalar_t, or uint8_t for an 8-bit cache (p.cache_8bit), whose rows convert tile by tile.
template <typename scalar_t, typename acc_t, typename cache_t = scalar_t>
void decode_forward_kernel(const AttentionProblem& p,
                           const scalar_t* q, const SeqLayout& q_layout,  // [b, Tq, Hq, Dqk]
                           const cache_t* k, const KeyLayout& k_layout,   // [b, Tk, Hkv, Dqk]
                           const cache_t* v, const KeyLayout& v_layout,   // [b, Tk, Hkv, Dv]
                           scalar_t* out, const SeqLayout& out_layout,    // [b, Tq, Hq, Dv]
                           acc_t* lse, const SeqLayout& lse_layout);      // [b, Hq, Tq]

// Forward of attention and of attention over a (paged) cache: the sequences with few query rows per KV head
// (at most kMaxDecodeRows: decode) on the decode kernel, the others (prefill chunks) on the tiled kernel, so
// one packed call of a mixed serving batch costs no more than a call per kind; arguments as above.
template <typename scalar_t, typename acc_t, typename cache_t = scalar_t>
void routed_forward_kernel(const AttentionProblem& p,
                           const scalar_t* q, const SeqLayout& q_layout,  // [b, Tq, Hq, Dqk]
                           const cache_t* k, const KeyLayout& k_layout,   // [b, Tk, Hkv, Dqk]
                           const cache_t* v, const KeyLayout& v_layout,   // [b, Tk, Hkv, Dv]
                           scalar_t* out, const SeqLayout& out_layout,    // [b, Tq, Hq, Dv]
                           acc_t* lse, const SeqLayout& lse_layout);      // [b, Hq, Tq]

}  // namespace attn_ops::cpu
