"""Swap the attention of transformers DeepSeek-V2/V3 models for attn_ops multi-head latent attention.

``swap_deepseek_attention(model)`` replaces every ``DeepseekV3Attention`` / ``DeepseekV2Attention`` of a
loaded model with a :class:`DeepseekMLAAttention` (a :class:`attn_ops.nn.MultiHeadLatentAttention`
with transformers' attention signature) that takes over the layer's projection and norm modules
themselves: the same parameter tensors, the same ``state_dict`` names. With a
:class:`~attn_ops.caches.deepseek.DeepseekLatentCache` (made automatically wherever
transformers would make a ``DynamicCache``, ``generate()`` included) a forward appends each token's
``[c_kv ; k_pe]`` latent row and attends in the absorbed form (:func:`attn_ops.mla_decode`), so no
per-head K/V is ever expanded; without a cache (``use_cache=False``) it runs the expanded,
differentiable path. See docs/deepseek.md.

Rotary embedding: the modules rotate with transformers' own ``position_embeddings`` (whatever the
RoPE type: default, YaRN with its attention factor, dynamic, ...) and use its ``scaling`` (YaRN's
``mscale`` included). Padding: the 2-D ``attention_mask`` of the model's forward says which new
tokens are padding; they are moved behind the real tokens of their row (causal attention then never
lets a real token see one) and dropped from the cache, so left-padded batches generate as in
transformers. Not supported (rejected with an error): DeepSeek-V3 ``rope_interleave=False``,
``output_attentions=True``, attention dropout in training mode, 4-D attention masks.
"""
from __future__ import annotations

import functools
import inspect
from typing import Optional

import torch
from torch import Tensor, nn
from transformers.cache_utils import DynamicCache
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2Model
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3Model

from .. import ops as _ops
from ..nn import MultiHeadLatentAttention
from ..caches.deepseek import DeepseekLatentCache

__all__ = ["swap_deepseek_attention", "DeepseekMLAAttention", "DeepseekLatentCache"]

_HF_ATTENTION = (DeepseekV2Attention, DeepseekV3Attention)
_HF_MODELS = (DeepseekV2Model, DeepseekV3Model)
# the submodules taken over from the transformers attention (those it has: q_proj or q_a/q_b)
_SUBMODULES = ("q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
               "kv_b_proj", "o_proj")
# keyword the model-level pre-hook adds to the forward kwargs (transformers passes them on to every
# attention layer): bool [B, T], which of the T new tokens are real; absent when none is padding
_REAL_TOKENS = "attn_ops_real_tokens"


class DeepseekMLAAttention(MultiHeadLatentAttention):
    """:class:`attn_ops.nn.MultiHeadLatentAttention` in place of a transformers ``DeepseekV3Attention``
    / ``DeepseekV2Attention``: built from that module, whose projections and RMSNorms it takes over
    (the same ``nn.Module`` objects, so the same parameters), with its ``scaling`` as softmax scale.
    Its forward has transformers' attention signature; the module's own rotary tables are not used
    (transformers' ``position_embeddings`` give the angles), so they are built for one position only.
    """

    def __init__(self, hf_attention: nn.Module):
        a = hf_attention
        if type(a) not in _HF_ATTENTION:
            raise TypeError(f"hf_attention must be a DeepseekV2Attention or DeepseekV3Attention, "
                            f"got {type(a).__name__}")
        w = a.kv_b_proj.weight if isinstance(a.kv_b_proj, nn.Linear) else None
        if w is None or not w.is_floating_point():
            raise TypeError(f"kv_b_proj of layer {a.layer_idx} must be an nn.Linear with a floating-point "
                            f"weight (the absorbed path reads it), got {type(a.kv_b_proj).__name__}")
        super().__init__(a.hidden_size, a.num_heads, a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim,
                         a.qk_rope_head_dim, a.v_head_dim, max_position_embeddings=1,
                         softmax_scale=a.scaling, attention_bias=a.config.attention_bias, device="meta")
        for name in _SUBMODULES:
            if getattr(a, name, None) is not None:
                setattr(self, name, getattr(a, name))
        self.rope_cos, self.rope_sin = _ops.rotary_cos_sin(
            1, a.qk_rope_head_dim, dtype=torch.float64 if w.dtype == torch.float64 else torch.float32,
            device=w.device)
        self.layer_idx = a.layer_idx
        self.attention_dropout = float(a.attention_dropout or 0.0)
        self.train(a.training)

    def forward(self, hidden_states: Tensor, position_embeddings=None, attention_mask=None,
                past_key_values: Optional[DeepseekLatentCache] = None,
                attn_ops_real_tokens: Optional[Tensor] = None, **kwargs):
        """transformers' attention call: ``hidden_states [B, T, hidden]``, ``position_embeddings``
        (DeepSeek-V3: ``(cos, sin)`` ``[B or 1, T, rope]``; V2: complex ``[B or 1, T, rope / 2]``),
        ``past_key_values`` (a :class:`DeepseekLatentCache` or ``None``). ``attention_mask`` (the 4-D mask
        transformers built) is not read: causality is the kernels', padding comes from
        ``attn_ops_real_tokens`` (bool ``[B, T]``, set by the model-level hook that
        :func:`swap_deepseek_attention` installs). Returns ``(output [B, T, hidden], None)``.
        """
        if self.training and self.attention_dropout > 0:
            raise ValueError(f"attention_dropout: the swapped attention has no dropout, got "
                             f"attention_dropout={self.attention_dropout} in training mode (call eval() or "
                             f"set config.attention_dropout=0)")
        if position_embeddings is None:
            raise ValueError("position_embeddings must be given (transformers' rotary cos/sin), got None")
        B, T, _ = hidden_states.shape
        cos, sin = _rope_tables(position_embeddings, B, T, self.qk_rope_head_dim // 2)
        cache, layer = None, None
        if past_key_values is not None:
            if not isinstance(past_key_values, DeepseekLatentCache):
                raise TypeError(f"past_key_values must be a DeepseekLatentCache or None, got "
                                f"{type(past_key_values).__name__}")
            layer = past_key_values.layers[self.layer_idx]
            cache = layer.reserve(B, T, hidden_states.dtype, hidden_states.device)
        # row b's tokens index rows b * T + t of the per-token tables
        row_start = torch.arange(B, device=hidden_states.device).unsqueeze(1) * T
        if attn_ops_real_tokens is None:
            positions = row_start + torch.arange(T, device=hidden_states.device)
            out = self._forward_with_tables(hidden_states, positions, cache, 0, (cos, sin))
            padding = None
        else:
            # real tokens first, in order (a stable sort); the padding after them is causal-invisible
            order = torch.argsort((~attn_ops_real_tokens).to(torch.int8), dim=1, stable=True)
            x = hidden_states.gather(1, order.unsqueeze(-1).expand_as(hidden_states))
            out = self._forward_with_tables(x, row_start + order, cache, 0, (cos, sin))
            out = out.gather(1, torch.argsort(order, dim=1).unsqueeze(-1).expand_as(out))
            padding = (~attn_ops_real_tokens).sum(1, dtype=torch.int32)
        if layer is not None:
            layer.commit(T, padding)
        return out, None


def _rope_tables(position_embeddings, B: int, T: int, half: int):
    """transformers' rotary angles as ``(cos, sin)`` tables ``[B * T, rope / 2]`` (row ``b * T + t``).

    DeepSeek-V3 passes ``cos``/``sin`` ``[B or 1, T, rope]`` whose halves are equal (``cat(freqs, freqs)``,
    the attention scaling of YaRN multiplied in); DeepSeek-V2 passes complex ``freqs_cis``
    ``[B or 1, T, rope / 2]`` (``cos + i sin``, the same scaling multiplied in)."""
    if isinstance(position_embeddings, Tensor) and position_embeddings.is_complex():
        cos, sin = position_embeddings.real, position_embeddings.imag
    else:
        cos, sin = (t[..., :half] for t in position_embeddings)
    return tuple(t.expand(B, T, half).reshape(B * T, half) for t in (cos, sin))


def _prepare_forward(model: nn.Module, args, kwargs, *, arg_names):
    """Forward pre-hook of a swapped ``DeepseekV2Model`` / ``DeepseekV3Model``: makes a
    :class:`DeepseekLatentCache` where transformers would make a ``DynamicCache``, and passes which new
    tokens are real (from the 2-D ``attention_mask``) to the attention layers."""
    kwargs = {**dict(zip(arg_names, args)), **kwargs}
    tokens = kwargs.get("input_ids")
    tokens = kwargs.get("inputs_embeds") if tokens is None else tokens
    if tokens is None:
        return (), kwargs  # transformers raises its own error
    T = tokens.shape[1]
    if kwargs.get("output_attentions", getattr(model.config, "output_attentions", False)):
        raise ValueError("output_attentions=True is not supported by the swapped DeepSeek attention "
                         "(it does not materialize attention weights)")
    cache = kwargs.get("past_key_values")
    if cache is None:
        use_cache = kwargs.get("use_cache")
        if use_cache is None:  # config default; none in grad mode (the cached path is inference only)
            use_cache = bool(model.config.use_cache) and not torch.is_grad_enabled()
        use_cache = use_cache and not (getattr(model, "gradient_checkpointing", False) and model.training)
        kwargs["use_cache"] = use_cache
        if use_cache:
            kwargs["past_key_values"] = DeepseekLatentCache(model.config)
    elif not isinstance(cache, DeepseekLatentCache):
        if type(cache) is not DynamicCache or cache.get_seq_length() != 0:
            raise TypeError(f"past_key_values must be a DeepseekLatentCache, None or an empty DynamicCache "
                            f"(replaced by a DeepseekLatentCache) for a model with swapped DeepSeek "
                            f"attention, got a {type(cache).__name__} holding {cache.get_seq_length()} "
                            f"tokens")
        kwargs["past_key_values"] = DeepseekLatentCache(model.config)  # generate()'s default cache
    mask = kwargs.get("attention_mask")
    if mask is not None:
        if mask.dim() != 2 or mask.shape[1] < T:
            raise ValueError(f"attention_mask must be a 2-D padding mask [batch, past + {T} new tokens] "
                             f"for the swapped DeepSeek attention, got shape {list(mask.shape)}")
        real = mask[:, -T:].bool()
        if not bool(real.all()):
            kwargs[_REAL_TOKENS] = real
    return (), kwargs


def swap_deepseek_attention(model: nn.Module) -> nn.Module:
    """Replace every ``DeepseekV3Attention`` / ``DeepseekV2Attention`` in ``model`` (in place) with a
    :class:`DeepseekMLAAttention` carrying the same weights, and install the pre-hook on each
    ``DeepseekV3Model`` / ``DeepseekV2Model`` that makes latent caches and reads the padding mask.
    Returns ``model``.

    Raises ``TypeError`` if ``model`` holds no DeepSeek-V2/V3 model, ``ValueError`` if it is swapped
    already or its config is not supported (DeepSeek-V3 ``rope_interleave=False``: the kernels rotate
    interleaved pairs).
    """
    bases = [m for m in model.modules() if isinstance(m, _HF_MODELS)]
    if not bases:
        raise TypeError(f"model must contain a transformers DeepseekV2Model or DeepseekV3Model, got "
                        f"{type(model).__name__}")
    for base in bases:
        if isinstance(base, DeepseekV3Model) and not base.config.rope_interleave:
            raise ValueError("config.rope_interleave must be True (the attn_ops kernels rotate interleaved "
                             "pairs, DeepSeek's layout), got False")
        attns = [layer.self_attn for layer in base.layers]
        if any(isinstance(a, DeepseekMLAAttention) for a in attns):
            raise ValueError(f"{type(base).__name__} already has swapped attention")
        swapped = [DeepseekMLAAttention(a) for a in attns]  # all built before any is put in
        for layer, attn in zip(base.layers, swapped):
            layer.self_attn = attn
        params = inspect.signature(type(base).forward).parameters
        arg_names = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD][1:]  # not self
        base.register_forward_pre_hook(functools.partial(_prepare_forward, arg_names=arg_names),
                                       with_kwargs=True)
    return model
