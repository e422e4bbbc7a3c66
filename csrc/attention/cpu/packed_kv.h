// K and V of a whole problem in brgemm's packed layout, for the low-precision forward on AMX
// (forward_tiles.h): tile t of (sequence b, KV head g) holds keys [t * tile, ...) as
//   K^T [Dqk, width] in column blocks of kPackBlock keys, each packed as [Dqk, kPackBlock], and
//   V [width, Dv] in column blocks of kPackBlock dims, each packed as [width, kPackBlock],
// width = the tile's key count rounded up to kPackBlock (zero keys pad it): brgemm's packed operands are
// kPackBlock columns wide. Packed once per call (one read of K and V) instead of once per query block;
// the same size as K and V. Needs Dqk even and Dv a multiple of kPackBlock.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/blas.h"
#include "attention/cpu/huge_buffer.h"
#include "attention/cpu/row_ops.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {

// AMX exists only on CPUs with AVX-512: the other copies never take the brgemm paths
// (the forward's, forward_tiles.h, and the backward's, backward_brgemm.h).
#if defined(CPU_CAPABILITY_AVX512)
constexpr bool kBrgemmCopy = true;
#else
constexpr bool kBrgemmCopy = false;
#endif

constexpr int64_t kPackBlock = 64;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The key tiles of a whole problem, numbered sequence by sequence, then tile by tile, then KV head by KV
// head: tile t of (sequence b, KV head g) holds keys [t * tile, min((t + 1) * tile, len_k[b])). The index of
// the packed copies of K and V (PackedKV here, PanelKV in panel_kv.h).
class KvTiles {
 public:
  KvTiles(const AttentionProblem& p, int64_t tile)
      : tile_(tile), heads_kv_(p.heads_kv), len_k_(p.len_k), first_(p.batch + 1, 0) {
    for (int64_t b = 0; b < p.batch; ++b) {
      first_[b + 1] = first_[b] + p.heads_kv * ((p.len_k[b] + tile - 1) / tile);
    }
  }
  int64_t tile() const { return tile_; }
  int64_t total() const { return first_.back(); }
  // The tile of sequence b, KV head g that starts at key k0 (a multiple of the tile size).
  int64_t index(int64_t b, int64_t g, int64_t k0) const { return first_[b] + (k0 / tile_) * heads_kv_ + g; }
  // fn(index, b, g, k0, n) for every tile (n keys from k0), the tiles spread over the threads.
  template <typename Fn>
  void parallel_for_each(const Fn& fn) const {
    std::vector<int64_t> tile_batch(total());
    for (int64_t b = 0; b + 1 < static_cast<int64_t>(first_.size()); ++b) {
      std::fill(tile_batch.begin() + first_[b], tile_batch.begin() + first_[b + 1], b);
    }
    at::parallel_for(0, total(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t index = begin; index < end; ++index) {
        const int64_t b = tile_batch[index], local = index - first_[b];
        const int64_t g = local % heads_kv_, k0 = (local / heads_kv_) * tile_;
        fn(index, b, g, k0, std::min(tile_, len_k_[b] - k0));
      }
    });
  }

 private:
  int64_t tile_, heads_kv_;
  std::vector<int64_t> len_k_;
  std::vector<int64_t> first_;  // [batch + 1]: index of sequence b's first tile
};

template <typename scalar_t>
class PackedKV {
 public:
  PackedKV(const AttentionProblem& p, int64_t tile, const scalar_t* k, const KeyLayout& k_layout, const scalar_t* v,
           const KeyLayout& v_layout)
      : tiles_(p, tile),
        dqk_(p.dim_qk),
        dv_(p.dim_v),
        k_(tiles_.total() * dqk_ * tile),
        v_(tiles_.total() * tile * dv_) {
    tiles_.parallel_for_each([&](int64_t index, int64_t b, int64_t g, int64_t k0, int64_t n) {
      std::vector<scalar_t> rows(std::max(dqk_, dv_) * tile);  // one tile, unpacked
      const int64_t width = round_up(n, kPackBlock);
      // K^T [Dqk, width]: column j is key k0 + j, zero past n (rows starts zeroed).
      if (k_layout.uniform(k0, n)) {  // equally spaced keys: 32 x 32 blocks (at::vec's AVX-512 transpose)
        const scalar_t* first = k + k_layout.at(b, k0, g);
        for (int64_t j = 0; j < n; j += 32) {
          for (int64_t d = 0; d < dqk_; d += 32) {
            at::vec::transpose_mxn<scalar_t>(first + j * k_layout.rows.seq_stride + d, k_layout.rows.seq_stride,
                                             rows.data() + d * width + j, width, std::min<int64_t>(32, n - j),
                                             std::min<int64_t>(32, dqk_ - d));
          }
        }
      } else {  // the tile crosses blocks of a paged cache
        for (int64_t j = 0; j < n; ++j) {
          const scalar_t* key = k + k_layout.at(b, k0 + j, g);
          for (int64_t d = 0; d < dqk_; ++d) {
            rows[d * width + j] = key[d];
          }
        }
      }
      scalar_t* k_out = k_.data() + index * dqk_ * tile;
      for (int64_t c = 0; c < width; c += kPackBlock) {
        lowp_brgemm_pack(dqk_, kPackBlock, width, rows.data() + c, k_out + c * dqk_);
      }
      // V [width, Dv]: row j is key k0 + j, zero past n (rows starts zeroed).
      for (int64_t j = 0; j < n; ++j) {
        std::copy_n(v + v_layout.at(b, k0 + j, g), dv_, rows.data() + j * dv_);
      }
      scalar_t* v_out = v_.data() + index * tile * dv_;
      for (int64_t c = 0; c < dv_; c += kPackBlock) {
        lowp_brgemm_pack(width, kPackBlock, dv_, rows.data() + c, v_out + c * tile);
      }
    });
  }

  // The packed tile of sequence b, KV head g that starts at key k0 (a multiple of the tile size): key
  // block c (keys c * kPackBlock ...) of K^T at k_tile + c * kPackBlock * Dqk, dim block c of V (its first
  // `keys` rows, keys even) at v_tile + c * kPackBlock * tile.
  const scalar_t* k_tile(int64_t b, int64_t g, int64_t k0) const {
    return k_.data() + tiles_.index(b, g, k0) * dqk_ * tiles_.tile();
  }
  const scalar_t* v_tile(int64_t b, int64_t g, int64_t k0) const {
    return v_.data() + tiles_.index(b, g, k0) * tiles_.tile() * dv_;
  }

 private:
  KvTiles tiles_;
  int64_t dqk_, dv_;
  HugeBuffer<scalar_t> k_, v_;  // every value of a tile that k_tile / v_tile's readers use is written
};

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
