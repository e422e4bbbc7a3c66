"""Seeded fuzz test of every op: invalid and extreme inputs, crash-isolated.

Each case starts from a valid call of one op (random small shapes, dtype, layout) and applies 0-2
random mutations: a wrong dtype / rank / device, a zero-size or stride-2 last dim, an expanded or
aliased output, index values out of range, NaN / inf / huge / tiny values, options float32 cannot
hold. Every case must end in one of two ways, never a crash:
  * a RuntimeError / ValueError whose message starts with "attn_ops.<op>: " and names an argument
    (or a dimension of one), with no byte of any written tensor's storage changed (bytes outside the
    view included);
  * a result that matches the float64 reference with the tolerance rule, the baseline being the reference
    computed in float32 from the same inputs and rounded once (NaN exactly where the reference has NaN);
    the cache appends, which copy, bit for bit.

All cases first run in child processes (tests/crash_isolation.py), so a crash fails its case only;
then they run again here for the checks. ATTN_OPS_FUZZ_SEED / ATTN_OPS_FUZZ_CASES change the seed
and the number of cases (defaults: a fixed seed, 240 cases, about 30 s on 2 cores).
"""
import os
import random
import re

import torch

import attn_ops
import crash_isolation
from additive_reference import additive_attention_ref
from kvcache_reference import attention_with_kvcache_ref, kv_cache_append_ref_, paged_kv_cache_append_ref_
from lightning_reference import recurrence
from mla_reference import mla_cache_append_ref_, mla_decode_ref, paged_mla_cache_append_ref_
from reference import assert_close_to_ref, attention_ref
from rope_reference import rope_ref

SEED = int(os.environ.get("ATTN_OPS_FUZZ_SEED", "20261124"))
NUM_CASES = int(os.environ.get("ATTN_OPS_FUZZ_CASES", "240"))
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Dimension names that messages use besides the schema's argument names.
DIM_NAMES = ("heads_q", "heads_kv", "head_dim", "head_dim_qk", "head_dim_v", "kv_lora_rank", "rope_dim", "seqlen",
             "batch", "capacity")
# Ops that copy values: what they write must be bit-identical to the reference's copy.
COPY_OPS = ("kv_cache_append", "paged_kv_cache_append", "mla_cache_append")


def _rand(rng, shape, dtype):
    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


class Case:
    """One call: op name, positional args, kwargs, which args it writes, and its reference:
    reference(case, compute_dtype) -> the expected outputs computed in compute_dtype."""

    def __init__(self, op, args, kwargs, written, reference):
        self.op, self.args, self.kwargs, self.written, self.reference = op, list(args), kwargs, written, reference

    def call(self):
        return getattr(attn_ops, self.op)(*self.args, **self.kwargs)


# ---- valid starting points ------------------------------------------------------------------------

def _attention(rng):
    dtype = rng.choice(FLOATS)
    B, Tq, Tk, Hkv = rng.randint(0, 3), rng.randint(0, 40), rng.randint(0, 70), rng.choice([1, 2])
    Hq, D = Hkv * rng.choice([1, 3]), rng.choice([8, 16, 24])
    kw = dict(causal=rng.random() < 0.5, softcap=rng.choice([0.0, 0.0, 5.0]),
              window_left=rng.choice([-1, -1, 4]), window_right=rng.choice([-1, 2]))
    q, k, v = _rand(rng, (B, Tq, Hq, D), dtype), _rand(rng, (B, Tk, Hkv, D), dtype), _rand(rng, (B, Tk, Hkv, D), dtype)

    def ref(c, cdt):
        return attention_ref(*c.args, **c.kwargs, compute_dtype=cdt)
    return Case("attention", (q, k, v), kw, [], ref)


def _with_kvcache(rng):
    dtype = rng.choice(FLOATS)
    B, Tq, Hkv, D = rng.randint(0, 3), rng.randint(1, 4), rng.choice([1, 2]), rng.choice([8, 16])
    Hq = Hkv * rng.choice([1, 4])
    paged = rng.random() < 0.5
    bs, cap = rng.choice([1, 4, 16]), 32
    lens = torch.tensor([rng.randint(Tq, cap) for _ in range(B)], dtype=torch.int32)
    q = _rand(rng, (B, Tq, Hq, D), dtype)
    if paged:
        nblk = B * (cap // bs) + 2
        kc, vc = _rand(rng, (nblk, bs, Hkv, D), dtype), _rand(rng, (nblk, bs, Hkv, D), dtype)
        perm = torch.randperm(nblk, generator=torch.Generator().manual_seed(rng.randrange(2 ** 31)))
        kw = dict(block_table=perm[:B * (cap // bs)].reshape(B, cap // bs).to(torch.int32))
    else:
        kc, vc = _rand(rng, (B, cap, Hkv, D), dtype), _rand(rng, (B, cap, Hkv, D), dtype)
        kw = {}
    kw.update(softcap=rng.choice([0.0, 3.0]), window_left=rng.choice([-1, 5]))

    def ref(c, cdt):
        return attention_with_kvcache_ref(*c.args, **c.kwargs, compute_dtype=cdt)
    return Case("attention_with_kvcache", (q, kc, vc, lens), kw, [], ref)


def _kv_append(rng):
    dtype = rng.choice(FLOATS)
    B, T, H, D = rng.randint(0, 3), rng.randint(0, 4), rng.choice([1, 2]), rng.choice([8, 16])
    cap = 12
    kc, vc = _rand(rng, (B, cap, H, D), dtype), _rand(rng, (B, cap, H, D), dtype)
    lens = torch.tensor([rng.randint(0, cap - T) for _ in range(B)], dtype=torch.int32)
    k, v = _rand(rng, (B, T, H, D), dtype), _rand(rng, (B, T, H, D), dtype)

    def ref(c, cdt):
        kc2, vc2 = c.args[0].clone(), c.args[1].clone()
        kv_cache_append_ref_(kc2, vc2, *c.args[2:])
        return kc2, vc2
    return Case("kv_cache_append", (kc, vc, k, v, lens), {}, [0, 1], ref)


def _paged_append(rng):
    dtype = rng.choice(FLOATS)
    nblk, bs, N, H, D = rng.randint(1, 5), rng.choice([1, 3, 16]), rng.randint(0, 6), rng.choice([1, 2]), 8
    kc, vc = _rand(rng, (nblk, bs, H, D), dtype), _rand(rng, (nblk, bs, H, D), dtype)
    free = list(range(nblk * bs))
    rng.shuffle(free)
    slots = torch.tensor([free[i] if i < len(free) and rng.random() < 0.8 else -1 for i in range(N)],
                         dtype=rng.choice([torch.int32, torch.int64]))

    def ref(c, cdt):
        kc2, vc2 = c.args[0].clone(), c.args[1].clone()
        paged_kv_cache_append_ref_(kc2, vc2, *c.args[2:])
        return kc2, vc2
    return Case("paged_kv_cache_append", (kc, vc, _rand(rng, (N, H, D), dtype), _rand(rng, (N, H, D), dtype), slots),
                {}, [0, 1], ref)


def _rotary(rng, in_place):
    dtype = rng.choice(FLOATS)
    B, T, H, half = rng.randint(0, 3), rng.randint(0, 5), rng.choice([1, 3]), rng.choice([2, 4])
    D = 2 * half + rng.choice([0, 2])
    maxpos = 16
    x = _rand(rng, (B, T, H, D), dtype)
    cos, sin = _rand(rng, (maxpos, half), torch.float32), _rand(rng, (maxpos, half), torch.float32)
    pos = torch.randint(0, maxpos, (B, T), generator=torch.Generator().manual_seed(rng.randrange(2 ** 31)))
    kw = dict(interleaved=rng.random() < 0.5, inverse=rng.random() < 0.3)

    def ref(c, cdt):
        return rope_ref(*c.args, **c.kwargs, compute_dtype=cdt)
    return Case("rotary_embedding_" if in_place else "rotary_embedding", (x, cos, sin, pos.to(torch.int32)), kw,
                [0] if in_place else [], ref)


def _mla_append(rng):
    dtype = rng.choice(FLOATS)
    d_c, d_r = rng.choice([8, 16]), rng.choice([0, 4])
    if rng.random() < 0.5:
        B, T, cap = rng.randint(0, 3), rng.randint(0, 3), 8
        lc = _rand(rng, (B, cap, d_c + d_r), dtype)
        lens = torch.tensor([rng.randint(0, cap - T) for _ in range(B)], dtype=torch.int32)

        def ref(c, cdt):
            lc2 = c.args[0].clone()
            mla_cache_append_ref_(lc2, *c.args[1:], c.kwargs["cache_seqlens"])
            return lc2
        return Case("mla_cache_append", (lc, _rand(rng, (B, T, d_c), dtype), _rand(rng, (B, T, d_r), dtype)),
                    dict(cache_seqlens=lens), [0], ref)
    nblk, bs, N = rng.randint(1, 4), rng.choice([1, 4]), rng.randint(0, 5)
    lc = _rand(rng, (nblk, bs, d_c + d_r), dtype)
    # A slot written twice in one call has no defined winner: repeats become -1 (skip).
    slots = torch.tensor(_unique_or_skip([rng.randrange(-1, nblk * bs) for _ in range(N)]), dtype=torch.int64)

    def ref_paged(c, cdt):
        lc2 = c.args[0].clone()
        paged_mla_cache_append_ref_(lc2, *c.args[1:], c.kwargs["slot_mapping"])
        return lc2
    return Case("mla_cache_append", (lc, _rand(rng, (N, d_c), dtype), _rand(rng, (N, d_r), dtype)),
                dict(slot_mapping=slots), [0], ref_paged)


def _unique_or_skip(slots):
    seen, out = set(), []
    for s in slots:
        out.append(s if s == -1 or s not in seen else -1)
        seen.add(s)
    return out


def _mla_decode(rng):
    dtype = rng.choice(FLOATS)
    B, Tq, H, d_c, d_r = rng.randint(0, 3), rng.randint(0, 3), rng.choice([1, 4]), rng.choice([8, 16]), 4
    cap = 24
    lens = torch.tensor([rng.randint(Tq, cap) for _ in range(B)], dtype=torch.int32)
    ql, qr = _rand(rng, (B, Tq, H, d_c), dtype), _rand(rng, (B, Tq, H, d_r), dtype)
    kw = dict(scale=rng.choice([0.1, 1.0, (d_c + d_r) ** -0.5]))
    if rng.random() < 0.5:
        bs = rng.choice([1, 8])
        nblk = B * (cap // bs) + 1
        lc = _rand(rng, (nblk, bs, d_c + d_r), dtype)
        perm = torch.randperm(nblk, generator=torch.Generator().manual_seed(rng.randrange(2 ** 31)))
        kw["block_table"] = perm[:B * (cap // bs)].reshape(B, cap // bs).to(torch.int32)
    else:
        lc = _rand(rng, (B, cap, d_c + d_r), dtype)

    def ref(c, cdt):
        return mla_decode_ref(*c.args, **c.kwargs, compute_dtype=cdt)
    return Case("mla_decode", (ql, qr, lc, lens), kw, [], ref)


def _additive(rng):
    dtype = rng.choice(FLOATS)
    B, Tq, Tk, A, Dv = rng.randint(0, 3), rng.randint(0, 20), rng.randint(0, 40), rng.choice([4, 8, 24]), 8
    kw = {}
    if rng.random() < 0.5:
        gen = torch.Generator().manual_seed(rng.randrange(2 ** 31))
        kw["key_padding_mask"] = torch.rand(B, Tk, generator=gen) < 0.3

    def ref(c, cdt):
        qp, kp, w, v = (t.to(cdt) for t in c.args)
        out, lse, _ = additive_attention_ref(qp, kp, w, v, c.kwargs.get("key_padding_mask"))
        return out, lse
    return Case("additive_attention", (_rand(rng, (B, Tq, A), dtype), _rand(rng, (B, Tk, A), dtype),
                                       _rand(rng, (A,), dtype), _rand(rng, (B, Tk, Dv), dtype)), kw, [], ref)


def _slopes(rng, H):
    return torch.tensor([rng.choice([0.0, 0.05, 0.5, 2.0]) for _ in range(H)], dtype=torch.float32)


def _lightning(rng):
    dtype = rng.choice(FLOATS)
    B, T, Hk, Dk, Dv = rng.randint(0, 3), rng.randint(0, 40), rng.choice([1, 2]), rng.choice([4, 8]), 8
    H = Hk * rng.choice([1, 2])
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    kw = dict(scale=rng.choice([1.0, 0.3]), block_size=rng.choice([None, 4, 16]))
    if rng.random() < 0.5:
        kw["initial_state"] = _rand(rng, (B, H, Dk, Dv), state_dtype)

    def ref(c, cdt):
        return recurrence(*c.args, scale=c.kwargs.get("scale", 1.0), initial_state=c.kwargs.get("initial_state"),
                          compute_dtype=cdt, round_out=False)
    return Case("lightning_attention", (_rand(rng, (B, T, H, Dk), dtype), _rand(rng, (B, T, Hk, Dk), dtype),
                                        _rand(rng, (B, T, Hk, Dv), dtype), _slopes(rng, H)), kw, [], ref)


def _lightning_decode(rng):
    dtype = rng.choice(FLOATS)
    B, Tq, Hk, Dk, Dv = rng.randint(0, 3), rng.randint(1, 3), rng.choice([1, 2]), 4, 8
    H, N = Hk * rng.choice([1, 2]), B + rng.randint(0, 2)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    state = _rand(rng, (N, H, Dk, Dv), state_dtype)
    kw = dict(scale=rng.choice([1.0, 0.3]))
    slots = list(range(N))
    rng.shuffle(slots)
    if N != B or rng.random() < 0.5:
        kw["state_indices"] = torch.tensor([slots[b] if rng.random() < 0.8 else -1 for b in range(B)],
                                           dtype=torch.int32)

    def ref(c, cdt):
        q, k, v, pool, slope = c.args
        pool = pool.to(cdt, copy=True)
        idx = c.kwargs["state_indices"].tolist() if "state_indices" in c.kwargs else list(range(q.shape[0]))
        for b, slot in enumerate(idx):
            if slot >= 0:
                _, final = recurrence(q[b:b + 1], k[b:b + 1], v[b:b + 1], slope, scale=c.kwargs.get("scale", 1.0),
                                      initial_state=pool[slot:slot + 1], compute_dtype=cdt)
                pool[slot] = final[0]
        return pool
    return Case("lightning_attention_decode_", (_rand(rng, (B, Tq, H, Dk), dtype), _rand(rng, (B, Tq, Hk, Dk), dtype),
                                                _rand(rng, (B, Tq, Hk, Dv), dtype), state, _slopes(rng, H)),
                kw, [3], ref)


BUILDERS = [_attention, _with_kvcache, _kv_append, _paged_append, lambda r: _rotary(r, True),
            lambda r: _rotary(r, False), _mla_append, _mla_decode, _additive, _lightning, _lightning_decode]


# ---- mutations ---------------------------------------------------------------------------------------

def _tensor_slots(case):
    """(container, key) of every tensor argument, positional and keyword."""
    slots = [(case.args, i) for i, a in enumerate(case.args) if isinstance(a, torch.Tensor)]
    return slots + [(case.kwargs, k) for k, a in case.kwargs.items() if isinstance(a, torch.Tensor)]


def _mutate(rng, case):
    slots = _tensor_slots(case)
    where, key = rng.choice(slots)
    t = where[key]
    kind = rng.choice(["dtype", "rank", "meta", "zero_dim", "stride2", "expand", "alias", "values", "values",
                       "index", "index", "option", "option"])
    if kind == "dtype":
        where[key] = t.to(rng.choice([torch.int32, torch.int64, torch.float32, torch.float64, torch.bfloat16,
                                      torch.bool]))
    elif kind == "rank" and t.dim() > 0:
        where[key] = t.unsqueeze(0) if rng.random() < 0.5 else t.flatten(0, 1) if t.dim() > 1 else t[None]
    elif kind == "meta":
        where[key] = torch.empty_like(t, device="meta")
    elif kind == "zero_dim" and t.dim() > 0:
        where[key] = t.narrow(rng.randrange(t.dim()), 0, 0)
    elif kind == "stride2" and t.dim() > 0 and t.shape[-1] > 0:
        wide = torch.cat([t, t], -1).contiguous()
        where[key] = wide[..., ::2]
    elif kind == "expand" and t.dim() > 0 and t.numel() > 0:
        where[key] = t.narrow(0, 0, 1).expand(max(2, t.shape[0]), *t.shape[1:])
    elif kind == "alias" and len(slots) > 1:
        w2, k2 = rng.choice(slots)
        where[key] = w2[k2]
    elif kind == "values" and t.is_floating_point() and t.numel() > 0:
        # Non-finite values go into queries only for the attention ops: a NaN / inf key or value that a
        # row does not see still meets a 0 probability inside its tile (0 * inf = NaN), in the reference
        # and in SDPA alike, so whether it shows depends on tiling (tests/test_reliability.py covers
        # NaN keys and values that rows see).
        attends = case.op in ("attention", "attention_with_kvcache", "mla_decode", "additive_attention",
                              "lightning_attention", "lightning_attention_decode_")
        flat = t.view(-1) if t.is_contiguous() and (not attends or (where is case.args and key == 0)) else None
        if flat is not None:
            # inf in a linear-attention query meets the 0 of the causal decay mask in the blocked
            # algorithm (inf * 0 = NaN) where the token recurrence adds infinities: NaN only there.
            specials = [float("nan")] if case.op.startswith("lightning") else [float("nan"), float("inf"),
                                                                                -float("inf")]
            flat[rng.randrange(t.numel())] = rng.choice(specials)
        else:
            where[key] = t * rng.choice([1e4, 1e-30])
    elif kind == "index" and not t.is_floating_point() and t.numel() > 0 and t.dtype != torch.bool \
            and t.is_contiguous():
        t.view(-1)[rng.randrange(t.numel())] = rng.choice([-5, -1, 2 ** 31 - 1, 40, 1000])
    elif kind == "option":
        name, value = rng.choice([("scale", 1e300), ("scale", float("nan")), ("scale", 0.5), ("scale", 1e-40),
                                  ("softcap", float("inf")), ("softcap", 1e-50), ("softcap", -1.0),
                                  ("window_left", -2), ("window_left", 2 ** 40), ("causal", False)])
        if case.op in ("attention", "attention_with_kvcache") or (case.op == "mla_decode" and name in ("scale",
                                                                                                          "causal")):
            case.kwargs[name] = value
        elif case.op.startswith("lightning") and name == "scale":
            case.kwargs[name] = value


def make_case(index):
    rng = random.Random(SEED * 1000003 + index)
    case = rng.choice(BUILDERS)(rng)
    for _ in range(rng.choice([0, 1, 1, 2])):
        _mutate(rng, case)
    return case


CASES = {f"case{i}": (lambda i=i: _run_quietly(i)) for i in range(NUM_CASES)}


def _run_quietly(index):
    """What the child process runs: the call alone (its outcome is checked in the parent)."""
    case = make_case(index)
    try:
        case.call()
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        pass


# ---- checks ------------------------------------------------------------------------------------------

def _storage_bytes(t):
    if t.device.type == "meta":
        return None
    return bytes(t.untyped_storage().cpu())


def _names(case):
    schema = getattr(torch.ops.attn_ops, case.op).default._schema
    return [a.name for a in schema.arguments] + list(DIM_NAMES)


def _close(ours, ref64, same, what):
    """The tolerance rule, max|ours - ref64| <= 2 * max|same - ref64| + eps, where `same` is the reference computed
    in the accumulation dtype from the same inputs and rounded once to ours' dtype (what the kernels do); NaN
    exactly where ref64 has NaN, and an infinity (in ref64, or from the rounding) exactly as in `same`."""
    o, r = ours.detach().cpu().double(), ref64.detach().cpu().double()
    same = same.detach().cpu()
    s = same.double()
    assert o.shape == r.shape, f"{what}: shape {tuple(o.shape)} != reference {tuple(r.shape)}"
    nan_ref, nan_ours = torch.isnan(r), torch.isnan(o)
    assert torch.equal(nan_ref, nan_ours), f"{what}: NaN at {int((nan_ref != nan_ours).sum())} places the " \
                                           f"reference does not agree with"
    inf = ~nan_ref & (torch.isinf(r) | torch.isinf(s))
    assert torch.equal(o[inf], s[inf]), f"{what}: infinities differ from the reference's"
    finite = ~nan_ref & ~inf
    if finite.any():
        assert_close_to_ref(o[finite], r[finite], same[finite], name=what)


def check_case(index):
    case = make_case(index)
    before = {i: _storage_bytes(case.args[i]) for i in case.written}
    try:
        result = case.call()
    except (RuntimeError, ValueError) as e:
        msg = str(e).splitlines()[0]
        assert msg.startswith(f"attn_ops.{case.op}: "), f"message does not name the op: {msg!r}"
        assert any(re.search(rf"\b{re.escape(n)}\b", msg) for n in _names(case)), \
            f"message names no argument: {msg!r}"
        for i, b in before.items():
            assert _storage_bytes(case.args[i]) == b, f"rejected call wrote into argument {i}: {msg!r}"
        return "rejected"
    written = [case.args[i] for i in case.written]
    if any(t.device.type == "meta" for t in case.args if isinstance(t, torch.Tensor)):
        return "meta"
    # Accepted: the values must match the reference, run on copies of the original inputs.
    got = written if written else result
    got = got if isinstance(got, (list, tuple)) else [got]
    ref64, same = (_as_list(case.reference(make_case(index), cdt)) for cdt in (torch.float64, torch.float32))
    for n, (g, r, s) in enumerate(zip(got, ref64, same)):
        if case.op in COPY_OPS:
            torch.testing.assert_close(g, r.to(g.device), rtol=0, atol=0, equal_nan=True, msg=f"output {n}")
        elif g.dtype == torch.float64:  # float64 accumulates in float64: its baseline is ref64
            _close(g, r, r, f"output {n}")
        else:
            _close(g, r, s.to(g.dtype), f"output {n}")
    return "accepted"


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def test_fuzz_never_crashes():
    report = crash_isolation.crash_report("test_fuzz", "CASES", list(CASES), timeout=600)
    crashed = {k: v for k, v in report.items() if v is not None}
    assert not crashed, f"crashed cases (rerun with make_case(i)): {crashed}"


def test_fuzz_rejects_clearly_or_matches_reference():
    outcomes, failures = {}, []
    for i in range(NUM_CASES):
        try:
            outcome = check_case(i)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        except Exception as e:  # an assertion, or an accepted input the reference cannot handle
            case = make_case(i)
            failures.append(f"case{i} ({case.op}): {type(e).__name__}: {str(e).splitlines()[0]}")
    assert not failures, "\n".join(failures)
    # The generator must exercise both sides.
    assert outcomes.get("rejected", 0) > NUM_CASES // 10 and outcomes.get("accepted", 0) > NUM_CASES // 10, outcomes
