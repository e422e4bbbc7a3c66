// The CUDA backend router (csrc/attention/cuda/backend_route.h) over a table of prepared calls: for each, the
// backend chosen and the reason. The calls are prepared from meta tensors by the ops' own preparations, so the
// router sees exactly what the CUDA backend would hand it; no GPU is involved.
#include "attention/cuda/backend_route.h"
#include "meta_calls.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

namespace attn_ops::cuda {
namespace {

using attn_ops_test::Dense;
using attn_ops_test::meta;
using attn_ops_test::over_cache;

constexpr int64_t kCudnn924 = 92400, kCudnn919 = 91900;

CudnnFacts h200(int64_t version = kCudnn924) { return CudnnFacts{true, version, 90, false}; }

void expect_route(const RouteDecision& d, AttentionBackend backend, const std::string& reason_part) {
  EXPECT_EQ(backend_name(d.backend), std::string(backend_name(backend))) << d.reason;
  EXPECT_NE(d.reason.find(reason_part), std::string::npos) << "reason: " << d.reason;
}

TEST(BackendRoute, DenseForwardAndBackwardGoToCudnn) {
  expect_route(route_forward(Dense{}.forward(), h200()), AttentionBackend::cudnn, "dense forward");
  expect_route(route_backward(Dense{}.backward(), h200()), AttentionBackend::cudnn, "dense backward");
  // torch 2.11's cuDNN, GQA, a sliding window, 192 / 128, more keys than queries
  Dense d;
  d.dqk = 192;
  d.window_left = 63;
  d.tq = 64;
  expect_route(route_forward(d.forward(), h200(kCudnn919)), AttentionBackend::cudnn, "dense forward");
  expect_route(route_backward(d.backward(), h200(kCudnn919)), AttentionBackend::cudnn, "dense backward");
  Dense f16;
  f16.dtype = at::kHalf;
  f16.dqk = f16.dv = 64;
  expect_route(route_forward(f16.forward(), h200()), AttentionBackend::cudnn, "dense forward");
}

TEST(BackendRoute, DeviceAndLibraryRules) {
  const AttentionCall call = Dense{}.forward();
  expect_route(route_forward(call, CudnnFacts{false, kCudnn924, 90, false}), AttentionBackend::native,
               "no cuDNN backend");
  expect_route(route_forward(call, CudnnFacts{true, 0, 90, false}), AttentionBackend::native, "no libcudnn");
  expect_route(route_forward(call, h200(92500)), AttentionBackend::native, "cuDNN 92500 is not allow-listed");
  expect_route(route_forward(call, h200(91400)), AttentionBackend::native, "not allow-listed");
  expect_route(route_forward(call, CudnnFacts{true, kCudnn924, 80, false}), AttentionBackend::native,
               "compute capability 8.0");
  expect_route(route_forward(call, CudnnFacts{true, kCudnn924, 100, false}), AttentionBackend::native,
               "compute capability 10.0");
}

TEST(BackendRoute, ProblemRulesKeepCallsNative) {
  struct Case {
    const char* reason;
    std::function<void(Dense&)> change;
  };
  const Case cases[] = {
      {"dtype Float", [](Dense& d) { d.dtype = at::kFloat; }},
      {"dtype Double", [](Dense& d) { d.dtype = at::kDouble; }},
      {"head dims 80 / 80", [](Dense& d) { d.dqk = d.dv = 80; }},
      {"head dims 576 / 512", [](Dense& d) { d.dqk = 576, d.dv = 512, d.hkv = 1; }},
      {"head dims 128 / 64", [](Dense& d) { d.dv = 64; }},
      {"an empty problem", [](Dense& d) { d.batch = 0; }},
      {"an empty problem", [](Dense& d) { d.tq = 0; }},
      {"batch or heads above 65535", [](Dense& d) { d.batch = 65536; }},
      {"softcap", [](Dense& d) { d.softcap = 30.0; }},
      {"attention sinks", [](Dense& d) { d.patterns.sinks = meta({8}, at::kFloat); }},
      {"ALiBi", [](Dense& d) { d.patterns.alibi_slopes = meta({8}, at::kFloat); }},
      {"chunked attention", [](Dense& d) { d.patterns.attention_chunk = 64; }},
      {"more queries than keys under a mask", [](Dense& d) { d.tq = 200; }},
      {"one key", [](Dense& d) { d.tk = 1, d.causal = false; }},
  };
  for (const Case& c : cases) {
    Dense d;
    c.change(d);
    SCOPED_TRACE(c.reason);
    expect_route(route_forward(d.forward(), h200()), AttentionBackend::native, c.reason);
  }
  // unmasked, more queries than keys: cuDNN's
  Dense wide;
  wide.causal = false;
  wide.tq = 300;
  expect_route(route_forward(wide.forward(), h200()), AttentionBackend::cudnn, "dense forward");
}

TEST(BackendRoute, BackwardRules) {
  expect_route(route_backward(Dense{}.backward(/*with_dlse=*/true), h200()), AttentionBackend::native,
               "a gradient flowing into lse");
  AttentionBackwardCall ordered = Dense{}.backward();
  ordered.deterministic = true;
  expect_route(route_backward(ordered, h200()), AttentionBackend::native, "deterministic");
  Dense one_query;
  one_query.tq = 1;
  expect_route(route_backward(one_query.backward(), h200()), AttentionBackend::native, "one query");
  Dense d256;
  d256.dqk = d256.dv = 256;
  expect_route(route_backward(d256.backward(), h200(kCudnn919)), AttentionBackend::native, "head dims 256 / 256");
  expect_route(route_backward(d256.backward(), h200()), AttentionBackend::cudnn, "dense backward");
  expect_route(route_forward(d256.forward(), h200(kCudnn919)), AttentionBackend::cudnn, "dense forward");
}

TEST(BackendRoute, PackedSequencesStayNative) {
  const at::Tensor cu = meta({3}, at::kInt);
  const AttentionCall call =
      prepare_attention(meta({40, 8, 128}), meta({40, 2, 128}), meta({40, 2, 128}), std::nullopt, true, -1, -1, 0.0,
                        cu, cu, std::nullopt, std::nullopt, PatternOptions{});
  expect_route(route_forward(call, h200()), AttentionBackend::native, "packed sequences");
}

TEST(BackendRoute, CacheForwards) {
  expect_route(route_forward(over_cache(1), h200()), AttentionBackend::cudnn, "contiguous cache forward");
  expect_route(route_forward(over_cache(4, 16), h200()), AttentionBackend::cudnn, "paged cache forward");
  expect_route(route_forward(over_cache(1, 64), h200()), AttentionBackend::cudnn, "paged cache forward");
  expect_route(route_forward(over_cache(1, 1), h200()), AttentionBackend::cudnn, "paged cache forward");
  expect_route(route_forward(over_cache(1, 0, /*leftpad=*/true), h200()), AttentionBackend::native,
               "cache_leftpad");
  // a block size of 12 tokens: 256 is not a multiple, so a table of 21 blocks per row
  const int64_t batch = 4;
  const AttentionCall odd = prepare_attention_with_kvcache(
      meta({batch, 1, 8, 128}), meta({batch * 22, 12, 2, 128}), meta({batch * 22, 12, 2, 128}),
      meta({batch}, at::kInt), meta({batch, 22}, at::kInt), std::nullopt, true, -1, -1, 0.0, KvCacheRows{},
      PatternOptions{});
  expect_route(route_forward(odd, h200()), AttentionBackend::native, "block size is not a power of two");
}

TEST(BackendRoute, RequestForcesOrRefuses) {
  const RouteDecision eligible = route_forward(Dense{}.forward(), h200());
  const RouteDecision refused = route_forward(Dense{}.forward(), CudnnFacts{true, kCudnn924, 80, false});
  expect_route(apply_request(eligible, BackendRequest::native, "attn_ops.attention"), AttentionBackend::native,
               "ATTN_OPS_ATTENTION_BACKEND=native");
  expect_route(apply_request(eligible, BackendRequest::cudnn, "attn_ops.attention"), AttentionBackend::cudnn,
               "dense forward");
  expect_route(apply_request(refused, BackendRequest::automatic, "attn_ops.attention"), AttentionBackend::native,
               "compute capability 8.0");
  try {
    apply_request(refused, BackendRequest::cudnn, "attn_ops.attention");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace())
                  .find("attn_ops.attention: ATTN_OPS_ATTENTION_BACKEND=cudnn, but cuDNN does not take this call: "
                        "compute capability 8.0 is not allow-listed (9.0 is)"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(BackendRoute, RequestFromTheEnvironment) {
  const char* name = "ATTN_OPS_ATTENTION_BACKEND";
  for (const auto& [value, expected] :
       {std::pair{"", BackendRequest::automatic}, {"auto", BackendRequest::automatic},
        {"cudnn", BackendRequest::cudnn}, {"native", BackendRequest::native}}) {
    setenv(name, value, 1);
    EXPECT_EQ(backend_request(), expected) << value;
  }
  setenv(name, "fast", 1);
  try {
    backend_request();
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace())
                  .find("ATTN_OPS_ATTENTION_BACKEND must be auto, cudnn or native, got 'fast'"),
              std::string::npos);
  }
  unsetenv(name);
  EXPECT_EQ(backend_request(), BackendRequest::automatic);
}

}  // namespace
}  // namespace attn_ops::cuda
