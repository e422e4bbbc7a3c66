"""Repeated cache_batch_idx rows in an append, which FlashAttention accepts (padding rows of a batch pointing at
one spare cache row). The rule, the same in kv_cache_append (CPU and CUDA) and in the FlashAttention-compatible
functions (contiguous and paged caches): where two batch rows write one cache position, the token of the higher
batch row lands; positions only one of them writes all land. FlashAttention itself leaves the winner unspecified
("might come from any of the duplicate indices"); attn_ops makes it deterministic.

test_op_kv_cache_append_repeated_rows and the contiguous-cache cases of test_flash_attn_with_kvcache_repeated_rows
go through kv_cache_append and need a library built with csrc/cache's rule; the paged and packed cases go
through slots (attn_ops/_flash_attn_kvcache.py) and pass on any build."""

import pytest
import torch

import attn_ops
import attn_ops.flash_attn3_interface as fa3
import attn_ops.flash_attn_interface as fa2

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def expected_cache(cache, new, lens, rows, tok_lens=None):
    """The rule in plain Python: write batch rows in ascending order, so a later (higher) row overwrites."""
    cache = cache.clone()
    for b in range(new.shape[0]):
        n = new.shape[1] if tok_lens is None else tok_lens[b]
        for i in range(n):
            cache[rows[b], lens[b] + i] = new[b, i]
    return cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["same_positions", "overlapping", "disjoint", "three_way"])
def test_op_kv_cache_append_repeated_rows(device, case):
    rows, lens, added = {"same_positions": ([2, 0, 2], [5, 1, 5], 2), "overlapping": ([1, 1, 3], [4, 6, 0], 3),
                         "disjoint": ([0, 0], [0, 8], 4), "three_way": ([3, 3, 3, 1], [2, 3, 2, 0], 2)}[case]
    kc, vc = torch.randn(4, 16, 2, 8, device=device), torch.randn(4, 16, 2, 4, device=device)
    k, v = torch.randn(len(rows), added, 2, 8, device=device), torch.randn(len(rows), added, 2, 4, device=device)
    want_k, want_v = expected_cache(kc, k, lens, rows), expected_cache(vc, v, lens, rows)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    attn_ops.kv_cache_append(kc, vc, k, v, i32(lens), cache_batch_idx=i32(rows))
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def _kvcache_args(paged):
    """Batch rows 0 and 2 write cache row 1 at the same positions (a padding row pointing at a spare row), row 1
    writes row 0: FlashAttention's duplicate case."""
    rows, lens = torch.tensor([1, 0, 1], dtype=torch.int32), torch.tensor([3, 6, 3], dtype=torch.int32)
    q, k, v = torch.randn(3, 2, 4, 16), torch.randn(3, 2, 2, 16), torch.randn(3, 2, 2, 16)
    if paged:
        kc, vc = torch.randn(10, 4, 2, 16), torch.randn(10, 4, 2, 16)
        table = torch.tensor([[7, 2, 5], [0, 9, 4]], dtype=torch.int32)
        return dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=lens, cache_batch_idx=rows), table
    kc, vc = torch.randn(2, 12, 2, 16), torch.randn(2, 12, 2, 16)
    return dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=lens, cache_batch_idx=rows), None


def _paged_view(cache, table):
    return torch.stack([cache[table[r].long()].flatten(0, 1) for r in range(table.shape[0])])


@pytest.mark.parametrize("module", ["fa2", "fa3"])
@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_repeated_rows(module, paged):
    a, table = _kvcache_args(paged)
    before = {n: a[n].clone() for n in ("k_cache", "v_cache")}
    if paged:
        a["block_table" if module == "fa2" else "page_table"] = table
    fn = fa2.flash_attn_with_kvcache if module == "fa2" else fa3.flash_attn_with_kvcache
    out = fn(**a, causal=True)
    rows, lens = a["cache_batch_idx"].tolist(), a["cache_seqlens"].tolist()
    for name, new in (("k_cache", a["k"]), ("v_cache", a["v"])):
        got = _paged_view(a[name], table) if paged else a[name]
        base = _paged_view(before[name], table) if paged else before[name]
        assert torch.equal(got, expected_cache(base, new, lens, rows)), name
    # rows 0 and 2 then attend to the same keys, the ones batch row 2 wrote
    ref = fn(**dict(a, k=None, v=None, cache_seqlens=a["cache_seqlens"] + 2), causal=True)
    assert torch.equal(out, ref)


def test_fa3_packed_new_keys_repeated_rows():
    """cu_seqlens_k_new rows of different lengths on one cache row: the overlap goes to the higher batch row."""
    kc, vc = torch.randn(2, 12, 2, 16), torch.randn(2, 12, 2, 16)
    before = kc.clone(), vc.clone()
    counts, lens, rows = [3, 1, 2], [2, 0, 3], [1, 0, 1]
    k, v = torch.randn(6, 2, 16), torch.randn(6, 2, 16)
    cu = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
    fa3.flash_attn_with_kvcache(torch.randn(3, 1, 4, 16), kc, vc, k, v, cache_seqlens=torch.tensor(lens).int(),
                                cache_batch_idx=torch.tensor(rows).int(), cu_seqlens_k_new=cu, causal=True)
    pad = lambda x: torch.stack([torch.cat([x[s:e], x.new_zeros(3 - (e - s), *x.shape[1:])])  # noqa: E731
                                 for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())])
    assert torch.equal(kc, expected_cache(before[0], pad(k), lens, rows, counts))
    assert torch.equal(vc, expected_cache(before[1], pad(v), lens, rows, counts))
