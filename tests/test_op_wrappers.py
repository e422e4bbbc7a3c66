"""Every argument of every schema the operator library registers is reachable from its Python wrapper
in attn_ops.ops."""
import inspect

import pytest
import torch

from attn_ops import ops


def _schema_arguments(name):
    return [a.name for a in getattr(torch.ops.attn_ops, name).default._schema.arguments]


# every public operator the library registered (torch.ops.attn_ops lists its ops only once they are used);
# names with a leading underscore are the library's test hooks (the CUDA build's _cuda_last_launch), not API
OPS = sorted({n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
              if n.startswith("attn_ops::") and not n.startswith("attn_ops::_")})


def test_ops_are_listed():
    assert {"attention", "attention_backward", "mla_decode", "lightning_attention_decode_"} <= set(OPS)


@pytest.mark.parametrize("name", OPS)
def test_every_schema_argument_reachable_from_python(name):
    wrapper = getattr(ops, name, None)
    assert wrapper is not None, f"attn_ops.ops has no wrapper for torch.ops.attn_ops.{name}"
    params = inspect.signature(wrapper).parameters
    missing = [a for a in _schema_arguments(name) if a not in params]
    assert not missing, f"attn_ops.ops.{name} does not expose {missing}"
