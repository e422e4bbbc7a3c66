"""Independent references and input builders for the MLA ops (docs/mla_api.md).

References, in plain PyTorch:
- the latent-cache appends are written as plain indexing (a copy is exact: the tests compare bits);
- mla_decode is computed the direct way, one batch row at a time: gather the row's first
  cache_seqlens[b] latent rows (contiguous, or through block_table), split them into c_kv and k_pe,
  scores = scale * (q_latent . c_kv + q_rope . k_pe), bottom-right causal mask when asked, softmax,
  out_latent = P c_kv, lse. The softmax is written out here (not reference.attention_ref), so the
  direct form and the expanded form below share no code path but the mask rule;
- mla_decode_expanded_ref: the same attention in the naive (non-absorbed) form of docs/mla_api.md
  "MLA, precisely": per-head keys k_h = [W_UK_h c_kv ; k_pe], values v_h = W_UV_h c_kv and queries
  [q_nope_h ; q_rope_h], run through reference.attention_ref. W_UV_h applied to the absorbed
  out_latent must give its output (absorb_query / apply_w_uv build the absorbed inputs / outputs).
"""

import torch

from kvcache_reference import gather_cache_row, shuffled_block_table
from reference import NEG_INF, attention_ref, visible_mask


# --------------------------------------------------------------------------------------------------
# Latent-cache appends (in place on the given tensor: apply them to a clone)
# --------------------------------------------------------------------------------------------------
def mla_cache_append_ref_(latent_cache, c_kv, k_pe, cache_seqlens):
    """Contiguous: latent_cache[b, cache_seqlens[b] + t] = [c_kv[b, t] ; k_pe[b, t]]."""
    d_c, T = c_kv.shape[-1], c_kv.shape[1]
    for b, L in enumerate(cache_seqlens.cpu().tolist()):
        latent_cache[b, L:L + T, :d_c] = c_kv[b]
        latent_cache[b, L:L + T, d_c:] = k_pe[b]


def paged_mla_cache_append_ref_(latent_cache, c_kv, k_pe, slot_mapping):
    """Paged: token i goes to block slot // block_size, offset slot % block_size; -1 skips it."""
    d_c, bs = c_kv.shape[-1], latent_cache.shape[1]
    for i, s in enumerate(slot_mapping.cpu().tolist()):
        if s == -1:
            continue
        latent_cache[s // bs, s % bs, :d_c] = c_kv[i]
        latent_cache[s // bs, s % bs, d_c:] = k_pe[i]


# --------------------------------------------------------------------------------------------------
# mla_decode, direct (absorbed) form
# --------------------------------------------------------------------------------------------------
def _softmax_rows(s, vis, p_dtype=None):
    """(P, lse) of scores s [..., Tk] restricted to vis; rows without a visible key: P = 0,
    lse = -inf. With p_dtype, exp(s - max) is rounded to it before the division by the (unrounded) sum, as
    the kernels round P."""
    if s.shape[-1] == 0:
        return s.clone(), s.new_full(s.shape[:-1], NEG_INF)
    masked = torch.where(vis, s, torch.full_like(s, NEG_INF))
    m = masked.amax(dim=-1, keepdim=True)
    # 0 for rows without a visible key or with only -inf scores (weight 0 each); NaN / +inf stay: NaN row
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.where(vis, torch.exp(masked - m), torch.zeros_like(s))
    l = e.sum(dim=-1, keepdim=True)
    has = l != 0
    p = (e if p_dtype is None else e.to(p_dtype).to(e.dtype)) / torch.where(has, l, torch.ones_like(l))
    lse = torch.where(has, m + torch.log(torch.where(has, l, torch.ones_like(l))),
                      torch.full_like(l, NEG_INF))
    return p, lse.squeeze(-1)


def mla_decode_ref(q_latent, q_rope, latent_cache, cache_seqlens, *, scale, block_table=None,
                   causal=True, compute_dtype=torch.float64, p_dtype=None):
    """(out_latent [B, Tq, H, d_c], lse [B, H, Tq]) in compute_dtype, one batch row at a time (p_dtype: as
    _softmax_rows)."""
    B, Tq, H, d_c = q_latent.shape
    cdt = compute_dtype
    outs, lses = [], []
    for b, L in enumerate(cache_seqlens.cpu().tolist()):
        rows = gather_cache_row(latent_cache, b, L, block_table).to(cdt)   # [L, d_c + d_rope]
        # plain 2-D matmuls on contiguous operands (CPU's batched low-precision bmm is very slow)
        c_kv, k_pe = rows[:, :d_c].contiguous(), rows[:, d_c:].contiguous()
        ql = q_latent[b].to(cdt).reshape(Tq * H, d_c)                      # [(Tq, H), d_c]
        qr = q_rope[b].to(cdt).reshape(Tq * H, q_rope.shape[-1])          # [(Tq, H), d_rope]
        s = (torch.mm(ql, c_kv.t()) + torch.mm(qr, k_pe.t())) * scale      # [(Tq, H), L]
        s = s.reshape(Tq, H, L).permute(1, 0, 2)                           # [H, Tq, L]
        vis = visible_mask(Tq, L, causal=causal, device=s.device).expand(H, Tq, L)
        p, lse = _softmax_rows(s, vis, p_dtype)                            # [H, Tq, L], [H, Tq]
        o = torch.mm(p.permute(1, 0, 2).reshape(Tq * H, L), c_kv)          # [(Tq, H), d_c]
        outs.append(o.reshape(Tq, H, d_c))
        lses.append(lse)
    if not outs:
        return (q_latent.new_zeros(0, Tq, H, d_c, dtype=cdt), q_latent.new_zeros(0, H, Tq, dtype=cdt))
    return torch.stack(outs, 0), torch.stack(lses, 0)


# --------------------------------------------------------------------------------------------------
# Expanded (naive) form
# --------------------------------------------------------------------------------------------------
def absorb_query(q_nope, w_uk):
    """q_latent_h = W_UK_h^T q_nope_h: q_nope [B, Tq, H, d_nope], W_UK [H, d_nope, d_c]."""
    return torch.einsum("bthn,hnc->bthc", q_nope, w_uk)


def apply_w_uv(out_latent, w_uv):
    """out_h = W_UV_h o_h: out_latent [B, Tq, H, d_c], W_UV [H, d_v, d_c] -> [B, Tq, H, d_v]."""
    return torch.einsum("bthc,hvc->bthv", out_latent, w_uv)


def mla_decode_expanded_ref(q_nope, q_rope, w_uk, w_uv, latent_cache, cache_seqlens, *, scale,
                            block_table=None, causal=True):
    """The naive MLA attention in float64: (out [B, Tq, H, d_v], lse [B, H, Tq]) from
    reference.attention_ref on per-head expanded keys and values."""
    d_c = w_uk.shape[-1]
    f64 = torch.float64
    q = torch.cat([q_nope.to(f64), q_rope.to(f64)], dim=-1)               # [B, Tq, H, d_nope + d_rope]
    w_uk, w_uv = w_uk.to(f64), w_uv.to(f64)
    H = q.shape[2]
    outs, lses = [], []
    for b, L in enumerate(cache_seqlens.cpu().tolist()):
        rows = gather_cache_row(latent_cache, b, L, block_table).to(f64)
        c_kv, k_pe = rows[:, :d_c], rows[:, d_c:]
        k_nope = torch.einsum("hnc,jc->jhn", w_uk, c_kv)                   # [L, H, d_nope]
        k = torch.cat([k_nope, k_pe.unsqueeze(1).expand(L, H, k_pe.shape[-1])], dim=-1)
        v = torch.einsum("hvc,jc->jhv", w_uv, c_kv)                        # [L, H, d_v]
        o, l = attention_ref(q[b:b + 1], k.unsqueeze(0), v.unsqueeze(0), scale=scale,
                             causal=causal)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs, 0), torch.cat(lses, 0)


# --------------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------------
def mla_inputs(B, Tq, H, d_c, d_rope, lens, *, dtype=torch.float32, device="cpu", capacity=None,
               block_size=None, extra_blocks=3, q_layout="contiguous", cache_layout="contiguous"):
    """q_latent [B, Tq, H, d_c], q_rope [B, Tq, H, d_rope], a latent cache (contiguous
    [B, capacity, d_c + d_rope], or paged with shuffled blocks when block_size is given) that is
    random everywhere (entries past a row's length too: a kernel that reads them gets a wrong
    result), cache_seqlens int32. Returns (q_latent, q_rope, latent_cache, seqlens, block_table or
    None, dense [B, capacity, d_c + d_rope] copy of the logical cache).

    q_layout: contiguous | transposed (a [B, H, Tq, D] tensor transposed) | sliced (views into one
      [B, Tq, H, d_c + d_rope + 3] projection output: q_latent = [..., :d_c], q_rope = next d_rope)
    cache_layout: contiguous | sliced (the first d_c + d_rope columns of a wider buffer)
    """
    assert len(lens) == B
    W = d_c + d_rope
    if capacity is None:
        capacity = max(list(lens) + [1]) + 5
    if block_size is not None:
        capacity = -(-capacity // block_size) * block_size
    if q_layout == "contiguous":
        ql = torch.randn(B, Tq, H, d_c, dtype=dtype, device=device)
        qr = torch.randn(B, Tq, H, d_rope, dtype=dtype, device=device)
    elif q_layout == "transposed":
        ql = torch.randn(B, H, Tq, d_c, dtype=dtype, device=device).transpose(1, 2)
        qr = torch.randn(B, H, Tq, d_rope, dtype=dtype, device=device).transpose(1, 2)
    elif q_layout == "sliced":
        base = torch.randn(B, Tq, H, W + 3, dtype=dtype, device=device)
        ql, qr = base[..., :d_c], base[..., d_c:W]
    else:
        raise ValueError(q_layout)
    dense = torch.randn(B, capacity, W, dtype=dtype, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    if block_size is None:
        cache, bt = dense.clone(), None
    else:
        mb = capacity // block_size
        nb = B * mb + extra_blocks
        bt = shuffled_block_table(B, mb, nb, device)
        cache = torch.randn(nb, block_size, W, dtype=dtype, device=device)
        cache[bt.long().reshape(-1)] = dense.reshape(B * mb, block_size, W)
    if cache_layout == "sliced":
        buf = torch.randn(*cache.shape[:-1], W + 5, dtype=dtype, device=device)
        buf[..., :W] = cache
        cache = buf[..., :W]
    elif cache_layout != "contiguous":
        raise ValueError(cache_layout)
    return ql, qr, cache, seqlens, bt, dense
