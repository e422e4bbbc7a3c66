"""The self-test of ``python -m attn_ops``: every public op on small random float32 inputs against the float64
references of :mod:`attn_ops._references`, on the CPU and, when a GPU is visible and the build has CUDA
kernels, on CUDA. A few seconds in all.

A :class:`Check` computes ``(ours, reference)`` tensor pairs on one device; :func:`run_checks` runs checks on
devices and reports each as a :class:`CheckResult`, so a caller (or a test) can run any list of checks.
"""
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import ops
from ._gpu_backend import cuda_kernels_compiled
from ._references import additive, attend, attend_batch, lightning, rotate
from .parallel import merge_attention_partials

Pairs = List[Tuple[Tensor, Tensor]]

FLOAT32_TOLERANCE = 1e-4  # float32 kernels against float64, on inputs of size ~1: errors are ~1e-6
EXACT = 0.0  # the cache writes copy values


class Inputs:
    """Random inputs for one check on one device, drawn from a fixed seed on the CPU (every device gets the
    same values)."""

    def __init__(self, device: str, seed: int = 0):
        self.device = device
        self._generator = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int) -> Tensor:
        """Normal float32 values."""
        return torch.randn(shape, generator=self._generator).to(self.device)

    def rand(self, *shape: int) -> Tensor:
        """Uniform float32 values in [0, 1)."""
        return torch.rand(shape, generator=self._generator).to(self.device)

    def randint(self, high: int, *shape: int) -> Tensor:
        """int64 values in [0, high)."""
        return torch.randint(high, shape, generator=self._generator).to(self.device)

    def tensor(self, values, dtype: torch.dtype = torch.int32) -> Tensor:
        """``values`` as a tensor (int32 unless told: the ops' lengths, slots and tables)."""
        return torch.tensor(values, dtype=dtype, device=self.device)


@dataclass(frozen=True)
class Check:
    """One op checked: ``compare`` runs it and its reference on an :class:`Inputs`' device and returns the
    ``(ours, reference)`` pairs, whose error must not exceed ``tolerance`` (see :func:`max_error`)."""

    name: str
    tolerance: float
    compare: Callable[[Inputs], Pairs]


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one device: its error, or ``problem`` (the exception it raised)."""

    name: str
    device: str
    tolerance: float
    error: Optional[float] = None
    problem: Optional[str] = None

    @property
    def passed(self) -> bool:
        return self.problem is None and self.error <= self.tolerance  # a NaN error fails

    def line(self) -> str:
        """``ok ...`` or ``FAIL <op> [<device>]: <error> > <tolerance>`` (or what it raised)."""
        where = f"{self.name} [{self.device}]"
        if self.problem is not None:
            return f"FAIL {where}: raised {self.problem}"
        if self.passed:
            return f"ok   {where}: {self.error:.1e} <= {self.tolerance:.0e}"
        return f"FAIL {where}: {self.error:.1e} > {self.tolerance:.0e}"


def max_error(pairs: Pairs) -> float:
    """The largest ``|ours - reference| / (1 + |reference|)`` over every element of every pair (0 where both
    hold the same value, infinities included; NaN when either holds a NaN, which fails every tolerance)."""
    worst = 0.0
    for ours, reference in pairs:
        if ours.shape != reference.shape:
            raise ValueError(f"the op gave shape {tuple(ours.shape)} where the reference has "
                             f"{tuple(reference.shape)}")
        ours, reference = ours.double(), reference.double()
        error = ((ours - reference).abs() / (1 + reference.abs())).masked_fill(ours == reference, 0)
        largest = error.max().item() if error.numel() else 0.0
        if math.isnan(largest):
            return largest
        worst = max(worst, largest)
    return worst


def _f64(*tensors: Tensor) -> List[Tensor]:
    """The tensors in float64, for the references."""
    return [t.double() for t in tensors]


def _grads(fn, inputs: Sequence[Tensor], cotangents: Sequence[Tensor]) -> Tuple[Tensor, ...]:
    """The gradients with respect to ``inputs`` of ``sum_i (fn(*inputs)[i] * cotangents[i]).sum()``."""
    inputs = [t.detach().requires_grad_() for t in inputs]
    loss = sum((out * grad.to(out.dtype)).sum() for out, grad in zip(fn(*inputs), cotangents))
    return torch.autograd.grad(loss, inputs)


# attention: GQA (4 query heads over 2 KV heads), causal with more keys than queries (bottom-right).
def _attention_inputs(x: Inputs):
    return x.randn(2, 5, 4, 8), x.randn(2, 7, 2, 8), x.randn(2, 7, 2, 8)


def _attention(x: Inputs) -> Pairs:
    q, k, v = _attention_inputs(x)
    out, lse = ops.attention(q, k, v, causal=True)
    ref_out, ref_lse = attend_batch(*_f64(q, k, v), scale=8 ** -0.5, causal=True)
    return [(out, ref_out), (lse, ref_lse)]


def _attention_backward(x: Inputs) -> Pairs:
    """The backward op called directly, and through autograd."""
    q, k, v = _attention_inputs(x)
    dout, dlse = x.randn(2, 5, 4, 8), x.randn(2, 4, 5)
    direct = ops.attention_backward(dout, q, k, v, *ops.attention(q, k, v, causal=True), dlse=dlse, causal=True)
    autograd = _grads(lambda *t: ops.attention(*t, causal=True), (q, k, v), (dout, dlse))
    ref = _grads(lambda *t: attend_batch(*t, scale=8 ** -0.5, causal=True), _f64(q, k, v), (dout, dlse))
    return list(zip(direct, ref)) + list(zip(autograd, ref))


def _kv_cache_append(x: Inputs) -> Pairs:
    k_cache, v_cache, k, v = x.randn(2, 6, 2, 4), x.randn(2, 6, 2, 5), x.randn(2, 2, 2, 4), x.randn(2, 2, 2, 5)
    lengths = [1, 4]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(lengths):
        expected_k[b, n:n + 2], expected_v[b, n:n + 2] = k[b], v[b]
    ops.kv_cache_append(k_cache, v_cache, k, v, x.tensor(lengths))
    return [(k_cache, expected_k), (v_cache, expected_v)]


def _paged_kv_cache_append(x: Inputs) -> Pairs:
    k_cache, v_cache, k, v = x.randn(3, 2, 2, 4), x.randn(3, 2, 2, 4), x.randn(4, 2, 4), x.randn(4, 2, 4)
    slots = [5, 0, -1, 2]  # block slot // 2, offset slot % 2; -1 skips the token
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for i, slot in enumerate(slots):
        if slot >= 0:
            expected_k[slot // 2, slot % 2], expected_v[slot // 2, slot % 2] = k[i], v[i]
    ops.paged_kv_cache_append(k_cache, v_cache, k, v, x.tensor(slots, torch.int64))
    return [(k_cache, expected_k), (v_cache, expected_v)]


def _over_cache(q: Tensor, keys, values, lengths) -> Tuple[Tensor, Tensor]:
    """The reference of attention over a cache: row ``b`` attends causally to ``keys(b)[:lengths[b]]``."""
    rows = [attend(q[b].double(), keys(b)[:n].double(), values(b)[:n].double(), scale=q.shape[-1] ** -0.5,
                   causal=True) for b, n in enumerate(lengths)]
    return torch.stack([out for out, _ in rows]), torch.stack([lse for _, lse in rows])


def _attention_with_kvcache(x: Inputs) -> Pairs:
    q, k_cache, v_cache = x.randn(2, 2, 4, 8), x.randn(2, 8, 2, 8), x.randn(2, 8, 2, 8)
    lengths = [6, 3]
    out, lse = ops.attention_with_kvcache(q, k_cache, v_cache, x.tensor(lengths))
    ref_out, ref_lse = _over_cache(q, lambda b: k_cache[b], lambda b: v_cache[b], lengths)
    return [(out, ref_out), (lse, ref_lse)]


def _attention_with_paged_kvcache(x: Inputs) -> Pairs:
    q, k_cache, v_cache = x.randn(2, 1, 4, 8), x.randn(6, 2, 2, 8), x.randn(6, 2, 2, 8)
    lengths, table = [5, 6], [[3, 0, 5], [1, 4, 2]]
    out, lse = ops.attention_with_kvcache(q, k_cache, v_cache, x.tensor(lengths), block_table=x.tensor(table))
    ref_out, ref_lse = _over_cache(q, lambda b: k_cache[table[b]].flatten(0, 1),
                                   lambda b: v_cache[table[b]].flatten(0, 1), lengths)
    return [(out, ref_out), (lse, ref_lse)]


def _rotary_inputs(x: Inputs):
    """x [2, 3, 2, 8] with 6 of its 8 features rotating, positions [2, 3] into a 16-position table."""
    cos, sin = ops.rotary_cos_sin(16, 6, device=x.device)
    return x.randn(2, 3, 2, 8), cos, sin, x.randint(16, 2, 3)


def _rotary_embedding(x: Inputs) -> Pairs:
    inp, cos, sin, positions = _rotary_inputs(x)
    out = ops.rotary_embedding(inp, cos, sin, positions)
    return [(out, rotate(*_f64(inp, cos, sin), positions, interleaved=False))]


def _rotary_embedding_inplace(x: Inputs) -> Pairs:
    inp, cos, sin, positions = _rotary_inputs(x)
    expected = rotate(*_f64(inp, cos, sin), positions, interleaved=True)
    ops.rotary_embedding_(inp, cos, sin, positions, interleaved=True)
    return [(inp, expected)]


def _mla_cache_append(x: Inputs) -> Pairs:
    cache, c_kv, k_pe = x.randn(2, 5, 8), x.randn(2, 2, 6), x.randn(2, 2, 2)
    lengths = [0, 3]
    expected = cache.clone()
    for b, n in enumerate(lengths):
        expected[b, n:n + 2] = torch.cat((c_kv[b], k_pe[b]), -1)
    ops.mla_cache_append(cache, c_kv, k_pe, cache_seqlens=x.tensor(lengths))
    return [(cache, expected)]


def _mla_decode(x: Inputs) -> Pairs:
    q_latent, q_rope, cache = x.randn(2, 2, 3, 8), x.randn(2, 2, 3, 4), x.randn(2, 7, 12)  # cache rows [c_kv; k_pe]
    lengths, scale = [7, 4], 0.3
    out, lse = ops.mla_decode(q_latent, q_rope, cache, x.tensor(lengths), scale=scale)
    # one KV head: the keys are the whole latent rows, the values their c_kv part
    rows = [attend(torch.cat((q_latent[b], q_rope[b]), -1).double(), cache[b, :n, None].double(),
                   cache[b, :n, None, :8].double(), scale=scale, causal=True) for b, n in enumerate(lengths)]
    ref_out, ref_lse = torch.stack([row[0] for row in rows]), torch.stack([row[1] for row in rows])
    return [(out, ref_out), (lse, ref_lse)]


# lightning attention: GQA (4 query heads over 2 KV heads), 9 steps in blocks of 4, from a given state.
def _lightning_inputs(x: Inputs):
    return x.randn(2, 9, 4, 4), x.randn(2, 9, 2, 4), x.randn(2, 9, 2, 6), x.rand(4), x.randn(2, 4, 4, 6)


def _lightning_batch(q, k, v, state, slope):
    rows = [lightning(q[b], k[b], v[b], slope, state[b], scale=0.5) for b in range(q.shape[0])]
    return torch.stack([out for out, _ in rows]), torch.stack([final for _, final in rows])


def _lightning_attention(x: Inputs) -> Pairs:
    q, k, v, slope, state = _lightning_inputs(x)
    out, final = ops.lightning_attention(q, k, v, slope, scale=0.5, initial_state=state, block_size=4)
    ref_out, ref_final = _lightning_batch(*_f64(q, k, v, state, slope))
    return [(out, ref_out), (final, ref_final)]


def _lightning_attention_backward(x: Inputs) -> Pairs:
    """The backward op called directly, and through autograd."""
    q, k, v, slope, state = _lightning_inputs(x)
    dout, dfinal = x.randn(2, 9, 4, 6), x.randn(2, 4, 4, 6)
    direct = ops.lightning_attention_backward(dout, dfinal, q, k, v, slope, scale=0.5, initial_state=state,
                                              block_size=4)
    autograd = _grads(lambda q, k, v, s: ops.lightning_attention(q, k, v, slope, scale=0.5, initial_state=s,
                                                                 block_size=4), (q, k, v, state), (dout, dfinal))
    ref = _grads(lambda *t: _lightning_batch(*t, slope.double()), _f64(q, k, v, state), (dout, dfinal))
    return list(zip(direct, ref)) + list(zip(autograd, ref))


def _lightning_attention_decode(x: Inputs) -> Pairs:
    q, k, v = x.randn(2, 2, 4, 4), x.randn(2, 2, 2, 4), x.randn(2, 2, 2, 6)
    slope, pool, slots = x.rand(4), x.randn(3, 4, 4, 6), [2, 0]  # slot 1 stays as it is
    expected_pool, outs = pool.double(), []
    for b, slot in enumerate(slots):
        out, expected_pool[slot] = lightning(*_f64(q[b], k[b], v[b], slope, pool[slot]), scale=0.5)
        outs.append(out)
    out = ops.lightning_attention_decode_(q, k, v, pool, slope, scale=0.5, state_indices=x.tensor(slots))
    return [(out, torch.stack(outs)), (pool, expected_pool)]


# additive attention: the second row's last two keys padded.
def _additive_inputs(x: Inputs):
    mask = x.tensor([[False] * 5, [False, False, False, True, True]], torch.bool)
    return (x.randn(2, 3, 6), x.randn(2, 5, 6), x.randn(6), x.randn(2, 5, 4)), mask


def _additive_attention(x: Inputs) -> Pairs:
    inputs, mask = _additive_inputs(x)
    out, lse, _ = ops.additive_attention(*inputs, key_padding_mask=mask)
    ref_out, ref_lse = additive(*_f64(*inputs), mask)
    return [(out, ref_out), (lse, ref_lse)]


def _additive_attention_backward(x: Inputs) -> Pairs:
    """The backward op called directly, and through autograd."""
    inputs, mask = _additive_inputs(x)
    dout, dlse = x.randn(2, 3, 4), x.randn(2, 3)
    out, lse, _ = ops.additive_attention(*inputs, key_padding_mask=mask)
    direct = ops.additive_attention_backward(dout, dlse, *inputs, out, lse, key_padding_mask=mask)
    autograd = _grads(lambda *t: ops.additive_attention(*t, key_padding_mask=mask)[:2], inputs, (dout, dlse))
    ref = _grads(lambda *t: additive(*t, mask), _f64(*inputs), (dout, dlse))
    return list(zip(direct, ref)) + list(zip(autograd, ref))


def _merge_attention_partials(x: Inputs) -> Pairs:
    """Attention over two key shards, merged, against attention over all the keys."""
    q, k, v = x.randn(1, 4, 4, 8), x.randn(1, 9, 2, 8), x.randn(1, 9, 2, 8)
    partials = [ops.attention(q, k[:, shard], v[:, shard]) for shard in (slice(0, 4), slice(4, 9))]
    out, lse = merge_attention_partials([o for o, _ in partials], [lse for _, lse in partials])
    ref_out, ref_lse = attend_batch(*_f64(q, k, v), scale=8 ** -0.5)
    return [(out, ref_out), (lse, ref_lse)]


CHECKS = [
    Check("attention", FLOAT32_TOLERANCE, _attention),
    Check("attention_backward", FLOAT32_TOLERANCE, _attention_backward),
    Check("kv_cache_append", EXACT, _kv_cache_append),
    Check("paged_kv_cache_append", EXACT, _paged_kv_cache_append),
    Check("attention_with_kvcache", FLOAT32_TOLERANCE, _attention_with_kvcache),
    Check("attention_with_kvcache (paged)", FLOAT32_TOLERANCE, _attention_with_paged_kvcache),
    Check("rotary_embedding", FLOAT32_TOLERANCE, _rotary_embedding),
    Check("rotary_embedding_ (interleaved)", FLOAT32_TOLERANCE, _rotary_embedding_inplace),
    Check("mla_cache_append", EXACT, _mla_cache_append),
    Check("mla_decode", FLOAT32_TOLERANCE, _mla_decode),
    Check("lightning_attention", FLOAT32_TOLERANCE, _lightning_attention),
    Check("lightning_attention_backward", FLOAT32_TOLERANCE, _lightning_attention_backward),
    Check("lightning_attention_decode_", FLOAT32_TOLERANCE, _lightning_attention_decode),
    Check("additive_attention", FLOAT32_TOLERANCE, _additive_attention),
    Check("additive_attention_backward", FLOAT32_TOLERANCE, _additive_attention_backward),
    Check("merge_attention_partials", FLOAT32_TOLERANCE, _merge_attention_partials),
]


def devices() -> Tuple[List[str], List[str]]:
    """The devices the self-test runs on, and why a device is left out (one note each)."""
    gpu, kernels = torch.cuda.is_available(), cuda_kernels_compiled()
    if gpu and kernels:
        return ["cpu", "cuda"], []
    if gpu:
        return ["cpu"], ["cuda: skipped, a GPU is visible but this build has no CUDA kernels"]
    if kernels:
        return ["cpu"], ["cuda: skipped, this build has CUDA kernels but torch sees no GPU"]
    return ["cpu"], []


def run_one(check: Check, device: str) -> CheckResult:
    """Runs ``check`` on ``device``; an exception becomes the result's ``problem`` (the self-test goes on)."""
    try:
        error = max_error(check.compare(Inputs(device)))
    except Exception as exc:  # any failure of an op is a result to report, not the end of the self-test
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return CheckResult(check.name, device, check.tolerance, problem=f"{type(exc).__name__}: {first_line}")
    return CheckResult(check.name, device, check.tolerance, error=error)


def run_checks(checks: Sequence[Check], on: Sequence[str],
               report: Optional[Callable[[CheckResult], None]] = None) -> List[CheckResult]:
    """Runs every check on every device of ``on`` (devices outer), calling ``report`` with each result as it
    comes; returns the results."""
    results = []
    for device in on:
        for check in checks:
            results.append(run_one(check, device))
            if report is not None:
                report(results[-1])
    return results

