"""CUDA: the experimental two-slice forward tiles (ATTN_OPS_CUDA_FWD_SLICES=2: 32 query rows per warp, head dims
64, 96 and 128, used only for at least 128 rows per batch and KV head; csrc/attention/cuda/forward_mma.cu),
checked as the default tiles are (float64 reference, the tests' tolerance rule), and the launch record says
they ran.

Each case runs in a child process: the tiles are new, and a fault in them (a sticky CUDA error) must not fail
the tests that share the process. Skipped without a GPU.
"""
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")

# name: (B, Tq, Tk, Hq, Hkv, D, dtype, kwargs)
CASES = {
    "d64_full_f16": (2, 150, 200, 4, 2, 64, "float16", {}),
    "d96_causal_bf16": (1, 300, 300, 8, 2, 96, "bfloat16", dict(causal=True)),
    "d128_gqa_causal_bf16": (2, 130, 257, 8, 1, 128, "bfloat16", dict(causal=True)),
    "d128_window_softcap_f16": (1, 200, 260, 4, 4, 128, "float16", dict(window_left=40, window_right=7, softcap=20.0)),
}

_CHILD = """
import torch
from reference import dense_inputs
from test_attention_forward import check_forward
B, Tq, Tk, Hq, Hkv, D, dtype, kw = {case!r}
q, k, v = dense_inputs(B, Tq, Tk, Hq, Hkv, D, D, getattr(torch, dtype), "cuda")
check_forward(q, k, v, **kw)
record = list(torch.ops.attn_ops._cuda_last_launch(torch.empty(0, device="cuda"), "forward_mma"))
assert record[:2] == [D, D] and record[6] == 32, record
cu = torch.tensor([0, 0, 140, 150], dtype=torch.int32, device="cuda")  # varlen with an empty sequence
qv, kv, vv = (t.reshape(-1, *t.shape[2:])[:150] for t in (q, k, v))
check_forward(qv, kv, vv, cu_seqlens_q=cu, cu_seqlens_k=cu, **kw)
torch.cuda.synchronize()
print("TWO-SLICE OK", flush=True)
"""


@pytest.mark.parametrize("case", list(CASES))
def test_two_slice_tiles_match_reference(case):
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, ATTN_OPS_CUDA_FWD_SLICES="2", PYTHONPATH=os.pathsep.join([tests] + sys.path))
    child = subprocess.run([sys.executable, "-c", _CHILD.format(case=CASES[case])], capture_output=True, text=True,
                           timeout=300, env=env, cwd=tests)
    output = child.stdout + child.stderr
    assert child.returncode == 0 and "TWO-SLICE OK" in output, output
