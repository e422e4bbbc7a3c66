"""attn_ops.nn.AdditiveAttention (Bahdanau) against the textbook materializing formulation in float64,
the decoder loop with keys projected once, padding, compile and bad inputs."""
import copy

import pytest
import torch

from attn_ops.nn import AdditiveAttention
from reference import assert_close_to_ref


def bahdanau_ref(m, query, key, value, mask=None):
    """scores = w . tanh(W_q q + W_k k), materialized [B, Tq, Tk, hidden]."""
    scores = torch.tanh(m.w_q(query)[:, :, None] + m.w_k(key)[:, None]) @ m.w
    if mask is not None:
        scores = scores.masked_fill(mask[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


@pytest.mark.parametrize("Tq, Tk", [(1, 1), (6, 9), (4, 0)])
@pytest.mark.parametrize("value_dim", [None, 5])
def test_matches_reference(Tq, Tk, value_dim):
    m = AdditiveAttention(7, 6, 12, value_dim, dtype=torch.float64)
    query, key = torch.randn(2, Tq, 7, dtype=torch.float64), torch.randn(2, Tk, 6, dtype=torch.float64)
    value = None if value_dim is None else torch.randn(2, Tk, 5, dtype=torch.float64)
    out, weights = m(query, key, value, return_weights=True)
    ref_out, ref_weights = bahdanau_ref(m, query, key, key if value is None else value)
    if Tk == 0:  # no key: zeros instead of the reference's NaN
        assert (out == 0).all() and weights.shape == (2, Tq, 0)
        return
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)


def test_decoder_loop_with_keys_projected_once():
    m = AdditiveAttention(8, 10, 16, dtype=torch.float64)
    enc = torch.randn(3, 11, 10, dtype=torch.float64)
    mask = torch.zeros(3, 11, dtype=torch.bool)
    mask[1, 7:] = True
    kp = m.project_keys(enc)
    state = torch.randn(3, 8, dtype=torch.float64)
    for _ in range(3):
        context, weights = m(state, enc, projected_keys=kp, key_padding_mask=mask, return_weights=True)
        ref_context, ref_weights = bahdanau_ref(m, state[:, None], enc, enc, mask)
        torch.testing.assert_close(context, ref_context[:, 0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(weights, ref_weights[:, 0], rtol=1e-12, atol=1e-12)
        assert (weights[1, 7:] == 0).all()
        state = torch.tanh(state + context[:, :8])


def test_training_gradients_match_reference():
    m = AdditiveAttention(5, 4, 8, dtype=torch.float64)
    query = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    key = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    # the inputs too: the key is also the value, so its gradient carries the op's dv
    params = [m.w_q.weight, m.w_k.weight, m.w_k.bias, m.w, query, key]
    grads = torch.autograd.grad(m(query, key)[0].square().sum(), params)
    ref = torch.autograd.grad(bahdanau_ref(m, query, key, key)[0].square().sum(), params)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


def test_mixed_precision_under_autocast():
    """Under torch.autocast the projections come out in bfloat16 while w and the value stay float32; the module
    feeds the op one dtype (it refused w's float32 before). The gradient reaches every parameter."""
    m = AdditiveAttention(6, 5, 7)
    query, key = torch.randn(2, 3, 6), torch.randn(2, 4, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights = m(query, key, return_weights=True)
        same = bahdanau_ref(m, query, key, key.to(torch.bfloat16))  # the materialized form under the same autocast
    assert out.dtype == torch.bfloat16
    m64 = copy.deepcopy(m).double()
    ref64 = bahdanau_ref(m64, query.double(), key.double(), key.double())
    assert_close_to_ref(out, ref64[0], same[0], name="out")
    assert_close_to_ref(weights, ref64[1], same[1], name="weights")
    # gradients of every parameter under the rule: ref64 from the float64 module, the baseline from the
    # materialized form under the same autocast
    params, params64 = list(m.parameters()), list(m64.parameters())
    grads = torch.autograd.grad(out.float().square().sum(), params)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        same_out = bahdanau_ref(m, query, key, key.to(torch.bfloat16))[0]
    same_grads = torch.autograd.grad(same_out.float().square().sum(), params)
    ref_grads = torch.autograd.grad(ref64[0].square().sum(), params64)
    for (name, _), g, r, sg in zip(m.named_parameters(), grads, ref_grads, same_grads):
        assert_close_to_ref(g, r, sg, name=f"grad {name}")


def test_compile_fullgraph():
    m = AdditiveAttention(8, 6, 16)
    compiled = torch.compile(m, fullgraph=True, dynamic=True)
    query, key = torch.randn(2, 5, 8), torch.randn(2, 7, 6)
    torch.testing.assert_close(compiled(query, key)[0], m(query, key)[0])


@pytest.mark.parametrize("query, key, value, message", [
    ((2, 3, 5), (2, 4, 6), None,
     "AdditiveAttention: query expected shape [batch, query_len, 8] or [batch, 8], got [2, 3, 5]"),
    ((2, 3, 8), (2, 4, 5), None, "AdditiveAttention: key expected shape [batch, key_len, 6], got [2, 4, 5]"),
    ((2, 3, 8), (2, 4, 6), (2, 4, 3), "AdditiveAttention: value expected last dim value_dim=6, got [2, 4, 3]"),
])
def test_bad_inputs(query, key, value, message):
    m = AdditiveAttention(8, 6, 16)
    with pytest.raises(ValueError) as info:
        m(torch.randn(query), torch.randn(key), None if value is None else torch.randn(value))
    assert str(info.value) == message
