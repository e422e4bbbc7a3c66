"""The paged layout shared by :class:`~attn_ops.caches.PagedKVCache` and
:class:`~attn_ops.caches.PagedLatentKVCache`: the block table, the host-side block allocator
(``reserve``, :class:`OutOfBlocksError`) and the slot mapping."""
from __future__ import annotations

import collections
from typing import List, Sequence, Tuple, Union

import torch
from torch import Tensor

from .._checks import check_positive, integer_values
from ._base import Rows, _CacheBase, _row_list

__all__ = ["OutOfBlocksError"]


class OutOfBlocksError(RuntimeError):
    """``reserve`` of a paged cache found fewer free blocks than the next tokens need."""


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

    def _layout(self, layer_storage: Tuple[Tensor, ...], batch_size: int) -> Tuple[Tuple[Tensor, ...], Tensor]:
        return layer_storage, self._rows(self.block_table, batch_size)

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
