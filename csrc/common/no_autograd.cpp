// Autograd-key kernel of the ops that have no derivative: the in-place writes (cache appends,
// rotary_embedding_) and attention_backward (so no double backward). Without it the dispatcher's fallback
// lets autograd run past them: an in-place rotation of a tensor in a graph then gave a wrong gradient with
// no error, and a second derivative through attention came out as zeros. With grad mode on, this kernel
// raises when a tensor the op writes requires grad, or, for rotary_embedding_ and attention_backward, when
// any tensor argument does. A cache append may store values that require grad (a training forward that
// also fills a cache): the cache keeps a copy, through which no gradient flows. Like PyTorch's in-place
// ops, it bumps the version counter of every tensor it writes, so a tensor saved for backward elsewhere
// and then overwritten is caught by autograd.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace attn_ops {
namespace {

std::string why_not_differentiable(const c10::FunctionSchema& schema) {
  if (schema.is_mutable()) {
    return "it writes in place and has no derivative; call it under torch.no_grad() or on tensors that do not "
           "require grad (detach() them)";
  }
  return "it is the derivative of attn_ops.attention, and double backward (a second derivative through "
         "attention, e.g. backward(create_graph=True)) is not supported";
}

template <bool written_only>
void no_autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const std::vector<c10::Argument>& args = schema.arguments();
  // "attn_ops::kv_cache_append" as users spell it: "attn_ops.kv_cache_append".
  const std::string name = "attn_ops." + schema.name().substr(schema.name().find("::") + 2);
  const auto values = torch::jit::last(*stack, args.size());
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!values[i].isTensor()) {
      continue;
    }
    const at::Tensor& t = values[i].toTensor();
    const bool is_written = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
    TORCH_CHECK(!((is_written || !written_only) && at::GradMode::is_enabled() && t.defined() && t.requires_grad()),
                name, ": ", args[i].name(), " requires grad, but ", name, " is not differentiable: ",
                why_not_differentiable(schema));
    if (is_written) {
      written.push_back(t);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) {
    t.unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, Autograd, m) {
  for (const char* name : {"kv_cache_append", "paged_kv_cache_append", "mla_cache_append"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&no_autograd_kernel</*written_only=*/true>>());
  }
  for (const char* name : {"rotary_embedding_", "attention_backward"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&no_autograd_kernel</*written_only=*/false>>());
  }
}

}  // namespace attn_ops
