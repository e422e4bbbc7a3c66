// A pass of the lightning recurrence over a whole batch on the CPU: every (sequence, query head, value-column
// chunk) stream, in parallel. The forward op, the three backward passes and the decode op each describe their
// operands as one PassSpec and call run_pass.
#pragma once

#include "common/cpu/parallel.h"
#include "lightning/cpu/stream.h"

#include <ATen/ATen.h>

#include <limits>

namespace attn_ops::cpu {

// Token rows of a [B, T, heads, width] tensor (or [total, heads, width] packed: batch_stride 0).
template <typename T>
struct TokenView {
  T* base = nullptr;
  int64_t batch_stride = 0, token_stride = 0, head_stride = 0;
  bool per_kv_head = false;  // indexed by the KV head h / group instead of the query head h

  T* row0(int64_t b, int64_t start, int64_t head) const {
    return base + b * batch_stride + start * token_stride + head * head_stride;
  }
};

template <typename T>
TokenView<T> token_view(T* base, const at::Tensor& t, bool packed, bool per_kv_head) {
  if (packed) {
    return {base, 0, t.stride(0), t.stride(1), per_kv_head};
  }
  return {base, t.stride(0), t.stride(1), t.stride(2), per_kv_head};
}

// A state tensor [slots, H, rows, cols] read or written through any strides (a transposed view included).
template <typename acc_t>
struct StateView {
  acc_t* base = nullptr;  // nullptr: no state (zeros in, nothing out)
  int64_t slot_stride = 0, head_stride = 0, row_stride = 0, col_stride = 0;
};

template <typename acc_t>
StateView<acc_t> state_view(const at::Tensor& t, bool transposed) {
  if (!t.defined()) {
    return {};
  }
  acc_t* base = const_cast<acc_t*>(t.const_data_ptr<acc_t>());
  return transposed ? StateView<acc_t>{base, t.stride(0), t.stride(1), t.stride(3), t.stride(2)}
                    : StateView<acc_t>{base, t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

template <typename in_t, typename out_t, typename acc_t>
struct PassSpec {
  TokenView<const in_t> qq, kk, vv;
  TokenView<out_t> out;
  int64_t heads = 0, group = 1;   // query heads, query heads per KV head
  int64_t dk = 0, dv = 0;         // widths of qq/kk and of vv/out (= the state's rows and columns)
  std::vector<int64_t> start, length;  // per sequence: first token and token count
  const int32_t* slots = nullptr;  // per sequence: its state slot, -1 = skip (nullptr: slot b)
  StateView<acc_t> init, final_;   // may be the same tensor (the decode's pool)
  const float* slope = nullptr;    // [heads]
  StreamParams<acc_t> params;      // length and slope are filled per stream
};

// Value columns per stream: split the columns when there are fewer streams than twice the threads.
inline int64_t column_chunk(int64_t streams, int64_t dv) {
  int64_t chunk = dv;
  const int64_t want = 2 * at::get_num_threads();
  while (streams * ((dv + chunk - 1) / chunk) < want && chunk >= 32) {
    chunk = (chunk / 2 + 7) / 8 * 8;
  }
  return std::max<int64_t>(chunk, 1);
}

template <typename in_t, typename out_t, typename acc_t>
void run_pass(const PassSpec<in_t, out_t, acc_t>& ps) {
  const int64_t batch = static_cast<int64_t>(ps.length.size());
  const int64_t chunk = column_chunk(batch * ps.heads, ps.dv);
  const int64_t chunks = ps.dv == 0 ? 0 : (ps.dv + chunk - 1) / chunk;
  struct Scratch {
    StreamScratch<acc_t> stream;
    std::vector<acc_t> state;
  };
  auto body = [&](int64_t item, Scratch& sc) {
    const int64_t b = item / (ps.heads * chunks), h = (item / chunks) % ps.heads, col0 = (item % chunks) * chunk;
    const int64_t nv = std::min(chunk, ps.dv - col0), g = h / ps.group, T = ps.length[b], s0 = ps.start[b];
    auto head_of = [&](const auto& view) { return view.per_kv_head ? g : h; };
    out_t* out = ps.out.row0(b, s0, head_of(ps.out)) + col0;
    const int64_t slot = ps.slots ? ps.slots[b] : b;
    if (slot < 0) {  // a skipped row outputs zeros and touches no state
      for (int64_t t = 0; t < T; ++t) {
        std::fill(out + t * ps.out.token_stride, out + t * ps.out.token_stride + nv, out_t(0));
      }
      return;
    }
    // A state updated in place with unit column stride (the decode's pool) is run where it lies: each
    // step then streams it through memory once. Otherwise the stream runs on a copy.
    // Its row stride is then the BLAS leading dimension, which must cover a row (a size-1 row dim may carry
    // any stride: such a state runs on the copy).
    const bool in_place = ps.init.base && ps.init.base == ps.final_.base && ps.init.col_stride == 1 &&
                          ps.init.row_stride == ps.final_.row_stride && ps.init.row_stride >= nv &&
                          ps.init.row_stride <= std::numeric_limits<int>::max();
    acc_t* S = nullptr;
    int64_t lds = nv;
    if (in_place) {
      S = ps.init.base + slot * ps.init.slot_stride + h * ps.init.head_stride + col0;
      lds = ps.init.row_stride;
    } else {
      sc.state.assign(ps.dk * nv, acc_t(0));
      S = sc.state.data();
      if (ps.init.base) {
        const acc_t* src =
            ps.init.base + slot * ps.init.slot_stride + h * ps.init.head_stride + col0 * ps.init.col_stride;
        for (int64_t i = 0; i < ps.dk; ++i) {
          for (int64_t j = 0; j < nv; ++j) {
            S[i * nv + j] = src[i * ps.init.row_stride + j * ps.init.col_stride];
          }
        }
      }
    }
    StreamParams<acc_t> sp = ps.params;
    sp.length = T;
    sp.slope = static_cast<acc_t>(ps.slope[h]);
    run_stream<in_t, out_t, acc_t>(
        sp, {ps.qq.row0(b, s0, head_of(ps.qq)), ps.qq.token_stride},
        {ps.kk.row0(b, s0, head_of(ps.kk)), ps.kk.token_stride}, ps.dk,
        {ps.vv.row0(b, s0, head_of(ps.vv)) + col0, ps.vv.token_stride}, nv, out, ps.out.token_stride,
        S, lds, sc.stream);
    if (ps.final_.base && !in_place) {
      acc_t* dst = ps.final_.base + slot * ps.final_.slot_stride + h * ps.final_.head_stride +
                   col0 * ps.final_.col_stride;
      for (int64_t i = 0; i < ps.dk; ++i) {
        for (int64_t j = 0; j < nv; ++j) {
          dst[i * ps.final_.row_stride + j * ps.final_.col_stride] = S[i * nv + j];
        }
      }
    }
  };
  const int64_t items = batch * ps.heads * chunks;
  int64_t tokens = 0;
  for (const int64_t t : ps.length) {
    tokens += t;
  }
  // The state products' multiply-adds: a small pass (decode of a few rows) runs on the calling thread.
  const double flops = 2.0 * static_cast<double>(tokens) * ps.heads * ps.dk * ps.dv;
  parallel_items(items, flops, [] { return Scratch{}; }, body);
}

}  // namespace attn_ops::cpu
