// The router's rules. Each rule that keeps a call on attn_ops' kernels returns its reason; the allow-lists are
// what cuDNN 9.19 and 9.24 support on Hopper per cudnn-frontend 1.32's support checks and the cuDNN attention
// bugs known to PyTorch (docs/cuda.md, "cuDNN backend", lists the rules with their sources).
#include "attention/cuda/backend_route.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <optional>
#include <string_view>

namespace attn_ops::cuda {
namespace {

constexpr int64_t kMaxBatchOrHeads = 65535;  // cuDNN's grid limit, as PyTorch enforces it

// The libcudnn releases whose attention the router trusts: the ones torch 2.11 (9.19) and 2.14 (9.24) ship.
bool cudnn_version_allowed(int64_t version) {
  return (version >= 91900 && version < 92000) || (version >= 92400 && version < 92500);
}

// Head dims with Hopper engines: Dqk = Dv in {64, 96, 128, 256} and DeepSeek's 192 / 128. The backward of
// 256 needs cuDNN 9.23.
bool head_dims_allowed(int64_t dim_qk, int64_t dim_v, bool backward, int64_t version) {
  if (dim_qk == 192 && dim_v == 128) {
    return true;
  }
  if (dim_qk != dim_v) {
    return false;
  }
  if (dim_qk == 256) {
    return !backward || version >= 92300;
  }
  return dim_qk == 64 || dim_qk == 96 || dim_qk == 128;
}

// cuDNN reads every tensor in 16-byte vectors: each stride but the last (which is 1) a multiple of 16 bytes,
// and the data 16-byte aligned (a misaligned operand gave wrong results on SM90).
bool aligned_16(const at::Tensor& t) {
  const int64_t elem = static_cast<int64_t>(t.element_size());
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && (t.stride(d) * elem) % 16 != 0) {
      return false;
    }
  }
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

bool is_power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

using Reason = std::optional<std::string>;

// The rules every pass shares: the device, the library, the dtype, the sizes and the options.
Reason common_rules(const AttentionCall& call, const CudnnFacts& facts, bool backward) {
  if (!facts.built) {
    return "this build has no cuDNN backend (cudnn-frontend headers were not found at build time)";
  }
  if (facts.version == 0) {
    return "no libcudnn is loaded";
  }
  if (!cudnn_version_allowed(facts.version)) {
    return "cuDNN " + std::to_string(facts.version) + " is not allow-listed (9.19.x and 9.24.x are)";
  }
  if (facts.sm != 90) {
    return "compute capability " + std::to_string(facts.sm / 10) + "." + std::to_string(facts.sm % 10) +
           " is not allow-listed (9.0 is)";
  }
  const auto dtype = call.q.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return std::string("dtype ") + c10::toString(dtype) + ": cuDNN's attention takes float16 and bfloat16";
  }
  const int64_t dim_qk = call.head_dim_qk.expect_int(), dim_v = call.head_dim_v.expect_int();
  if (!head_dims_allowed(dim_qk, dim_v, backward, facts.version)) {
    return "head dims " + std::to_string(dim_qk) + " / " + std::to_string(dim_v) +
           " have no cuDNN engine on this version (64, 96, 128, 256 and 192 / 128 do)";
  }
  const int64_t batch = call.batch.expect_int(), heads = call.heads_q.expect_int();
  if (batch == 0 || call.seqlen_q.expect_int() == 0 || call.seqlen_k.expect_int() == 0) {
    return "an empty problem";
  }
  if (batch > kMaxBatchOrHeads || heads > kMaxBatchOrHeads) {
    return "batch or heads above 65535";
  }
  if (call.softcap > 0) {
    return "softcap: cuDNN applies it only through a score modifier, which turns its masks off";
  }
  if (call.patterns.sinks.has_value()) {
    return "attention sinks are not routed to cuDNN";
  }
  if (call.patterns.alibi_slopes.has_value()) {
    return "ALiBi with given slopes: cuDNN's ALiBi computes its own";
  }
  if (call.patterns.attention_chunk > 0) {
    return "chunked attention has no cuDNN mask";
  }
  if (call.packed_q() || call.varlen()) {
    return "packed sequences: cuDNN before 9.25 gives NaN for an empty one, which attn_ops allows";
  }
  for (const at::Tensor* t : {&call.q, &call.k, &call.v}) {
    if (!aligned_16(*t)) {
      return "an operand whose data or strides are not 16-byte aligned";
    }
  }
  return std::nullopt;
}

// A causal or windowed call whose queries outnumber its keys: cuDNN refuses s_q > s_kv under a mask.
bool masked_with_more_queries(const AttentionCall& call) {
  const bool masked = call.causal || call.window_left >= 0 || call.window_right >= 0;
  return masked && call.seqlen_q.expect_int() > call.seqlen_k.expect_int();
}

RouteDecision keep_native(std::string reason) { return {AttentionBackend::native, std::move(reason)}; }

}  // namespace

BackendRequest backend_request() {
  const char* raw = std::getenv("ATTN_OPS_ATTENTION_BACKEND");
  const std::string_view value = raw == nullptr ? "" : raw;
  if (value.empty() || value == "auto") {
    return BackendRequest::automatic;
  }
  if (value == "cudnn") {
    return BackendRequest::cudnn;
  }
  if (value == "native") {
    return BackendRequest::native;
  }
  TORCH_CHECK(false, "ATTN_OPS_ATTENTION_BACKEND must be auto, cudnn or native, got '", value, "'");
}

RouteDecision route_forward(const AttentionCall& call, const CudnnFacts& facts) {
  if (const Reason reason = common_rules(call, facts, /*backward=*/false)) {
    return keep_native(*reason);
  }
  if (call.over_cache()) {
    if (call.cache_batch_idx.has_value() || call.cache_leftpad.has_value()) {
      return keep_native("cache_batch_idx / cache_leftpad have no cuDNN equivalent");
    }
    if (call.paged() && !is_power_of_two(call.k.size(1))) {
      return keep_native("a paged cache whose block size is not a power of two");
    }
    return {AttentionBackend::cudnn, call.paged() ? "paged cache forward" : "contiguous cache forward"};
  }
  if (call.seqlen_k.expect_int() == 1) {
    return keep_native("one key: cuDNN has no engine for s_kv = 1");
  }
  if (masked_with_more_queries(call)) {
    return keep_native("more queries than keys under a mask");
  }
  return {AttentionBackend::cudnn, "dense forward"};
}

RouteDecision route_backward(const AttentionBackwardCall& call, const CudnnFacts& facts) {
  if (const Reason reason = common_rules(call, facts, /*backward=*/true)) {
    return keep_native(*reason);
  }
  if (call.dlse.has_value()) {
    return keep_native("a gradient flowing into lse: cuDNN's backward has no input for it");
  }
  if (call.deterministic) {
    return keep_native("deterministic: cuDNN's ordered backward needs 9.25");
  }
  if (call.seqlen_q.expect_int() == 1) {
    return keep_native("one query: cuDNN's backward at s_q = 1 is refused or NaN in known versions");
  }
  if (call.seqlen_k.expect_int() == 1) {
    return keep_native("one key: cuDNN has no engine for s_kv = 1");
  }
  if (masked_with_more_queries(call)) {
    return keep_native("more queries than keys under a mask");
  }
  for (const at::Tensor* t : {&call.dout, &call.out}) {
    if (!aligned_16(*t)) {
      return keep_native("an operand whose data or strides are not 16-byte aligned");
    }
  }
  return {AttentionBackend::cudnn, "dense backward"};
}

RouteDecision apply_request(const RouteDecision& eligible, BackendRequest request, const char* op) {
  switch (request) {
    case BackendRequest::native:
      return keep_native("ATTN_OPS_ATTENTION_BACKEND=native");
    case BackendRequest::cudnn:
      TORCH_CHECK(eligible.backend == AttentionBackend::cudnn, op,
                  ": ATTN_OPS_ATTENTION_BACKEND=cudnn, but cuDNN does not take this call: ", eligible.reason);
      return eligible;
    case BackendRequest::automatic:
      break;
  }
  return eligible;
}

const char* backend_name(AttentionBackend backend) {
  return backend == AttentionBackend::cudnn ? "cudnn" : "native";
}

}  // namespace attn_ops::cuda
