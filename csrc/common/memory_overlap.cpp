// Overlap of strided tensors as a bounded integer equation: element i of a tensor lies at
// offset + sum_k i_k * stride_k, so two elements meet when a sum of stride multiples, each multiple in a known
// range, equals a given difference of offsets.
#include "common/memory_overlap.h"

#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <utility>
#include <vector>

namespace attn_ops {
namespace {

// One unknown of the equation: coef * x with lo <= x <= hi.
struct Term {
  int64_t coef, lo, hi;
};

int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return -floor_div(-a, b);
}

// Whether sum_k coef_k * x_k == target has an integer solution in the ranges (one with some x_k != 0 when
// `nonzero`). A depth-first search over the terms in decreasing |coef|: each level tries only the values from
// which the later terms can still reach what is left of the target. The strides of views made by slicing,
// transposing, selecting or interleaving nest, which leaves one or two values per level. Past kBudget nodes
// the answer is no, PyTorch's own answer for layouts it cannot decide.
class BoundedSum {
 public:
  BoundedSum(std::vector<Term> terms, bool nonzero) : terms_(std::move(terms)), nonzero_(nonzero) {
    std::sort(terms_.begin(), terms_.end(),
              [](const Term& a, const Term& b) { return std::llabs(a.coef) > std::llabs(b.coef); });
    reach_lo_.assign(terms_.size() + 1, 0);
    reach_hi_.assign(terms_.size() + 1, 0);
    for (size_t k = terms_.size(); k-- > 0;) {
      const int64_t a = terms_[k].coef * terms_[k].lo, b = terms_[k].coef * terms_[k].hi;
      reach_lo_[k] = reach_lo_[k + 1] + std::min(a, b);
      reach_hi_[k] = reach_hi_[k + 1] + std::max(a, b);
    }
  }

  bool solvable(int64_t target) {
    nodes_ = 0;
    return visit(0, target, /*all_zero=*/true);
  }

 private:
  static constexpr int64_t kBudget = 100000;

  bool visit(size_t k, int64_t rest, bool all_zero) {
    if (k == terms_.size()) {
      return rest == 0 && !(nonzero_ && all_zero);
    }
    if (rest < reach_lo_[k] || rest > reach_hi_[k] || ++nodes_ > kBudget) {
      return false;
    }
    // The values x for which rest - coef * x stays within what terms k + 1 .. can reach.
    const Term& t = terms_[k];
    const int64_t after_lo = rest - reach_hi_[k + 1], after_hi = rest - reach_lo_[k + 1];  // range of coef * x
    int64_t lo = t.coef > 0 ? ceil_div(after_lo, t.coef) : ceil_div(after_hi, t.coef);
    int64_t hi = t.coef > 0 ? floor_div(after_hi, t.coef) : floor_div(after_lo, t.coef);
    lo = std::max(lo, t.lo);
    hi = std::min(hi, t.hi);
    if (nonzero_ && all_zero) {
      lo = std::max<int64_t>(lo, 0);  // x and -x solve the same self-overlap: the first nonzero one is positive
    }
    for (int64_t x = lo; x <= hi; ++x) {
      if (visit(k + 1, rest - t.coef * x, all_zero && x == 0)) {
        return true;
      }
    }
    return false;
  }

  std::vector<Term> terms_;
  std::vector<int64_t> reach_lo_, reach_hi_;  // what terms k .. can sum to, at least and at most
  bool nonzero_;
  int64_t nodes_ = 0;
};

bool symbolic(const at::Tensor& t) {
  return t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

}  // namespace

bool shares_elements(const at::Tensor& t) {
  const at::MemOverlap status = at::has_internal_overlap(t);
  if (status != at::MemOverlap::TooHard || symbolic(t)) {
    return status == at::MemOverlap::Yes;
  }
  // Two index vectors i != j at one address: sum_k (i_k - j_k) * stride_k == 0 with |i_k - j_k| < size_k.
  std::vector<Term> terms;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) {
      terms.push_back({t.stride(d), -(t.size(d) - 1), t.size(d) - 1});
    }
  }
  return BoundedSum(std::move(terms), /*nonzero=*/true).solvable(0);
}

bool shares_memory(const at::Tensor& a, const at::Tensor& b) {
  const at::MemOverlapStatus status = at::get_overlap_status(a, b);
  if (status != at::MemOverlapStatus::TooHard || symbolic(a) || symbolic(b)) {
    return status == at::MemOverlapStatus::Full || status == at::MemOverlapStatus::Partial;
  }
  if (!a.storage().is_alias_of(b.storage()) || a.numel() == 0 || b.numel() == 0) {
    return false;
  }
  // In bytes: element i of a spans [A + sum_k i_k a_k, + size_a), element j of b [B + sum_m j_m b_m, + size_b);
  // they meet when (A + sum i_k a_k) - (B + sum j_m b_m) = delta with -(size_a - 1) <= delta <= size_b - 1.
  const int64_t size_a = a.element_size(), size_b = b.element_size();
  std::vector<Term> terms;
  for (const auto& [t, sign, item] : {std::tuple{&a, int64_t{1}, size_a}, std::tuple{&b, int64_t{-1}, size_b}}) {
    for (int64_t d = 0; d < t->dim(); ++d) {
      if (t->size(d) > 1 && t->stride(d) != 0) {  // a stride-0 dim reaches no other address
        terms.push_back({sign * t->stride(d) * item, 0, t->size(d) - 1});
      }
    }
  }
  if (size_a > 1 || size_b > 1) {
    terms.push_back({-1, -(size_a - 1), size_b - 1});
  }
  const int64_t target = b.storage_offset() * size_b - a.storage_offset() * size_a;
  return BoundedSum(std::move(terms), /*nonzero=*/false).solvable(target);
}

}  // namespace attn_ops
