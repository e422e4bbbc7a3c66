"""Plain-PyTorch reference of additive (Bahdanau) attention; it materializes [B, Tq, Tk, A] (fine for
test shapes). Computed in the inputs' dtype: float64 inputs give the reference, low-precision inputs
the 'same dtype' baseline of the tolerance rule."""
import torch


def additive_attention_ref(qp, kp, w, v, key_padding_mask=None):
    """-> (out [B, Tq, Dv], lse [B, Tq], weights [B, Tq, Tk]); rows without a visible key give zeros, -inf."""
    scores = torch.tanh(qp[:, :, None, :] + kp[:, None, :, :]) @ w  # [B, Tq, Tk]
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores.float() if scores.dtype != torch.float64 else scores, dim=-1)
    weights = torch.exp(scores - lse[..., None].to(scores.dtype))
    weights = torch.where(torch.isneginf(lse)[..., None], torch.zeros_like(weights), weights)
    return weights @ v, lse, weights


def additive_inputs(B, Tq, Tk, A, Dv, dtype=torch.float64, requires_grad=False):
    """Fresh random inputs; the projections are scaled so that tanh is neither linear nor saturated."""
    def make(*shape, scale=1.0):
        return (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype).requires_grad_(requires_grad)
    return make(B, Tq, A, scale=1.5), make(B, Tk, A, scale=1.5), make(A), make(B, Tk, Dv)
