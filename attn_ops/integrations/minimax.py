"""transformers' MiniMax (``MiniMaxForCausalLM``): run its lightning-attention layers on attn_ops.

    from attn_ops.integrations.minimax import swap_minimax_attention
    model = MiniMaxForCausalLM.from_pretrained(name, attn_implementation="attn_ops")  # softmax layers
    swap_minimax_attention(model)  # linear-attention layers

:func:`swap_minimax_attention` replaces every ``MiniMaxLightningAttention`` with a
:class:`MiniMaxLightningAttention` of this module, which shares the parameter tensors and the ``slope_rate``
buffer of the layer it replaces (no copy) and keeps transformers' call signature and its ``MiniMaxCache``
protocol: prefill (no state in the cache yet) runs :func:`attn_ops.lightning_attention` from a zero state and
stores the float32 final state; a later forward with a state (decode, or several tokens continuing a cache)
advances that state in place with :func:`attn_ops.lightning_attention_decode_`. The derived decay buffers
(``query_decay``, ``key_decay``, ``diagonal_decay``) are dropped: the kernels compute the decays themselves.
The cache's beam-search reorder (``batch_select_indices``) and expansion work unchanged on the states.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .. import ops
from ..nn.lightning import LightningAttention

__all__ = ["MiniMaxLightningAttention", "swap_minimax_attention"]


class MiniMaxLightningAttention(LightningAttention):
    """A :class:`attn_ops.nn.LightningAttention` with transformers' MiniMax forward signature and cache protocol."""

    @classmethod
    def from_transformers(cls, module: nn.Module) -> "MiniMaxLightningAttention":
        """Wrap transformers' ``module``, sharing its submodules (hence parameters) and ``slope_rate``."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.head_dim = module.head_dim
        new.num_attention_heads = module.num_attention_heads
        new.layer_idx = module.layer_idx
        new.block_size = None
        new.act_fn = module.act_fn
        new.norm = module.norm
        new.qkv_proj = module.qkv_proj
        new.out_proj = module.out_proj
        new.output_gate = module.output_gate
        new.register_buffer("slope_rate", module.slope_rate)
        new.train(module.training)
        return new

    def forward(self, hidden_states: Tensor, position_embeddings=None, attention_mask: Optional[Tensor] = None,
                past_key_values=None, **kwargs):
        q, k, v = self.qkv(hidden_states, attention_mask)
        state = past_key_values.get_linear_cache(self.layer_idx) if past_key_values is not None else None
        if not isinstance(state, Tensor):  # no state yet ([] marks a layer the cache skipped)
            attn, state = ops.lightning_attention(q, k, v, self.slope)
        else:
            want = torch.float64 if q.dtype == torch.float64 else torch.float32  # the ops' state dtype
            if state.dtype != want or state.requires_grad or state.stride(-1) != 1:
                state = state.detach().to(want).contiguous()
            # one pool slot per batch row: the cache keeps a [B, H, D, D] state per layer
            attn = ops.lightning_attention_decode_(q, k, v, state, self.slope)
        if past_key_values is not None:
            past_key_values.set_linear_cache(self.layer_idx, state)
        return self.output(hidden_states, attn), state


def swap_minimax_attention(model: nn.Module) -> int:
    """Replace every transformers ``MiniMaxLightningAttention`` inside ``model`` (in place); returns how many.

    The replacements share the original parameters, so optimizers, ``state_dict`` keys (minus the derived decay
    buffers) and tied weights stay valid. The softmax layers are left alone: load the model with
    ``attn_implementation="attn_ops"`` (:func:`attn_ops.integrations.transformers.register`) for those.
    """
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention as HFLightning

    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, HFLightning):
                setattr(parent, name, MiniMaxLightningAttention.from_transformers(child))
                count += 1
    return count
