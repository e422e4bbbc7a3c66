"""Attention modules built on the attn_ops operators: grouped-query (GQA), multi-query (MQA) and
multi-head (MHA) self-attention with rotary position embeddings, for training and for cached
inference (the caches of :mod:`attn_ops.caches`).
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor, nn

from .. import ops as _ops
from .._checks import check_positive
from ._rotary import RotaryTables, positions_for, rotate
from ..caches import KVCache, PagedKVCache

__all__ = ["GroupedQueryAttention", "MultiQueryAttention", "MultiHeadAttention"]


class GroupedQueryAttention(RotaryTables):
    """Causal grouped-query self-attention with RoPE, laid out like HuggingFace's Llama / Mistral /
    Qwen2 attention (so their checkpoints' weights load by name).

    Parameters: ``q_proj`` (``hidden_size -> num_heads * head_dim``), ``k_proj`` / ``v_proj``
    (``hidden_size -> num_kv_heads * head_dim``), all with a bias when ``bias=True`` (Qwen2), and
    ``o_proj`` (``num_heads * head_dim -> hidden_size``, no bias). Query head ``h`` reads KV head
    ``h // (num_heads // num_kv_heads)``; K/V are never repeated in memory.

    Rotary embedding: non-persistent buffers ``rope_cos`` / ``rope_sin``
    (``[max_position_embeddings, head_dim // 2]``) from :func:`attn_ops.rotary_cos_sin`; the
    half-split (``rotate_half``, Llama) convention, or pairs ``(2i, 2i+1)`` with
    ``rope_interleaved=True`` (GPT-J / DeepSeek). The tables stay float32 when the module is cast to
    float16 / bfloat16 (float64 for a float64 module); the rotation is computed in float32.

    Sliding window: ``sliding_window=W`` means what it means in HuggingFace Mistral / Qwen2: a query
    sees the ``W`` most recent keys, itself included (key ``j`` visible to query ``i`` iff
    ``i - W < j <= i``), i.e. the ops' ``window_left = W - 1``. ``None`` is unbounded.

    Args:
        hidden_size: model width ``E``.
        num_heads, num_kv_heads: query and key/value heads (``num_heads % num_kv_heads == 0``).
        head_dim: defaults to ``hidden_size // num_heads``; must be even.
        bias: bias on ``q_proj`` / ``k_proj`` / ``v_proj``.
        rope_theta, max_position_embeddings: the rotary base and table length (positions must be
            below it).
        softmax_scale: logit scale, default ``1 / sqrt(head_dim)`` (keyword-only; HF's ``scaling``).
        sinks: learned attention sinks as gpt-oss has them (keyword-only): a parameter ``sinks``
            ``[num_heads]``, initialised to 0, whose ``exp(sinks[h])`` joins every softmax denominator of
            head ``h`` (:func:`attn_ops.attention`'s ``sinks``); gpt-oss checkpoints load it by name.
        attention_chunk: chunked-local attention as Llama 4's chunked layers (keyword-only; 0: none): a
            query at position ``p`` sees only keys at positions ``p // C * C .. p``.
        alibi: ALiBi instead of rotary embeddings, as BLOOM and MPT (keyword-only): no rotation, and the
            logit of query ``p`` and key ``j`` of head ``h`` gains ``-m_h * (p - j)`` with the slopes
            ``m`` of :func:`attn_ops.alibi_slopes` (``num_heads`` of them; the property
            :attr:`alibi_slopes`).

    :meth:`from_linear` wraps a model's existing projections (docs/module_swap.md);
    :func:`attn_ops.tensor_parallel` shards the heads over ranks (docs/distributed.md).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: Optional[int] = None,
                 bias: bool = False, rope_theta: float = 10000.0, sliding_window: Optional[int] = None,
                 rope_interleaved: bool = False, max_position_embeddings: int = 4096, device=None,
                 dtype=None, *, softmax_scale: Optional[float] = None, sinks: bool = False,
                 attention_chunk: int = 0, alibi: bool = False):
        super().__init__()
        check_positive("hidden_size", hidden_size)
        check_positive("num_heads", num_heads)  # before the division below (0 raised ZeroDivisionError)
        check_positive("max_position_embeddings", max_position_embeddings)
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of num_heads ({num_heads}) "
                                 f"when head_dim is not given")
            head_dim = hidden_size // num_heads
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads "
                             f"({num_kv_heads})")
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim must be even and >= 2 for rotary embeddings, got {head_dim}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
        if attention_chunk < 0:
            raise ValueError(f"attention_chunk must be >= 0 (0: no chunking), got {attention_chunk}")
        self.attention_chunk = int(attention_chunk)
        self.alibi = bool(alibi)
        # (heads of the model's layer, this module's first): a tensor-parallel shard's slopes are its heads' slice
        self._alibi_heads = (num_heads, 0)
        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_kv_heads
        self.head_dim = head_dim
        self.softmax_scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.rope_interleaved = bool(rope_interleaved)
        self.sliding_window = sliding_window
        fk = dict(device=device, dtype=dtype)
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias, **fk)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias, **fk)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias, **fk)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False, **fk)
        self.sinks = nn.Parameter(torch.zeros(num_heads, **fk)) if sinks else None
        self._init_rotary(head_dim, rope_theta, max_position_embeddings, dtype, device)

    @classmethod
    def from_linear(cls, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear, o_proj: nn.Linear, *,
                    num_heads: int, num_kv_heads: int, head_dim: Optional[int] = None,
                    rope_theta: float = 10000.0, sliding_window: Optional[int] = None,
                    rope_interleaved: bool = False, max_position_embeddings: int = 4096,
                    softmax_scale: Optional[float] = None) -> "GroupedQueryAttention":
        """A module that uses the given projections themselves (shared, not copied): the recipe for
        swapping a model's own attention module (docs/module_swap.md).

        ``q_proj`` must map ``hidden_size -> num_heads * head_dim``, ``k_proj`` / ``v_proj``
        ``hidden_size -> num_kv_heads * head_dim`` and ``o_proj`` ``num_heads * head_dim -> hidden_size``
        (``hidden_size = q_proj.in_features``; ``head_dim`` defaults to ``hidden_size // num_heads``), all on
        one device with one dtype. Biases are used where the given layers have them (``q`` / ``k`` /
        ``v`` as Qwen2; ``o_proj`` too). The output rows of ``q_proj`` / ``k_proj`` / ``v_proj`` are
        read head-major (head ``h`` is rows ``h * head_dim .. (h + 1) * head_dim - 1``), query head
        ``h`` reads KV head ``h // (num_heads // num_kv_heads)``. The other arguments are the
        constructor's. Always returns a :class:`GroupedQueryAttention` (MQA and MHA are head counts).
        """
        layers = dict(q_proj=q_proj, k_proj=k_proj, v_proj=v_proj, o_proj=o_proj)
        for name, layer in layers.items():
            if not isinstance(layer, nn.Linear):
                raise TypeError(f"{name} must be a torch.nn.Linear, got {type(layer).__name__}")
        hidden_size, w = q_proj.in_features, q_proj.weight
        module = GroupedQueryAttention(
            hidden_size, num_heads, num_kv_heads, head_dim, rope_theta=rope_theta,
            sliding_window=sliding_window, rope_interleaved=rope_interleaved,
            max_position_embeddings=max_position_embeddings, device="meta", dtype=w.dtype,
            softmax_scale=softmax_scale)
        q_dim, kv_dim = num_heads * module.head_dim, num_kv_heads * module.head_dim
        heads = f"num_heads * head_dim = {num_heads} * {module.head_dim}"
        kv_heads = f"num_kv_heads * head_dim = {num_kv_heads} * {module.head_dim}"
        expected = dict(q_proj=((q_dim, hidden_size), f"hidden_size -> {heads}"),
                        k_proj=((kv_dim, hidden_size), f"hidden_size -> {kv_heads}"),
                        v_proj=((kv_dim, hidden_size), f"hidden_size -> {kv_heads}"),
                        o_proj=((hidden_size, q_dim), f"{heads} -> hidden_size"))
        for name, layer in layers.items():
            shape, what = expected[name]
            if tuple(layer.weight.shape) != shape:
                raise ValueError(f"{name} must map {what} (hidden_size = q_proj.in_features = {hidden_size}): "
                                 f"weight of shape {list(shape)}, got {list(layer.weight.shape)}")
            for pname, p in layer.named_parameters():
                if p.dtype != w.dtype or p.device != w.device:
                    raise ValueError(f"{name}.{pname} must have the dtype and device of q_proj.weight "
                                     f"({w.dtype}, {w.device}), got {p.dtype}, {p.device}")
        for name, layer in layers.items():
            setattr(module, name, layer)
        table_dtype = torch.float64 if w.dtype == torch.float64 else torch.float32
        module.rope_cos, module.rope_sin = _ops.rotary_cos_sin(
            max_position_embeddings, module.head_dim, module.rope_theta, dtype=table_dtype, device=w.device)
        return module

    @property
    def alibi_slopes(self) -> Optional[Tensor]:
        """float32 ``[num_heads]``: the ALiBi slopes of this module's heads, or ``None`` without ALiBi. Computed
        when read (not a buffer, so casting the module cannot round them)."""
        if not self.alibi:
            return None
        total, first = self._alibi_heads
        return _ops.alibi_slopes(total, device=self.q_proj.weight.device)[first:first + self.num_heads]

    @property
    def window_left(self) -> int:
        """The ops' ``window_left`` for :attr:`sliding_window` (``-1`` when unbounded)."""
        return self.sliding_window - 1 if self.sliding_window is not None else -1

    def forward(self, x: Tensor, positions: Optional[Tensor] = None,
                cache: Optional[Union[KVCache, PagedKVCache]] = None, layer_idx: int = 0) -> Tensor:
        """``x [B, T, E] -> [B, T, E]``.

        Without a cache (training, full-sequence inference): ``positions`` (int ``[T]`` or ``[B, T]``)
        default to ``0 .. T-1``; RoPE by the differentiable :func:`attn_ops.rotary_embedding` (none with
        ``alibi``, which ignores ``positions``), then causal :func:`attn_ops.attention`. Gradients flow to
        ``x`` and every parameter.

        With a cache (inference; call it under ``torch.no_grad()`` / ``inference_mode``): the ``T``
        tokens of row ``b`` sit at cache positions ``cache.seqlens[b] + t``; ``positions`` defaults to
        those (give it only to rotate at other positions -- the tokens are stored after the row's
        current length regardless). ``q`` / ``k`` are rotated in place, ``k`` / ``v`` appended to layer
        ``layer_idx`` of the cache, and ``q`` attends causally over ``cache.seqlens + T`` keys. The
        layer with ``layer_idx == cache.num_layers - 1`` then advances ``cache.seqlens`` by ``T`` in
        place, so a forward through all the layers of a model advances the cache once; layers before
        it leave the lengths alone. Only tensor ops on the lengths: a decode step compiles with
        ``torch.compile(fullgraph=True)``. A :class:`~attn_ops.nn.PagedKVCache` needs
        ``cache.reserve(T)`` before the step.
        """
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        if not self.alibi:  # ALiBi's positions are the ops' (cache positions with a cache)
            cos, sin = self._tables(q.dtype)
            positions = positions_for(positions, B, T, x.device, cache)
            # with a cache, rotate in place (tensors that require grad still rotate out of place)
            rope = dict(interleaved=self.rope_interleaved, in_place=cache is not None)
            q, k = rotate(q, cos, sin, positions, **rope), rotate(k, cos, sin, positions, **rope)
        pattern = dict(sinks=self.sinks, attention_chunk=self.attention_chunk, alibi_slopes=self.alibi_slopes)
        if cache is None:
            out, _ = _ops.attention(q, k, v, scale=self.softmax_scale, causal=True,
                                    window_left=self.window_left, **pattern)
        else:
            cache.append(layer_idx, k, v)
            out = cache.attend(layer_idx, q, scale=self.softmax_scale, window_left=self.window_left, **pattern)
            if layer_idx == cache.num_layers - 1:
                cache.advance(T, B)
        return self.o_proj(out.reshape(B, T, self.num_heads * self.head_dim))

    def extra_repr(self) -> str:
        s = (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
             f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
             f"rope_theta={self.rope_theta:g}")
        if self.softmax_scale != 1.0 / math.sqrt(self.head_dim):
            s += f", softmax_scale={self.softmax_scale:.6g}"
        if self.rope_interleaved:
            s += ", rope_interleaved=True"
        if self.sliding_window is not None:
            s += f", sliding_window={self.sliding_window}"
        if self.sinks is not None:
            s += ", sinks=True"
        if self.attention_chunk:
            s += f", attention_chunk={self.attention_chunk}"
        if self.alibi:
            s += ", alibi=True"
        return s


class MultiQueryAttention(GroupedQueryAttention):
    """:class:`GroupedQueryAttention` with one key/value head shared by all query heads (MQA)."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: Optional[int] = None, **kwargs):
        super().__init__(hidden_size, num_heads, 1, head_dim, **kwargs)


class MultiHeadAttention(GroupedQueryAttention):
    """:class:`GroupedQueryAttention` with one key/value head per query head (MHA)."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: Optional[int] = None, **kwargs):
        super().__init__(hidden_size, num_heads, num_heads, head_dim, **kwargs)
