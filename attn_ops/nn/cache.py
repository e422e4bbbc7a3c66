"""KV caches for the attention modules of :mod:`attn_ops.nn` (inference).

The cache objects hold the keys and values of every layer of a model plus one ``int32`` length per
batch row (``seqlens``):

* :class:`KVCache` -- one block of ``capacity`` tokens per row: per layer ``k [batch, capacity, Hkv, D]`` /
  ``v [.., Dv]`` (on the CPU, views of ``[batch, Hkv, capacity, D]`` storage).
* :class:`PagedKVCache` -- paged (vLLM layout): per layer ``k [num_blocks, block_size, Hkv, D]``,
  a ``block_table`` ``int32 [batch_size, max_blocks_per_seq]`` mapping each row's logical blocks to
  physical ones, and a host-side free-block allocator (:meth:`PagedKVCache.reserve`).
* :class:`LatentKVCache` / :class:`PagedLatentKVCache` -- the same two layouts for multi-head latent
  attention (:class:`attn_ops.nn.MultiHeadLatentAttention`): one row ``[c_kv ; k_pe]`` of
  ``kv_lora_rank + rope_dim`` values per token and layer, shared by all heads (per layer
  ``latent [batch, capacity, d_c + d_rope]`` or ``[num_blocks, block_size, d_c + d_rope]``).

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
from __future__ import annotations

import collections
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .. import _huge_pages
from .. import ops as _ops
from .._checks import check_positive, integer_values

__all__ = ["KVCache", "PagedKVCache", "LatentKVCache", "PagedLatentKVCache", "OutOfBlocksError"]

Rows = Union[int, Sequence[int], Tensor]


class OutOfBlocksError(RuntimeError):
    """``reserve`` of a paged cache found fewer free blocks than the next tokens need."""


def _per_layer(num_layers: int, shape: Tuple[int, ...], dtype: torch.dtype, device) -> List[Tensor]:
    """``num_layers`` zero tensors of ``shape`` (separate allocations, so compiled code never sees
    aliased inputs); on a Linux CPU, in transparent huge pages (attn_ops/_huge_pages.py: faster decode)."""
    return [_huge_pages.zeros(*shape, dtype=dtype, device=device) for _ in range(num_layers)]


def _allocate_layers(num_layers: int, rows: Tuple[int, int], num_kv_heads: int, head_dim: int,
                     head_dim_v: Optional[int], dtype: torch.dtype, device) -> Tuple[List[Tensor], List[Tensor]]:
    """One K and one V tensor per layer, ``[*rows, num_kv_heads, head_dim(_v)]`` (rows: ``(batch, capacity)``
    or ``(num_blocks, block_size)``). On the CPU each is the ``.transpose(1, 2)`` view of a ``[rows[0],
    num_kv_heads, rows[1], head_dim(_v)]`` tensor: each KV head's rows of a batch row or block are then
    contiguous, which the decode kernel streams one head at a time. Elsewhere they are contiguous."""
    check_positive("num_kv_heads", num_kv_heads)
    check_positive("head_dim", head_dim)
    head_dim_v = head_dim if head_dim_v is None else check_positive("head_dim_v", head_dim_v)
    head_major = _huge_pages.resolve_device(device).type == "cpu"

    def layers(dim: int) -> List[Tensor]:
        if not head_major:
            return _per_layer(num_layers, (*rows, num_kv_heads, dim), dtype, device)
        storage = _per_layer(num_layers, (rows[0], num_kv_heads, rows[1], dim), dtype, device)
        return [t.transpose(1, 2) for t in storage]

    return layers(head_dim), layers(head_dim_v)


def _row_list(rows: Rows, n: int, what: str) -> List[int]:
    rows = integer_values(what, "rows", rows).tolist()  # a bool mask would have freed rows 0 and 1
    for r in rows:
        if not 0 <= r < n:
            raise IndexError(f"{what}: row {r} is out of range [0, {n})")
    return rows


class _CacheBase:
    """What every cache shares: lengths, positions, advancing, host-side length management, sizes.
    Subclasses hold their per-layer storage tensors (``[rows, slots, *per_token]``) and list them in
    :meth:`_storage`."""

    num_layers: int
    seqlens: Tensor  # int32 [rows]; the live lengths (modified in place)

    def _storage(self) -> List[Tensor]:
        raise NotImplementedError

    def _rows(self, t: Tensor, batch_size: int) -> Tensor:
        """The first ``batch_size`` rows of ``t`` (``t`` itself when that is all of them); a batch larger
        than the cache is the caller's mistake, said as such (not as an op's index error)."""
        rows = t.shape[0]
        if batch_size > rows:
            raise ValueError(f"{type(self).__name__}: the input has batch size {batch_size}, but the cache "
                             f"has only {rows} rows")
        return t if batch_size == rows else t[:batch_size]

    # ---- used inside a (possibly compiled) forward: tensor ops only -------------------------
    def positions(self, batch_size: int, num_tokens: int) -> Tensor:
        """``int32 [B, T]``: the cache positions of the next ``T`` tokens of rows ``0 .. B-1``
        (``seqlens[b] + t``)."""
        seqlens = self._rows(self.seqlens, batch_size)
        t = torch.arange(num_tokens, dtype=torch.int32, device=seqlens.device)
        return seqlens.unsqueeze(1) + t

    def advance(self, num_tokens: Union[int, Tensor], batch_size: Optional[int] = None) -> None:
        """Add ``num_tokens`` to the lengths of rows ``0 .. batch_size-1`` (all rows by default), in
        place. The attention modules call it after the last layer (``layer_idx == num_layers - 1``);
        call it yourself only when you append with the ops directly."""
        rows = self.seqlens if batch_size is None else self._rows(self.seqlens, batch_size)
        rows.add_(num_tokens)

    # ---- host side, between steps ------------------------------------------------------------
    def lengths(self) -> Tensor:
        """A copy of the current lengths (``int32 [rows]``)."""
        return self.seqlens.clone()

    def reset(self) -> None:
        """Empty every row (lengths 0). The stored values are left as they are (they are
        overwritten by the next appends)."""
        self.seqlens.zero_()

    def free_rows(self, rows: Rows) -> None:
        """Empty the given rows (lengths 0)."""
        idx = _row_list(rows, self.seqlens.shape[0], f"{type(self).__name__}.free_rows")
        if idx:
            self.seqlens[torch.tensor(idx, dtype=torch.long, device=self.seqlens.device)] = 0

    def truncate(self, lengths: Union[Sequence[int], Tensor]) -> None:
        """Set the lengths of rows ``0 .. len(lengths)-1`` to ``lengths`` (each at most the current
        length), e.g. after a right-padded prefill of prompts of different lengths."""
        name = f"{type(self).__name__}.truncate"
        new = integer_values(name, "lengths", lengths).to(torch.int32)
        n = new.shape[0]
        if n > self.seqlens.shape[0]:
            raise ValueError(f"{name}: got {n} lengths for a cache of {self.seqlens.shape[0]} rows")
        cur = self.seqlens[:n].cpu()
        bad = ((new < 0) | (new > cur)).nonzero()
        if bad.numel():
            b = int(bad[0, 0])
            raise ValueError(f"{name}: lengths[{b}] = {int(new[b])} must be in [0, {int(cur[b])}] "
                             f"(the row's current length)")
        self.seqlens[:n].copy_(new.to(self.seqlens.device))

    @property
    def nbytes(self) -> int:
        """Bytes of the cache storage of all layers (the lengths and block table not counted)."""
        return sum(t.numel() * t.element_size() for t in self._storage())

    @property
    def bytes_per_token(self) -> int:
        """Cache bytes one token takes over all layers."""
        return sum(math.prod(t.shape[2:]) * t.element_size() for t in self._storage())

    @property
    def dtype(self) -> torch.dtype:
        return self._storage()[0].dtype

    @property
    def device(self) -> torch.device:
        return self._storage()[0].device

    def _check_layer(self, layer_idx: int) -> None:
        if not 0 <= layer_idx < self.num_layers:
            raise IndexError(f"{type(self).__name__}: layer_idx {layer_idx} is out of range "
                             f"[0, {self.num_layers})")


class _KVCacheBase(_CacheBase):
    """Storage of the K/V caches: per layer one K and one V tensor."""

    k: List[Tensor]
    v: List[Tensor]

    def _storage(self) -> List[Tensor]:
        return self.k + self.v

    @property
    def num_kv_heads(self) -> int:
        return self.k[0].shape[-2]

    @property
    def head_dim(self) -> int:
        return self.k[0].shape[-1]

    @property
    def head_dim_v(self) -> int:
        return self.v[0].shape[-1]


class _ContiguousRows:
    """What the contiguous caches share: ``batch_size`` rows of ``capacity`` tokens each."""

    def _init_rows(self, num_layers: int, batch_size: int, capacity: int, device) -> None:
        self.num_layers = check_positive("num_layers", num_layers)
        self.batch_size = check_positive("batch_size", batch_size)
        self._capacity = check_positive("capacity", capacity)
        self.seqlens = torch.zeros(batch_size, dtype=torch.int32, device=device)

    @property
    def capacity(self) -> int:
        """Tokens each row can hold."""
        return self._capacity


class KVCache(_ContiguousRows, _KVCacheBase):
    """KV cache of ``capacity`` tokens per row (not paged): per layer ``k [batch_size, capacity, Hkv, D]``,
    ``v [.., Dv]`` (one allocation per layer and per tensor), and ``seqlens`` (``int32 [batch_size]``).

    Args:
        num_layers: how many attention layers share the cache (``layer_idx`` in ``0 .. num_layers-1``;
            the last one advances the lengths).
        batch_size: rows; a forward may use the first ``B <= batch_size`` of them.
        capacity: tokens per row. Appending past it raises the op's ``RuntimeError``
            ("... exceeds the cache capacity ...") before anything is written.
        num_kv_heads, head_dim: the KV heads and head dim of the layers; ``head_dim_v`` defaults to
            ``head_dim``.

    The sliding window of a module does not shrink the cache: it must hold the whole sequence. On a Linux
    CPU the storage is in transparent huge pages, as in every cache here (attn_ops/_huge_pages.py).

    On the CPU, ``k[layer]`` / ``v[layer]`` are the ``.transpose(1, 2)`` views of ``[batch_size, Hkv,
    capacity, D]`` tensors (same shape and values, other strides): each KV head's rows are then contiguous,
    and the decode kernel streams every head in address order (1.25-1.3x faster than the same huge pages
    in the [batch_size, capacity, Hkv, D] order at B=32 on the README's Zen 4, "CPU decode"). Elsewhere
    they are contiguous.
    """

    def __init__(self, num_layers: int, batch_size: int, capacity: int, num_kv_heads: int,
                 head_dim: int, *, head_dim_v: Optional[int] = None,
                 dtype: torch.dtype = torch.float32, device=None):
        self._init_rows(num_layers, batch_size, capacity, device)
        self.k, self.v = _allocate_layers(num_layers, (batch_size, capacity), num_kv_heads, head_dim,
                                          head_dim_v, dtype, device)

    def append(self, layer_idx: int, k: Tensor, v: Tensor) -> None:
        """Write ``k [B, T, Hkv, D]`` / ``v [B, T, Hkv, Dv]`` of layer ``layer_idx`` at the current
        lengths of rows ``0 .. B-1`` (the lengths are not changed)."""
        self._check_layer(layer_idx)
        B = k.shape[0]
        _ops.kv_cache_append(self._rows(self.k[layer_idx], B), self._rows(self.v[layer_idx], B), k, v,
                             self._rows(self.seqlens, B))

    def attend(self, layer_idx: int, q: Tensor, *, scale: Optional[float] = None,
               window_left: int = -1, softcap: float = 0.0) -> Tensor:
        """Causal attention of ``q [B, T, Hq, D]`` (the ``T`` tokens just appended) over layer
        ``layer_idx``'s cache: ``[B, T, Hq, Dv]``."""
        self._check_layer(layer_idx)
        B, T = q.shape[0], q.shape[1]
        out, _ = _ops.attention_with_kvcache(
            q, self._rows(self.k[layer_idx], B), self._rows(self.v[layer_idx], B),
            self._rows(self.seqlens, B) + T, scale=scale, causal=True, window_left=window_left,
            softcap=softcap)
        return out

    def __repr__(self) -> str:
        return (f"KVCache(num_layers={self.num_layers}, batch_size={self.batch_size}, "
                f"capacity={self.capacity}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, device={self.device}, "
                f"nbytes={self.nbytes})")


class _PagedBase(_CacheBase):
    """The paged layout shared by :class:`PagedKVCache` and :class:`PagedLatentKVCache`: the block
    table, the host-side block allocator and the slot mapping (see :class:`PagedKVCache`)."""

    def _init_paged(self, num_layers: int, num_blocks: int, block_size: int, batch_size: int,
                    max_blocks_per_seq: int, device) -> None:
        self.num_layers = check_positive("num_layers", num_layers)
        self.num_blocks = check_positive("num_blocks", num_blocks)
        self.block_size = check_positive("block_size", block_size)
        self.batch_size = check_positive("batch_size", batch_size)
        self.max_blocks_per_seq = check_positive("max_blocks_per_seq", max_blocks_per_seq)
        self.seqlens = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self.block_table = torch.full((batch_size, max_blocks_per_seq), num_blocks, dtype=torch.int32,
                                      device=device)
        self._free: collections.deque = collections.deque(range(num_blocks))
        self._row_blocks: List[List[int]] = [[] for _ in range(batch_size)]

    # ---- properties ----------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Tokens one row can hold (``max_blocks_per_seq * block_size``)."""
        return self.max_blocks_per_seq * self.block_size

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def row_blocks(self, row: int) -> List[int]:
        """The physical blocks assigned to ``row``, in logical order (a copy)."""
        return list(self._row_blocks[row])

    # ---- host-side allocator -------------------------------------------------------------------
    def reserve(self, num_new_tokens: Union[int, Sequence[int], Tensor]) -> int:
        """Assign the blocks rows need to hold ``num_new_tokens`` more tokens each.

        ``num_new_tokens``: an int for every row, or one count per row for rows ``0 .. n-1`` (the
        other rows get 0). Reads the lengths back to the host. Idempotent for a given step (blocks
        already assigned are kept). Returns the number of blocks assigned by this call.
        """
        name = f"{type(self).__name__}.reserve"
        given = torch.as_tensor(num_new_tokens)
        counts = integer_values(name, "num_new_tokens", given).tolist()
        if given.dim() == 0:  # an int, a 0-d tensor or a NumPy integer: every row
            counts = counts * self.batch_size
        else:
            if len(counts) > self.batch_size:
                raise ValueError(f"{name}: got {len(counts)} counts for a cache "
                                 f"of {self.batch_size} rows")
            counts += [0] * (self.batch_size - len(counts))
        if any(c < 0 for c in counts):
            raise ValueError(f"{name}: token counts must be >= 0, got {counts}")
        lengths = self.seqlens.tolist()
        need = []
        for b, (n, L) in enumerate(zip(counts, lengths)):
            blocks = -(-(L + n) // self.block_size) if n > 0 else 0
            if blocks > self.max_blocks_per_seq:
                raise RuntimeError(
                    f"{type(self).__name__}.reserve: row {b} would hold {L + n} tokens, more than its "
                    f"capacity {self.capacity} (max_blocks_per_seq {self.max_blocks_per_seq} x "
                    f"block_size {self.block_size})")
            need.append(max(0, blocks - len(self._row_blocks[b])))
        total = sum(need)
        if total > len(self._free):
            raise OutOfBlocksError(
                f"{type(self).__name__}.reserve: out of KV-cache blocks: the next tokens need {total} "
                f"more blocks of {self.block_size} tokens, {len(self._free)} of {self.num_blocks} are free "
                f"(free finished rows with free_rows(), or make num_blocks larger)")
        if total == 0:
            return 0
        for j in range(max(need)):  # round-robin over the rows
            for b in range(self.batch_size):
                if need[b] > j:
                    self._row_blocks[b].append(self._free.popleft())
        self._sync_table()
        return total

    def free_rows(self, rows: Rows) -> None:
        """Empty the given rows and return their blocks to the free list (reserve again before a
        row takes part in another step)."""
        idx = _row_list(rows, self.batch_size, f"{type(self).__name__}.free_rows")
        for b in idx:
            self._free.extend(self._row_blocks[b])
            self._row_blocks[b] = []
        super().free_rows(idx)
        self._sync_table()

    def truncate(self, lengths: Union[Sequence[int], Tensor]) -> None:
        """Set the lengths of rows ``0 .. len(lengths)-1`` (each at most its current length) and
        return the blocks no longer needed to the free list."""
        super().truncate(lengths)
        n = torch.as_tensor(lengths).numel()
        for b, L in enumerate(self.seqlens[:n].tolist()):
            keep = -(-L // self.block_size)
            if len(self._row_blocks[b]) > keep:
                self._free.extend(self._row_blocks[b][keep:])
                del self._row_blocks[b][keep:]
        self._sync_table()

    def reset(self) -> None:
        """Empty every row, free every block (the free list back in its initial order)."""
        super().reset()
        self._free = collections.deque(range(self.num_blocks))
        self._row_blocks = [[] for _ in range(self.batch_size)]
        self._sync_table()

    def _sync_table(self) -> None:
        table = torch.full((self.batch_size, self.max_blocks_per_seq), self.num_blocks,
                           dtype=torch.int32)
        for b, blocks in enumerate(self._row_blocks):
            if blocks:
                table[b, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        self.block_table.copy_(table.to(self.block_table.device))

    # ---- used inside a (possibly compiled) forward ---------------------------------------------
    def _write(self, append, num_tokens: int) -> None:
        """Runs ``append()`` (a paged append op call). Eagerly, an out-of-range slot means the allocator
        assigned no block for these tokens, so the error says to call :meth:`reserve` (compiled code
        gets the op's own message: its values are checked when the graph runs)."""
        if torch.compiler.is_compiling():
            append()
            return
        try:
            append()
        except RuntimeError as e:
            if "slot_mapping[" not in str(e):
                raise
            raise RuntimeError(
                f"{type(self).__name__}.append: the {num_tokens} new token(s) of a row reach past the blocks "
                f"assigned to it: call reserve({num_tokens}) before each step (outside compiled code). "
                f"The op said: {e}") from e

    def slot_mapping(self, batch_size: int, num_tokens: int) -> Tensor:
        """``int64 [B * T]``: the cache slot (``block * block_size + offset``) of the next ``T``
        tokens of rows ``0 .. B-1``, row-major. Positions outside what the row's blocks cover map to
        an out-of-range slot (the append op then raises)."""
        pos = self.positions(batch_size, num_tokens).long()
        blk_idx = torch.div(pos, self.block_size, rounding_mode="floor")
        offset = pos - blk_idx * self.block_size
        table = self._rows(self.block_table, batch_size).long()
        blk = torch.gather(table, 1, blk_idx.clamp(max=self.max_blocks_per_seq - 1))
        blk = torch.where(blk_idx < self.max_blocks_per_seq, blk, self.num_blocks)
        return (blk * self.block_size + offset).reshape(-1)


class PagedKVCache(_PagedBase, _KVCacheBase):
    """Paged KV cache (vLLM layout) with a host-side block allocator.

    Per layer ``k [num_blocks, block_size, Hkv, D]`` / ``v [.., Dv]``; ``block_table``
    (``int32 [batch_size, max_blocks_per_seq]``): token ``p`` of row ``b`` lives in block
    ``block_table[b, p // block_size]`` at offset ``p % block_size``; entries not assigned hold
    ``num_blocks`` (out of range, so an append the allocator did not reserve for raises the op's
    ``RuntimeError`` and writes nothing). All layers share one block table.

    Before each step (outside compiled code) call :meth:`reserve` with the number of tokens the step
    adds; it assigns the blocks the rows need, round-robin over the rows (row 0's next block, row 1's
    next block, ...), so rows that grow together get interleaved, non-contiguous blocks. Freed blocks
    go to the back of the free list. Raises :class:`OutOfBlocksError` (a ``RuntimeError``) when the free
    blocks do not suffice, and ``RuntimeError`` when a row would need more than ``max_blocks_per_seq``
    blocks; in both cases nothing is assigned.

    ``batch_size``: rows of the block table; a forward may use the first ``B <= batch_size``.

    On the CPU, ``k[layer]`` / ``v[layer]`` are the ``.transpose(1, 2)`` views of ``[num_blocks, Hkv,
    block_size, D]`` tensors (same shape and values, other strides): within a block each KV head's rows are
    contiguous, and the decode kernel streams one head at a time (1.05-1.37x faster at block sizes 4-256 on
    the README's Zen 4, "CPU decode"). Elsewhere they are contiguous.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, batch_size: int, max_blocks_per_seq: int, *,
                 head_dim_v: Optional[int] = None, dtype: torch.dtype = torch.float32, device=None):
        self._init_paged(num_layers, num_blocks, block_size, batch_size, max_blocks_per_seq, device)
        self.k, self.v = _allocate_layers(num_layers, (num_blocks, block_size), num_kv_heads, head_dim,
                                          head_dim_v, dtype, device)

    def append(self, layer_idx: int, k: Tensor, v: Tensor) -> None:
        """Write ``k [B, T, Hkv, D]`` / ``v [B, T, Hkv, Dv]`` of layer ``layer_idx`` after the current
        lengths of rows ``0 .. B-1`` (the lengths are not changed)."""
        self._check_layer(layer_idx)
        B, T = k.shape[0], k.shape[1]
        slots = self.slot_mapping(B, T)
        self._write(lambda: _ops.paged_kv_cache_append(self.k[layer_idx], self.v[layer_idx], k.flatten(0, 1),
                                                       v.flatten(0, 1), slots), T)

    def attend(self, layer_idx: int, q: Tensor, *, scale: Optional[float] = None,
               window_left: int = -1, softcap: float = 0.0) -> Tensor:
        """Causal attention of ``q [B, T, Hq, D]`` (the ``T`` tokens just appended) over layer
        ``layer_idx``'s cache: ``[B, T, Hq, Dv]``."""
        self._check_layer(layer_idx)
        B, T = q.shape[0], q.shape[1]
        out, _ = _ops.attention_with_kvcache(
            q, self.k[layer_idx], self.v[layer_idx], self._rows(self.seqlens, B) + T,
            block_table=self._rows(self.block_table, B), scale=scale, causal=True,
            window_left=window_left, softcap=softcap)
        return out

    def __repr__(self) -> str:
        return (f"PagedKVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, "
                f"block_size={self.block_size}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, batch_size={self.batch_size}, "
                f"max_blocks_per_seq={self.max_blocks_per_seq}, dtype={self.dtype}, "
                f"device={self.device}, free_blocks={self.num_free_blocks})")


# --------------------------------------------------------------------------------------------------
# Multi-head latent attention (DeepSeek-V2/V3 MLA): one [c_kv ; k_pe] row per token and layer
# --------------------------------------------------------------------------------------------------
class _LatentCacheBase(_CacheBase):
    """Storage of the MLA caches: per layer one tensor whose rows are ``[c_kv ; k_pe]``
    (``kv_lora_rank + rope_dim`` values per token, shared by all heads; docs/mla_api.md)."""

    latent: List[Tensor]
    _kv_lora_rank: int

    def _init_latent(self, rows: Tuple[int, int], kv_lora_rank: int, rope_dim: int,
                     dtype: torch.dtype, device) -> None:
        self._kv_lora_rank = check_positive("kv_lora_rank", kv_lora_rank)
        check_positive("rope_dim", rope_dim)
        self.latent = _per_layer(self.num_layers, (*rows, kv_lora_rank + rope_dim), dtype, device)

    def _storage(self) -> List[Tensor]:
        return self.latent

    @property
    def kv_lora_rank(self) -> int:
        """``d_c``: the first ``d_c`` values of a row are ``c_kv`` (keys and values in latent space)."""
        return self._kv_lora_rank

    @property
    def rope_dim(self) -> int:
        """``d_rope``: the last values of a row are the rotated, head-shared ``k_pe``."""
        return self.latent[0].shape[-1] - self._kv_lora_rank

    def _repr_dims(self) -> str:
        return (f"kv_lora_rank={self.kv_lora_rank}, rope_dim={self.rope_dim}, dtype={self.dtype}, "
                f"device={self.device}, bytes_per_token={self.bytes_per_token}")


class LatentKVCache(_ContiguousRows, _LatentCacheBase):
    """Contiguous MLA cache: per layer ``latent [batch_size, capacity, kv_lora_rank + rope_dim]``
    (row ``[c_kv ; k_pe]``: the normalized latent ``c_kv`` and the rotated ``k_pe`` of each token) and
    ``seqlens`` (``int32 [batch_size]``), used by :class:`attn_ops.nn.MultiHeadLatentAttention`.

    ``dtype`` / ``device`` are keyword-only. ``bytes_per_token`` is
    ``num_layers * (kv_lora_rank + rope_dim) * element_size``, against
    ``num_layers * num_heads * (qk_nope + qk_rope + v_head_dim) * element_size`` for a K/V cache of the
    expanded heads (576 vs 40960 values per layer at DeepSeek-V3 size). Lengths, ``advance``,
    ``truncate``, ``free_rows``, ``reset`` as :class:`KVCache`.
    """

    def __init__(self, num_layers: int, batch_size: int, capacity: int, kv_lora_rank: int,
                 rope_dim: int, *, dtype: torch.dtype = torch.float32, device=None):
        self._init_rows(num_layers, batch_size, capacity, device)
        self._init_latent((batch_size, capacity), kv_lora_rank, rope_dim, dtype, device)

    def append(self, layer_idx: int, c_kv: Tensor, k_pe: Tensor) -> None:
        """Write ``c_kv [B, T, d_c]`` / ``k_pe [B, T, d_rope]`` of layer ``layer_idx`` at the current
        lengths of rows ``0 .. B-1`` (the lengths are not changed)."""
        self._check_layer(layer_idx)
        B = c_kv.shape[0]
        _ops.mla_cache_append(self._rows(self.latent[layer_idx], B), c_kv, k_pe,
                              cache_seqlens=self._rows(self.seqlens, B))

    def attend(self, layer_idx: int, q_latent: Tensor, q_rope: Tensor, *, scale: float) -> Tensor:
        """Absorbed causal attention (:func:`attn_ops.mla_decode`) of ``q_latent [B, T, H, d_c]`` /
        ``q_rope [B, T, H, d_rope]`` (the ``T`` tokens just appended) over layer ``layer_idx``'s cache:
        ``out_latent [B, T, H, d_c]``."""
        self._check_layer(layer_idx)
        B, T = q_latent.shape[0], q_latent.shape[1]
        out, _ = _ops.mla_decode(q_latent, q_rope, self._rows(self.latent[layer_idx], B),
                                 self._rows(self.seqlens, B) + T, scale=scale)
        return out

    def __repr__(self) -> str:
        return (f"LatentKVCache(num_layers={self.num_layers}, batch_size={self.batch_size}, "
                f"capacity={self.capacity}, {self._repr_dims()})")


class PagedLatentKVCache(_PagedBase, _LatentCacheBase):
    """Paged MLA cache: per layer ``latent [num_blocks, block_size, kv_lora_rank + rope_dim]``, with
    the block table and host-side allocator of :class:`PagedKVCache` (``reserve`` before each step,
    ``free_rows``, ``truncate``, ``reset``, :class:`OutOfBlocksError`). Any block size. ``dtype`` /
    ``device`` are keyword-only."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_lora_rank: int,
                 rope_dim: int, batch_size: int, max_blocks_per_seq: int, *,
                 dtype: torch.dtype = torch.float32, device=None):
        self._init_paged(num_layers, num_blocks, block_size, batch_size, max_blocks_per_seq, device)
        self._init_latent((num_blocks, block_size), kv_lora_rank, rope_dim, dtype, device)

    def append(self, layer_idx: int, c_kv: Tensor, k_pe: Tensor) -> None:
        """Write ``c_kv [B, T, d_c]`` / ``k_pe [B, T, d_rope]`` of layer ``layer_idx`` after the current
        lengths of rows ``0 .. B-1`` (the lengths are not changed)."""
        self._check_layer(layer_idx)
        B, T = c_kv.shape[0], c_kv.shape[1]
        slots = self.slot_mapping(B, T)
        self._write(lambda: _ops.mla_cache_append(self.latent[layer_idx], c_kv.flatten(0, 1), k_pe.flatten(0, 1),
                                                  slot_mapping=slots), T)

    def attend(self, layer_idx: int, q_latent: Tensor, q_rope: Tensor, *, scale: float) -> Tensor:
        """As :meth:`LatentKVCache.attend`, over the paged cache."""
        self._check_layer(layer_idx)
        B, T = q_latent.shape[0], q_latent.shape[1]
        out, _ = _ops.mla_decode(q_latent, q_rope, self.latent[layer_idx],
                                 self._rows(self.seqlens, B) + T, scale=scale,
                                 block_table=self._rows(self.block_table, B))
        return out

    def __repr__(self) -> str:
        return (f"PagedLatentKVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, "
                f"block_size={self.block_size}, batch_size={self.batch_size}, "
                f"max_blocks_per_seq={self.max_blocks_per_seq}, free_blocks={self.num_free_blocks}, "
                f"{self._repr_dims()})")
