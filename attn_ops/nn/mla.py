"""DeepSeek-V2/V3 multi-head latent attention (MLA) on the attn_ops operators.

Per token (docs/mla_api.md, "MLA, precisely"): the query goes through a low-rank
path (``q_a_proj -> RMSNorm -> q_b_proj``, or one ``q_proj``) and splits per head into ``q_nope``
(``qk_nope_head_dim``) and ``q_pe`` (``qk_rope_head_dim``); ``kv_a_proj_with_mqa`` gives the latent
``c_kv`` (``kv_lora_rank``, then RMSNorm) and one rotary key ``k_pe`` shared by all heads;
``kv_b_proj`` expands ``c_kv`` into per-head ``k_nope`` and ``v``. Keys are ``[k_nope_h ; k_pe]``.

* Training / full-sequence inference: K/V are expanded and :func:`attn_ops.attention` runs with
  ``Dqk = nope + rope`` (192 at DeepSeek-V3 size) and ``Dv = v_head_dim`` (128); differentiable.
* Cached inference (absorbed form): only ``[c_kv ; k_pe]`` is cached (:class:`LatentKVCache`,
  :class:`PagedLatentKVCache`); ``W_UK`` is folded into the query (``q_latent_h = W_UK_h^T q_nope_h``),
  :func:`attn_ops.mla_decode` attends in latent space, ``W_UV`` and ``o_proj`` are applied after.
"""
from __future__ import annotations

import weakref
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .. import ops as _ops
from .._checks import check_positive
from ._norm import _RMSNorm
from ._rotary import RotaryTables, positions_for, rotate
from ..caches.latent import LatentKVCache, PagedLatentKVCache, _LatentCacheBase

__all__ = ["MultiHeadLatentAttention"]


class MultiHeadLatentAttention(RotaryTables):
    """Causal multi-head latent attention (DeepSeek-V2/V3), laid out like HuggingFace's
    ``DeepseekV3Attention`` so its checkpoints' attention weights load by name, unchanged.

    Parameters (``H = num_heads``, ``nope / rope / v`` the head dims, ``d_c = kv_lora_rank``):
    ``q_a_proj`` (``hidden -> q_lora_rank``, bias if ``attention_bias``), ``q_a_layernorm.weight``,
    ``q_b_proj`` (``q_lora_rank -> H * (nope + rope)``, no bias) -- or, with ``q_lora_rank=None``,
    ``q_proj`` (``hidden -> H * (nope + rope)``, no bias); ``kv_a_proj_with_mqa``
    (``hidden -> d_c + rope``, bias if ``attention_bias``), ``kv_a_layernorm.weight``, ``kv_b_proj``
    (``d_c -> H * (nope + v)``, no bias; per head the ``nope`` rows are ``W_UK_h``, the ``v`` rows
    ``W_UV_h``), ``o_proj`` (``H * v -> hidden``, bias if ``attention_bias``).

    Rotary embedding: interleaved pairs ``(2i, 2i + 1)`` on ``q_pe`` and ``k_pe`` only, as DeepSeek's
    reference code and HuggingFace with ``rope_interleave=True`` (its default for DeepSeek-V3). HF
    de-interleaves ``q_pe`` / ``k_pe`` (``view(d/2, 2).transpose``) before a ``rotate_half`` rotation; that
    permutes the rope features of ``q`` and ``k`` identically, so every score and the module output are
    the same as rotating the pairs in place (what this module does; only the stored ``k_pe`` is in the
    interleaved feature order). Tables: non-persistent ``rope_cos`` / ``rope_sin``
    ``[max_position_embeddings, rope / 2]`` from :func:`attn_ops.rotary_cos_sin`, kept in float32 when
    the module is cast to float16 / bfloat16. YaRN is the caller's: overwrite the tables and pass
    ``softmax_scale`` (``(nope + rope) ** -0.5 * mscale ** 2``).

    Args:
        hidden_size, num_heads, q_lora_rank (``None``: no query compression), kv_lora_rank,
        qk_nope_head_dim, qk_rope_head_dim (even), v_head_dim: the DeepSeek config fields.
        softmax_scale: logit scale, default ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``.
        rms_norm_eps: epsilon of the two RMSNorms (HF uses its default 1e-6 for them).

    Tensor parallel (heads sharded over ranks, latent cache replicated):
    :func:`attn_ops.tensor_parallel` gives a
    :class:`~attn_ops.nn.TensorParallelMultiHeadLatentAttention` (docs/distributed.md).
    """

    def __init__(self, hidden_size: int, num_heads: int, q_lora_rank: Optional[int], kv_lora_rank: int,
                 qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
                 rope_theta: float = 10000.0, max_position_embeddings: int = 4096,
                 softmax_scale: Optional[float] = None, attention_bias: bool = False,
                 rms_norm_eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads),
                            ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
                            ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim),
                            ("max_position_embeddings", max_position_embeddings)):
            check_positive(name, value)
        if q_lora_rank is not None:
            check_positive("q_lora_rank", q_lora_rank)
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for rotary embeddings, got {qk_rope_head_dim}")
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.q_lora_rank, self.kv_lora_rank = q_lora_rank, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.softmax_scale = float(softmax_scale) if softmax_scale is not None else self.qk_head_dim ** -0.5
        fk = dict(device=device, dtype=dtype)
        H = num_heads
        if q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, H * self.qk_head_dim, bias=False, **fk)
        else:
            self.q_a_proj = nn.Linear(hidden_size, q_lora_rank, bias=attention_bias, **fk)
            self.q_a_layernorm = _RMSNorm(q_lora_rank, rms_norm_eps, **fk)
            self.q_b_proj = nn.Linear(q_lora_rank, H * self.qk_head_dim, bias=False, **fk)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim,
                                            bias=attention_bias, **fk)
        self.kv_a_layernorm = _RMSNorm(kv_lora_rank, rms_norm_eps, **fk)
        self.kv_b_proj = nn.Linear(kv_lora_rank, H * (qk_nope_head_dim + v_head_dim), bias=False, **fk)
        self.o_proj = nn.Linear(H * v_head_dim, hidden_size, bias=attention_bias, **fk)
        self._init_rotary(qk_rope_head_dim, rope_theta, max_position_embeddings, dtype, device)
        # (key, weakref to kv_b_proj.weight, w_uk, w_uv): see absorbed_weights()
        self._absorbed: Optional[tuple] = None

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._absorbed = None  # the parameters have new storage anyway; drop the stale copies now
        return self

    def __getstate__(self):
        state = super().__getstate__()
        state["_absorbed"] = None  # holds a weakref (not picklable) and derived tensors
        return state

    # ---- absorbed weights ------------------------------------------------------------------------
    def _split_kv_b(self, w: Tensor) -> Tuple[Tensor, Tensor]:
        """Views of ``kv_b_proj.weight``: ``W_UK [H, nope, d_c]`` and ``W_UV^T [H, d_c, v]``."""
        w = w.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:].transpose(1, 2)

    def absorbed_weights(self) -> Tuple[Tensor, Tensor]:
        """``(w_uk [H, nope, d_c], w_uv [H, d_c, v])`` from ``kv_b_proj.weight``: the cached path computes
        ``q_latent_h = q_nope_h @ w_uk[h]`` and ``out_h = out_latent_h @ w_uv[h]``.

        Eager: contiguous copies (no autograd history), made once per weight version and reused by
        every step: they are remade when ``kv_b_proj.weight`` is another tensor, has other storage
        (``.to()``), or its version counter moved (any in-place update: optimizer steps,
        ``load_state_dict``, ``copy_`` under ``no_grad``). Writes through ``weight.data`` do not move
        the counter: call :meth:`refresh_absorbed_weights` after those. Weights created under
        ``torch.inference_mode()`` have no version counter and are split again at every call.
        Under ``torch.compile`` the weights are views of the live parameter inside the graph (no
        copy, no Python-side state), so compiled steps always see the current weights.
        """
        w = self.kv_b_proj.weight
        if torch.compiler.is_compiling():
            return self._split_kv_b(w)
        key = None
        if not w.is_inference() and w.device.type != "meta":
            # copies made under inference_mode are inference tensors, which a later step in grad mode could
            # not save for backward: they are kept apart
            key = (w.data_ptr(), w._version, w.dtype, w.device, tuple(w.shape), torch.is_inference_mode_enabled())
        cached = self._absorbed
        if key is not None and cached is not None and cached[0] == key and cached[1]() is w:
            return cached[2], cached[3]
        with torch.no_grad():
            w_uk, w_uv = (t.contiguous() for t in self._split_kv_b(w))
        self._absorbed = (key, weakref.ref(w), w_uk, w_uv) if key is not None else None
        return w_uk, w_uv

    def refresh_absorbed_weights(self) -> None:
        """Drop the cached absorbed weights (they are remade at the next cached step)."""
        self._absorbed = None

    # ---- forward ---------------------------------------------------------------------------------
    def forward(self, x: Tensor, positions: Optional[Tensor] = None,
                cache: Optional[Union[LatentKVCache, PagedLatentKVCache]] = None,
                layer_idx: int = 0) -> Tensor:
        """``x [B, T, hidden] -> [B, T, hidden]``.

        Without a cache (training, full-sequence inference): ``positions`` (int ``[T]`` or ``[B, T]``)
        default to ``0 .. T-1``; ``k_nope`` / ``v`` are expanded from ``c_kv`` with ``kv_b_proj``, ``k_pe``
        is broadcast over the heads, and causal :func:`attn_ops.attention` runs with
        ``Dqk = nope + rope``, ``Dv = v``. Gradients flow to ``x`` and every parameter.

        With a :class:`LatentKVCache` / :class:`PagedLatentKVCache` (inference; call it under
        ``torch.no_grad()`` / ``inference_mode``): the absorbed form. ``q_pe`` / ``k_pe`` are rotated in
        place at ``positions`` (default: the cache positions ``cache.seqlens[b] + t``), ``[c_kv ; k_pe]``
        is appended to layer ``layer_idx`` (:func:`attn_ops.mla_cache_append`), ``W_UK`` is folded into
        the query, :func:`attn_ops.mla_decode` attends over ``cache.seqlens + T`` latent rows, then
        ``W_UV`` and ``o_proj``. The layer with ``layer_idx == cache.num_layers - 1`` advances the
        lengths by ``T``. Tensor ops only: a decode step compiles with ``fullgraph=True``. A paged
        cache needs ``cache.reserve(T)`` before the step.

        Rotary angles computed elsewhere belong in a subclass that calls :meth:`_forward_with_tables`, as
        the DeepSeek adapter (:class:`attn_ops.integrations.deepseek.DeepseekMLAAttention`) does.
        """
        return self._forward_with_tables(x, positions, cache, layer_idx)

    def _queries(self, x: Tensor) -> Tensor:
        """``q [B, T, H, nope + rope]`` of ``x [B, T, hidden]``."""
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(*x.shape[:2], self.num_heads, self.qk_head_dim)

    def _latent(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """``(c_kv [B, T, d_c], k_pe [B, T, rope])`` of ``x [B, T, hidden]``: the normalized latent and
        the (not yet rotated) rotary key, both shared by every head."""
        compressed = self.kv_a_proj_with_mqa(x)
        return self.kv_a_layernorm(compressed[..., :self.kv_lora_rank]), compressed[..., self.kv_lora_rank:]

    def _forward_with_tables(self, x: Tensor, positions: Optional[Tensor],
                             cache: Optional[Union[LatentKVCache, PagedLatentKVCache]], layer_idx: int,
                             rope_tables: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
        """:meth:`forward` with the rotary angles given: ``rope_tables`` ``(cos, sin)`` ``[N, rope / 2]``
        (float32 or ``x``'s dtype) used instead of the module's ``rope_cos`` / ``rope_sin``, whose rows
        ``positions`` (required then) index -- for angles computed elsewhere, e.g. per-token tables from
        transformers' ``position_embeddings`` (any RoPE scaling, YaRN's attention factor included).
        ``None``: the module's own tables."""
        B, T, _ = x.shape
        H, nope, rope, dv = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        q = self._queries(x)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        c_kv, k_pe = self._latent(x)
        k_pe = k_pe.unsqueeze(2)  # [B, T, 1, rope], shared by all heads
        if rope_tables is None:
            cos, sin = self._tables(q.dtype)
        elif positions is None:
            raise ValueError("positions must be given with rope_tables (they index its rows), got None")
        else:
            cos, sin = rope_tables

        if cache is not None and not isinstance(cache, _LatentCacheBase):
            raise TypeError(f"MultiHeadLatentAttention needs a LatentKVCache or PagedLatentKVCache, "
                            f"got {type(cache).__name__}")
        if cache is not None and (cache.kv_lora_rank, cache.rope_dim) != (self.kv_lora_rank, rope):
            # a row of the same width split otherwise would be read right, but the cache would describe it wrong
            raise ValueError(f"MultiHeadLatentAttention: the cache holds kv_lora_rank {cache.kv_lora_rank} + rope_dim "
                             f"{cache.rope_dim} per token, this module kv_lora_rank {self.kv_lora_rank} + "
                             f"qk_rope_head_dim {rope}")
        positions = positions_for(positions, B, T, x.device, cache)
        # with a cache, rotate in place (tensors that require grad still rotate out of place)
        q_pe = rotate(q_pe, cos, sin, positions, interleaved=True, in_place=cache is not None)
        k_pe = rotate(k_pe, cos, sin, positions, interleaved=True, in_place=cache is not None)

        if cache is None:
            kv = self.kv_b_proj(c_kv).view(B, T, H, nope + dv)
            k_nope, v = kv[..., :nope], kv[..., nope:]
            q = torch.cat((q_nope, q_pe), dim=-1)
            k = torch.cat((k_nope, k_pe.expand(B, T, H, rope)), dim=-1)
            out, _ = _ops.attention(q, k, v, causal=True, scale=self.softmax_scale)
            return self.o_proj(out.reshape(B, T, H * dv))

        cache.append(layer_idx, c_kv, k_pe.squeeze(2))
        w_uk, w_uv = self.absorbed_weights()
        dc = self.kv_lora_rank
        # q_latent_h = W_UK_h^T q_nope_h, as H matmuls [B*T, nope] @ [nope, d_c]
        q_latent = torch.bmm(q_nope.reshape(B * T, H, nope).transpose(0, 1), w_uk)
        q_latent = q_latent.transpose(0, 1).view(B, T, H, dc)     # strided view, last dim stride 1
        out_latent = cache.attend(layer_idx, q_latent, q_pe, scale=self.softmax_scale)
        # out_h = W_UV_h out_latent_h, as H matmuls [B*T, d_c] @ [d_c, v]
        out = torch.bmm(out_latent.reshape(B * T, H, dc).transpose(0, 1), w_uv)
        if layer_idx == cache.num_layers - 1:
            cache.advance(T, B)
        return self.o_proj(out.transpose(0, 1).reshape(B, T, H * dv))

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
                f"q_lora_rank={self.q_lora_rank}, kv_lora_rank={self.kv_lora_rank}, "
                f"qk_nope_head_dim={self.qk_nope_head_dim}, qk_rope_head_dim={self.qk_rope_head_dim}, "
                f"v_head_dim={self.v_head_dim}, rope_theta={self.rope_theta:g}, "
                f"softmax_scale={self.softmax_scale:.6g}")
