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
