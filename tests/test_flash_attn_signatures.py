"""The FlashAttention-compatible modules keep FlashAttention's signatures exactly: parameter names, order,
kinds and defaults, from the table below (transcribed from FlashAttention's flash_attn/flash_attn_interface.py,
2.8.4, and hopper/flash_attn_interface.py, FA3). attn_ops' extensions are keyword-only parameters after
FlashAttention's, listed separately, so every call written for FlashAttention binds the same way."""

import inspect

import pytest

import attn_ops.flash_attn3_interface as fa3
import attn_ops.flash_attn_interface as fa2
from attn_ops import flash_attn_padding, flash_attn_rotary

REQ = inspect.Parameter.empty
WINDOW = (-1, -1)

# function -> [(name, default)], in FlashAttention's order (REQ: no default)
FA2 = {
    "flash_attn_qkvpacked_func": [("qkv", REQ), ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
                                  ("window_size", WINDOW), ("softcap", 0.0), ("alibi_slopes", None),
                                  ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_kvpacked_func": [("q", REQ), ("kv", REQ), ("dropout_p", 0.0), ("softmax_scale", None),
                                 ("causal", False), ("window_size", WINDOW), ("softcap", 0.0), ("alibi_slopes", None),
                                 ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_func": [("q", REQ), ("k", REQ), ("v", REQ), ("dropout_p", 0.0), ("softmax_scale", None),
                        ("causal", False), ("window_size", WINDOW), ("softcap", 0.0), ("alibi_slopes", None),
                        ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_varlen_qkvpacked_func": [("qkv", REQ), ("cu_seqlens", REQ), ("max_seqlen", REQ), ("dropout_p", 0.0),
                                         ("softmax_scale", None), ("causal", False), ("window_size", WINDOW),
                                         ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                                         ("return_attn_probs", False)],
    "flash_attn_varlen_kvpacked_func": [("q", REQ), ("kv", REQ), ("cu_seqlens_q", REQ), ("cu_seqlens_k", REQ),
                                        ("max_seqlen_q", REQ), ("max_seqlen_k", REQ), ("dropout_p", 0.0),
                                        ("softmax_scale", None), ("causal", False), ("window_size", WINDOW),
                                        ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                                        ("return_attn_probs", False)],
    "flash_attn_varlen_func": [("q", REQ), ("k", REQ), ("v", REQ), ("cu_seqlens_q", REQ), ("cu_seqlens_k", REQ),
                               ("max_seqlen_q", REQ), ("max_seqlen_k", REQ), ("dropout_p", 0.0),
                               ("softmax_scale", None), ("causal", False), ("window_size", WINDOW), ("softcap", 0.0),
                               ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False),
                               ("block_table", None)],
    "flash_attn_with_kvcache": [("q", REQ), ("k_cache", REQ), ("v_cache", REQ), ("k", None), ("v", None),
                                ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                                ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
                                ("softmax_scale", None), ("causal", False), ("window_size", WINDOW), ("softcap", 0.0),
                                ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
                                ("return_softmax_lse", False)],
}
_DESCALES = [("q_descale", None), ("k_descale", None), ("v_descale", None)]
FA3 = {
    "flash_attn_qkvpacked_func": [("qkv", REQ), ("softmax_scale", None), ("causal", False), *_DESCALES,
                                  ("window_size", WINDOW), ("attention_chunk", 0), ("softcap", 0.0),
                                  ("deterministic", False), ("num_heads_q", None), ("sm_margin", 0),
                                  ("return_attn_probs", False)],
    "flash_attn_func": [("q", REQ), ("k", REQ), ("v", REQ), ("softmax_scale", None), ("causal", False), ("qv", None),
                        *_DESCALES, ("window_size", WINDOW), ("attention_chunk", 0), ("softcap", 0.0),
                        ("num_splits", 1), ("pack_gqa", None), ("deterministic", False), ("sm_margin", 0),
                        ("return_attn_probs", False)],
    "flash_attn_varlen_func": [("q", REQ), ("k", REQ), ("v", REQ), ("cu_seqlens_q", REQ), ("cu_seqlens_k", REQ),
                               ("max_seqlen_q", REQ), ("max_seqlen_k", REQ), ("seqused_q", None), ("seqused_k", None),
                               ("softmax_scale", None), ("causal", False), ("qv", None), *_DESCALES,
                               ("window_size", WINDOW), ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1),
                               ("pack_gqa", None), ("deterministic", False), ("sm_margin", 0),
                               ("return_attn_probs", False)],
    "flash_attn_combine": [("out_partial", REQ), ("lse_partial", REQ), ("out", None), ("out_dtype", None)],
    "flash_attn_with_kvcache": [("q", REQ), ("k_cache", REQ), ("v_cache", REQ), ("k", None), ("v", None),
                                ("qv", None), ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                                ("cache_batch_idx", None), ("cache_leftpad", None), ("page_table", None),
                                ("cu_seqlens_q", None), ("cu_seqlens_k_new", None), ("max_seqlen_q", None),
                                ("rotary_seqlens", None), *_DESCALES, ("softmax_scale", None), ("causal", False),
                                ("window_size", WINDOW), ("attention_chunk", 0), ("softcap", 0.0),
                                ("rotary_interleaved", True), ("scheduler_metadata", None), ("num_splits", 0),
                                ("pack_gqa", None), ("sm_margin", 0), ("return_softmax_lse", False)],
    "get_scheduler_metadata": [("batch_size", REQ), ("max_seqlen_q", REQ), ("max_seqlen_k", REQ),
                               ("num_heads_q", REQ), ("num_heads_kv", REQ), ("headdim", REQ), ("cache_seqlens", REQ),
                               ("qkv_dtype", "torch.bfloat16"), ("headdim_v", None), ("cu_seqlens_q", None),
                               ("cu_seqlens_k_new", None), ("cache_leftpad", None), ("page_size", None),
                               ("max_seqlen_k_new", 0), ("causal", False), ("window_size", WINDOW),
                               ("attention_chunk", 0), ("has_softcap", False), ("num_splits", 0), ("pack_gqa", None),
                               ("sm_margin", 0)],
}
# attn_ops extensions: keyword-only, after FlashAttention's parameters, default None
SINKS = ["s_aux", "learnable_sink"]
FA2_EXTRA = {name: SINKS for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache")}
FA3_EXTRA = {"flash_attn_func": ["out", "learnable_sink", "s_aux"],
             "flash_attn_varlen_func": ["page_table", "out", "learnable_sink", "s_aux"],
             "flash_attn_with_kvcache": ["out", "learnable_sink", "s_aux"]}
PADDING = {
    "index_first_axis": [("input", REQ), ("indices", REQ)],
    "index_put_first_axis": [("values", REQ), ("indices", REQ), ("first_axis_dim", REQ)],
    "unpad_input": [("hidden_states", REQ), ("attention_mask", REQ), ("unused_mask", None)],
    "pad_input": [("hidden_states", REQ), ("indices", REQ), ("batch", REQ), ("seqlen", REQ)],
}
ROTARY = {"apply_rotary_emb": [("x", REQ), ("cos", REQ), ("sin", REQ), ("interleaved", False), ("inplace", False),
                               ("seqlen_offsets", 0), ("cu_seqlens", None), ("max_seqlen", None)]}

CASES = [(fa2, FA2, FA2_EXTRA), (fa3, FA3, FA3_EXTRA), (flash_attn_padding, PADDING, {}),
         (flash_attn_rotary, ROTARY, {})]


def _default(value):
    return str(value) if value.__class__.__name__ == "dtype" else value


@pytest.mark.parametrize("module,table,extra", CASES, ids=["fa2", "fa3", "bert_padding", "rotary"])
def test_signatures_match_flash_attention(module, table, extra):
    assert sorted(module.__all__) == sorted(table), "the module exports exactly FlashAttention's functions"
    for name, expected in table.items():
        params = list(inspect.signature(getattr(module, name)).parameters.values())
        positional = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert [(p.name, _default(p.default)) for p in positional] == expected, name
        keyword_only = [p for p in params if p.kind == p.KEYWORD_ONLY]
        assert [p.name for p in keyword_only] == extra.get(name, []), name
        assert all(p.default is None for p in keyword_only), name
        assert len(positional) + len(keyword_only) == len(params), f"{name}: no *args / **kwargs"
