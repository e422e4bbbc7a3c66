"""Small model pieces shared by the module tests."""
from torch import nn


class Stack(nn.Module):
    """Residual stack of attention layers sharing one cache (layer i uses layer_idx=i)."""

    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x, positions=None, cache=None):
        for i, layer in enumerate(self.layers):
            x = x + layer(x, positions=positions, cache=cache, layer_idx=i)
        return x


def gather_paged(cache_t, block_table, b, L):
    """The first L token rows of row b of a paged cache tensor [num_blocks, block_size, ...]."""
    bs = cache_t.shape[1]
    blocks = block_table[b, : -(-L // bs)].long()
    return cache_t[blocks].flatten(0, 1)[:L]
