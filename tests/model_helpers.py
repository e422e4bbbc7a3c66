"""What the module tests (test_nn_modules.py for GQA, test_nn_mla.py for MLA) share: model pieces,
inputs, cache construction, and the cached-inference test bodies that hold for every attention module
with a cache (the module and its caches are passed in)."""
import torch
from torch import nn

from attn_ops.nn import PagedKVCache, PagedLatentKVCache
from reference import assert_close_to_ref


class Stack(nn.Module):
    """Residual stack of attention layers sharing one cache (layer i uses layer_idx=i)."""

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x, positions=None, cache=None):
        for i, layer in enumerate(self.layers):
            x = x + layer(x, positions=positions, cache=cache, layer_idx=i)
        return x


def stack_of(build, name, dtype, device, layers=2):
    """A :class:`Stack` of ``layers`` modules ``build(name, dtype, device)``."""
    return Stack([build(name, dtype, device) for _ in range(layers)])


def rotate_half(x):
    """HF's rotate_half: ``[x1, x2] -> [-x2, x1]`` over the two halves of the last dim."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def randomize_vectors(mod):
    """Random norm weights and biases (nn.Linear's default init is fine for the weights): ``mod``."""
    with torch.no_grad():
        for p in mod.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.5)
    return mod


def rand_x(B, T, E, dtype, device):
    return (2 * torch.randn(B, T, E, device=device)).to(dtype)


def default_positions(B, T, device):
    return torch.arange(T, device=device).expand(B, T)


def make_cache_of(kind, B, capacity, contiguous, paged, spare_blocks=3):
    """A cache of ``kind``: ``"contig"`` -> ``contiguous(capacity)``; ``"paged<N>"`` (block size N) ->
    ``paged(num_blocks, N, max_blocks_per_seq)``, with ``spare_blocks`` blocks more than ``B`` full
    rows need."""
    if kind == "contig":
        return contiguous(capacity)
    bs = int(kind.replace("paged", ""))
    mb = -(-capacity // bs)
    return paged(B * mb + spare_blocks, bs, mb)


def cache_factory(make_cache, stack, dtype, device, kind=None):
    """``make_cache(kind, num_layers, B, capacity, module, dtype, device)`` for the layers of ``stack``:
    of ``kind``, or with the kind as first argument when ``kind`` is None."""
    if kind is None:
        return lambda kind, L, B, cap: make_cache(kind, L, B, cap, stack.layers[0], dtype, device)
    return lambda L, B, cap: make_cache(kind, L, B, cap, stack.layers[0], dtype, device)


def cached_step(model, x, cache):
    """One cached forward; a paged cache reserves the step's tokens first."""
    if isinstance(cache, (PagedKVCache, PagedLatentKVCache)):
        cache.reserve(x.shape[1])
    return model(x, cache=cache)


def gather_paged(cache_t, block_table, b, L):
    """The first L token rows of row b of a paged cache tensor [num_blocks, block_size, ...]."""
    bs = cache_t.shape[1]
    blocks = block_table[b, : -(-L // bs)].long()
    return cache_t[blocks].flatten(0, 1)[:L]


# --------------------------------------------------------------------------------------------------
# Cached-inference test bodies
# --------------------------------------------------------------------------------------------------
def check_prefill_then_decode(stack, make_cache, ref_stack_forward, dtype, device, full_tol):
    """Prefill in two chunks (8 + 5 tokens), then decode 7 tokens one at a time, through ``stack``
    sharing one cache (``make_cache(num_layers, B, capacity)``): every step's output equals the
    full-sequence forward at its positions (within ``full_tol``; ``None`` skips that comparison) and
    the reference by the tolerance rule."""
    E = stack.layers[0].hidden_size
    B, chunks = 3, [8, 5] + [1] * 7
    T = sum(chunks)
    x = rand_x(B, T, E, dtype, device)
    pos = default_positions(B, T, device)
    cache = make_cache(len(stack.layers), B, T + 3)
    outs, s = [], 0
    with torch.no_grad():
        full = stack(x)
        for n in chunks:
            outs.append(cached_step(stack, x[:, s:s + n], cache))
            s += n
            assert cache.lengths().tolist() == [s] * B
        ref64 = ref_stack_forward(stack, x, pos, torch.float64)
        same = ref_stack_forward(stack, x, pos, dtype)
    cached = torch.cat(outs, dim=1)
    assert_close_to_ref(cached, ref64, same, name="cached")
    if full_tol is not None:
        torch.testing.assert_close(cached, full, rtol=full_tol, atol=full_tol)


def check_ragged_prompts_right_padded(stack, make_cache, dtype, device, tol):
    """Rows with different prompt lengths in one batch: right-pad, prefill, truncate to the prompt
    lengths, decode; each row equals its own unpadded full-sequence forward."""
    E = stack.layers[0].hidden_size
    lens, P, n_dec = [11, 4, 8], 11, 5
    B = len(lens)
    xp = rand_x(B, P, E, dtype, device)          # the padding is random too
    xd = rand_x(B, n_dec, E, dtype, device)
    cache = make_cache(len(stack.layers), B, P + n_dec)
    with torch.no_grad():
        pre = cached_step(stack, xp, cache)
        cache.truncate(lens)
        assert cache.lengths().tolist() == lens
        if hasattr(cache, "row_blocks"):
            assert [len(cache.row_blocks(b)) for b in range(B)] == [
                -(-L // cache.block_size) for L in lens]
        dec = torch.cat([cached_step(stack, xd[:, t:t + 1], cache) for t in range(n_dec)], dim=1)
        assert cache.lengths().tolist() == [L + n_dec for L in lens]
        for b, L in enumerate(lens):
            full = stack(torch.cat([xp[b:b + 1, :L], xd[b:b + 1]], dim=1))
            torch.testing.assert_close(pre[b:b + 1, :L], full[:, :L], rtol=tol, atol=tol)
            torch.testing.assert_close(dec[b:b + 1], full[:, L:], rtol=tol, atol=tol)


def check_paged_equals_contiguous(stack, make_cache, block_size, storage, device):
    """Prefill 21 tokens then decode 4 through a contiguous and a paged cache (``make_cache(kind,
    num_layers, B, capacity)``): the same outputs, lengths and stored rows (``storage(cache, layer)``:
    the layer's storage tensors); the paged rows' blocks interleave."""
    dtype = torch.float32
    E = stack.layers[0].hidden_size
    B, P, n_dec = 3, 21, 4
    L = P + n_dec
    x = rand_x(B, L, E, dtype, device)
    contig = make_cache("contig", len(stack.layers), B, L)
    paged = make_cache(f"paged{block_size}", len(stack.layers), B, L)
    with torch.no_grad():
        for s, e in [(0, P)] + [(P + t, P + t + 1) for t in range(n_dec)]:
            oc = cached_step(stack, x[:, s:e], contig)
            op = cached_step(stack, x[:, s:e], paged)
            torch.testing.assert_close(op, oc, rtol=1e-6, atol=1e-6)
    assert paged.lengths().tolist() == contig.lengths().tolist() == [L] * B
    rows = [paged.row_blocks(b) for b in range(B)]
    if block_size < L:  # the blocks are interleaved between the rows, not one contiguous run per row
        assert any(r != list(range(r[0], r[0] + len(r))) for r in rows)
    assert sorted(sum(rows, [])) == sorted(set(sum(rows, [])))
    for layer in range(len(stack.layers)):
        for b in range(B):
            for pc, cc in zip(storage(paged, layer), storage(contig, layer)):
                got = gather_paged(pc, paged.block_table, b, L)
                if layer == 0:   # same inputs, same ops: the same bits
                    assert torch.equal(got, cc[b, :L])
                else:
                    torch.testing.assert_close(got, cc[b, :L], rtol=1e-6, atol=1e-6)
