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

    Returns:
        ``(out, lse)``: ``out`` is ``[B, Tq, Hq, Dv]`` (``[total_q, Hq, Dv]`` for varlen) in the
        input dtype; ``lse`` is the natural-log sum of exponentials of each query row's logits,
        ``[B, Hq, Tq]`` (``[Hq, total_q]`` for varlen), float32 (float64 for float64 inputs). A row
        that sees no key gives zeros and ``lse = -inf``. Both outputs are differentiable, so results
        over different key chunks can be merged with their ``lse`` during training too.

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
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv)`` of :func:`attention` (what autograd calls; exposed for custom graphs).

    ``out`` and ``lse`` are the forward's outputs for the same arguments; ``dout`` is the gradient of
    ``out`` and ``dlse`` (optional) the gradient of ``lse``. ``dk`` / ``dv`` are summed over the query
    heads of each KV group. The outputs have the shapes and dtypes of ``q``, ``k``, ``v``.
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
    )
