"""HuggingFace transformers integration: ``attn_implementation="attn_ops"``.

    from attn_ops.integrations.transformers import register
    register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attn_ops")
    # or, on a model already built: model.set_attn_implementation("attn_ops")

:func:`register` adds two functions to transformers under the name ``"attn_ops"``:

* :func:`attention_forward` in ``AttentionInterface``: what every attention layer calls. It takes
  transformers' ``[B, H, S, D]`` query and un-repeated ``[B, Hkv, Skv, D]`` keys/values (the whole
  cache so far during generation) and runs :func:`attn_ops.attention` on ``[B, S, H, D]``
  transposed views: no ``repeat_kv``, no materialised mask.
* :func:`padding_layout` in ``AttentionMaskInterface``: what the model calls once per forward (per
  attention type) in place of building a ``[B, 1, S, Skv]`` mask. Without it transformers would
  pass no mask at all to a custom implementation and silently drop causal and padding masking.

Padding masks become a compact layout, ``None`` or int32 ``[B, 4, 1, 1]``: per row, the run of
real (non-padding) queries and the run of real keys (4-D, so that transformers passes it through
unchanged when ``generate`` builds the masks ahead of a static-cache forward). The attention then
runs as a varlen batch whose sequences are each row's real run and, around it, padding runs that
see nothing (their outputs are zeros; transformers' eager path outputs meaningless averages there).
Each row's real tokens must be one contiguous run: left padding, right padding, and a cache's
unused tail all are.

Supported: causal (bottom-right aligned, so decoding over a cache needs no mask), ``scaling``,
``sliding_window``, ``softcap``, attention sinks (gpt-oss's ``s_aux``), chunked attention (Llama 4's
``attention_chunk_size`` layers), GQA/MQA, padding, ``DynamicCache`` / ``StaticCache`` generation,
``torch.compile(fullgraph=True)``; bidirectional masks pad keys only, as transformers' do (encoders,
cross-attention). Not supported (clear errors): attention dropout, 4-D masks, custom ``or_mask_function`` /
``and_mask_function``, prefix-LM / block masks, packed sequences given only by ``position_ids`` and position
biases. See docs/transformers.md.

Chunked layers: transformers builds their mask with ``local_size`` (the chunk) and caches only the keys their
queries' chunks can hold, so a layer's first key sits at any position. The layout then starts each row's key
run at the chunk of its first real query (the keys before it are in earlier chunks, which no query of the call
sees), so the op's chunks, counted from the run's first key, are the model's, counted from the row's first real
token.
"""
import warnings
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
import transformers
from packaging.version import Version
from torch import Tensor
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.utils.import_utils import is_tracing

from .. import ops

__all__ = ["NAME", "register", "attention_forward", "padding_layout"]

NAME = "attn_ops"
# The transformers minor release this adapter is tested against (setup.py's `transformers` extra).
TESTED_MINOR = (5, 17)
# Keyword arguments of other attention implementations that attn_ops cannot honour.
_UNSUPPORTED_KWARGS = ("position_bias",)


def register() -> str:
    """Register ``"attn_ops"`` with transformers' attention and mask interfaces; returns the name.

    Idempotent. Afterwards pass ``attn_implementation="attn_ops"`` to ``from_pretrained`` /
    ``from_config``, or call ``model.set_attn_implementation("attn_ops")``. Warns when the installed
    transformers is not the tested minor release (the interfaces it plugs into change between them).
    """
    installed = Version(transformers.__version__)
    if installed.release[:2] != TESTED_MINOR:
        warnings.warn(f"attn_ops.integrations.transformers is tested with transformers "
                      f"{TESTED_MINOR[0]}.{TESTED_MINOR[1]}.x, found {transformers.__version__}",
                      stacklevel=2)
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, padding_layout)
    return NAME


# --------------------------------------------------------------------------------------------------
# Mask function (AttentionMaskInterface)
# --------------------------------------------------------------------------------------------------
def padding_layout(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                   mask_function=None, attention_mask: Optional[Tensor] = None,
                   use_vmap: bool = False, device="cpu", **kwargs) -> Optional[Tensor]:
    """The mask "function" for ``"attn_ops"``: a compact padding layout instead of a dense mask.

    Called by transformers' ``create_causal_mask`` / ``create_sliding_window_causal_mask`` with the
    2-D padding mask ``attention_mask`` ``[B, >= kv_offset + kv_length]`` (True = real token) and
    the positions of the queries (``q_offset + i``) and keys (``kv_offset + j``).

    Returns ``None`` when no row has padding and the queries are the last ``q_length`` keys (the
    attention then uses the dense op, causal aligned bottom-right), else int32 ``[B, 4, 1, 1]``:
    per row ``(q_start, q_count, k_start, k_count)``, the run of real queries among the
    ``q_length`` and of real keys among the ``kv_length``. Keys past the padding mask (a
    ``StaticCache``'s unused tail) are not real.

    Raises ValueError when a row's real tokens are not one contiguous run, or when ``mask_function``
    hides a real key from the real query right after it (packed sequences found in
    ``position_ids``, chunked attention): patterns the layout cannot express. In eager mode this
    costs one device sync per mask; under torch.compile the checks become runtime asserts.
    """
    if use_vmap:
        raise NotImplementedError(
            "attn_ops attention does not support custom or_mask_function / and_mask_function "
            "masks (they need a dense mask); use attn_implementation='sdpa' for this model")
    config = kwargs.get("config")
    # A chunked layer's mask: create_chunked_causal_mask passes the chunk as local_size (the sliding-window masks
    # pass their window; no transformers model has both)
    chunk = getattr(config, "attention_chunk_size", None)
    chunk = chunk if chunk and kwargs.get("local_size") == chunk else None
    q_pos = torch.arange(q_length, device=device) + q_offset
    kv_pos = torch.arange(kv_length, device=device) + kv_offset
    aligned = isinstance(q_offset, int) and q_offset + q_length == kv_offset + kv_length
    # A bidirectional mask (encoders, cross-attention) pads keys only, as transformers' own masks do: every
    # query is real (a cross-attention's queries are not even positions of attention_mask's sequence), and
    # every key up to kv_length is. A causal one also ends each row's keys at its last query (the unused
    # tail of a StaticCache, which a full-length attention_mask may still mark real).
    bidirectional = _first_query_sees(mask_function, q_pos, q_pos[:1] + 1)  # True: an encoder's or cross mask
    keys_in_reach = (kv_pos < q_offset + q_length) | bidirectional
    if attention_mask is None:
        q_real = torch.ones(batch_size, q_length, dtype=torch.bool, device=device)
        kv_real = keys_in_reach.expand(batch_size, kv_length)
    else:
        attention_mask = attention_mask.to(device=device, dtype=torch.bool)
        missing = kv_offset + kv_length - attention_mask.shape[-1]
        if missing > 0:
            attention_mask = F.pad(attention_mask, (0, missing))
        width = attention_mask.shape[-1]
        q_in_mask = attention_mask[:, q_pos.clamp(max=width - 1)] & (q_pos < width)
        q_real = q_in_mask | bidirectional
        kv_real = attention_mask[:, kv_offset:kv_offset + kv_length] & keys_in_reach
    # transformers counts a chunked layer's chunks from each row's first real token (after its left padding)
    left_pad = None
    if chunk:
        left_pad = (torch.zeros(batch_size, dtype=torch.long, device=device) if attention_mask is None
                    else (attention_mask.cumsum(dim=-1) == 0).sum(dim=-1))
    _check_no_breaks(mask_function, batch_size, q_pos, q_real, chunk, left_pad)
    if attention_mask is None and aligned and not chunk:
        return None
    q_start, q_count, q_one_run = _real_run(q_real)
    k_start, k_count, k_one_run = _real_run(kv_real)
    _require(q_one_run & k_one_run,
             "attn_ops attention needs each row's real (attention_mask = 1) tokens to be one "
             "contiguous run (left or right padding); this attention_mask has padding between "
             "real tokens")
    if chunk:
        # Drop the keys before the chunk of the row's first real query: in earlier chunks, seen by no query.
        first_key = kv_offset + k_start - left_pad
        first_query_chunk = torch.div(q_offset + q_start - left_pad, chunk, rounding_mode="floor") * chunk
        drop = torch.minimum((first_query_chunk - first_key).clamp(min=0), k_count)
        k_start, k_count = k_start + drop, k_count - drop
    elif aligned and not is_tracing(q_real) and bool(q_real.all() & kv_real.all()):
        return None
    if aligned and kv_length > 0:
        # The op aligns a window bottom-right: query i of the run sits at key position i + k_count - q_count of
        # its key run. With every query of a bidirectional mask real, that holds for left padding but shifted
        # right-padded rows' windows by the padding (ModernBERT's local layers). So under a bidirectional window
        # (the first query does not see the last key) the query run ends where the key run does; the trailing
        # padding queries then see no key (zeros, as in transformers' flash-attention path, which drops
        # padding). Without a window the alignment changes nothing, and a cross-attention's queries stay whole.
        windowed = bidirectional & ~_first_query_sees(mask_function, q_pos, kv_pos[-1:])
        aligned_end = torch.minimum(q_count, (k_start + k_count - q_start).clamp(min=0))
        q_count = torch.where(windowed, aligned_end, q_count)
    layout = torch.stack((q_start, q_count, k_start, k_count), dim=1).to(torch.int32)
    return layout[:, :, None, None]


def _real_run(real: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``(start, count, ok)`` for a bool ``[B, L]``: where each row's True run starts, its length,
    and whether every row's True entries do form a single run."""
    count = real.sum(dim=1)
    start = (real.cumsum(dim=1) == 0).sum(dim=1)
    pos = torch.arange(real.shape[1], device=real.device)
    inside = (pos >= start[:, None]) & (pos < (start + count)[:, None])
    return start, count, (inside == real).all()


def _first_query_sees(mask_function, q_pos: Tensor, key_pos: Tensor) -> Tensor:
    """Whether ``mask_function`` lets the first query see the key at position ``key_pos`` (a 0-d tensor), as a
    bool tensor (traced, no host read); False without a function or without queries."""
    if mask_function is None or q_pos.numel() == 0:
        return torch.zeros((), dtype=torch.bool, device=q_pos.device)
    first = torch.zeros(1, 1, dtype=torch.long, device=q_pos.device)
    return mask_function(first, first, q_pos[None, :1], key_pos.reshape(1, 1)).reshape(())


def _check_no_breaks(mask_function, batch_size: int, q_pos: Tensor, q_real: Tensor, chunk=None,
                     left_pad: Optional[Tensor] = None) -> None:
    """Between two real neighbouring queries, the later must see the earlier (true of causal,
    bidirectional and sliding-window (width >= 2) masks, false at the boundaries of packed sequences and,
    in a chunked layer's mask, of chunks: pairs in two chunks are not checked there), and whether the earlier
    sees the later must be the same for every such pair (all: bidirectional, none: causal; some: a prefix-LM
    or block mask, PaliGemma's image and prefix tokens). The layout can express neither of the two patterns
    it rules out."""
    if mask_function is None or q_pos.numel() < 2:
        return
    batch = torch.arange(batch_size, device=q_pos.device)[:, None]
    head = torch.zeros(1, 1, dtype=torch.long, device=q_pos.device)
    real_pair = q_real[:, 1:] & q_real[:, :-1]
    if chunk:  # chunks counted from each row's first real token
        chunk_of = torch.div(q_pos[None, :] - left_pad[:, None], chunk, rounding_mode="floor")
        real_pair = real_pair & (chunk_of[:, 1:] == chunk_of[:, :-1])
    sees_before = mask_function(batch, head, q_pos[None, 1:], q_pos[None, :-1])
    _require((sees_before | ~real_pair).all(),
             "attn_ops attention supports causal, bidirectional and sliding-window masks only: "
             "this model's mask hides a token from the next one (packed sequences in "
             "position_ids, or chunked attention); use attn_implementation='sdpa' for it")
    sees_after = mask_function(batch, head, q_pos[None, :-1], q_pos[None, 1:])
    _require((sees_after | ~real_pair).all() | (~sees_after | ~real_pair).all(),
             "attn_ops attention supports causal, bidirectional and sliding-window masks only: "
             "this model's mask lets some tokens see later ones and not others (a prefix-LM or block "
             "mask, e.g. image and prefix tokens); use attn_implementation='sdpa' for it")


def _require(ok: Tensor, message: str) -> None:
    """Raise ValueError(message) unless the bool scalar ``ok`` is True. Traced (torch.compile), a
    runtime assert in the graph instead: RuntimeError(message) on the CPU, a device-side assert on
    CUDA, and no host synchronization. (Not torch._check_tensor_all: torch 2.11's dynamo cannot
    trace it, and 2.14's drops the message.)"""
    if is_tracing(ok):
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise ValueError(message)


# --------------------------------------------------------------------------------------------------
# Attention function (AttentionInterface)
# --------------------------------------------------------------------------------------------------
def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Optional[Tensor], dropout: float = 0.0,
                      scaling: Optional[float] = None, sliding_window: Optional[int] = None,
                      softcap: Optional[float] = None, is_causal: Optional[bool] = None,
                      **kwargs) -> Tuple[Tensor, None]:
    """transformers attention function: ``(attn_output [B, S, Hq, Dv], None)``.

    Args:
        query: ``[B, Hq, S, Dqk]``; key / value: ``[B, Hkv, Skv, Dqk / Dv]``, not repeated
            (``Hq % Hkv == 0``), the whole cache so far when generating.
        attention_mask: the layout from :func:`padding_layout` (``None`` or int32 ``[B, 4, 1, 1]``).
        dropout: must be 0 (the op has no dropout); transformers passes the config's
            ``attention_dropout`` in training mode.
        scaling: logit scale, default ``1 / sqrt(Dqk)``.
        sliding_window: a query sees itself and the ``sliding_window - 1`` keys before it
            (transformers' convention; also after it when not causal).
        softcap: logits become ``softcap * tanh(logits / softcap)`` (Gemma-2).
        is_causal: default ``module.is_causal`` (True when the module has no such attribute).
        s_aux: attention sinks ``[Hq]`` (gpt-oss): ``exp(s_aux[h])`` joins each row's softmax
            denominator; differentiable.

    A layer of a model whose ``config.attention_chunk_size`` is set is chunked when its ``layer_types`` entry is
    ``"chunked_attention"`` (every layer when the config has no ``layer_types``, as transformers decides).
    """
    if dropout:
        raise ValueError(f"attn_ops attention has no dropout, got dropout={dropout} (the model's "
                         f"attention_dropout in training mode); set config.attention_dropout = 0.0")
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"attn_ops attention does not support the {name!r} argument; "
                                      f"use attn_implementation='eager' or 'sdpa' for this model")
    if kwargs.get("output_attentions") and not torch.compiler.is_compiling():
        # as transformers' own sdpa / flash-attention functions do: the weights are never formed
        warnings.warn("attn_ops attention does not return attention weights (output_attentions=True): the "
                      "model's `attentions` stay empty; use attn_implementation='eager' to get them", stacklevel=2)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    window = sliding_window - 1 if sliding_window else -1
    options = dict(scale=scaling, causal=bool(is_causal), window_left=window, window_right=window,
                   softcap=softcap or 0.0, sinks=kwargs.get("s_aux"), attention_chunk=_chunk_of(module))
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if attention_mask is None:
        return ops.attention(q, k, v, **options)[0], None
    if attention_mask.dtype != torch.int32 or tuple(attention_mask.shape) != (q.shape[0], 4, 1, 1):
        raise ValueError(
            f"attention_mask must be the int32 [batch, 4, 1, 1] padding layout that attn_ops' mask "
            f"function builds from a 2-D attention_mask, got {attention_mask.dtype} of shape "
            f"{list(attention_mask.shape)} (4-D masks are not supported by attn_ops)")
    return _padded_attention(q, k, v, attention_mask, options), None


def _chunk_of(module: torch.nn.Module) -> int:
    """The attention chunk of ``module``'s layer (0: not a chunked layer)."""
    config = getattr(module, "config", None)
    chunk = getattr(config, "attention_chunk_size", None)
    if not chunk:
        return 0
    layer_types = getattr(config, "layer_types", None)
    layer_idx = getattr(module, "layer_idx", None)
    if layer_types is None or layer_idx is None:
        return int(chunk)
    return int(chunk) if layer_types[layer_idx] == "chunked_attention" else 0


def _padded_attention(q: Tensor, k: Tensor, v: Tensor, layout: Tensor, options: dict) -> Tensor:
    """Attention over ``[B, S, H, D]`` rows with padding, as one varlen batch of 5 runs per row.

    Row b's queries split into ``[q_start pads | q_count real | trailing pads]`` and its keys into
    ``[k_start pads | k_count real | trailing pads and the gap to the next row]``; the varlen
    sequences are ``(pads, no keys)``, ``(no queries, pads)``, ``(real, real)``, ``(pads, no
    keys)``, ``(no queries, pads)``, so only real queries see keys, only real ones, and causal and
    window masks align bottom-right within the real run as in a batch without padding.
    """
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k = k.shape[1]
    k_tokens, v_tokens, pitch = _kv_tokens(k, v)
    q_start, q_count, k_start, k_count = layout[:, :, 0, 0].unbind(dim=1)
    zero = torch.zeros_like(q_start)
    row_end = torch.full_like(k_start, pitch)
    row_end[-1] = seqlen_k
    q_lens = torch.stack((q_start, zero, q_count, seqlen_q - q_start - q_count, zero), dim=1)
    k_lens = torch.stack((zero, k_start, k_count, zero, row_end - k_start - k_count), dim=1)
    out, _ = ops.attention(q.reshape(batch * seqlen_q, heads_q, q.shape[-1]), k_tokens, v_tokens,
                           cu_seqlens_q=_cumulative(q_lens), cu_seqlens_k=_cumulative(k_lens),
                           **options)
    return out.view(batch, seqlen_q, heads_q, out.shape[-1])


def _cumulative(lengths: Tensor) -> Tensor:
    """int32 cu_seqlens ``[n + 1]`` of the sequence lengths ``lengths`` (any shape, row-major)."""
    return F.pad(lengths.flatten().cumsum(dim=0), (1, 0)).to(torch.int32)


def _head_major(t: Tensor) -> bool:
    """Whether ``t`` ``[B, S, H, D]`` is the transposed view of a contiguous ``[B, H, S, D]`` tensor, by its
    strides, size-1 dims included (``is_contiguous`` ignores their strides, and so a ``[B, 1, H, D]``
    tensor laid out token-major passed it)."""
    _, seqlen, heads, dim = t.shape
    return (t.stride(3) == 1 and t.stride(1) == dim and t.stride(2) == seqlen * dim
            and t.stride(0) == heads * seqlen * dim)


def _kv_tokens(k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor, int]:
    """``k`` / ``v`` ``[B, S, H, D]`` as token-major ``[T, H, D]``, and the row pitch: row b's keys
    are tokens ``b * pitch ... b * pitch + S - 1``.

    Caches store ``[B, H, S, D]`` contiguously, which no ``[B * S, H, D]`` view can describe. When
    no gradient is needed such k / v are read in place through an overlapping strided view with
    pitch ``H * S`` tokens: the tokens between two rows alias other heads' keys and fall in key
    runs that no query attends to. Otherwise (training, other layouts) they are reshaped, which
    copies only when a view is impossible.
    """
    batch, seqlen, heads, _ = k.shape
    in_place = (not (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad))
                and _head_major(k) and _head_major(v))
    if not in_place or heads * seqlen == seqlen:
        return k.reshape(batch * seqlen, heads, -1), v.reshape(batch * seqlen, heads, -1), seqlen
    pitch = heads * seqlen
    tokens = (batch - 1) * pitch + seqlen
    return (k.as_strided((tokens, heads, k.shape[-1]), (k.stride(1), k.stride(2), 1)),
            v.as_strided((tokens, heads, v.shape[-1]), (v.stride(1), v.stride(2), 1)), pitch)
