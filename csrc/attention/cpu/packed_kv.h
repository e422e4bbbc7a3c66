// K and V of a whole problem in brgemm's packed layout, for the low-precision forward on AMX
// (forward_tiles.h): tile t of (sequence b, KV head g) holds keys [t * tile, ...) as
//   K^T [Dqk, width] in column blocks of kPackBlock keys, each packed as [Dqk, kPackBlock], and
//   V [width, Dv] in column blocks of kPackBlock dims, each packed as [width, kPackBlock],
// width = the tile's key count rounded up to kPackBlock (zero keys pad it): brgemm's packed operands are
// kPackBlock columns wide. Each tile is packed once per call (one read of K and V), by the first work item
// that needs it (KvTiles::prepare), instead of once per query block;
// the same size as K and V. Needs Dqk even and Dv a multiple of kPackBlock.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "common/cpu/blas.h"
#include "attention/cpu/huge_buffer.h"
#include "attention/cpu/row_ops.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
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
// the packed copies of K and V (PackedKV here, PanelKV in panel_kv.h), and who packs which tile: the
// forward's work items pack the tiles they need themselves, inside its one parallel region (prepare), since
// a parallel region of its own for the packing costs a fork and a join per call (milliseconds when a loaded
// machine deschedules one thread) and leaves threads idle while the last tiles are packed.
class KvTiles {
 public:
  KvTiles(const AttentionProblem& p, int64_t tile)
      : tile_(tile), heads_kv_(p.heads_kv), len_k_(p.len_k), first_(p.batch + 1, 0) {
    for (int64_t b = 0; b < p.batch; ++b) {
      first_[b + 1] = first_[b] + p.heads_kv * ((p.len_k[b] + tile - 1) / tile);
    }
    state_.reset(new std::atomic<int>[total()]);
    for (int64_t i = 0; i < total(); ++i) {
      state_[i].store(kUnpacked, std::memory_order_relaxed);
    }
  }
  int64_t tile() const { return tile_; }
  int64_t total() const { return first_.back(); }
  // The tile of sequence b, KV head g that starts at key k0 (a multiple of the tile size).
  int64_t index(int64_t b, int64_t g, int64_t k0) const { return first_[b] + (k0 / tile_) * heads_kv_ + g; }
  // Makes the tiles of (b, g) that hold keys [k_begin, k_end) ready (k_begin a multiple of the tile size):
  // packs, by pack(index, k0, n), each one that no thread has claimed yet, then waits for those that other
  // threads are packing; threads that need the same tiles at once share the packing.
  template <typename Pack>
  void prepare(int64_t b, int64_t g, int64_t k_begin, int64_t k_end, const Pack& pack) const {
    for (int64_t k0 = k_begin; k0 < k_end; k0 += tile_) {
      const int64_t i = index(b, g, k0);
      int expected = kUnpacked;
      if (state_[i].load(std::memory_order_acquire) == kUnpacked &&
          state_[i].compare_exchange_strong(expected, kPacking, std::memory_order_acq_rel)) {
        pack(i, k0, std::min(tile_, len_k_[b] - k0));
        state_[i].store(kReady, std::memory_order_release);
      }
    }
    for (int64_t k0 = k_begin; k0 < k_end; k0 += tile_) {
      while (state_[index(b, g, k0)].load(std::memory_order_acquire) != kReady) {
        std::this_thread::yield();
      }
    }
  }

 private:
  static constexpr int kUnpacked = 0, kPacking = 1, kReady = 2;
  int64_t tile_, heads_kv_;
  std::vector<int64_t> len_k_;
  std::vector<int64_t> first_;                 // [batch + 1]: index of sequence b's first tile
  std::unique_ptr<std::atomic<int>[]> state_;  // [total()]: kUnpacked, kPacking or kReady
};

// K^T [Dqk, n] of keys k0 .. k0 + n - 1 of (sequence b, KV head g), rows `ld` apart: equally spaced keys by
// at::vec's register transposes (16 x 16 floats, 32 x 32 16-bit values), keys crossing the blocks of a paged
// cache one by one.
template <typename scalar_t>
void transpose_keys(const scalar_t* k, const KeyLayout& layout, int64_t b, int64_t g, int64_t k0, int64_t n,
                    int64_t dqk, scalar_t* out, int64_t ld) {
  constexpr int64_t block = sizeof(scalar_t) == 4 ? 16 : 32;
  if (layout.uniform(k0, n)) {
    const int64_t stride = layout.rows.seq_stride;
    const scalar_t* first = k + layout.at(b, k0, g);
    for (int64_t j = 0; j < n; j += block) {
      for (int64_t d = 0; d < dqk; d += block) {
        at::vec::transpose_mxn<scalar_t>(first + j * stride + d, stride, out + d * ld + j, ld,
                                         std::min(block, n - j), std::min(block, dqk - d));
      }
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const scalar_t* key = k + layout.at(b, k0 + j, g);
      for (int64_t d = 0; d < dqk; ++d) {
        out[d * ld + j] = key[d];
      }
    }
  }
}

// A packed copy of K and V for a whole problem (PackedKV below, PanelKV in panel_kv.h): the inputs it is
// packed from, one buffer of Dqk x tile values per tile of K and of tile x Dv per tile of V (KvTiles'
// numbering), and who packs which tile. Derived::pack(index, b, g, k0, n) writes tile `index` (keys
// k0 .. k0 + n - 1 of sequence b, KV head g) in its own arrangement.
template <typename scalar_t, typename Derived>
class KvTileStore {
 public:
  KvTileStore(const AttentionProblem& p, int64_t tile, const scalar_t* k, const KeyLayout& k_layout,
              const scalar_t* v, const KeyLayout& v_layout)
      : tiles_(p, tile),
        dqk_(p.dim_qk),
        dv_(p.dim_v),
        k_in_(k),
        v_in_(v),
        k_layout_(k_layout),
        v_layout_(v_layout),
        k_(tiles_.total() * tile * dqk_),
        v_(tiles_.total() * tile * dv_) {}

  // Packs the tiles of (b, g) over keys [k_begin, k_end) that no thread has packed yet (KvTiles::prepare):
  // called by each work item before its products.
  void prepare(int64_t b, int64_t g, int64_t k_begin, int64_t k_end) {
    tiles_.prepare(b, g, k_begin, k_end, [&](int64_t index, int64_t k0, int64_t n) {
      static_cast<Derived*>(this)->pack(index, b, g, k0, n);
    });
  }

  // The packed tile of sequence b, KV head g that starts at key k0 (a multiple of the tile size).
  const scalar_t* k_tile(int64_t b, int64_t g, int64_t k0) const {
    return k_.data() + tiles_.index(b, g, k0) * tiles_.tile() * dqk_;
  }
  const scalar_t* v_tile(int64_t b, int64_t g, int64_t k0) const {
    return v_.data() + tiles_.index(b, g, k0) * tiles_.tile() * dv_;
  }

 protected:
  KvTiles tiles_;
  int64_t dqk_, dv_;
  const scalar_t *k_in_, *v_in_;  // the inputs
  KeyLayout k_layout_, v_layout_;
  HugeBuffer<scalar_t> k_, v_;  // the derived class says which values of a tile it writes
};

// brgemm's arrangement (see the top of this file): key block c (keys c * kPackBlock ...) of K^T at
// k_tile + c * kPackBlock * Dqk, dim block c of V (its first `keys` rows, keys even) at
// v_tile + c * kPackBlock * tile. Every value of a tile that k_tile / v_tile's readers use is written.
template <typename scalar_t>
class PackedKV : public KvTileStore<scalar_t, PackedKV<scalar_t>> {
  using Store = KvTileStore<scalar_t, PackedKV<scalar_t>>;
  friend Store;

 public:
  using Store::Store;

 private:
  void pack(int64_t index, int64_t b, int64_t g, int64_t k0, int64_t n) {
    const int64_t tile = this->tiles_.tile(), dqk = this->dqk_, dv = this->dv_;
    std::vector<scalar_t> rows(std::max(dqk, dv) * tile);  // one tile, unpacked
    const int64_t width = round_up(n, kPackBlock);
    // K^T [Dqk, width]: column j is key k0 + j, zero past n (rows starts zeroed).
    transpose_keys(this->k_in_, this->k_layout_, b, g, k0, n, dqk, rows.data(), width);
    scalar_t* k_out = this->k_.data() + index * dqk * tile;
    for (int64_t c = 0; c < width; c += kPackBlock) {
      lowp_brgemm_pack(dqk, kPackBlock, width, rows.data() + c, k_out + c * dqk);
    }
    // V [width, Dv]: row j is key k0 + j, zero past n (rows starts zeroed).
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(this->v_in_ + this->v_layout_.at(b, k0 + j, g), dv, rows.data() + j * dv);
    }
    scalar_t* v_out = this->v_.data() + index * tile * dv;
    for (int64_t c = 0; c < dv; c += kPackBlock) {
      lowp_brgemm_pack(width, kPackBlock, dv, rows.data() + c, v_out + c * tile);
    }
  }
};

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
