// K and V of a whole problem arranged for panel_gemm (gemm_kernels.h), for the float32 forward (FloatPanel)
// and, on AVX512-BF16, the bfloat16 one (Bf16PairPanel) (forward_tiles.h). With S = Panel::kStep values
// per step (1, or 2 for bfloat16 pairs), tile t of (sequence b, KV head g) (KvTiles, packed_kv.h) holds
//   K^T in panels of kPanelWidth keys: [tile / kPanelWidth][Dqk / S][kPanelWidth][S], zero keys past the
//       last, and
//   V in panels of kPanelWidth dims:  [Dv / kPanelWidth][tile / S][kPanelWidth][S] (bfloat16: a zero key
//       after an odd last one; rows past it unused).
// Each tile is packed once per call (one read of K and V, the same size again), by the first work item that
// needs it (KvTiles::prepare), and shared by every query tile and every query head of the group; contiguous
// panels also keep P V clear of the 4 KiB-strided rows of V in a [T, Hkv, D] tensor, which alias in L1.
// Needs Dv a multiple of kPanelWidth, and Dqk a multiple of S.
#pragma once

#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/gemm_kernels.h"
#include "attention/cpu/packed_kv.h"

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>

namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS {

template <typename Panel>
class PanelKV : public KvTileStore<typename Panel::b_t, PanelKV<Panel>> {
  using scalar_t = typename Panel::b_t;
  using Store = KvTileStore<scalar_t, PanelKV<Panel>>;
  friend Store;
  static constexpr int64_t S = Panel::kStep, W = kPanelWidth;

 public:
  using Store::Store;

  // K^T panel c of a tile at k_tile + c * k_panel_stride(), V panel c at v_tile + c * v_panel_stride(), both
  // rows W * S apart. V rows past a tile's last key (pair) stay unwritten: P V never reads them.
  int64_t k_panel_stride() const { return this->dqk_ * W; }
  int64_t v_panel_stride() const { return this->tiles_.tile() * W; }

 private:
  void pack(int64_t index, int64_t b, int64_t g, int64_t k0, int64_t n) {
    const int64_t tile = this->tiles_.tile(), dqk = this->dqk_, dv = this->dv_;
    const KeyLayout &k_layout = this->k_layout_, &v_layout = this->v_layout_;
    scalar_t* k_out = this->k_.data() + index * tile * dqk;
    for (int64_t j = 0; j < n; j += W) {  // panel j / W, column jj is key k0 + j + jj
      const int64_t keys = std::min(W, n - j);
      scalar_t* panel = k_out + j * dqk;
      if constexpr (S == 1) {
        transpose_keys(this->k_in_, k_layout, b, g, k0 + j, keys, dqk, panel, W);
      } else {
        for (int64_t jj = 0; jj < keys; ++jj) {
          const scalar_t* key = this->k_in_ + k_layout.at(b, k0 + j + jj, g);
          for (int64_t d = 0; d < dqk; ++d) {
            panel[(d / S * W + jj) * S + d % S] = key[d];
          }
        }
      }
      for (int64_t step = 0; step < dqk / S; ++step) {  // zero keys in the last panel
        std::fill(panel + (step * W + keys) * S, panel + (step + 1) * W * S, scalar_t(0));
      }
    }
    scalar_t* v_out = this->v_.data() + index * tile * dv;
    if constexpr (S == 1) {
      for (int64_t j = 0; j < n; ++j) {
        const scalar_t* row = this->v_in_ + v_layout.at(b, k0 + j, g);
        for (int64_t c = 0; c < dv; c += W) {
          std::copy_n(row + c, W, v_out + c * tile + j * W);
        }
      }
    } else {
      Panel::pack_row_pairs([&](int64_t j) { return this->v_in_ + v_layout.at(b, k0 + j, g); }, n, dv, v_out,
                            tile * W, 2 * W);
    }
  }
};

}  // namespace attn_ops::cpu::ATTN_OPS_PREFILL_NS
