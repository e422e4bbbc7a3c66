// Host value checks of index tensors, shared by the op families (common/index_checks.h).
#include "common/index_checks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

namespace attn_ops {
namespace {

at::Tensor host_int32(const at::Tensor& t) { return t.to(at::kCPU).contiguous(); }

}  // namespace

int64_t check_cu_seqlens_values(const char* op, const char* name, const at::Tensor& cu, int64_t total,
                                const char* tensor_name) {
  const at::Tensor host = cu.to(at::kCPU).contiguous();
  const int32_t* c = host.data_ptr<int32_t>();
  const int64_t n = host.numel();
  TORCH_CHECK(c[0] == 0, op, ": ", name, " must start at 0, got ", c[0]);
  int64_t longest = 0;
  for (int64_t i = 1; i < n; ++i) {
    TORCH_CHECK(c[i] >= c[i - 1], op, ": ", name, " must be non-decreasing, got ", name, "[", i, "] = ", c[i],
                " after ", name, "[", i - 1, "] = ", c[i - 1]);
    longest = std::max<int64_t>(longest, c[i] - c[i - 1]);
  }
  TORCH_CHECK(c[n - 1] == total, op, ": ", name, " must end at the number of tokens in ", tensor_name, " (", total,
              "), got ", c[n - 1]);
  return longest;
}

void check_max_seqlen(const char* op, const char* name, const char* cu_name, std::optional<int64_t> max_seqlen,
                      int64_t longest) {
  if (max_seqlen.has_value()) {
    TORCH_CHECK(*max_seqlen >= longest, op, ": ", name, " (", *max_seqlen, ") is smaller than the longest sequence in ",
                cu_name, " (", longest, ")");
  }
}

void check_cache_lengths_and_blocks(const char* op, const at::Tensor& cache_seqlens, const at::Tensor& block_table,
                                    int64_t capacity, int64_t block_size, int64_t num_blocks,
                                    const at::Tensor& table_rows, const at::Tensor& first_key) {
  const at::Tensor lens = cache_seqlens.to(at::kCPU).contiguous();
  const int32_t* len = lens.const_data_ptr<int32_t>();
  const at::Tensor table = block_table.defined() ? block_table.to(at::kCPU).contiguous() : at::Tensor();
  for (int64_t b = 0; b < lens.numel(); ++b) {
    TORCH_CHECK(len[b] >= 0, op, ": cache_seqlens[", b, "] = ", len[b], " must be >= 0");
    if (!table.defined()) {
      TORCH_CHECK(len[b] <= capacity, op, ": cache_seqlens[", b, "] = ", len[b], " exceeds the cache capacity ",
                  capacity);
      continue;
    }
    TORCH_CHECK(len[b] <= capacity, op, ": cache_seqlens[", b, "] = ", len[b], " exceeds the cache capacity ",
                capacity, " (max_blocks_per_seq ", table.size(1), " x block_size ", block_size, ")");
    const int64_t t = table_rows.defined() ? table_rows.const_data_ptr<int32_t>()[b] : b;
    const int32_t* row = table.const_data_ptr<int32_t>() + t * table.size(1);
    const int64_t first = first_key.defined() ? first_key.const_data_ptr<int32_t>()[b] : 0;
    // block_size 0 (a cache of empty blocks) has capacity 0, so only len[b] = 0 reaches here: no block is read
    for (int64_t j = block_size > 0 ? first / block_size : 0; j * block_size < len[b]; ++j) {
      TORCH_CHECK(row[j] >= 0 && row[j] < num_blocks, op, ": block_table[", t, ", ", j, "] = ", row[j],
                  " is out of range [0, ", num_blocks, ")");
    }
  }
}

void check_batch_idx_values(const char* op, const at::Tensor& cache_batch_idx, int64_t rows, const char* rows_name,
                            bool distinct) {
  const at::Tensor host = host_int32(cache_batch_idx);
  const int32_t* v = host.const_data_ptr<int32_t>();
  for (int64_t b = 0; b < host.numel(); ++b) {
    TORCH_CHECK(v[b] >= 0 && v[b] < rows, op, ": cache_batch_idx[", b, "] = ", v[b], " is out of range [0, ", rows,
                ") (the rows of ", rows_name, ")");
  }
  if (!distinct) {
    return;
  }
  std::vector<int64_t> writer(rows, -1);  // the batch row that writes each cache row
  for (int64_t b = 0; b < host.numel(); ++b) {
    TORCH_CHECK(writer[v[b]] < 0, op, ": cache_batch_idx[", b, "] = ", v[b], " repeats cache_batch_idx[", writer[v[b]],
                "]: the rows of one write must be distinct cache rows");
    writer[v[b]] = b;
  }
}

void check_append_lengths(const char* op, const at::Tensor& cache_seqlens, int64_t added, int64_t capacity) {
  const at::Tensor lens = cache_seqlens.to(at::kCPU).contiguous();
  const int32_t* l = lens.const_data_ptr<int32_t>();
  for (int64_t b = 0; b < lens.numel(); ++b) {
    TORCH_CHECK(l[b] >= 0, op, ": cache_seqlens[", b, "] = ", l[b], " must be >= 0");
    TORCH_CHECK(l[b] + added <= capacity, op, ": cache_seqlens[", b, "] = ", l[b], " plus ", added,
                " new tokens exceeds the cache capacity ", capacity);
  }
}

void check_slot_values(const char* op, const at::Tensor& slot_mapping, int64_t num_blocks, int64_t block_size) {
  const at::Tensor slots = slot_mapping.to(at::kCPU, at::kLong).contiguous();
  const int64_t* s = slots.const_data_ptr<int64_t>();
  const int64_t num_slots = num_blocks * block_size;
  for (int64_t i = 0; i < slots.numel(); ++i) {
    TORCH_CHECK(s[i] >= -1 && s[i] < num_slots, op, ": slot_mapping[", i, "] = ", s[i],
                " is out of range: the cache has ", num_slots, " slots (num_blocks ", num_blocks, " x block_size ",
                block_size, "); -1 skips a token");
  }
}

void check_position_values(const char* op, const at::Tensor& positions, int64_t max_positions) {
  const at::Tensor pos = positions.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = pos.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < pos.numel(); ++i) {
    if (p[i] < 0 || p[i] >= max_positions) {
      // Name the offending element by its multi-index, e.g. positions[1, 3].
      std::string index;
      for (int64_t d = pos.dim() - 1, rest = i; d >= 0; --d) {
        index = std::to_string(rest % pos.size(d)) + (index.empty() ? "" : ", ") + index;
        rest /= pos.size(d);
      }
      TORCH_CHECK(false, op, ": positions[", index, "] = ", p[i], " is out of range [0, ", max_positions,
                  ") of the cos/sin table");
    }
  }
}

}  // namespace attn_ops
