// The tensor-core forward of attention for float16 / bfloat16: FlashAttention-2 style, mma.sync.m16n8k16
// with fp32 accumulators (sm_80+; the H100, sm_90, is the target). It reproduces forward_rows_kernel
// (forward_rows.cuh) row for row: the same windows, splits, skipped keys and empty-row result.
//
// Rows. A block owns kBlockM consecutive rows of one (batch b, KV head); row r is query position
// r / group and query head kv_head * group + r % group. The `group` query heads that read one KV head thus
// share every K/V tile the block loads: decode (Tq = 1) with group 8 fills 8 rows of a 16-row MMA, MLA
// (one KV head for all heads) puts 16 heads in each warp's rows.
//
// Warps. Warp w computes the 16 rows (16 kSlices with the two-slice tiles) of row slice w / kWarpsD and the
// output columns of slice w % kWarpsD.
// kWarpsD = 1 except for MLA (576/512): 16 rows x 512 fp32 columns would need 256 accumulator registers
// per thread, so two warps split Dv (128 registers each, as for head dim 256) and each computes the whole
// S = Q K^T of its rows. That repeats 576 of the 576 + 512 MMA columns per key (~1.5x the tensor work),
// which costs only when MLA decode is compute bound (about 64+ heads per KV head); in exchange the warps
// never exchange S or row statistics (no smem round trip, no extra barrier).
//
// Per key tile (kBlockN keys): S = Q K^T (Q and K fragments by ldmatrix from smem); logits scaled into
// log2 units (or soft-capped: cap * log2e * tanh(dot * scale / cap)); masked to -inf where needed; online
// softmax in fp32 registers (exp2); P re-packed from the S accumulators into A fragments in registers;
// O += P V (V fragments by ldmatrix.trans). At the end O / l, lse = ln2 * (m + log2 l).
//
// Keys. Every key goes through KeyLayout::at (dense, varlen, paged with any block size). Two tiles ahead,
// one thread per key writes the key's K and V row offsets (-1: not loaded) into a ring of kSlots smem
// slots, and each warp a bit mask of the keys it could read (ballot); all threads then gather the rows in
// 16-byte chunks with cp.async, zero-filling keys outside the block's key range and keys whose
// block-table entry is invalid (their bits mask them too). The block visits only the tiles that meet
// [lo(first row), hi(last row)] (window bounds are non-decreasing in the position, so this covers every
// row's window), cut to its split. Per warp, a tile outside all its rows' windows is skipped, a tile inside
// all of them with every key readable is not masked, and any other is masked per element. Q rows past
// len_q are zero-filled and never stored. K/V tiles are double-buffered: tile t + 1 is in flight while
// tile t is computed.
//
// V from K. When v and k are the same tensor with the same layout (MLA's latent cache: the values are the
// first 512 of the 576 key columns; values_inside_keys), V fragments are read from the K tile: no V copy,
// less smem.
//
// Configurations (smem: row offsets and key bits + Q + 2 K + 2 V tiles, rows padded by 16 bytes so that
// the 8 rows of an ldmatrix hit 8 different bank quads; registers from ptxas for sm_90, no spills; blocks
// per SM on an H100 (228 KB smem, 64K registers) as limited by smem / by registers):
//   dim_qk/dim_v  warps (rows x Dv)  kBlockM  kBlockN  smem              registers  blocks/SM
//   64/64         4 x 1              64       64        48.5 KB          161        4 / 3
//   96/96         4 x 1              64       64        68.5 KB          168        3 / 3
//   128/128       4 x 1              64       64        88.5 KB          201        2 / 2
//   192/128       4 x 1              64       32        69.0 KB          167        3 / 3
//   256/256       4 x 1              64       32       101.0 KB          255        2 / 2
//   576/512       2 x 2              32       32       176.3 KB          254        1 / 2
//                                                      (111.3 V from K)             (2 / 2)
// Two-slice tiles (ATTN_OPS_CUDA_FWD_SLICES=2, experimental), 4 x 1 warps of 32 rows, kBlockM 128:
//   64/64 (kBlockN 64) 255 registers; 96/96 (32) 230; 128/128 (32) 255 with 32 bytes of spills (8 values
//   stored once before the key loop).
//
// Expected limits: below FlashAttention-2 on the same GPU (no swizzled smem or register-resident Q: Q
// fragments are re-read from smem per tile; 16 rows per warp; two barriers per tile; an offset per key,
// which for paged caches costs a shift, or a 32-bit division for other block sizes, per key and tile)
// and well below Hopper-native kernels (wgmma/TMA). Decode is memory bound: it needs split-KV for
// parallelism, and warps whose rows are all past the sequence only help load. Long causal prefill
// schedules the heaviest row tiles first.
#include "attention/cuda/attention_cuda.h"
#include "attention/cuda/forward_rows.cuh"
#include "attention/cuda/launch_record.h"
#include "attention/cuda/mma_fragments.cuh"
#include "common/cuda/kernel_attributes.cuh"

#include <c10/util/Exception.h>
#include <nv/target>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>

namespace attn_ops::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kSlots = 3;  // key-offset slots: tile t + 2 is written while tile t is masked and t + 1 copied

// Tile shape of one (dim_qk, dim_v) pair. Slices: m16 row slices per warp (1, or 2 for the two-slice tiles,
// whose K / V fragments each feed two MMAs).
template <int Dqk, int Dv, int WarpsM, int WarpsD, int BlockN, int Slices = 1>
struct Tile {
  static constexpr int kDqk = Dqk, kDv = Dv, kWarpsM = WarpsM, kWarpsD = WarpsD, kBlockN = BlockN;
  static constexpr int kSlices = Slices;
  static constexpr int kBlockM = 16 * kSlices * kWarpsM;  // rows of a block: kSlices m16 slices per warp row
  static constexpr int kThreads = kWarpSize * kWarpsM * kWarpsD;
  static constexpr int kDvWarp = kDv / kWarpsD;  // output columns of one warp
  // smem row pitches in elements (Q and K share one): 8 more than a row, an odd number of 16-byte units.
  static constexpr int kKPitch = kDqk + 8, kVPitch = kDv + 8;
  static constexpr int kKeyWords = kBlockN / 32;  // 32-bit words of one bit per key of a tile
  // Words of the readable-key bits of the K and V offsets of every slot, rounded up to 16 bytes.
  static constexpr int kBitWords = (2 * kSlots * kKeyWords + 3) / 4 * 4;
  static_assert(kDqk % 16 == 0 && kDvWarp % 16 == 0, "whole m16n8k16 steps");
  static_assert(kBlockN == 32 || kBlockN == 64, "whole 32-bit words of key bits, at most 64 keys");
  static_assert(2 * kBlockN <= kThreads, "one thread per key for the K offsets and one for the V offsets");
  static_assert(kDv <= kDqk, "V from K reads the first dim_v columns of a key row");

  // Dynamic smem of a block: row offsets of Q, K and V, readable-key bits, then the Q, K and V tiles.
  static constexpr int smem_bytes(bool v_in_k) {
    return (kBlockM + 2 * kSlots * kBlockN) * int(sizeof(int64_t)) + kBitWords * int(sizeof(uint32_t)) +
           ((kBlockM + 2 * kBlockN) * kKPitch + (v_in_k ? 0 : 2 * kBlockN * kVPitch)) * kElemBytes;
  }
  // Blocks per SM asked of ptxas (its register budget): as many as the smem allows on an H100 (228 KB,
  // 1 KB reserved per block), at most 3: 4 would cap registers at 128, and the 64/64 tile then spills. Two
  // slices hold twice the accumulators: at most 2 blocks (255 registers).
  static constexpr int kMinBlocks = std::min(kSlices == 1 ? 3 : 2, 228 * 1024 / (smem_bytes(false) + 1024));
};

using Tiles = std::tuple<Tile<64, 64, 4, 1, 64>, Tile<96, 96, 4, 1, 64>, Tile<128, 128, 4, 1, 64>,
                         Tile<192, 128, 4, 1, 32>, Tile<256, 256, 4, 1, 32>, Tile<576, 512, 2, 2, 32>>;
// Experimental, opt-in (ATTN_OPS_CUDA_FWD_SLICES=2), not yet run on a GPU: 32 rows per warp, as
// FlashAttention-2's 128-row blocks, so each ldmatrix of K or V feeds two MMAs (half the shared-memory reads
// per FLOP) and each warp has twice the independent MMAs in flight. 32-key tiles for 96 and 128 keep the
// doubled S and O accumulators within 255 registers.
using TwoSliceTiles =
    std::tuple<Tile<64, 64, 4, 1, 64, 2>, Tile<96, 96, 4, 1, 32, 2>, Tile<128, 128, 4, 1, 32, 2>>;

// Host-computed constants of one launch.
struct Launch {
  int64_t row_tiles;  // blocks per (batch, KV head): ceil(max_len_q * group / kBlockM)
  int64_t heads_kv;
  bool v_in_k;  // V fragments come from the K tile (v == k with the same layout)
};

template <typename F>
__device__ __forceinline__ int warp_reduce(int x, F op) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// copy_tile from the row offsets in smem `offsets`.
template <typename T, int kRows, int kCols, int kPitch, int kThreads>
__device__ __forceinline__ void copy_rows(uint32_t dst, const T* src, const int64_t* offsets) {
  copy_tile<T, kRows, kCols, kPitch, kThreads>(dst, src, [&](int r) { return offsets[r]; });
}

// One block: kBlockM rows of one (batch, KV head) against the keys of split blockIdx.y.
template <typename T, typename C>
__device__ __forceinline__ void forward_mma_block(const ForwardArgs<T>& a, const Launch& p) {
  static_assert(sizeof(T) == kElemBytes);
  constexpr int BN = C::kBlockN, kPitch = C::kKPitch;
  extern __shared__ __align__(16) unsigned char smem[];
  int64_t* q_off = reinterpret_cast<int64_t*>(smem);  // [kBlockM] Q row offsets, -1: row past len_q
  int64_t* k_off = q_off + C::kBlockM;                 // [kSlots][BN] K row offsets, -1: not loaded
  int64_t* v_off = k_off + kSlots * BN;                // [kSlots][BN] V row offsets (unused when v_in_k)
  // [2 (K, V)][kSlots][kKeyWords] bit k % 32 of word k / 32: key k of the slot's tile has a K (V) row.
  uint32_t* key_bits = reinterpret_cast<uint32_t*>(v_off + kSlots * BN);
  // Shared addresses of the tiles, and the bytes of one K and one V tile.
  const int v_pitch = p.v_in_k ? kPitch : C::kVPitch;
  constexpr int kKBuf = BN * kPitch * kElemBytes;
  const int v_buf = BN * v_pitch * kElemBytes;
  const uint32_t sq = smem_u32(key_bits + C::kBitWords);      // [kBlockM][kPitch] Q
  const uint32_t sk = sq + C::kBlockM * kPitch * kElemBytes;  // [2][BN][kPitch] double-buffered K
  const uint32_t sv = p.v_in_k ? sk : sk + 2 * kKBuf;         // [2][BN][v_pitch] double-buffered V

  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int wm = warp / C::kWarpsD, wd = warp % C::kWarpsD;  // row slices, output-column slice
  const int g = lane / 4, c = 2 * (lane % 4);                // fragment row and column (mma_16816)
  // This thread's rows: g + 8 h of each of the warp's kSlices m16 slices; row i (of kRows) is slice i / 2,
  // half i % 2, at block row warp_row0 + 16 (i / 2) + g + 8 (i % 2).
  constexpr int kSl = C::kSlices, kRows = 2 * kSl;
  const int warp_row0 = wm * 16 * kSl;

  // Late row tiles first: under a causal mask they see the most keys.
  const int64_t tile = p.row_tiles - 1 - blockIdx.x % p.row_tiles;
  const int64_t b = blockIdx.x / p.row_tiles / p.heads_kv, kv_head = blockIdx.x / p.row_tiles % p.heads_kv;
  const int64_t split = blockIdx.y;
  const Seq s = a.seqs.at(b);
  const int64_t len_q = min(s.len_q, a.max_len_q);
  const int64_t r0 = tile * C::kBlockM;  // first row of the block
  if (r0 / a.group >= len_q) {
    return;  // the whole block is past the sequence
  }

  if (split >= a.splits_used(s.len_k)) {
    return;  // past the sequence's keys: merge_splits_kernel reads only the used splits
  }
  const int64_t chunk = a.splits > 1 ? a.keys_per_split(s.len_k) : 0;  // a multiple of BN
  const int64_t split_lo = split * chunk;
  const int64_t split_hi = a.splits > 1 ? split_lo + chunk - 1 : INT64_MAX;
  auto keys_of = [&](int64_t i, int64_t& lo, int64_t& hi) {  // visible keys of position i in this split
    a.window.keys_of(s, i, &lo, &hi);
    lo = max(lo, split_lo);
    hi = min(hi, split_hi);
  };
  int64_t klo, khi, unused;  // the block's keys
  keys_of(r0 / a.group, klo, unused);
  keys_of(min((r0 + C::kBlockM - 1) / a.group, len_q - 1), unused, khi);
  // Keys from here on are counted from first_key, in int (fewer registers; key counts fit: sequence
  // lengths are int32), clamped so that even unchecked lengths cannot overflow.
  const int64_t first_key = klo / BN * BN;  // tiles start at multiples of BN
  const auto key_rel = [&](int64_t j) {
    return static_cast<int>(min(max(j - first_key, int64_t(-1)), int64_t(INT_MAX / 2)));
  };
  const int block_lo = key_rel(klo), block_hi = key_rel(khi);
  const int n_tiles = block_hi >= block_lo ? block_hi / BN + 1 : 0;

  // Windows of this thread's rows (rows past len_q: empty), and their extremes over the valid rows of the
  // warp.
  bool valid[kRows];
  int lo[kRows], hi[kRows];
  int lo_min = INT_MAX, lo_max = INT_MIN, hi_min = INT_MAX, hi_max = INT_MIN;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = (r0 + warp_row0 + 16 * (r / 2) + g + 8 * (r % 2)) / a.group;
    valid[r] = i < len_q;
    lo[r] = 0;
    hi[r] = -1;
    if (valid[r]) {
      int64_t row_lo, row_hi;
      keys_of(i, row_lo, row_hi);
      lo[r] = key_rel(row_lo);
      hi[r] = key_rel(row_hi);
      lo_min = min(lo_min, lo[r]);
      lo_max = max(lo_max, lo[r]);
      hi_min = min(hi_min, hi[r]);
      hi_max = max(hi_max, hi[r]);
    }
  }
  lo_min = warp_reduce(lo_min, [](int x, int y) { return min(x, y); });
  lo_max = warp_reduce(lo_max, [](int x, int y) { return max(x, y); });
  hi_min = warp_reduce(hi_min, [](int x, int y) { return min(x, y); });
  hi_max = warp_reduce(hi_max, [](int x, int y) { return max(x, y); });

  // Threads [0, BN) write the K row offsets of the keys of tile t into its slot, threads [BN, 2 BN) the V
  // row offsets (-1: outside the block's keys, or an invalid block-table entry), with their bits.
  auto write_key_offsets = [&](int t) {
    const bool is_v = tid >= BN;
    if (tid >= 2 * BN || (is_v && p.v_in_k)) {
      return;  // whole warps: BN is a multiple of 32
    }
    const int key = tid % BN, j = t * BN + key, slot = t % kSlots;
    int64_t off = -1;
    if (j >= block_lo && j <= block_hi) {
      off = is_v ? a.v_layout.at(b, s.k0, first_key + j, kv_head) : a.k_layout.at(b, s.k0, first_key + j, kv_head);
    }
    (is_v ? v_off : k_off)[slot * BN + key] = off;
    const uint32_t bits = __ballot_sync(0xffffffffu, off >= 0);
    if (lane == 0) {
      key_bits[(is_v * kSlots + slot) * C::kKeyWords + key / 32] = bits;
    }
  };
  auto load_tile = [&](int t) {
    const int buf = t % 2, slot = t % kSlots;
    copy_rows<T, BN, C::kDqk, kPitch, C::kThreads>(sk + buf * kKBuf, a.k, k_off + slot * BN);
    if (!p.v_in_k) {
      copy_rows<T, BN, C::kDv, C::kVPitch, C::kThreads>(sv + buf * v_buf, a.v, v_off + slot * BN);
    }
  };

  // ldmatrix row addresses of this lane (ldmatrix_x4), at k / key / column step 0 of buffer 0:
  //   Q, A of S = Q K^T: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
  //     (rows 8-15, k 8-15) = a[0..3].
  //   K, B of S (stored keys x k): matrices (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7),
  //     (keys 8-15, k 8-15) = b0, b1 of key n-tile 0, then b0, b1 of key n-tile 1.
  //   V, B of O = P V (stored keys x columns, read transposed): matrices (keys 0-7, cols 0-7),
  //     (keys 8-15, cols 0-7), (keys 0-7, cols 8-15), (keys 8-15, cols 8-15) = b0, b1 of column n-tile 0,
  //     then b0, b1 of column n-tile 1.
  const uint32_t q_addr = sq + ((warp_row0 + lane % 16) * kPitch + lane / 16 * 8) * kElemBytes;  // slice 0
  const uint32_t k_addr = sk + ((lane % 8 + lane / 16 * 8) * kPitch + lane / 8 % 2 * 8) * kElemBytes;
  const uint32_t v_addr = sv + ((lane % 8 + lane / 8 % 2 * 8) * v_pitch + wd * C::kDvWarp + lane / 16 * 8) * kElemBytes;

  // Logits in log2 units: dot * scale * log2e, or cap * log2e * tanh(dot * scale / cap).
  const float cap = a.logit.softcap;
  const float dot_mul = cap > 0.f ? a.logit.scale / cap : a.logit.scale * kLog2e;
  const float cap_log2 = cap * kLog2e;

  // O of slice sl: n-tile n holds its rows g, g + 8 x columns wd * kDvWarp + 8 n + c + {0, 1}.
  float o[kSl][C::kDvWarp / 8][4] = {};
  float m[kRows], l[kRows];  // running max (log2 units) and sum over this thread's columns of each row
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = neg_inf<float>();
    l[r] = 0.f;  // summed over the quad at the end
  }

  auto compute_tile = [&](int t) {
    const int j0 = t * BN;
    if (j0 + BN - 1 < lo_min || j0 > hi_max) {
      return;  // no row of this warp sees a key of the tile (or the warp has no row)
    }
    const int buf = t % 2;
    // S of slice sl: n-tile n holds its rows g, g + 8 x keys j0 + 8 n + c + {0, 1}.
    float sc[kSl][BN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < C::kDqk / 16; ++kk) {
      uint32_t qa[kSl][4];
#pragma unroll
      for (int sl = 0; sl < kSl; ++sl) {
        ldmatrix_x4<false>(qa[sl], q_addr + (sl * 16 * kPitch + kk * 16) * kElemBytes);
      }
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4<false>(kb, k_addr + buf * kKBuf + (np * 16 * kPitch + kk * 16) * kElemBytes);
#pragma unroll
        for (int sl = 0; sl < kSl; ++sl) {
          mma_16816<T>(sc[sl][2 * np], qa[sl], kb[0], kb[1]);
          mma_16816<T>(sc[sl][2 * np + 1], qa[sl], kb[2], kb[3]);
        }
      }
    }
    if (cap > 0.f) {  // one branch per tile, not per element: tanhf is not evaluated without a cap
#pragma unroll
      for (int sl = 0; sl < kSl; ++sl) {
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            sc[sl][n][e] = cap_log2 * tanhf(dot_mul * sc[sl][n][e]);
          }
        }
      }
    } else {
#pragma unroll
      for (int sl = 0; sl < kSl; ++sl) {
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            sc[sl][n][e] *= dot_mul;
          }
        }
      }
    }
    if (a.alibi.slopes != nullptr) {  // -slope * |p - j| in log2 units, slopes read per tile (no registers held)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = r0 + warp_row0 + 16 * (r / 2) + g + 8 * (r % 2);
        const float m_log2 = a.alibi.slope(b, kv_head * a.group + row % a.group) * kLog2e;
        // the row's key position, relative to first_key as the tile's columns
        const float p_rel = static_cast<float>(row / a.group + s.len_k - s.len_q - first_key);
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            sc[r / 2][n][2 * (r % 2) + e] -= m_log2 * fabsf(p_rel - static_cast<float>(j0 + 8 * n + c + e));
          }
        }
      }
    }
    // Per-element mask unless every key of the tile has K and V rows and is inside every row's window.
    // Bit k of `readable` / `keep`: tile column k (masks, not per-element compares, keep the register
    // count down: the compiler would compute every compare ahead of the MMAs).
    uint64_t readable = 0;
#pragma unroll
    for (int w = 0; w < C::kKeyWords; ++w) {
      const int word = t % kSlots * C::kKeyWords + w;
      const uint32_t bits = key_bits[word] & (p.v_in_k ? ~0u : key_bits[kSlots * C::kKeyWords + word]);
      readable |= uint64_t(bits) << (32 * w);
    }
    if (readable != ~0ull >> (64 - BN) || j0 < lo_max || j0 + BN - 1 > hi_min) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int first = max(lo[r] - j0, 0), last = min(hi[r] - j0, BN - 1);  // visible columns of row r
        const uint64_t window = first <= last ? (~0ull >> (63 - last)) & (~0ull << first) : 0;
        const uint64_t keep = (readable & window) >> c;  // bit 8 n + e: column 8 n + c + e of this thread
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (!(keep >> (8 * n + e) & 1)) {
              sc[r / 2][n][2 * (r % 2) + e] = neg_inf<float>();
            }
          }
        }
      }
    }
    // Online softmax: the quad of lanes 4g .. 4g + 3 holds rows g and g + 8 of each slice; row r is slice
    // r / 2, elements 2 h, 2 h + 1 (h = r % 2) of its n-tiles.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int sl = r / 2, h = r % 2;
      float top = m[r];
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        top = nan_max(top, nan_max(sc[sl][n][2 * h], sc[sl][n][2 * h + 1]));
      }
      top = nan_max(top, __shfl_xor_sync(0xffffffffu, top, 1));
      top = nan_max(top, __shfl_xor_sync(0xffffffffu, top, 2));
      const float ref = top == neg_inf<float>() ? 0.f : top;  // no key seen yet: exp2(-inf - 0) = 0, no NaN
      const float correction = exp2f(m[r] - ref);
      m[r] = top;
      l[r] *= correction;
#pragma unroll
      for (int n = 0; n < C::kDvWarp / 8; ++n) {
        o[sl][n][2 * h] *= correction;
        o[sl][n][2 * h + 1] *= correction;
      }
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        sc[sl][n][2 * h] = exp2f(sc[sl][n][2 * h] - ref);
        sc[sl][n][2 * h + 1] = exp2f(sc[sl][n][2 * h + 1] - ref);
        l[r] += sc[sl][n][2 * h] + sc[sl][n][2 * h + 1];
      }
    }
    // O += P V: the accumulators of key n-tiles 2 kk, 2 kk + 1 are the A fragment of key step kk.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[kSl][4];
#pragma unroll
      for (int sl = 0; sl < kSl; ++sl) {
        pa[sl][0] = pack2<T>(sc[sl][2 * kk][0], sc[sl][2 * kk][1]);
        pa[sl][1] = pack2<T>(sc[sl][2 * kk][2], sc[sl][2 * kk][3]);
        pa[sl][2] = pack2<T>(sc[sl][2 * kk + 1][0], sc[sl][2 * kk + 1][1]);
        pa[sl][3] = pack2<T>(sc[sl][2 * kk + 1][2], sc[sl][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < C::kDvWarp / 16; ++np) {
        uint32_t vb[4];
        ldmatrix_x4<true>(vb, v_addr + buf * v_buf + (kk * 16 * v_pitch + np * 16) * kElemBytes);
#pragma unroll
        for (int sl = 0; sl < kSl; ++sl) {
          mma_16816<T>(o[sl][2 * np], pa[sl], vb[0], vb[1]);
          mma_16816<T>(o[sl][2 * np + 1], pa[sl], vb[2], vb[3]);
        }
      }
    }
  };

  if (n_tiles > 0) {
    for (int q_row = tid; q_row < C::kBlockM; q_row += C::kThreads) {
      const int64_t row = r0 + q_row, i = row / a.group;
      q_off[q_row] = i < len_q ? a.q_layout.at(b, s.q0, i, kv_head * a.group + row % a.group) : -1;
    }
    write_key_offsets(0);
    if (n_tiles > 1) {
      write_key_offsets(1);
    }
    __syncthreads();  // publishes q_off and the key offsets of tiles 0 and 1
    copy_rows<T, C::kBlockM, C::kDqk, kPitch, C::kThreads>(sq, a.q, q_off);
    load_tile(0);
    cp_async_commit();
    for (int t = 0; t < n_tiles; ++t) {
      // Offsets of tile t + 1 are published; every warp is done with tile t - 1, whose buffer t + 1 reuses.
      __syncthreads();
      if (t + 1 < n_tiles) {
        load_tile(t + 1);
      }
      cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning "up to tile t"
      cp_async_wait_all_but_newest();
      __syncthreads();  // tile t (and Q) visible to every warp
      compute_tile(t);
      // Slot (t + 2) % kSlots last held tile t - 1, finished by every warp before this iteration's first
      // barrier; it is read for tile t + 2 only after the next iteration's first barrier.
      if (t + 2 < n_tiles) {
        write_key_offsets(t + 2);
      }
    }
  }

  // Row sums over the quad, then store as store_row does: out = O / l, lse = m + log l; 0 and -inf for a
  // row that saw no key; with splits, normalised fp32 partials for merge_splits_kernel.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const bool writes_lse = wd == 0 && lane % 4 == 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!valid[r]) {
      continue;
    }
    const int sl = r / 2, h = r % 2;
    const int64_t row = r0 + warp_row0 + 16 * sl + g + 8 * h, pos = row / a.group;
    const int64_t head = kv_head * a.group + row % a.group;
    // l == 0: no visible key (zeros, -inf); a NaN l (NaN in a score) stays NaN in both.
    const float inv = l[r] != 0.f ? 1.f / l[r] : 0.f;
    const float lse = l[r] != 0.f ? (m[r] + log2f(l[r])) * kLn2 : neg_inf<float>();
    const int col0 = wd * C::kDvWarp + c;
    if (a.splits == 1) {
      T* out = a.out + a.out_layout.at(b, s.q0, pos, head) + col0;
#pragma unroll
      for (int n = 0; n < C::kDvWarp / 8; ++n) {
        *reinterpret_cast<uint32_t*>(out + 8 * n) = pack2<T>(o[sl][n][2 * h] * inv, o[sl][n][2 * h + 1] * inv);
      }
      if (writes_lse) {
        a.lse[a.lse_layout.at(b, s.q0, pos, head)] = lse;
      }
    } else {
      const int64_t idx = partial_index(a, split, b, pos, head);
      float* out = a.partial_out + idx * a.dim_v + col0;
#pragma unroll
      for (int n = 0; n < C::kDvWarp / 8; ++n) {
        *reinterpret_cast<float2*>(out + 8 * n) = make_float2(o[sl][n][2 * h] * inv, o[sl][n][2 * h + 1] * inv);
      }
      if (writes_lse) {
        a.partial_lse[idx] = lse;
      }
    }
  }
}

// grid (row_tiles * batch * heads_kv, splits), block C::kThreads, dynamic smem C::smem_bytes(v_in_k).
template <typename T, typename C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    forward_mma_kernel(const ForwardArgs<T> a, const Launch p) {
  // cp.async, ldmatrix and bf16 mma need sm_80; mma_forward_supported() sends older GPUs to the row kernel.
  NV_IF_TARGET(NV_PROVIDES_SM_80, (forward_mma_block<T, C>(a, p);))
}

}  // namespace

// Whether V can be read from the K tile: v and k are one tensor read through the same key layout. The head
// stride counts only with more than one KV head (MLA's values, a narrowed view of the latent cache, have a
// head stride of 512 to the keys' 576, but there is only head 0).
bool values_inside_keys(const void* k, const KeyLayout& k_layout, const void* v, const KeyLayout& v_layout,
                        int64_t heads_kv) {
  const TokenLayout &x = k_layout.rows, &y = v_layout.rows;
  return k == v && x.batch_stride == y.batch_stride && x.token_stride == y.token_stride &&
         (heads_kv == 1 || x.head_stride == y.head_stride) && k_layout.block_table == v_layout.block_table &&
         k_layout.table_stride == v_layout.table_stride && k_layout.block_stride == v_layout.block_stride &&
         k_layout.block_size == v_layout.block_size && k_layout.num_blocks == v_layout.num_blocks &&
         k_layout.table_width == v_layout.table_width && k_layout.cache_row == v_layout.cache_row &&
         k_layout.num_rows == v_layout.num_rows;
}

namespace {

template <typename T, typename C>
void launch_tile(const ForwardArgs<T>& a) {
  const int64_t heads_kv = a.heads_q / a.group;
  const Launch p{ceil_div(a.max_len_q * a.group, C::kBlockM), heads_kv,
                 values_inside_keys(a.k, a.k_layout, a.v, a.v_layout, heads_kv)};
  const int64_t blocks = p.row_tiles * a.batch * p.heads_kv;
  if (blocks == 0) {
    return;
  }
  TORCH_CHECK(blocks <= INT32_MAX && a.splits <= 65535, "attn_ops: attention too large for one launch (", blocks,
              " row blocks, ", a.splits, " splits)");
  const int smem = C::smem_bytes(p.v_in_k);
  allow_dynamic_smem<forward_mma_kernel<T, C>>(smem);
  record_launch("forward_mma", {C::kDqk, C::kDv, p.v_in_k, smem, a.splits, a.split_min_keys, 16 * C::kSlices});
  forward_mma_kernel<T, C><<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.splits)), C::kThreads,
                             smem, at::cuda::getCurrentCUDAStream()>>>(a, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ATTN_OPS_CUDA_FWD_SLICES=2 asks for the experimental two-slice tiles (TwoSliceTiles) where the head dims have
// one, for launches of at least one 128-row block per (batch, KV head): decode keeps the 64-row tiles, most of
// whose rows it leaves empty already. Read at every launch, so that a test can switch it.
template <typename T>
bool two_slice_tiles_requested(const ForwardArgs<T>& a) {
  const char* value = std::getenv("ATTN_OPS_CUDA_FWD_SLICES");
  return value != nullptr && std::strcmp(value, "2") == 0 && a.max_len_q * a.group >= 128;
}

}  // namespace

// sm_80+ with room for the tile's smem without V from K (sm_86 / sm_89 have 99 KB per block: no 256/256 and
// no 576/512 there; an A100, 163 KB: no 576/512).
bool mma_forward_supported(c10::ScalarType dtype, int64_t dim_qk, int64_t dim_v) {
  int64_t smem = -1;
  return (dtype == c10::kHalf || dtype == c10::kBFloat16) &&
         with_tile<Tiles>(dim_qk, dim_v, [&](auto tile) { smem = decltype(tile)::smem_bytes(false); }) &&
         mma_smem_fits(smem);
}

// Q, K and V rows are copied in 16-byte chunks; out is stored in pairs of T, partial_out in pairs of float.
template <typename T>
bool mma_forward_aligned(const ForwardArgs<T>& a) {
  constexpr int64_t kChunk = 16 / sizeof(T);
  return pointer_aligned(a.q, 16) && pointer_aligned(a.k, 16) && pointer_aligned(a.v, 16) &&
         strides_divisible(a.q_layout, kChunk) && strides_divisible(a.k_layout.rows, kChunk) &&
         strides_divisible(a.v_layout.rows, kChunk) && a.k_layout.block_stride % kChunk == 0 &&
         a.v_layout.block_stride % kChunk == 0 && pointer_aligned(a.out, 2 * sizeof(T)) &&
         strides_divisible(a.out_layout, 2) && (a.splits == 1 || pointer_aligned(a.partial_out, 2 * sizeof(float)));
}

template <typename T>
void launch_forward_mma(const ForwardArgs<T>& a) {
  if (two_slice_tiles_requested(a)) {
    bool launched = false;
    with_tile<TwoSliceTiles>(a.dim_qk, a.dim_v, [&](auto tile) {
      using C = decltype(tile);
      if (mma_smem_fits(C::smem_bytes(false))) {
        launch_tile<T, C>(a);
        launched = true;
      }
    });
    if (launched) {
      return;
    }
  }
  const bool found = with_tile<Tiles>(a.dim_qk, a.dim_v, [&](auto tile) { launch_tile<T, decltype(tile)>(a); });
  TORCH_INTERNAL_ASSERT(found, "launch_forward_mma: no tile for head dims ", a.dim_qk, "/", a.dim_v);
}

template bool mma_forward_aligned<c10::Half>(const ForwardArgs<c10::Half>& a);
template bool mma_forward_aligned<c10::BFloat16>(const ForwardArgs<c10::BFloat16>& a);
template void launch_forward_mma<c10::Half>(const ForwardArgs<c10::Half>& a);
template void launch_forward_mma<c10::BFloat16>(const ForwardArgs<c10::BFloat16>& a);

}  // namespace attn_ops::cuda
