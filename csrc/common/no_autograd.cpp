// Autograd-key kernel of the ops that have no derivative. Without one the dispatcher's fallback lets autograd
// run past an op with only a warning: an in-place rotation of a tensor in a graph then gave a wrong gradient,
// a second derivative through attention or lightning attention came out as zeros, and a decode over a cache
// left q without a gradient. With grad mode on, the kernel
//  - raises when a tensor the op writes requires grad, or, for rotary_embedding_ and the backward ops (so no
//    double backward), when any tensor argument does. A cache append may store values that require grad (a
//    training forward that also fills a cache): the cache keeps a copy, through which no gradient flows.
//  - for the decode ops (attention_with_kvcache, mla_decode, lightning_attention_decode_), whose outputs come
//    from q (which requires grad in a module that decodes without torch.no_grad()), lets the call run but links
//    its outputs to a node whose backward raises: inference that forgot no_grad keeps working, a backward
//    through them is refused instead of leaving their inputs without a gradient. The raise is an op
//    (_not_differentiable_grad), so torch.compile, which traces that backward ahead, compiles the step.
// Like PyTorch's in-place ops, it bumps the version counter of every tensor it writes, so a tensor saved for
// backward elsewhere and then overwritten is caught by autograd.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace attn_ops {
namespace {

// Which arguments that require grad the kernel refuses, and what it does with the outputs otherwise.
enum class Policy {
  kRefuseWritten,             // cache appends
  kRefuseAny,                 // rotary_embedding_, the backward ops
  kRefuseWrittenOutputsRaise  // the decode ops
};

// "attn_ops::kv_cache_append" as users spell it: "attn_ops.kv_cache_append".
std::string user_name(const c10::FunctionSchema& schema) {
  return "attn_ops." + schema.name().substr(schema.name().find("::") + 2);
}

std::string why_not_differentiable(const c10::FunctionSchema& schema) {
  if (schema.is_mutable()) {
    return "it writes in place and has no derivative; call it under torch.no_grad() or on tensors that do not "
           "require grad (detach() them)";
  }
  const std::string name = user_name(schema), suffix = "_backward";
  const std::string forward = name.substr(0, name.size() - suffix.size());
  return "it is the derivative of " + forward + ", and double backward (a second derivative through " + forward +
         ", e.g. backward(create_graph=True)) is not supported";
}

// Returns `computed` (outputs made below autograd from `inputs`) linked to a node whose backward raises
// `message`. A custom Function, not an Error node set by hand: torch 2.11 and 2.14 hold nodes in different
// pointer types, and this API is the same in both.
struct NotDifferentiable : public torch::autograd::Function<NotDifferentiable> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                                                const torch::autograd::variable_list& computed,
                                                const std::string& message) {
    ctx->saved_data["message"] = message;
    ctx->save_for_backward(inputs.vec());  // only their shapes are used
    return computed;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // Raises when run, not when traced: torch.compile traces this backward ahead of any call to it.
    static const auto raise_op = c10::Dispatcher::singleton()
                                     .findSchemaOrThrow("attn_ops::_not_differentiable_grad", "")
                                     .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
    at::Tensor grad;
    for (const at::Tensor& g : grad_outputs) {
      grad = grad.defined() ? grad : g;
    }
    const std::string& message = ctx->saved_data["message"].toStringRef();
    torch::autograd::variable_list grads;
    for (const at::Tensor& input : ctx->get_saved_variables()) {
      grads.push_back(raise_op.call(grad, input, message));
    }
    // One more entry per other argument of forward: `computed` (a vector, which custom Functions count as one
    // non-tensor argument) and `message`; neither gets a gradient.
    grads.resize(grads.size() + 2);
    return grads;
  }
};

template <Policy policy>
void no_autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const std::vector<c10::Argument>& args = schema.arguments();
  const std::string name = user_name(schema);
  const bool grad_mode = at::GradMode::is_enabled();
  const auto values = torch::jit::last(*stack, args.size());
  std::vector<at::Tensor> written, tracked;  // tracked: the arguments that require grad
  for (size_t i = 0; i < args.size(); ++i) {
    if (!values[i].isTensor() || !values[i].toTensor().defined()) {
      continue;
    }
    const at::Tensor& t = values[i].toTensor();
    const bool is_written = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
    const bool refused = is_written || policy == Policy::kRefuseAny;
    TORCH_CHECK(!(refused && grad_mode && t.requires_grad()), name, ": ", args[i].name(), " requires grad, but ",
                name, " is not differentiable: ", why_not_differentiable(schema));
    if (is_written) {
      written.push_back(t);
    }
    if (t.requires_grad()) {
      tracked.push_back(t);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) {
    t.unsafeGetTensorImpl()->bump_version();
  }
  if (policy != Policy::kRefuseWrittenOutputsRaise || !grad_mode || tracked.empty()) {
    return;
  }
  const size_t num_returns = schema.returns().size(), first = stack->size() - num_returns;
  torch::autograd::variable_list computed;
  for (size_t i = first; i < stack->size(); ++i) {
    computed.push_back((*stack)[i].toTensor());
  }
  const std::string message = name + " is not differentiable: a backward reached its outputs (computed from "
                              "inputs that require grad); run it under torch.no_grad() or on detached inputs";
  // TensorList, not the vector: Function::apply finds the inputs it links to among the arguments of that type
  const torch::autograd::variable_list linked = NotDifferentiable::apply(at::TensorList(tracked), computed, message);
  for (size_t i = 0; i < num_returns; ++i) {
    (*stack)[first + i] = linked[i];
  }
}

template <Policy policy>
torch::CppFunction kernel() {
  return torch::CppFunction::makeFromBoxedFunction<&no_autograd_kernel<policy>>();
}

// _not_differentiable_grad: raises with the message when run; on Meta (fake tensors while torch.compile traces
// the backward) an empty tensor like `input`, so the traced graph holds the call and raises when it runs.
at::Tensor not_differentiable_grad(const at::Tensor& /*grad*/, const at::Tensor& /*input*/, c10::string_view message) {
  TORCH_CHECK(false, message);
  return {};
}

at::Tensor not_differentiable_grad_meta(const at::Tensor& /*grad*/, const at::Tensor& input, c10::string_view) {
  return at::empty_like(input);
}

}  // namespace

TORCH_LIBRARY_IMPL(attn_ops, CompositeExplicitAutograd, m) {
  m.impl("_not_differentiable_grad", &not_differentiable_grad);
}

TORCH_LIBRARY_IMPL(attn_ops, Meta, m) {
  m.impl("_not_differentiable_grad", &not_differentiable_grad_meta);
}

TORCH_LIBRARY_IMPL(attn_ops, Autograd, m) {
  for (const char* name : {"kv_cache_append", "paged_kv_cache_append", "mla_cache_append"}) {
    m.impl(name, kernel<Policy::kRefuseWritten>());
  }
  for (const char* name : {"rotary_embedding_", "attention_backward", "lightning_attention_backward",
                           "additive_attention_backward"}) {
    m.impl(name, kernel<Policy::kRefuseAny>());
  }
  for (const char* name : {"attention_with_kvcache", "mla_decode", "lightning_attention_decode_"}) {
    m.impl(name, kernel<Policy::kRefuseWrittenOutputsRaise>());
  }
}

}  // namespace attn_ops
