"""attn_ops.parallel: the LSE merge of attention partials and tensor-parallel attention modules.

* In process: merge_attention_partials of attn_ops.attention over key shards (causal splits where
  some rows see no key in a shard, rows with no key at all, varlen) against the float64 reference
  attention over all keys (reference.attention_ref), forward and gradients; its input checks.
* Two processes (gloo, CPU, file:// store, spawned once for the module): tensor_parallel GQA (KV heads
  sharded, and replicated for MQA; an o_proj bias via from_linear) and MLA (q_lora_rank set and None,
  biases) in float64 against the single-process module: outputs, input gradient, every weight's
  gradient (gathered and reassembled here from the head layout), and cached prefill + decode (KVCache,
  PagedKVCache, LatentKVCache) against the single-process full-sequence forward; the all-gather merge
  of two key halves against full attention, with gradients; tensor_parallel's input checks.

Tolerance: reference.assert_close_to_ref (|ours - ref64| <= 2 * |same_dtype - ref64| + eps); in
float64 against a float64 single-process module that is the eps of float64 (1e-10 relative).
"""
import datetime
import json
import time
import traceback
import warnings
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import attn_ops
from attn_ops.parallel import (ColumnParallelLinear, RowParallelLinear, merge_attention_partials,
                               merge_attention_partials_across_ranks, tensor_parallel)
from attn_ops.nn import (GroupedQueryAttention, KVCache, LatentKVCache, MultiHeadLatentAttention,
                         PagedKVCache)
from reference import accumulation_dtype, assert_close_to_ref, attention_ref, cu_seqlens, same_dtype_ref
from rope_reference import assert_table_from_formula, cos_sin_formula

F64 = torch.float64
WORLD = 2


def close64(ours, ref, name):
    """The tolerance rule for float64 against a float64 reference (same_dtype = ref64)."""
    assert_close_to_ref(ours, ref, ref, name=name)


# --------------------------------------------------------------------------------------------------
# Partials over key shards with the op
# --------------------------------------------------------------------------------------------------
def causal_partials(q, k, v, bounds):
    """attn_ops.attention of q over keys [s, e) for each (s, e) in bounds, masked as global causal
    attention over all Tk keys (query i sees key j iff j <= i + Tk - Tq): within a shard of Tk' keys
    starting at s that is window_right = Tk - s - Tk' (bottom-right aligned)."""
    Tk = k.shape[1]
    parts = [attn_ops.attention(q, k[:, s:e], v[:, s:e], window_right=Tk - e) for s, e in bounds]
    return [o for o, _ in parts], [l for _, l in parts]


def backward_loss(out, lse, dout, dlse):
    """sum(out * dout) + sum(lse * dlse) over the rows with a finite lse (dout / dlse cast to the
    dtypes of out / lse)."""
    lse_term = torch.where(torch.isfinite(lse.detach()), lse * dlse.to(lse.dtype), torch.zeros_like(lse))
    return (out * dout.to(out.dtype)).sum() + lse_term.sum()


# Tq > Tk: the first Tq - Tk query rows see no key at all (out 0, lse -inf in every shard).
MERGE_CASES = {
    "halves": dict(Tq=9, Tk=16, bounds=[(0, 8), (8, 16)]),
    "three_uneven": dict(Tq=16, Tk=16, bounds=[(0, 3), (3, 13), (13, 16)]),
    "no_key_rows": dict(Tq=12, Tk=8, bounds=[(0, 5), (5, 8)]),
    # lse ~ 150, past float32's exp range: a merge that skips the max shift overflows (inf lse, NaN out)
    "large_logits": dict(Tq=9, Tk=16, bounds=[(0, 8), (8, 16)], q_scale=40.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, F64, torch.bfloat16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("case", list(MERGE_CASES))
def test_merge_equals_full_attention(case, dtype):
    c = MERGE_CASES[case]
    B, H, Hkv, D = 2, 4, 2, 16
    q = (torch.randn(B, c["Tq"], H, D) * c.get("q_scale", 1.0)).to(dtype).requires_grad_()
    k = torch.randn(B, c["Tk"], Hkv, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, c["Tk"], Hkv, D, dtype=dtype, requires_grad=True)
    outs, lses = causal_partials(q, k, v, c["bounds"])
    out, lse = merge_attention_partials(outs, lses)
    assert out.dtype == dtype and lse.dtype == (F64 if dtype == F64 else torch.float32)

    leaves64 = [t.detach().to(F64).requires_grad_() for t in (q, k, v)]
    leaves_same = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref64 = attention_ref(*leaves64, causal=True)
    same = same_dtype_ref(attention_ref, *leaves_same, causal=True, compute_dtype=dtype)
    max_logit = ref64[1][torch.isfinite(ref64[1])].abs().max().item()
    assert_close_to_ref(out, ref64[0], same[0], name="out", max_logit=max_logit)
    assert_close_to_ref(lse, ref64[1], same[1], name="lse", max_logit=max_logit)
    # some rows see no key in one shard; with Tq > Tk some see none at all: exactly 0 there
    assert any(torch.isneginf(l).any() for l in lses)
    no_key = torch.isneginf(ref64[1]).transpose(1, 2)
    assert torch.equal(out[no_key], torch.zeros_like(out[no_key]))

    # gradients through the merge (and its lse); the baseline is the reference's gradients of the same inputs in
    # the accumulation dtype, rounded once (test_attention_backward.same_dtype_grads)
    dout = torch.randn(out.shape, dtype=F64).to(dtype).double()
    dlse = torch.randn(lse.shape, dtype=F64).float().double()
    acc = accumulation_dtype(dtype)
    if acc != dtype:
        leaves_same = [t.detach().to(acc).requires_grad_() for t in (q, k, v)]
        same = attention_ref(*leaves_same, causal=True, compute_dtype=acc)
    for result in ((out, lse), ref64, same):
        backward_loss(*result, dout, dlse).backward()
    for name, ours, ref, ref_same in zip("qkv", (q, k, v), leaves64, leaves_same):
        assert torch.isfinite(ours.grad).all()
        assert_close_to_ref(ours.grad, ref.grad, ref_same.grad.to(dtype), name=f"d{name}",
                            rounded_intermediates=True, max_logit=max_logit)


def test_merge_varlen():
    """Varlen layout (out [total_q, H, D], lse [H, total_q]): each sequence's keys split in two
    shards, one of them empty for the second sequence."""
    lens_q, lens_k = [5, 3], [7, 4]
    split = [(3, 4), (4, 0)]  # per sequence: keys in shard 0, keys in shard 1
    H, Hkv, D = 4, 1, 8
    q = torch.randn(sum(lens_q), H, D, dtype=F64, requires_grad=True)
    k = torch.randn(sum(lens_k), Hkv, D, dtype=F64, requires_grad=True)
    v = torch.randn(sum(lens_k), Hkv, D, dtype=F64, requires_grad=True)
    starts = [0, lens_k[0]]
    shard_keys = [torch.cat([torch.arange(st, st + n0) for st, (n0, _) in zip(starts, split)]),
                  torch.cat([torch.arange(st + n0, st + n0 + n1) for st, (n0, n1) in zip(starts, split)])]
    outs, lses = [], []
    for shard, idx in enumerate(shard_keys):
        o, l = attn_ops.attention(q, k[idx], v[idx], cu_seqlens_q=cu_seqlens(lens_q),
                                  cu_seqlens_k=cu_seqlens([n[shard] for n in split]))
        outs.append(o)
        lses.append(l)
    out, lse = merge_attention_partials(outs, lses)
    ref = attention_ref(q, k, v, cu_seqlens_q=cu_seqlens(lens_q), cu_seqlens_k=cu_seqlens(lens_k))
    close64(out, ref[0], "out")
    close64(lse, ref[1], "lse")
    # and the gradients through the merge, its lse and the empty shard
    dout, dlse = torch.randn(out.shape, dtype=F64), torch.randn(lse.shape, dtype=F64)
    grads = torch.autograd.grad(backward_loss(out, lse, dout, dlse), (q, k, v))
    ref_grads = torch.autograd.grad(backward_loss(*ref, dout, dlse), (q, k, v))
    for name, g, r in zip("qkv", grads, ref_grads):
        close64(g, r, f"d{name}")


def _partials(n=2, shape=(2, 3, 4, 8)):
    outs = [torch.randn(shape) for _ in range(n)]
    lses = [torch.randn(shape[0], shape[2], shape[1]) for _ in range(n)]
    return outs, lses


@pytest.mark.parametrize("mutate, message", [
    (lambda o, l: (o, l[:1]), r"outs and lses must be sequences of the same non-zero length, got 2 outs "
                              r"and 1 lses"),
    (lambda o, l: ([], []), r"outs and lses must be .* got 0 outs and 0 lses"),
    (lambda o, l: ([t[0, 0] for t in o], l), r"outs\[0\] must be a 4-D tensor \[batch, seqlen_q, heads, "
                                            r"head_dim_v\] or a 3-D tensor \[total_q, heads, head_dim_v\], "
                                            r"got a 2-D tensor of shape \[4, 8\]"),
    (lambda o, l: ([o[0], o[1][..., :4]], l), r"outs\[1\] must have the shape, dtype and device of "
                                              r"outs\[0\] \(\[2, 3, 4, 8\], torch.float32, cpu\), got "
                                              r"\[2, 3, 4, 4\], torch.float32, cpu"),
    (lambda o, l: ([o[0], o[1].double()], l), r"outs\[1\] must have .* got \[2, 3, 4, 8\], torch.float64"),
    (lambda o, l: (o, [l[0], l[1].transpose(1, 2)]), r"lses\[1\] must have shape \[2, 4, 3\] \(\[batch, "
                                                     r"heads, seqlen_q\] for outs of shape \[2, 3, 4, 8\]\), "
                                                     r"dtype torch.float32 and device cpu, got \[2, 3, 4\]"),
    (lambda o, l: (o, [l[0], l[1].double()]), r"lses\[1\] must have .* got \[2, 4, 3\], torch.float64, cpu"),
    (lambda o, l: (o, [t.half() for t in l]), r"lses\[0\] must be float32 or float64, got torch.float16"),
], ids=["count", "empty", "out_dims", "out_shape", "out_dtype", "lse_shape", "lse_dtype", "lse_half"])
def test_merge_errors(mutate, message):
    outs, lses = mutate(*_partials())
    with pytest.raises(ValueError, match=r"^merge_attention_partials: " + message):
        merge_attention_partials(outs, lses)


def test_tensor_parallel_needs_process_group():
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        tensor_parallel(GroupedQueryAttention(32, 4, 2))


# --------------------------------------------------------------------------------------------------
# Two processes
# --------------------------------------------------------------------------------------------------
def gather(t):
    """Every rank's ``t`` (same shape), in rank order."""
    parts = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(parts, t.contiguous())
    return parts


def random_small_params(module):
    """Norm weights and biases drawn at random (the defaults are ones / small)."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.5)


def cached_run(module, x, cache, split):
    """Prefill x[:, :split] then decode the remaining tokens one at a time; the outputs along T."""
    outs = []
    for s, e in [(0, split)] + [(t, t + 1) for t in range(split, x.shape[1])]:
        if isinstance(cache, PagedKVCache):
            cache.reserve(e - s)
        outs.append(module(x[:, s:e], cache=cache))
    return torch.cat(outs, dim=1)


def check_module(full, x, make_cache, rotary_dim, rope_theta):
    """Train step and cached run of tensor_parallel(full) against full; returns the local module and
    the gathered gradients of every local parameter (collectives all done here). The shard's rotary tables
    must be the formula's for the scenario's rotary_dim and rope_theta: agreeing with full alone would let
    both share wrong ones."""
    local = tensor_parallel(full)
    exact_cos, exact_sin = cos_sin_formula(4096, rotary_dim, rope_theta)
    assert_table_from_formula(local.rope_cos, exact_cos, "shard rope_cos")
    assert_table_from_formula(local.rope_sin, exact_sin, "shard rope_sin")
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = full(x_ref)
    dy = torch.randn_like(ref)
    ref.backward(dy)
    out = local(x_tp)
    out.backward(dy)
    grads = {n: gather(p.grad) for n, p in local.named_parameters()}
    with torch.no_grad():
        cached = cached_run(local, x, make_cache(local), split=x.shape[1] - 2)
        full_seq = full(x)
    close64(out, ref, "out")
    close64(x_tp.grad, x_ref.grad, "dx")
    close64(cached, full_seq, "cached prefill + decode")
    return local, grads


def check_grads(full, grads, sharded_rows, sharded_columns):
    """Full gradients from the gathered ones: rows / columns concatenated in rank order for sharded
    weights, the whole gradient on every rank for replicated parameters."""
    for name, parts in grads.items():
        full_grad = full.get_parameter(name).grad
        if name in sharded_rows:
            close64(torch.cat(parts, dim=0), full_grad, f"grad {name}")
        elif name in sharded_columns:
            close64(torch.cat(parts, dim=1), full_grad, f"grad {name}")
        else:
            for r, g in enumerate(parts):
                close64(g, full_grad, f"grad {name} (rank {r})")


def scenario_gqa_sharded_kv():
    """Hq 4, Hkv 2 over 2 ranks (one KV head each), q/k/v and o_proj biases (from_linear), sliding
    window, rope_theta 1e6, contiguous cache."""
    E, H, Hkv, D = 32, 4, 2, 8
    lin = [nn.Linear(E, H * D, bias=True), nn.Linear(E, Hkv * D, bias=True),
           nn.Linear(E, Hkv * D, bias=True), nn.Linear(H * D, E, bias=True)]
    full = GroupedQueryAttention.from_linear(*[m.double() for m in lin], num_heads=H, num_kv_heads=Hkv,
                                             sliding_window=5, rope_theta=1e6)
    random_small_params(full)
    x = torch.randn(2, 9, E, dtype=F64)
    local, grads = check_module(full, x, lambda m: KVCache(1, 2, 9, m.num_kv_heads, D, dtype=F64), D, 1e6)
    assert (local.num_heads, local.num_kv_heads) == (2, 1)
    assert local.o_proj.bias is not None and local.sliding_window == 5
    rows = {f"{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")}
    check_grads(full, grads, rows, {"o_proj.weight"})


def scenario_gqa_replicated_kv():
    """MQA (Hkv 1) over 2 ranks: the KV head is replicated, its gradient summed over both; paged
    cache with block size 2."""
    E, H, D = 24, 4, 6
    full = attn_ops.nn.MultiQueryAttention(E, H, D, bias=True, dtype=F64)
    random_small_params(full)
    x = torch.randn(2, 7, E, dtype=F64)
    local, grads = check_module(
        full, x, lambda m: PagedKVCache(1, 10, 2, m.num_kv_heads, D, 2, 4, dtype=F64), D, 10000.0)
    assert (local.num_heads, local.num_kv_heads) == (2, 1)
    rows = {"q_proj.weight", "q_proj.bias"}
    check_grads(full, grads, rows, {"o_proj.weight"})  # k/v: the full gradient on both ranks


def scenario_gqa_kv_heads_per_rank():
    """Hq 8, Hkv 4 over 2 ranks (two KV heads each), no bias, interleaved rope."""
    E, H, Hkv, D = 32, 8, 4, 4
    full = GroupedQueryAttention(E, H, Hkv, D, rope_interleaved=True, rope_theta=500.0, dtype=F64)
    x = torch.randn(1, 6, E, dtype=F64)
    local, grads = check_module(full, x, lambda m: KVCache(1, 1, 6, m.num_kv_heads, D, dtype=F64), D, 500.0)
    assert (local.num_heads, local.num_kv_heads) == (4, 2)
    check_grads(full, grads, {"q_proj.weight", "k_proj.weight", "v_proj.weight"}, {"o_proj.weight"})


def _mla_scenario(**config):
    full = MultiHeadLatentAttention(**config, dtype=F64)
    random_small_params(full)
    x = torch.randn(2, 6, config["hidden_size"], dtype=F64)
    local, grads = check_module(
        full, x, lambda m: LatentKVCache(1, 2, 6, m.kv_lora_rank, m.qk_rope_head_dim, dtype=F64),
        config["qk_rope_head_dim"], config.get("rope_theta", 10000.0))
    assert local.num_heads == config["num_heads"] // WORLD
    rows = {"q_proj.weight", "q_b_proj.weight", "kv_b_proj.weight"}
    check_grads(full, grads, rows, {"o_proj.weight"})  # the rest replicated: full gradient everywhere


def scenario_mla_q_lora_bias():
    _mla_scenario(hidden_size=32, num_heads=4, q_lora_rank=12, kv_lora_rank=16,
                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, attention_bias=True, rope_theta=1e6)


def scenario_mla_no_q_lora():
    _mla_scenario(hidden_size=24, num_heads=2, q_lora_rank=None, kv_lora_rank=8,
                  qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=8, softmax_scale=0.3)


def scenario_merge_across_ranks():
    """Rank r attends the (replicated) queries to key half r; the all-gather merge equals causal
    attention over all keys; the k / v gradients of each half and the summed q gradient equal the
    reference's. Query 0 sees no key of the second half."""
    B, Tq, Tk, H, Hkv, D = 2, 6, 10, 4, 2, 8
    q, k, v = (torch.randn(B, Tq, H, D, dtype=F64), torch.randn(B, Tk, Hkv, D, dtype=F64),
               torch.randn(B, Tk, Hkv, D, dtype=F64))
    half = Tk // 2
    s, e = dist.get_rank() * half, (dist.get_rank() + 1) * half
    q_r, k_r, v_r = (q.clone().requires_grad_(), k[:, s:e].clone().requires_grad_(),
                     v[:, s:e].clone().requires_grad_())
    part_out, part_lse = attn_ops.attention(q_r, k_r, v_r, window_right=Tk - e)
    out, lse = merge_attention_partials_across_ranks(part_out, part_lse)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    backward_loss(out, lse, dout, dlse).backward()
    dk, dv = gather(k_r.grad), gather(v_r.grad)
    dq = q_r.grad.clone()
    dist.all_reduce(dq)
    no_key_in_half = gather(torch.isneginf(part_lse).any().to(torch.int32).reshape(1))

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = attention_ref(*leaves, causal=True)
    backward_loss(*ref, dout, dlse).backward()
    close64(out, ref[0], "out")
    close64(lse, ref[1], "lse")
    close64(dq, leaves[0].grad, "dq (summed over ranks)")
    close64(torch.cat(dk, dim=1), leaves[1].grad, "dk")
    close64(torch.cat(dv, dim=1), leaves[2].grad, "dv")
    assert bool(no_key_in_half[1])


def scenario_tensor_parallel_errors():
    """Head counts the 2 ranks cannot split, a module that is not attention, a shard sharded again."""
    cases = [
        (lambda: GroupedQueryAttention(24, 3, 3), ValueError,
         r"num_heads \(3\) must be divisible by the world size of the group \(2\)"),
        (lambda: GroupedQueryAttention(24, 6, 3), ValueError,
         r"num_kv_heads \(3\) must be divisible by the world size of the group \(2\), or divide it"),
        (lambda: MultiHeadLatentAttention(24, 3, None, 8, 4, 4, 4), ValueError,
         r"num_heads \(3\) must be divisible by the world size of the group \(2\)"),
        (lambda: nn.Linear(4, 4), TypeError,
         r"module must be a GroupedQueryAttention or a MultiHeadLatentAttention, got Linear"),
        (lambda: tensor_parallel(GroupedQueryAttention(24, 2, 2)), ValueError,
         r"module is already a tensor-parallel shard"),
        (lambda: type("AdapterAttention", (MultiHeadLatentAttention,), {})(24, 2, None, 8, 4, 4, 4), TypeError,
         r"module must be one of .*, not a subclass of them, got AdapterAttention"),
    ]
    for make, error, message in cases:
        with pytest.raises(error, match=r"^tensor_parallel: " + message):
            tensor_parallel(make())


def scenario_parallel_linears_default_group():
    """ColumnParallelLinear (copy_input) then RowParallelLinear, both with group=None: None is the default
    group for every collective, so x's gradient is summed over the ranks (copy_to_ranks took None as "no
    group" and left each rank with its shard's part)."""
    first, second = nn.Linear(6, 8).double(), nn.Linear(8, 5).double()
    x = torch.randn(3, 6, dtype=F64, requires_grad=True)
    half = 8 // WORLD
    start = dist.get_rank() * half
    column = ColumnParallelLinear.shard(first, start, half, None, copy_input=True)
    row = RowParallelLinear.shard(second, start, half, None)
    out = row(torch.tanh(column(x)))
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    ref = second(torch.tanh(first(x_ref)))
    (ref * dout).sum().backward()
    close64(out, ref, "out")
    close64(x.grad, x_ref.grad, "x.grad")


SCENARIOS = {f.__name__[len("scenario_"):]: f for f in (
    scenario_gqa_sharded_kv, scenario_gqa_replicated_kv, scenario_gqa_kv_heads_per_rank,
    scenario_mla_q_lora_bias, scenario_mla_no_q_lora, scenario_merge_across_ranks,
    scenario_tensor_parallel_errors, scenario_parallel_linears_default_group)}


def _worker(rank, store, results_dir):
    """One rank: every scenario in turn (each seeded the same on both ranks, so the inputs and full
    modules are identical), its traceback or None written to rank<r>.json. A scenario asserts only
    after its last collective, so a failure cannot leave the other rank waiting."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        for name, fn in SCENARIOS.items():
            torch.manual_seed(zlib.crc32(name.encode()))
            try:
                fn()
                results[name] = None
            except Exception:  # noqa: BLE001  (reported by the test of that scenario)
                results[name] = traceback.format_exc()
    finally:
        with open(f"{results_dir}/rank{rank}.json", "w") as f:
            json.dump(results, f)
        # Both ranks leave together: a rank that tears gloo down while the other still talks to it
        # made the other abort ("terminate called without an active exception") on a loaded machine.
        dist.barrier()
        dist.destroy_process_group()


def _run_two_ranks(d):
    """Every scenario on 2 spawned CPU processes (gloo) with its store and results in directory d."""
    ctx = mp.start_processes(_worker, args=(str(d / "store"), str(d)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 180
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the 2-process run took more than 180 s")
    results = []
    for r in range(WORLD):
        with open(d / f"rank{r}.json") as f:
            results.append(json.load(f))
    return results


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    """Runs every scenario once on 2 spawned CPU processes (gloo); each rank's results. A rank killed by a
    signal gets one more run: a CI run saw gloo abort a rank ("terminate called without an active exception")
    once, with no test failing, and it did not reproduce in 20 runs here, loaded or not. A scenario's own failure
    is a result (rank<r>.json), not a signal, so it is never retried; a crash that repeats fails the second run."""
    try:
        return _run_two_ranks(tmp_path_factory.mktemp("dist"))
    except mp.ProcessExitedException as e:
        if e.signal_name is None:
            raise
        warnings.warn(f"two-rank run: {e}; running it again")
        return _run_two_ranks(tmp_path_factory.mktemp("dist"))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_two_ranks(two_rank_results, scenario):
    for r, results in enumerate(two_rank_results):
        assert scenario in results, f"rank {r} did not run {scenario}"
        assert results[scenario] is None, f"rank {r}:\n{results[scenario]}"
