"""Plain-PyTorch references of the ops for the self-test of ``python -m attn_ops``: the formulas of the
docs/*_api.md files, written for clarity (loops, repeated heads, dense masks) and run in float64."""
import torch
from torch import Tensor


def attend(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool = False):
    """Softmax attention of one sequence: ``q`` ``[Tq, H, D]``, ``k`` ``[Tk, Hkv, D]``, ``v`` ``[Tk, Hkv, Dv]``,
    query head ``h`` reading KV head ``h // (H // Hkv)``. Query ``i`` is at position ``i + Tk - Tq``
    (bottom-right causal). Returns ``out [Tq, H, Dv]`` and ``lse [H, Tq]``."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    logits = torch.einsum("qhd,khd->hqk", q, k) * scale
    if causal:
        positions = torch.arange(q.shape[0], device=q.device)[:, None] + k.shape[0] - q.shape[0]
        logits = logits.masked_fill(torch.arange(k.shape[0], device=q.device) > positions, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(logits, -1), v), torch.logsumexp(logits, -1)


def attend_batch(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool = False):
    """:func:`attend` of each row of a dense batch ``[B, T, H, D]``: ``out [B, Tq, H, Dv]``, ``lse [B, H, Tq]``."""
    outs, lses = zip(*(attend(q[b], k[b], v[b], scale=scale, causal=causal) for b in range(q.shape[0])))
    return torch.stack(outs), torch.stack(lses)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, *, interleaved: bool) -> Tensor:
    """Rotary embedding of ``x`` ``[..., H, D]``: the first ``2 * cos.shape[1]`` features rotate in pairs,
    ``(x[i], x[i + half])`` or ``(x[2i], x[2i + 1])``, by the angle of ``positions`` (``x``'s leading dims)."""
    half = cos.shape[1]
    c, s = cos[positions].unsqueeze(-2), sin[positions].unsqueeze(-2)
    rotated = x[..., :2 * half]
    a, b = (rotated[..., 0::2], rotated[..., 1::2]) if interleaved else (rotated[..., :half], rotated[..., half:])
    a, b = a * c - b * s, a * s + b * c
    rotated = torch.stack((a, b), -1).flatten(-2) if interleaved else torch.cat((a, b), -1)
    return torch.cat((rotated, x[..., 2 * half:]), -1)


def lightning(q: Tensor, k: Tensor, v: Tensor, slope: Tensor, state: Tensor, *, scale: float):
    """Lightning attention of one sequence, step by step: ``S_t = exp(-slope) S_{t-1} + k_t^T v_t``,
    ``out_t = scale * q_t S_t``. ``q`` ``[T, H, Dk]``, ``k`` ``[T, Hk, Dk]``, ``v`` ``[T, Hk, Dv]``, ``state``
    ``[H, Dk, Dv]``. Returns ``out [T, H, Dv]`` and the final state."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    decay = torch.exp(-slope)[:, None, None]
    outs = []
    for t in range(q.shape[0]):
        state = decay * state + torch.einsum("hk,hv->hkv", k[t], v[t])
        outs.append(scale * torch.einsum("hk,hkv->hv", q[t], state))
    return torch.stack(outs), state


def additive(qp: Tensor, kp: Tensor, w: Tensor, v: Tensor, key_padding_mask: Tensor):
    """Additive attention: ``score_ij = w . tanh(qp_i + kp_j)``, padded keys (True) left out, softmax over keys.
    Returns ``out [B, Tq, Dv]`` and ``lse [B, Tq]``."""
    scores = torch.tanh(qp[:, :, None, :] + kp[:, None, :, :]) @ w
    scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)
