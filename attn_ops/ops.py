"""Typed Python wrappers over ``torch.ops.attn_ops.*``.

The operators, their autograd (registered in C++ at the Autograd key) and their Meta kernels (for
fake tensors and ``torch.compile`` with dynamic shapes) all live in the compiled library; these
functions only give them Python signatures and documentation.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    sinks: Optional[Tensor] = None,
    attention_chunk: int = 0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Scaled dot-product attention with multi-head, grouped-query or multi-query heads.

    Layout is ``[batch, seqlen, heads, head_dim]`` (BSHD, as FlashAttention):

    * ``q``: ``[B, Tq, Hq, Dqk]``, ``k``: ``[B, Tk, Hkv, Dqk]``, ``v``: ``[B, Tk, Hkv, Dv]``, with
      ``Hq % Hkv == 0``. Query head ``h`` reads KV head ``h // (Hq // Hkv)``; K/V are never
      repeated in memory. ``Dqk`` and ``Dv`` may differ (e.g. 192 / 128 for DeepSeek MLA training).
    * Any strides on the first three dims are read in place (a ``[B, H, T, D]`` tensor transposed
      to BSHD is not copied); the last dim must have stride 1.
    * Packed variable-length batches: pass ``q`` ``[total_q, Hq, Dqk]``, ``k``/``v``
      ``[total_k, Hkv, D]`` and ``cu_seqlens_q`` / ``cu_seqlens_k`` (int32, ``[B + 1]``, starting at
      0, non-decreasing, ending at the token totals). Empty sequences are allowed.
      ``max_seqlen_q`` / ``max_seqlen_k`` are optional hints (they must not be smaller than the
      longest sequence).

    Args:
        scale: logit scale, default ``1 / sqrt(Dqk)``.
        causal: mask future keys, aligned bottom-right when ``Tq != Tk`` (query ``i`` sees keys
            ``j <= i + Tk - Tq``). Same as ``window_right=0``; it overrides ``window_right``.
        window_left, window_right: sliding window, query ``i`` sees keys
            ``i + Tk - Tq - window_left <= j <= i + Tk - Tq + window_right``; ``-1`` is unbounded.
        softcap: if > 0, logits become ``softcap * tanh(logits / softcap)`` (Gemma-2 style).
        sinks: attention sinks (gpt-oss), float32 or the input dtype ``[Hq]``: one logit per query
            head, in the units of the scaled (and soft-capped) logits. ``exp(sinks[h])`` joins every
            row's softmax denominator and adds nothing to the output; ``lse`` includes it (merge such
            partials with :func:`merge_attention_partials` only if exactly one of them carries the
            sink). Differentiable: the gradient is summed over batch and rows.
        attention_chunk: chunked-local attention (Llama 4) when > 0: the query at position
            ``p = i + Tk - Tq`` sees only keys ``j`` with ``j // attention_chunk == p // attention_chunk``
            (floor division), intersected with ``causal`` and the window.
        alibi_slopes: ALiBi (BLOOM, MPT), float32 ``[Hq]`` or ``[B, Hq]``: the logit of query ``i`` and
            key ``j`` gains ``-slope * |i + Tk - Tq - j|`` after soft-capping (FlashAttention 2's
            definition). Not differentiable: slopes that require grad are refused while grad mode is on.
        deterministic: the backward in a fixed summation order (also on when
            ``torch.are_deterministic_algorithms_enabled()``): on CUDA the kernels without atomics (and never
            cuDNN); the CPU backward always is. The forward is deterministic either way.

    Returns:
        ``(out, lse)``: ``out`` is ``[B, Tq, Hq, Dv]`` (``[total_q, Hq, Dv]`` for varlen) in the
        input dtype; ``lse`` is the natural-log sum of exponentials of each query row's logits
        (and sink), ``[B, Hq, Tq]`` (``[Hq, total_q]`` for varlen), float32 (float64 for float64
        inputs). A row that sees no key gives zeros and ``lse = -inf`` (``sinks[h]`` with sinks). Both
        outputs are differentiable, so results over different key chunks can be merged with their ``lse``
        during training too.

    Dtypes: float16, bfloat16, float32, float64 (accumulation in float32, float64 for float64).
    """
    return torch.ops.attn_ops.attention(
        q,
        k,
        v,
        scale=scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        sinks=sinks,
        attention_chunk=attention_chunk,
        alibi_slopes=alibi_slopes,
        deterministic=deterministic,
    )


def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    dlse: Optional[Tensor] = None,
    scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    attention_chunk: int = 0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv)`` of :func:`attention` (what autograd calls; exposed for custom graphs).

    ``out`` and ``lse`` are the forward's outputs for the same arguments; ``dout`` is the gradient of
    ``out`` and ``dlse`` (optional) the gradient of ``lse``. ``dk`` / ``dv`` are summed over the query
    heads of each KV group. The outputs have the shapes and dtypes of ``q``, ``k``, ``v``. A forward
    with ``sinks`` needs nothing more here: its ``out`` and ``lse`` already include them (the sinks'
    own gradient is computed by autograd from ``out``, ``lse``, ``dout`` and ``dlse``).
    """
    return torch.ops.attn_ops.attention_backward(
        dout,
        q,
        k,
        v,
        out,
        lse,
        dlse=dlse,
        scale=scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        attention_chunk=attention_chunk,
        alibi_slopes=alibi_slopes,
        deterministic=deterministic,
    )


def kv_cache_append(
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor,
    v: Tensor,
    cache_seqlens: Tensor,
    *,
    cache_batch_idx: Optional[Tensor] = None,
    k_scale: Optional[Tensor] = None,
    v_scale: Optional[Tensor] = None,
) -> None:
    """Write new keys/values into a contiguous KV cache, in place.

    ``k_cache`` ``[B, capacity, Hkv, Dk]``, ``v_cache`` ``[B, capacity, Hkv, Dv]``; ``k`` ``[B, Tnew, Hkv, Dk]``
    and ``v`` ``[B, Tnew, Hkv, Dv]`` are written at rows ``cache_seqlens[b] .. cache_seqlens[b] + Tnew - 1``
    (``cache_seqlens``: int32 ``[B]``). ``cache_seqlens`` itself is not changed: advance it after the call.
    With ``cache_batch_idx`` (int32 ``[B]``) the caches hold any number of rows (a pool) and row ``b`` of ``k``
    goes to cache row ``cache_batch_idx[b]``. Rows may repeat (FlashAttention's padding rows pointing at one spare
    row): where two batch rows write the same cache position, the higher batch row's token lands, on every
    backend; positions only one of them writes all land.
    8-bit caches (``torch.float8_e4m3fn`` / ``torch.float8_e5m2``, CPU; ``k`` / ``v`` float16, bfloat16 or
    float32) store ``saturate(k / k_scale)`` (and ``v / v_scale``) rounded to nearest even, saturating at the
    format's largest finite value (448 / 57344); NaN stays NaN. The scales are float32 tensors of one value
    (``[]`` or ``[1]``) or one per KV head (``[Hkv]``), default 1; give :func:`attention_with_kvcache` the same.
    Every check (shapes, dtypes, scales, capacity, batch indices) runs before anything is written.
    """
    torch.ops.attn_ops.kv_cache_append(
        k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx=cache_batch_idx, k_scale=k_scale, v_scale=v_scale
    )


def paged_kv_cache_append(
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor,
    v: Tensor,
    slot_mapping: Tensor,
    *,
    k_scale: Optional[Tensor] = None,
    v_scale: Optional[Tensor] = None,
) -> None:
    """Write tokens into a paged KV cache, in place (vLLM's layout).

    ``k_cache`` ``[num_blocks, block_size, Hkv, Dk]`` (any block size, 1 included), ``k`` ``[N, Hkv, Dk]``;
    token ``i`` goes to block ``slot_mapping[i] // block_size``, offset ``slot_mapping[i] % block_size``
    (int32 or int64; ``-1`` skips the token). The slots of one call should be distinct. 8-bit caches and
    ``k_scale`` / ``v_scale`` as in :func:`kv_cache_append`. Every check runs before anything is written.
    """
    torch.ops.attn_ops.paged_kv_cache_append(k_cache, v_cache, k, v, slot_mapping, k_scale=k_scale, v_scale=v_scale)


def attention_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Tensor,
    *,
    block_table: Optional[Tensor] = None,
    scale: Optional[float] = None,
    causal: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    attention_chunk: int = 0,
    alibi_slopes: Optional[Tensor] = None,
    num_splits: int = 0,
    k_scale: Optional[Tensor] = None,
    v_scale: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Attention of new queries over a KV cache: decode (``Tq = 1``), chunked prefill, speculative verification.

    ``q`` ``[B, Tq, Hq, D]`` holds the last ``Tq`` positions of each row; ``cache_seqlens`` (int32 ``[B]``)
    counts the keys row ``b`` attends to, its ``Tq`` new ones included (append first, then attend). So query
    ``i`` of row ``b`` is at position ``cache_seqlens[b] - Tq + i`` and ``causal`` / windows align bottom-right
    as in :func:`attention`. The cache is contiguous (``k_cache`` ``[B, capacity, Hkv, D]``) or, with
    ``block_table`` (int32 ``[B, max_blocks_per_seq]``), paged (``k_cache`` ``[num_blocks, block_size, Hkv, D]``;
    key ``j`` of row ``b`` lives in block ``block_table[b, j // block_size]``). GQA/MQA by head counts, K/V
    never repeated. Long caches are split across threads and merged by their log-sum-exp.

    Serving batches: with ``cu_seqlens_q`` (int32 ``[B + 1]``) ``q`` is packed ``[total_q, Hq, D]`` and row ``b``
    has its own query count ``cu_seqlens_q[b + 1] - cu_seqlens_q[b]`` (decode and prefill rows in one call;
    ``max_seqlen_q`` optional); ``cache_batch_idx`` (int32 ``[B]``) makes row ``b`` read cache row
    ``cache_batch_idx[b]`` (of a pool with any number of rows; for a paged cache, block-table row);
    ``cache_leftpad`` (int32 ``[B]``) makes row ``b``'s keys the cache positions
    ``cache_leftpad[b] .. cache_seqlens[b] - 1``.

    ``sinks``, ``attention_chunk`` and ``alibi_slopes`` as in :func:`attention`; chunk and ALiBi positions are
    cache positions counted from ``cache_leftpad[b]``.

    ``num_splits``: the most pieces each row's keys are cut into for parallel work (0: automatic; 1: none, which
    makes a decode row's result independent of the other rows of the batch, bit for bit).

    8-bit caches (``torch.float8_e4m3fn`` / ``torch.float8_e5m2``, CPU so far; ``q`` float16, bfloat16 or
    float32): keys read as ``k_cache * k_scale`` and values as ``v_cache * v_scale`` (float32 ``[]``, ``[1]``
    or ``[Hkv]``, default 1), converted as they are read; ``q`` and the outputs keep their dtype.

    Returns ``(out [B, Tq, Hq, Dv], lse [B, Hq, Tq])`` (packed: ``out [total_q, Hq, Dv]``, ``lse [Hq, total_q]``);
    a row with an empty cache gives zeros and ``-inf``. Not differentiable (inference op).
    """
    return torch.ops.attn_ops.attention_with_kvcache(
        q,
        k_cache,
        v_cache,
        cache_seqlens,
        block_table=block_table,
        scale=scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q,
        cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad,
        sinks=sinks,
        attention_chunk=attention_chunk,
        alibi_slopes=alibi_slopes,
        num_splits=num_splits,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def rotary_cos_sin(
    max_positions: int,
    rotary_dim: int,
    theta: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device] = None,
) -> Tuple[Tensor, Tensor]:
    """The cos/sin tables of rotary embeddings: each ``[max_positions, rotary_dim // 2]``.

    Pair ``i`` rotates by ``p * theta ** (-2 i / rotary_dim)`` at position ``p`` (Llama/GPT-NeoX frequencies;
    the angles are computed in float64 and rounded once to ``dtype``).
    """
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    inv_freq = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    angles = torch.arange(max_positions, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def alibi_slopes(num_heads: int, *, device: Optional[torch.device] = None) -> Tensor:
    """The ALiBi slopes of ``num_heads`` heads as BLOOM and MPT use them: float32 ``[num_heads]``, for
    :func:`attention`'s ``alibi_slopes``.

    With ``n`` the largest power of two ``<= num_heads``, head ``h < n`` gets ``2 ** (-8 (h + 1) / n)``; the
    remaining heads take every other slope of the sequence for ``2 n`` heads, ``2 ** (-4 (2 i + 1) / n)``
    (the ALiBi paper's rule for head counts that are not powers of two). Computed in float64, rounded once.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    n = 1 << (num_heads.bit_length() - 1)
    exponents = torch.arange(1, n + 1, dtype=torch.float64, device=device) * (-8.0 / n)
    extra = torch.arange(num_heads - n, dtype=torch.float64, device=device) * 2 + 1
    exponents = torch.cat([exponents, extra * (-4.0 / n)])
    return torch.exp2(exponents).to(torch.float32)


def rotary_embedding(
    x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, *, interleaved: bool = False, inverse: bool = False
) -> Tensor:
    """Rotary position embedding of ``x`` ``[..., heads, head_dim]``, out of place and differentiable.

    ``positions`` (int32/int64) has ``x``'s leading dims (e.g. ``[B, T]`` for ``x`` ``[B, T, H, D]``);
    ``cos``/``sin`` are ``[max_positions, rotary_dim // 2]`` tables (see :func:`rotary_cos_sin`), float32 or
    ``x``'s dtype; the first ``rotary_dim`` features rotate, the rest pass through. ``interleaved=False``
    pairs ``(x[i], x[i + rotary_dim // 2])`` (HuggingFace ``rotate_half``); ``interleaved=True`` pairs
    ``(x[2i], x[2i + 1])`` (DeepSeek, GPT-J). ``inverse=True`` rotates by the negative angle (undoes the
    rotation).
    """
    return torch.ops.attn_ops.rotary_embedding(x, cos, sin, positions, interleaved=interleaved, inverse=inverse)


def rotary_embedding_(
    x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, *, interleaved: bool = False, inverse: bool = False
) -> None:
    """In-place :func:`rotary_embedding` (inference: rotate q / k just before they are cached). Not
    differentiable: with grad mode on it refuses tensors that require grad (use :func:`rotary_embedding`)."""
    torch.ops.attn_ops.rotary_embedding_(x, cos, sin, positions, interleaved=interleaved, inverse=inverse)


def mla_cache_append(
    latent_cache: Tensor,
    c_kv: Tensor,
    k_pe: Tensor,
    *,
    cache_seqlens: Optional[Tensor] = None,
    slot_mapping: Optional[Tensor] = None,
    cache_batch_idx: Optional[Tensor] = None,
    kv_scale: Optional[Tensor] = None,
) -> None:
    """Write MLA latent rows ``[c_kv ; k_pe]`` into a latent cache, in place.

    Contiguous (give ``cache_seqlens``, int32 ``[B]``): ``latent_cache`` ``[B, capacity, d_c + d_rope]``,
    ``c_kv`` ``[B, Tnew, d_c]``, ``k_pe`` ``[B, Tnew, d_rope]``, written at rows ``cache_seqlens[b] + t`` (the
    lengths are not changed). Paged (give ``slot_mapping``, int32/int64 ``[N]``, ``-1`` skips):
    ``latent_cache`` ``[num_blocks, block_size, d_c + d_rope]``, ``c_kv`` ``[N, d_c]``, ``k_pe`` ``[N, d_rope]``.
    With ``cache_batch_idx`` (contiguous only; int32 ``[B]``, distinct) row ``b`` goes to cache row
    ``cache_batch_idx[b]`` of a cache with any number of rows. An 8-bit ``latent_cache`` (``torch.float8_e4m3fn``
    / ``torch.float8_e5m2``, CPU) stores every column as ``saturate(x / kv_scale)`` (float32 ``[]`` or ``[1]``,
    default 1), as :func:`kv_cache_append` does. Every check runs before anything is written.
    """
    torch.ops.attn_ops.mla_cache_append(latent_cache, c_kv, k_pe, cache_seqlens=cache_seqlens,
                                        slot_mapping=slot_mapping, cache_batch_idx=cache_batch_idx,
                                        kv_scale=kv_scale)


def mla_decode(
    q_latent: Tensor,
    q_rope: Tensor,
    latent_cache: Tensor,
    cache_seqlens: Tensor,
    *,
    scale: float,
    block_table: Optional[Tensor] = None,
    causal: bool = True,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    kv_scale: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Absorbed MLA attention (DeepSeek-V2/V3 inference) over a latent cache.

    ``q_latent`` ``[B, Tq, H, d_c]`` (``W_UK^T q_nope`` per head) and ``q_rope`` ``[B, Tq, H, d_rope]`` attend to
    the first ``cache_seqlens[b]`` rows of ``latent_cache`` (contiguous ``[B, capacity, d_c + d_rope]``, or paged
    ``[num_blocks, block_size, d_c + d_rope]`` with ``block_table``): score ``= scale * (q_latent . c_kv +
    q_rope . k_pe)``, output ``sum_j p_j c_kv_j`` in latent space (apply ``W_UV`` after). The queries are the
    last ``Tq`` positions (bottom-right causal). ``scale`` is required: DeepSeek uses
    ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``.

    ``cu_seqlens_q``, ``max_seqlen_q``, ``cache_batch_idx`` and ``cache_leftpad`` work as in
    :func:`attention_with_kvcache` (packed ``q_latent`` ``[total_q, H, d_c]`` / ``q_rope`` ``[total_q, H, d_rope]``).
    An 8-bit ``latent_cache`` reads as ``latent_cache * kv_scale`` (every column, latent and rope alike).

    Returns ``(out_latent [B, Tq, H, d_c], lse [B, H, Tq])`` (packed: ``[total_q, H, d_c]``, ``[H, total_q]``).
    Not differentiable (inference op).
    """
    return torch.ops.attn_ops.mla_decode(q_latent, q_rope, latent_cache, cache_seqlens, scale=scale,
                                         block_table=block_table, causal=causal, cu_seqlens_q=cu_seqlens_q,
                                         max_seqlen_q=max_seqlen_q, cache_batch_idx=cache_batch_idx,
                                         cache_leftpad=cache_leftpad, kv_scale=kv_scale)


def additive_attention(
    qp: Tensor,
    kp: Tensor,
    w: Tensor,
    v: Tensor,
    *,
    key_padding_mask: Optional[Tensor] = None,
    return_weights: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Additive (Bahdanau) attention, fused: ``score_ij = w . tanh(qp_i + kp_j)``, softmax over ``j``,
    ``out_i = sum_j p_ij v_j``.

    ``qp`` ``[B, Tq, A]`` and ``kp`` ``[B, Tk, A]`` are the already projected queries and keys
    (``W_q q``, ``W_k k``, biases included), ``w`` ``[A]``, ``v`` ``[B, Tk, Dv]``. Keys are streamed with an
    online softmax: no ``[B, Tq, Tk, A]`` (nor ``[B, Tq, Tk]``) tensor is built, forward or backward.
    ``key_padding_mask``: bool ``[B, Tk]``, True marks a padded key to ignore (as ``nn.MultiheadAttention``).

    Returns ``(out [B, Tq, Dv], lse [B, Tq], weights)``. ``lse`` is the log-sum-exp of each row's scores,
    float32 (float64 for float64 inputs); a row whose keys are all padded gives zeros and ``lse = -inf``.
    ``weights`` is the softmax ``[B, Tq, Tk]`` when ``return_weights`` (it then costs ``B*Tq*Tk`` memory),
    else an empty ``[0]`` tensor; the op always has three outputs so that it traces with a fixed schema.
    ``out`` and ``lse`` are differentiable (``qp``, ``kp``, ``w``, ``v``); ``weights`` is not.

    Dtypes: float16, bfloat16, float32, float64 (float32 accumulation, float64 for float64).
    """
    return torch.ops.attn_ops.additive_attention(qp, kp, w, v, key_padding_mask=key_padding_mask,
                                                 return_weights=return_weights)


def lightning_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slope: Tensor,
    *,
    scale: float = 1.0,
    initial_state: Optional[Tensor] = None,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
    block_size: Optional[int] = None,
) -> Tuple[Tensor, Tensor]:
    """Lightning attention: causal linear attention with a per-head exponential decay (MiniMax-Text-01).

    Per query head ``h`` with ``a = exp(-slope[h])``: ``S_t = a * S_{t-1} + k_t^T v_t`` (state ``[Dk, Dv]``)
    and ``out_t = scale * q_t S_t``, from ``S_0 = initial_state`` (zeros when absent). No softmax.

    * ``q`` ``[B, T, H, Dk]``, ``k`` ``[B, T, Hk, Dk]``, ``v`` ``[B, T, Hk, Dv]`` with ``H % Hk == 0`` (query
      head ``h`` reads K/V head ``h // (H // Hk)``; the state stays per query head). Packed varlen:
      ``[total, heads, D]`` tensors with ``cu_seqlens`` (int32 ``[B + 1]``), one state per sequence.
    * ``slope``: float32 ``[H]``, finite and ``>= 0`` (0 is plain causal linear attention). It gets no gradient.
    * ``initial_state``: ``[B, H, Dk, Dv]`` float32 (float64 for float64 inputs); differentiable.
    * ``block_size``: block length of the chunked algorithm (default 64); the result does not depend on it
      beyond rounding.

    Returns ``(out [B, T, H, Dv] in q's dtype, final_state [B, H, Dk, Dv] float32)``; both differentiable
    with respect to q, k, v and initial_state. Memory is linear in T. See docs/lightning_api.md.
    """
    return torch.ops.attn_ops.lightning_attention(
        q, k, v, slope, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen, block_size=block_size)


def lightning_attention_decode_(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: Tensor,
    slope: Tensor,
    *,
    scale: float = 1.0,
    state_indices: Optional[Tensor] = None,
) -> Tensor:
    """Advance a lightning-attention state pool in place over ``Tq >= 1`` new tokens and return their output.

    ``q`` ``[B, Tq, H, Dk]``, ``k``/``v`` ``[B, Tq, Hk, Dk/Dv]``, ``state`` ``[N, H, Dk, Dv]`` (float32, float64
    for float64 inputs), ``slope`` float32 ``[H]``. Row ``b`` reads and updates slot ``state_indices[b]`` (int32
    ``[B]``; ``-1`` skips the row, whose output is zeros; a slot may appear once); without ``state_indices``,
    ``N == B`` and row ``b`` uses slot ``b``. Decode (``Tq = 1``), chunked prefill into an existing state and
    speculative verification are the same call. Every check runs before the state is written. Not
    differentiable; ``state`` must not require grad.
    """
    return torch.ops.attn_ops.lightning_attention_decode_(q, k, v, state, slope, scale=scale,
                                                          state_indices=state_indices)


# The backward ops of the other families, exposed as attention_backward is (for custom graphs), so
# that every schema argument is reachable from Python.
def additive_attention_backward(
    dout: Tensor,
    dlse: Optional[Tensor],
    qp: Tensor,
    kp: Tensor,
    w: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    key_padding_mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients ``(dqp, dkp, dw, dv)`` of :func:`additive_attention` (what autograd calls). ``out`` /
    ``lse`` are the forward's outputs for the same arguments, ``dout`` / ``dlse`` (optional) their
    gradients. The outputs have the shapes and dtypes of ``qp``, ``kp``, ``w``, ``v``."""
    return torch.ops.attn_ops.additive_attention_backward(dout, dlse, qp, kp, w, v, out, lse,
                                                          key_padding_mask=key_padding_mask)


def lightning_attention_backward(
    dout: Tensor,
    dfinal_state: Optional[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slope: Tensor,
    *,
    scale: float = 1.0,
    initial_state: Optional[Tensor] = None,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
    block_size: Optional[int] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv, dinitial_state)`` of :func:`lightning_attention` (what autograd calls)
    for the same arguments; ``dout`` / ``dfinal_state`` (optional) are the gradients of its two
    outputs. ``dinitial_state`` is returned even without ``initial_state`` (the gradient of a zero
    initial state)."""
    return torch.ops.attn_ops.lightning_attention_backward(
        dout, dfinal_state, q, k, v, slope, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen, block_size=block_size)
