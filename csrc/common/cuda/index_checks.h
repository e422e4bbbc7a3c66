// Value checks of index tensors (and of lightning attention's decay rates) on the device, for CUDA inputs
// (CPU and Meta inputs keep the host checks of the shared validation, which for a CUDA tensor would copy it
// to the host: a synchronisation on every eager call). Each check is one small kernel on the current stream,
// launched after the shape checks and before the op's first write kernel: at the first bad value it prints
// the message of the host check ("attn_ops.<op>: <argument>[i] = v ...") and fails a device-side assert, as
// CUDA_KERNEL_ASSERT does. That ends the CUDA context, so the op's later kernels never run: a rejected
// in-place call writes nothing. The error reaches Python at the next synchronising call, as "CUDA error:
// device-side assert triggered", the message on stdout. Under CUDA-graph capture the checks are not recorded
// (the kernels then clamp or skip bad indices, docs/cuda.md). Every check is a no-op for an empty tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace attn_ops::cuda {

// Whether the device checks run: not while the current stream captures a CUDA graph.
bool device_checks_enabled();

// cache_seqlens [batch] int32 in [0, capacity]; with block_table [table_rows, max_blocks] (else undefined),
// the entries of the blocks each row's keys occupy in [0, num_blocks): row b's keys are positions
// first_key[b] (cache_leftpad, else 0) .. cache_seqlens[b] - 1 of block-table row table_rows[b]
// (cache_batch_idx, else b). table_rows and first_key, when given, must have been checked on the device
// first (check_batch_idx_on_device, check_leftpad_on_device).
void check_cache_lengths_and_blocks_on_device(const char* op, const at::Tensor& cache_seqlens,
                                              const at::Tensor& block_table, int64_t capacity, int64_t block_size,
                                              int64_t num_blocks, const at::Tensor& table_rows = at::Tensor(),
                                              const at::Tensor& first_key = at::Tensor());

// cache_batch_idx [batch] int32 in [0, rows) (the rows of `rows_name`) and, when `distinct` (a write: two
// batch rows writing one cache row would race), no value repeated.
void check_batch_idx_on_device(const char* op, const at::Tensor& cache_batch_idx, int64_t rows, const char* rows_name,
                               bool distinct);

// cache_leftpad [batch] int32: 0 <= cache_leftpad[b] <= cache_seqlens[b].
void check_leftpad_on_device(const char* op, const at::Tensor& cache_leftpad, const at::Tensor& cache_seqlens);

// cache_seqlens [batch] int32: len >= 0 and len + added <= capacity.
void check_append_lengths_on_device(const char* op, const at::Tensor& cache_seqlens, int64_t added,
                                    int64_t capacity);

// slot_mapping (int32 / int64) in [-1, num_blocks * block_size).
void check_slot_values_on_device(const char* op, const at::Tensor& slot_mapping, int64_t num_blocks,
                                 int64_t block_size);

// positions (int32 / int64, at most 8 dims) in [0, max_positions).
void check_positions_on_device(const char* op, const at::Tensor& positions, int64_t max_positions);

// cu_seqlens [batch + 1] int32: starts at 0, non-decreasing, ends at `total` (tokens of `tensor_name`),
// and, when max_seqlen >= 0, no sequence longer than max_seqlen (named max_name).
void check_cu_seqlens_on_device(const char* op, const char* name, const at::Tensor& cu_seqlens, int64_t total,
                                const char* tensor_name, int64_t max_seqlen, const char* max_name);

// lightning_attention_decode_'s state_indices [batch] int32: each in [-1, num_slots) (-1 skips a row), and no
// slot named by two rows.
void check_state_indices_on_device(const char* op, const at::Tensor& state_indices, int64_t num_slots);

// lightning attention's slope [heads] float32: every value finite and >= 0.
void check_slope_on_device(const char* op, const at::Tensor& slope);

}  // namespace attn_ops::cuda
