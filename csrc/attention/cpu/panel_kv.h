// K and V of a whole problem arranged for panel_gemm (gemm_kernels.h), for the float32 forward
// (forward_tiles.h): tile t of (sequence b, KV head g) (KvTiles, packed_kv.h) holds
//   K^T in panels of kPanelWidth keys: [tile / kPanelWidth][Dqk][kPanelWidth], zero keys past the last, and
//   V in panels of kPanelWidth dims:  [Dv / kPanelWidth][tile][kPanelWidth] (rows past the last unused).
// Each tile is packed once per call (one read of K and V, the same size again), by the first work item that
// needs it (KvTiles::prepare), and shared by every query tile and every query head of the group; contiguous panels also keep P V clear of the 4 KiB-strided rows of V in a
// [T, Hkv, D] tensor, which alias in L1. Needs Dv a multiple of kPanelWidth.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/gemm_kernels.h"
#include "attention/cpu/huge_buffer.h"
#include "attention/cpu/packed_kv.h"

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {

class PanelKV {
 public:
  PanelKV(const AttentionProblem& p, int64_t tile, const float* k, const KeyLayout& k_layout, const float* v,
          const KeyLayout& v_layout)
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
    tiles_.prepare(b, g, k_begin, k_end, [&](int64_t index, int64_t k0, int64_t n) { pack(index, b, g, k0, n); });
  }

  // The tile of sequence b, KV head g that starts at key k0 (a multiple of the tile size): K^T panel c at
  // k_tile + c * k_panel_stride(), V panel c at v_tile + c * v_panel_stride(), both rows kPanelWidth apart.
  const float* k_tile(int64_t b, int64_t g, int64_t k0) const {
    return k_.data() + tiles_.index(b, g, k0) * tiles_.tile() * dqk_;
  }
  const float* v_tile(int64_t b, int64_t g, int64_t k0) const {
    return v_.data() + tiles_.index(b, g, k0) * tiles_.tile() * dv_;
  }
  int64_t k_panel_stride() const { return dqk_ * kPanelWidth; }
  int64_t v_panel_stride() const { return tiles_.tile() * kPanelWidth; }

 private:
  // Packs tile `index` (keys k0 .. k0 + n - 1 of sequence b, KV head g).
  void pack(int64_t index, int64_t b, int64_t g, int64_t k0, int64_t n) {
    constexpr int64_t W = kPanelWidth;
    const int64_t tile = tiles_.tile();
    float* k_out = k_.data() + index * tile * dqk_;
    for (int64_t j = 0; j < n; j += W) {  // panel j / W: [Dqk, W], column jj is key k0 + j + jj
      const int64_t keys = std::min(W, n - j);
      float* panel = k_out + j * dqk_;
      if (k_layout_.uniform(k0 + j, keys)) {  // equally spaced keys: 16 x 16 register transposes
        const int64_t stride = k_layout_.rows.seq_stride;
        const float* first = k_in_ + k_layout_.at(b, k0 + j, g);
        for (int64_t jj = 0; jj < keys; jj += 16) {
          for (int64_t d = 0; d < dqk_; d += 16) {
            at::vec::transpose_mxn<float>(first + jj * stride + d, stride, panel + d * W + jj, W,
                                          std::min<int64_t>(16, keys - jj), std::min<int64_t>(16, dqk_ - d));
          }
        }
      } else {  // the panel crosses blocks of a paged cache
        for (int64_t jj = 0; jj < keys; ++jj) {
          const float* key = k_in_ + k_layout_.at(b, k0 + j + jj, g);
          for (int64_t d = 0; d < dqk_; ++d) {
            panel[d * W + jj] = key[d];
          }
        }
      }
      for (int64_t d = 0; d < dqk_; ++d) {  // zero keys in the last panel
        std::fill(panel + d * W + keys, panel + (d + 1) * W, 0.f);
      }
    }
    float* v_out = v_.data() + index * tile * dv_;
    for (int64_t j = 0; j < n; ++j) {
      const float* row = v_in_ + v_layout_.at(b, k0 + j, g);
      for (int64_t c = 0; c < dv_; c += W) {
        std::copy_n(row + c, W, v_out + c * tile + j * W);
      }
    }
  }

  KvTiles tiles_;
  int64_t dqk_, dv_;
  const float *k_in_, *v_in_;  // the inputs
  KeyLayout k_layout_, v_layout_;
  HugeBuffer<float> k_, v_;  // V rows past a tile's last key stay unwritten: P V never reads them
};

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
