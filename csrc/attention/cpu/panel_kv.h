// K and V of a whole problem arranged for panel_gemm (gemm_kernels.h), for the float32 forward
// (forward_tiles.h): tile t of (sequence b, KV head g) (KvTiles, packed_kv.h) holds
//   K^T in panels of kPanelWidth keys: [tile / kPanelWidth][Dqk][kPanelWidth], zero keys past the last, and
//   V in panels of kPanelWidth dims:  [Dv / kPanelWidth][tile][kPanelWidth] (rows past the last unused).
// Each tile is packed once per call (one read of K and V, the same size again), by the first work item that
// needs it (KvTiles::prepare), and shared by every query tile and every query head of the group; contiguous
// panels also keep P V clear of the 4 KiB-strided rows of V in a [T, Hkv, D] tensor, which alias in L1.
// Needs Dv a multiple of kPanelWidth.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/gemm_kernels.h"
#include "attention/cpu/packed_kv.h"

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {

class PanelKV : public KvTileStore<float, PanelKV> {
  friend KvTileStore<float, PanelKV>;

 public:
  using KvTileStore::KvTileStore;

  // K^T panel c of a tile at k_tile + c * k_panel_stride(), V panel c at v_tile + c * v_panel_stride(), both
  // rows kPanelWidth apart. V rows past a tile's last key stay unwritten: P V never reads them.
  int64_t k_panel_stride() const { return dqk_ * kPanelWidth; }
  int64_t v_panel_stride() const { return tiles_.tile() * kPanelWidth; }

 private:
  void pack(int64_t index, int64_t b, int64_t g, int64_t k0, int64_t n) {
    constexpr int64_t W = kPanelWidth;
    const int64_t tile = tiles_.tile();
    float* k_out = k_.data() + index * tile * dqk_;
    for (int64_t j = 0; j < n; j += W) {  // panel j / W: [Dqk, W], column jj is key k0 + j + jj
      const int64_t keys = std::min(W, n - j);
      float* panel = k_out + j * dqk_;
      transpose_keys(k_in_, k_layout_, b, g, k0 + j, keys, dqk_, panel, W);
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
};

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
