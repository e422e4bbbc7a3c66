// sdpa_graph / validate_sdpa, and the run-time loading of libcudnn that cudnn-frontend's dynamic-loading mode
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING) asks of its user: the library links neither libcudnn nor cudart and
// uses the libcudnn.so.9 that torch's CUDA libraries already loaded.
#ifdef ATTN_OPS_WITH_CUDNN

#include "attention/cuda/cudnn_graph.h"
#include "attention/cuda/cudnn_frontend_include.h"

#include <c10/util/Exception.h>

#include <functional>
#include <list>
#include <memory>

#include <dlfcn.h>

#include <mutex>

// cudnn-frontend's dynamic loading reads every cuDNN entry point from this handle (cudnn_frontend_shim.h).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace attn_ops::cuda {
namespace {

namespace fe = cudnn_frontend;

// Sets cudnn_frontend::cudnn_dlhandle once: the libcudnn torch loaded, else one found by the loader. Returns
// whether a library is there.
bool load_cudnn() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* handle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    fe::cudnn_dlhandle = handle != nullptr ? handle : dlopen("libcudnn.so.9", RTLD_NOW);
  });
  return fe::cudnn_dlhandle != nullptr;
}

std::shared_ptr<fe::graph::Tensor_attributes> add_tensor(fe::graph::Graph& g, const char* name, SdpaUid uid,
                                                         const SdpaTensor& t) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(t.dims).set_stride(t.strides));
}

void set_output(const std::shared_ptr<fe::graph::Tensor_attributes>& out, SdpaUid uid, const SdpaTensor& t) {
  out->set_output(true).set_uid(uid).set_dim(t.dims).set_stride(t.strides);
}

// [B, 1, 1, 1] int32 row lengths.
std::shared_ptr<fe::graph::Tensor_attributes> row_lengths(fe::graph::Graph& g, const char* name, SdpaUid uid,
                                                          int64_t batch) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({batch, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

// The band and scale both passes share.
template <typename Attributes>
void set_mask(Attributes& attrs, const SdpaProblem& p) {
  attrs.set_attn_scale(static_cast<float>(p.scale));
  if (p.left_bound || p.right_bound) {
    attrs.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT);
  }
  if (p.left_bound) {
    attrs.set_diagonal_band_left_bound(static_cast<int>(*p.left_bound));
  }
  if (p.right_bound) {
    attrs.set_diagonal_band_right_bound(static_cast<int>(*p.right_bound));
  }
}

void forward_nodes(fe::graph::Graph& g, const SdpaProblem& p) {
  const auto q = add_tensor(g, "q", kUidQ, p.q);
  const auto k = add_tensor(g, "k", kUidK, p.k);
  const auto v = add_tensor(g, "v", kUidV, p.v);
  auto attrs = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true);
  set_mask(attrs, p);
  if (p.padding_mask) {
    attrs.set_padding_mask(true)
        .set_seq_len_q(row_lengths(g, "seq_len_q", kUidSeqLenQ, p.batch))
        .set_seq_len_kv(row_lengths(g, "seq_len_kv", kUidSeqLenKv, p.batch));
  }
  if (p.paged) {
    auto table = [&](const char* name, SdpaUid uid) {
      return g.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(p.page_table.dims)
                          .set_stride(p.page_table.strides)
                          .set_data_type(fe::DataType_t::INT32));
    };
    attrs.set_paged_attention_k_table(table("page_table_k", kUidPageTableK))
        .set_paged_attention_v_table(table("page_table_v", kUidPageTableV))
        .set_paged_attention_max_seq_len_kv(static_cast<int>(p.seqlen_k));
  }
  auto [o, stats] = g.sdpa(q, k, v, attrs);
  set_output(o, kUidO, p.o);
  set_output(stats, kUidStats, p.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
}

void backward_nodes(fe::graph::Graph& g, const SdpaProblem& p) {
  const auto q = add_tensor(g, "q", kUidQ, p.q);
  const auto k = add_tensor(g, "k", kUidK, p.k);
  const auto v = add_tensor(g, "v", kUidV, p.v);
  const auto o = add_tensor(g, "o", kUidO, p.o);
  const auto dout = add_tensor(g, "dout", kUidDout, p.dout);
  const auto stats = add_tensor(g, "stats", kUidStats, p.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto attrs = fe::graph::SDPA_backward_attributes().set_name("attention_backward");
  set_mask(attrs, p);
  auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, attrs);
  set_output(dq, kUidDq, p.dq);
  set_output(dk, kUidDk, p.dk);
  set_output(dv, kUidDv, p.dv);
}

// The operation graph of a problem (not validated, no plans), for compute capability sm (0: the current
// device's). The nodes take the graph's settings when added, so the version is set first.
std::shared_ptr<fe::graph::Graph> sdpa_graph(const SdpaProblem& problem, int sm = 0) {
  auto graph = std::make_shared<fe::graph::Graph>();
  if (sm > 0) {
    graph->set_sm_version(sm);
  }
  graph->set_io_data_type(problem.bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (problem.backward) {
    backward_nodes(*graph, problem);
  } else {
    forward_nodes(*graph, problem);
  }
  return graph;
}

}  // namespace

std::string validate_sdpa(const SdpaProblem& problem, int sm) {
  if (!load_cudnn()) {
    return "libcudnn.so.9 could not be loaded";
  }
  const auto graph = sdpa_graph(problem, sm);
  fe::error_t status = graph->validate();
  return status.is_good() ? std::string() : status.get_message();
}

int64_t loaded_cudnn_version() {
  return load_cudnn() ? static_cast<int64_t>(fe::detail::get_backend_version()) : 0;
}

struct __attribute__((visibility("hidden"))) SdpaPlan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
};

namespace {

// The cache's key: everything a graph bakes in (the device, and the problem: dtypes, every dim and stride, the
// band, the masks, the page size). The libcudnn does not change within a process.
struct PlanKey {
  int device;
  SdpaProblem problem;
  bool operator==(const PlanKey&) const = default;
};

void mix(size_t& seed, int64_t value) {
  seed ^= std::hash<int64_t>{}(value) + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
}

void mix(size_t& seed, const SdpaTensor& t) {
  for (const int64_t d : t.dims) {
    mix(seed, d);
  }
  for (const int64_t s : t.strides) {
    mix(seed, s);
  }
}

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    const SdpaProblem& p = k.problem;
    size_t seed = 0;
    for (const int64_t v : {int64_t(k.device), int64_t(p.backward), int64_t(p.bf16), p.batch, p.heads_q, p.heads_kv,
                            p.seqlen_q, p.seqlen_k, p.dim_qk, p.dim_v, p.left_bound.value_or(-1),
                            p.right_bound.value_or(-1), int64_t(p.padding_mask), int64_t(p.paged), p.block_size}) {
      mix(seed, v);
    }
    for (const SdpaTensor* t : {&p.q, &p.k, &p.v, &p.o, &p.stats, &p.dout, &p.dq, &p.dk, &p.dv, &p.page_table}) {
      mix(seed, *t);
    }
    mix(seed, static_cast<int64_t>(std::hash<double>{}(p.scale)));
    return seed;
  }
};

// A cached outcome: a plan, or cuDNN's refusal.
struct CachedPlan {
  std::shared_ptr<const SdpaPlan> plan;
  std::string refusal;
};

// Least recently used first out, at most kPlanCacheSize problems (each plan holds cuDNN's compiled kernels).
constexpr size_t kPlanCacheSize = 256;

class PlanCache {
 public:
  std::optional<CachedPlan> find(const PlanKey& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) {
      return std::nullopt;
    }
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }
  void insert(const PlanKey& key, CachedPlan value) {
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    if (order_.size() > kPlanCacheSize) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  std::list<std::pair<PlanKey, CachedPlan>> order_;
  std::unordered_map<PlanKey, std::list<std::pair<PlanKey, CachedPlan>>::iterator, PlanKeyHash> index_;
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

PlanCache& plan_cache() {
  static auto* cache = new PlanCache();  // never destroyed: plans must not be freed after cuDNN unloads
  return *cache;
}

// Builds a problem's plan, or returns cuDNN's reason for refusing it.
CachedPlan build_plan(const SdpaProblem& problem, cudnnHandle_t handle) {
  auto plan = std::make_shared<SdpaPlan>();
  plan->graph = sdpa_graph(problem);
  fe::graph::Graph& g = *plan->graph;
  for (const auto& step : std::initializer_list<std::function<fe::error_t()>>{
           [&] { return g.validate(); }, [&] { return g.build_operation_graph(handle); },
           [&] { return g.create_execution_plans({fe::HeurMode_t::A}); }, [&] { return g.check_support(handle); },
           [&] { return g.build_plans(); }, [&] { return g.get_workspace_size(plan->workspace); }}) {
    fe::error_t status = step();
    if (!status.is_good()) {
      return {nullptr, status.get_message()};
    }
  }
  return {std::move(plan), ""};
}

}  // namespace

std::shared_ptr<const SdpaPlan> sdpa_plan(const SdpaProblem& problem, int device, cudnnHandle_t handle,
                                          bool capturing, std::string* why) {
  const PlanKey key{device, problem};
  const std::lock_guard<std::mutex> lock(cache_mutex());
  std::optional<CachedPlan> cached = plan_cache().find(key);
  if (!cached) {
    if (capturing) {
      *why = "its cuDNN plan was not built before this CUDA-graph capture";
      return nullptr;
    }
    cached = build_plan(problem, handle);
    plan_cache().insert(key, *cached);
  }
  if (!cached->plan) {
    *why = "cuDNN refused the graph: " + cached->refusal;
  }
  return cached->plan;
}

int64_t sdpa_workspace_size(const SdpaPlan& plan) { return plan.workspace; }

void run_sdpa(const SdpaPlan& plan, cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pointers,
              void* workspace) {
  fe::error_t status = plan.graph->execute(handle, pointers, workspace);
  TORCH_CHECK(status.is_good(), "cuDNN attention failed: ", status.get_message());
}

}  // namespace attn_ops::cuda

#endif  // ATTN_OPS_WITH_CUDNN
