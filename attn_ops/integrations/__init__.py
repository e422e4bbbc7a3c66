"""Adapters that put attn_ops attention into existing model libraries.

* :mod:`attn_ops.integrations.transformers`: ``register()`` adds an ``"attn_ops"`` attention
  implementation to HuggingFace transformers (``attn_implementation="attn_ops"``), for models with
  MHA / GQA / MQA attention (Llama, Mistral, Qwen2, Gemma-2, ...). See docs/transformers.md.
* :mod:`attn_ops.integrations.deepseek`: ``swap_deepseek_attention(model)`` swaps the attention of
  transformers DeepSeek-V2/V3 models for multi-head latent attention. See docs/deepseek.md.

Each submodule imports its library only when it is imported itself, so ``import attn_ops`` never
needs transformers.
"""
