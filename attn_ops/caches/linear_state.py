"""The cache of the linear-attention family (lightning attention, :class:`attn_ops.nn.LightningAttention`):
:class:`LinearAttentionState`, one ``[num_slots, H, Dk, Dv]`` recurrent-state pool per layer, with host-side
slot allocation, reset and reorder (beam search)."""
from __future__ import annotations

from collections import Counter
from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from .._checks import check_positive, is_integer_dtype

__all__ = ["LinearAttentionState", "OutOfSlotsError"]


class OutOfSlotsError(RuntimeError):
    """:meth:`LinearAttentionState.allocate` found fewer free slots than requested."""


class LinearAttentionState:
    """Recurrent states of the linear-attention layers of a model: ``states[i]`` is layer ``i``'s pool
    ``[num_slots, H, Dk, Dv]``.

    A sequence owns one slot (the same in every layer). :meth:`allocate` hands out zeroed slots, :meth:`free`
    returns them, :meth:`reset` zeroes them, :meth:`reorder` copies states between slots (beam search: every
    beam takes its parent's state). These are host-side calls between steps; the steps themselves only pass
    ``layer(i)`` and an int32 ``state_indices`` to the ops, which trace under ``torch.compile(fullgraph=True)``.

    Each layer's pool is a tensor of its own, not a view into one ``[num_layers, ...]`` tensor: under
    ``torch.compile(dynamic=True)``, Inductor (torch 2.14) writes an in-place op's output that is a view with a
    storage offset at the start of its base instead, which would make every layer advance layer 0's states.
    """

    def __init__(self, num_layers: int, num_slots: int, num_heads: int, head_dim: int,
                 head_dim_v: Optional[int] = None, *, dtype: torch.dtype = torch.float32, device=None):
        check_positive("num_layers", num_layers)
        head_dim_v = head_dim if head_dim_v is None else head_dim_v
        shape = (check_positive("num_slots", num_slots), check_positive("num_heads", num_heads),
                 check_positive("head_dim", head_dim), check_positive("head_dim_v", head_dim_v))
        self.states: List[Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._free = list(range(num_slots))

    @property
    def num_layers(self) -> int:
        return len(self.states)

    @property
    def num_slots(self) -> int:
        return self.states[0].shape[0]

    @property
    def device(self) -> torch.device:
        return self.states[0].device

    def layer(self, layer_idx: int) -> Tensor:
        """Layer ``layer_idx``'s pool ``[num_slots, H, Dk, Dv]`` (updated in place by the ops)."""
        return self.states[layer_idx]

    def allocate(self, n: int) -> Tensor:
        """``n`` free slots, zeroed, as int32 ``[n]`` (on the states' device)."""
        check_positive("n", n, minimum=0)
        if n > len(self._free):
            raise OutOfSlotsError(f"LinearAttentionState.allocate: {n} slots requested, {len(self._free)} free "
                                  f"of {self.num_slots}")
        slots, self._free = self._free[:n], self._free[n:]
        out = torch.tensor(slots, dtype=torch.int32, device=self.device)
        self.reset(out)
        return out

    def free(self, slots: Union[Sequence[int], Tensor]) -> None:
        """Return ``slots`` to the free list (their states are zeroed when allocated again)."""
        slots = [int(s) for s in (slots.tolist() if isinstance(slots, Tensor) else slots)]
        repeated = sorted(s for s, n in Counter(slots).items() if n > 1)
        if repeated:  # freed twice, a slot would later be handed to two sequences
            raise ValueError(f"LinearAttentionState.free: slots {repeated} are given more than once")
        taken = set(range(self.num_slots)) - set(self._free)
        bad = [s for s in slots if s not in taken]
        if bad:
            raise ValueError(f"LinearAttentionState.free: slots {bad} are not allocated")
        self._free.extend(slots)

    def reset(self, slots: Union[None, Sequence[int], Tensor] = None) -> None:
        """Zero the states of ``slots`` (all slots when ``None``) in every layer."""
        index = None if slots is None else self._index("reset", "slots", slots)
        for pool in self.states:
            if index is None:
                pool.zero_()
            else:
                pool[index] = 0

    def reorder(self, slots: Union[Sequence[int], Tensor], source: Union[Sequence[int], Tensor]) -> None:
        """Slot ``slots[i]`` takes the state that slot ``source[i]`` had before the call, in every layer."""
        dst, src = self._index("reorder", "slots", slots), self._index("reorder", "source", source)
        if dst.numel() != src.numel():
            raise ValueError(f"LinearAttentionState.reorder: slots and source must have one entry each per slot, got "
                             f"{dst.numel()} and {src.numel()}")
        for pool in self.states:
            pool[dst] = pool[src]

    def _index(self, method: str, name: str, slots: Union[Sequence[int], Tensor]) -> Tensor:
        """``slots`` as an int64 index on the states' device: integers in ``[0, num_slots)`` (a negative value
        would silently count from the end)."""
        index = torch.as_tensor(slots, device=self.device)
        if index.numel() == 0 and index.dim() == 1:  # [] is float32 to torch.as_tensor
            return index.long()
        if not is_integer_dtype(index.dtype) or index.dim() > 1:
            raise ValueError(f"LinearAttentionState.{method}: {name} must be a list or 1-D tensor of slot numbers, "
                             f"got {index.dtype} of shape {tuple(index.shape)}")
        bad = index[(index < 0) | (index >= self.num_slots)]
        if bad.numel():
            raise ValueError(f"LinearAttentionState.{method}: {name} {bad.tolist()} are out of range [0, "
                             f"{self.num_slots})")
        return index.long().reshape(-1)
