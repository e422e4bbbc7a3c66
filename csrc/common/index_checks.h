// Value checks of index tensors on the host (lengths, cu_seqlens, block tables, slots, rows, positions),
// shared by the op families. Each reads the values, so call them only where can_read_values() allows (CPU
// tensors; not meta / fake ones); CUDA inputs get the same checks on the device (common/cuda/index_checks.h).
// Every message names the op, the argument and the offending element.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace attn_ops {

// Reads cu_seqlens (copying it to the host if needed) and checks its values (starts at 0, non-decreasing,
// ends at `total`, the token count of `tensor_name`); returns the longest sequence.
int64_t check_cu_seqlens_values(const char* op, const char* name, const at::Tensor& cu, int64_t total,
                                const char* tensor_name);
// max_seqlen (when given) is at least `longest`, the longest sequence of `cu_name`.
void check_max_seqlen(const char* op, const char* name, const char* cu_name, std::optional<int64_t> max_seqlen,
                      int64_t longest);

// Values of cache_seqlens (0 <= len <= capacity) and, for a paged cache, of the block-table entries each
// row uses (in [0, num_blocks)). block_table is undefined (and block_size, num_blocks unused) for a
// contiguous cache. `table_rows` (host int32 [B], checked in range) picks the block-table row of each batch
// row, `first_key` (host int32 [B]) the cache position of its first key (cache_leftpad); either may be
// undefined (row b, position 0).
void check_cache_lengths_and_blocks(const char* op, const at::Tensor& cache_seqlens, const at::Tensor& block_table,
                                    int64_t capacity, int64_t block_size, int64_t num_blocks,
                                    const at::Tensor& table_rows = at::Tensor(),
                                    const at::Tensor& first_key = at::Tensor());

// cache_batch_idx [batch] int32 in [0, rows) (the rows of `rows_name`) and, when `distinct` (a write: two
// batch rows writing one cache row would race), no value repeated.
void check_batch_idx_values(const char* op, const at::Tensor& cache_batch_idx, int64_t rows, const char* rows_name,
                            bool distinct);

// cache_seqlens[b] >= 0 and cache_seqlens[b] + added <= capacity (a cache write of `added` tokens per row).
void check_append_lengths(const char* op, const at::Tensor& cache_seqlens, int64_t added, int64_t capacity);

// -1 <= slot_mapping[i] < num_blocks * block_size.
void check_slot_values(const char* op, const at::Tensor& slot_mapping, int64_t num_blocks, int64_t block_size);

// positions (int32 / int64, any shape) in [0, max_positions), the rows of the cos/sin table.
void check_position_values(const char* op, const at::Tensor& positions, int64_t max_positions);

}  // namespace attn_ops
