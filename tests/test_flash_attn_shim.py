"""attn_ops.flash_attn_shim: FlashAttention's module names resolve to attn_ops (checked in a fresh
subprocess), flash_attn.bert_padding and flash_attn.layers.rotary against plain-PyTorch references, and
transformers' own flash_attention_2 path through the shim against its eager attention.

transformers refuses flash_attention_2 without a GPU ("FlashAttention2 is not available on CPU") after its
package checks pass; on CPU the test checks that refusal, then lets transformers' availability check answer yes
(the only thing patched) and runs its FlashAttention 2 code path (unpad with flash_attn.bert_padding, varlen
attention, pad) on the shim."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from attn_ops import flash_attn_padding as padding
from attn_ops.flash_attn_rotary import apply_rotary_emb
from reference import assert_close_to_ref
from rope_reference import rope_ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)] if not args else
                          [sys.executable, *args], input=None, capture_output=True, text=True, env=env, timeout=300)


def test_shim_serves_flash_attention_modules_in_a_fresh_process():
    result = run_python("""
        import importlib.metadata as md, importlib.util, sys
        spec = importlib.util.find_spec("flash_attn")
        assert spec is None or "attn_ops" in str(spec)
        import attn_ops.flash_attn_shim as shim
        shim.install(); shim.install()  # idempotent
        import flash_attn, flash_attn_interface
        from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
        from flash_attn.flash_attn_interface import flash_attn_qkvpacked_func
        from flash_attn.bert_padding import pad_input, unpad_input, index_first_axis
        from flash_attn.layers.rotary import apply_rotary_emb
        import attn_ops.flash_attn_interface as fa2, attn_ops.flash_attn3_interface as fa3
        assert flash_attn_func is fa2.flash_attn_func and flash_attn_qkvpacked_func is fa2.flash_attn_qkvpacked_func
        assert flash_attn_interface.flash_attn_func is fa3.flash_attn_func
        assert flash_attn.__version__ == shim.FLASH_ATTN_VERSION == md.version("flash-attn")
        assert md.version("flash_attn_3") == shim.FLASH_ATTN_3_VERSION
        assert "flash-attn" in md.packages_distributions()["flash_attn"]
        assert "flash-attn-3" in md.packages_distributions()["flash_attn_interface"]
        import torch
        q = torch.randn(1, 5, 2, 16)
        assert torch.equal(flash_attn_func(q, q, q, causal=True), fa2.flash_attn_func(q, q, q, causal=True))
        shim.uninstall()
        assert "flash_attn" not in sys.modules and not shim.installed()
        print("ok")
    """)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_shim_runs_a_program_unchanged(tmp_path):
    program = tmp_path / "program.py"
    program.write_text("import sys, torch\nfrom flash_attn import flash_attn_func\n"
                       "q = torch.randn(1, 3, 2, 8)\nprint(flash_attn_func(q, q, q).shape, sys.argv[1:])\n")
    result = run_python(None, "-m", "attn_ops.flash_attn_shim", str(program), "--flag")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torch.Size([1, 3, 2, 8]) ['--flag']"


def test_install_refuses_after_a_real_import(monkeypatch):
    import attn_ops.flash_attn_shim as shim
    monkeypatch.setitem(sys.modules, "flash_attn", type(sys)("flash_attn"))
    with pytest.raises(RuntimeError, match=r"flash_attn already imported .*install the shim before"):
        shim.install()


def test_bert_padding_round_trip_and_gradients():
    x = torch.randn(3, 6, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    unused = torch.tensor([[0, 0, 0, 1, 0, 0], [0] * 6, [0] * 6])
    tokens, indices, cu_seqlens, max_seqlen, used = padding.unpad_input(x, mask)
    assert torch.equal(tokens, x.reshape(18, 4)[mask.flatten().bool()])
    assert cu_seqlens.tolist() == [0, 3, 8, 14] and cu_seqlens.dtype == torch.int32 and max_seqlen == 6
    assert used.tolist() == [3, 5, 6]
    back = padding.pad_input(tokens, indices, 3, 6)
    assert torch.equal(back, x * mask[..., None])
    (grad,) = torch.autograd.grad(back.sum(), x)
    assert torch.equal(grad, mask[..., None].expand_as(x).float())
    tokens, _, cu_u, max_u, used_u = padding.unpad_input(x, mask, unused)
    assert tokens.shape[0] == 15 and cu_u.tolist() == [0, 4, 9, 15] and used_u.tolist() == [3, 5, 6]
    assert torch.equal(padding.index_first_axis(x.flatten(0, 1), indices), x.flatten(0, 1)[indices])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["dense_int_offset", "dense_tensor_offset", "varlen"])
@pytest.mark.parametrize("inplace", [False, True])
def test_apply_rotary_emb(layout, interleaved, inplace):
    cos_sin = torch.rand(64, 8, dtype=torch.float64) * 6
    cos, sin = cos_sin.cos().float(), cos_sin.sin().float()
    if layout == "varlen":
        c = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
        x = torch.randn(12, 2, 32)
        offsets = torch.tensor([3, 0, 9], dtype=torch.int32)
        pos = torch.cat([torch.arange(5) + 3, torch.arange(7) + 9])
        kw = dict(cu_seqlens=c, max_seqlen=7, seqlen_offsets=offsets)
    else:
        x = torch.randn(2, 7, 2, 32)
        offsets = 4 if layout == "dense_int_offset" else torch.tensor([1, 20], dtype=torch.int32)
        pos = (torch.arange(7) + (offsets if isinstance(offsets, int) else offsets[:, None])).expand(2, 7)
        kw = dict(seqlen_offsets=offsets)
    ref = rope_ref(x, cos, sin, pos, interleaved=interleaved, compute_dtype=torch.float64)
    same = rope_ref(x, cos, sin, pos, interleaved=interleaved, compute_dtype=torch.float32)
    original = x.clone()
    out = apply_rotary_emb(x, cos, sin, interleaved, inplace, **kw)
    assert_close_to_ref(out, ref, same, name="rotary")
    assert (out is x) == inplace and (torch.equal(x, original) != inplace)


# --------------------------------------------------------------------------------------------------
# transformers' flash_attention_2 through the shim
# --------------------------------------------------------------------------------------------------
TRANSFORMERS_RUN = """
import copy, json, sys
import attn_ops.flash_attn_shim as shim
shim.install()  # before transformers is imported: it reads the installed distributions then
import torch, transformers
import transformers.modeling_flash_attention_utils as fa_utils
from transformers.utils import import_utils

dtype = getattr(torch, sys.argv[1])
device = "cuda" if torch.cuda.is_available() else "cpu"
report = {"device": device, "package_found": import_utils._is_package_available("flash_attn", return_version=True)}
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                  initializer_range=0.2, pad_token_id=0)
model = transformers.LlamaForCausalLM(config).eval()
model64 = copy.deepcopy(model).double().to(device)
model = model.to(dtype).to(device)
ids = torch.randint(1, 97, (3, 10), device=device)
mask = torch.ones(3, 10, dtype=torch.long, device=device)
mask[0, :4] = 0
mask[2, :1] = 0
ids = ids.masked_fill(mask == 0, 0)
try:
    model.set_attn_implementation("flash_attention_2")
    report["refused"] = None
except ImportError as e:  # no GPU: transformers' device check
    report["refused"] = str(e)
    fa_utils.is_flash_attn_2_available = lambda *a, **k: True
    model.config._attn_implementation = "flash_attention_2"
with torch.no_grad():
    flash = model(ids, attention_mask=mask).logits
    report["flash_fn"] = fa_utils._flash_varlen_fn.__module__ + "." + fa_utils._flash_varlen_fn.__name__
    report["pad_fn"] = fa_utils._pad_fn.__module__ + "." + fa_utils._pad_fn.__name__
    model.set_attn_implementation("eager")
    eager = model(ids, attention_mask=mask).logits
    model64.set_attn_implementation("eager")
    # eager rounds its softmax through float32 even for float64 inputs (its float64 mask value then overflows
    # to -inf, giving NaN): keep float64 in float64 so that eager on the float64 copy is the ground truth
    softmax = torch.nn.functional.softmax
    torch.nn.functional.softmax = lambda x, dim=None, _stacklevel=3, dtype=None: softmax(
        x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)
    ref64 = model64(ids, attention_mask=mask).logits
    torch.nn.functional.softmax = softmax
real = mask.bool()
report["nan_in_ref64"] = bool(ref64[real].isnan().any())
torch.save({"flash": flash[real].cpu(), "eager": eager[real].cpu(), "ref64": ref64[real].cpu()}, sys.argv[2])
print(json.dumps(report))
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_transformers_flash_attention_2_through_the_shim(tmp_path, dtype):
    pytest.importorskip("transformers")
    import json
    script = tmp_path / "run.py"
    script.write_text(TRANSFORMERS_RUN)
    result = run_python(None, str(script), dtype, str(tmp_path / "logits.pt"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["package_found"] == [True, "2.8.4"]
    if report["device"] == "cpu":
        assert report["refused"] == ("FlashAttention2 has been toggled on, but it cannot be used due to the following "
                                     "error: FlashAttention2 is not available on CPU. Please make sure you are on any "
                                     "of the supported devices: ('cuda', 'mlu', 'npu', 'xpu').")
    assert report["flash_fn"] == "attn_ops.flash_attn_interface.flash_attn_varlen_func"
    assert report["pad_fn"] == "attn_ops.flash_attn_padding.pad_input"
    logits = torch.load(tmp_path / "logits.pt")
    # eager computes in the model dtype with a float32 softmax: the same-dtype baseline of reference.py's rule
    assert_close_to_ref(logits["flash"], logits["ref64"], logits["eager"], name=f"logits ({dtype})")
    print(f"{dtype}: max|flash - eager| = {(logits['flash'].double() - logits['eager'].double()).abs().max():.3e}, "
          f"max|flash - ref64| = {(logits['flash'].double() - logits['ref64']).abs().max():.3e}, "
          f"max|eager - ref64| = {(logits['eager'].double() - logits['ref64']).abs().max():.3e}")
