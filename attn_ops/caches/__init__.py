"""The caches of every attention family, in one place (inference). The modules of :mod:`attn_ops.nn`
take them, and :mod:`attn_ops.nn` re-exports them (``attn_ops.nn.KVCache`` is ``attn_ops.caches.KVCache``).

The KV and latent cache objects hold the keys and values of every layer of a model plus one ``int32``
length per batch row (``seqlens``):

* :class:`KVCache` -- one block of ``capacity`` tokens per row: per layer ``k [batch, capacity, Hkv, D]`` /
  ``v [.., Dv]`` (on the CPU, views of ``[batch, Hkv, capacity, D]`` storage).
* :class:`PagedKVCache` -- paged (vLLM layout): per layer ``k [num_blocks, block_size, Hkv, D]``,
  a ``block_table`` ``int32 [batch_size, max_blocks_per_seq]`` mapping each row's logical blocks to
  physical ones, and a host-side free-block allocator (:meth:`PagedKVCache.reserve`).
* :class:`LatentKVCache` / :class:`PagedLatentKVCache` -- the same two layouts for multi-head latent
  attention (:class:`attn_ops.nn.MultiHeadLatentAttention`): one row ``[c_kv ; k_pe]`` of
  ``kv_lora_rank + rope_dim`` values per token and layer, shared by all heads (per layer
  ``latent [batch, capacity, d_c + d_rope]`` or ``[num_blocks, block_size, d_c + d_rope]``).
* :class:`LinearAttentionState` -- the recurrent states of lightning attention
  (:class:`attn_ops.nn.LightningAttention`): one ``[num_slots, H, Dk, Dv]`` pool per layer, a slot per
  sequence (:mod:`attn_ops.caches.linear_state`).
* :class:`~attn_ops.caches.deepseek.DeepseekLatentCache` -- a transformers ``Cache`` of
  :class:`LatentKVCache` rows for DeepSeek models swapped to attn_ops MLA. It needs transformers, so
  this package does not import it: import it from :mod:`attn_ops.integrations.deepseek`.

Modules: ``_base`` (what the KV and latent caches share), ``_paged`` (the block table and allocator),
``kv``, ``latent``, ``linear_state``, ``deepseek``.

How a step works (what :class:`attn_ops.nn.GroupedQueryAttention` does with a cache; the MLA module
does the same with ``[c_kv ; k_pe]`` instead of ``k`` / ``v``): every layer
``l`` rotates its new ``q`` / ``k`` at positions ``seqlens[b] + t``, appends ``k`` / ``v`` at row ``b``'s
current length (:meth:`append`), attends over ``seqlens + T`` keys (:meth:`attend`), and the layer with
``layer_idx == num_layers - 1`` then advances ``seqlens`` by ``T`` (:meth:`advance`). So one model
forward over all layers advances the cache by the ``T`` tokens it was given; a caller that drives the
ops itself calls :meth:`advance` after its last layer.

Everything the modules call (``positions``, ``slot_mapping``, ``append``, ``attend``, ``advance``) is
tensor ops on the ``int32`` lengths (in place), with no ``.item()`` and no data-dependent Python branch,
so a decode step traces under ``torch.compile(fullgraph=True)``. The host-side methods (``reset``,
``free_rows``, ``truncate``, ``lengths``, ``reserve`` of the paged caches) run between steps, outside
compiled code; ``truncate`` and ``reserve`` read the lengths back to the host.

Every forward writes ``T`` tokens into each of its ``B`` rows (rows ``0 .. B-1`` of the cache, ``B`` may be
smaller than the cache's batch). Batches of prompts with different lengths: pad them on the right to a
common length, prefill, then :meth:`truncate` each row to its prompt length -- causal attention never
lets a real token see the padding after it, and the padded entries are overwritten by later appends.

Create the caches in the same grad mode as the steps that use them (e.g. all under ``torch.no_grad()``;
tensors created under ``torch.inference_mode()`` cannot be modified outside it).
"""
from ._paged import OutOfBlocksError
from .kv import KVCache, PagedKVCache
from .latent import LatentKVCache, PagedLatentKVCache
from .linear_state import LinearAttentionState, OutOfSlotsError

__all__ = ["KVCache", "PagedKVCache", "LatentKVCache", "PagedLatentKVCache", "OutOfBlocksError",
           "LinearAttentionState", "OutOfSlotsError"]
