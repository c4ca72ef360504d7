"""Tiny random LLM checkpoints and a tiny chat tokenizer, built offline for tests.

Everything is saved with `save_pretrained` and must be loaded back through the same
`from_pretrained(local_dir)` path real checkpoints use.
"""

from __future__ import annotations

from pathlib import Path

import torch

from graft.benchmarks.random_checkpoint import build_tokenizer  # the one `graft models random` writes


def _llm_config(family: str, vocab_size: int, pad_id: int, eos_id: int):
    from transformers import Glm4Config, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    if family == "llama":
        return LlamaConfig(**common, tie_word_embeddings=True)
    if family == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False)
    if family == "qwen3":
        # explicit head_dim different from hidden/heads, qk-norm is built in
        return Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
    if family == "glm4":
        return Glm4Config(**common, head_dim=16, partial_rotary_factor=0.5, attention_bias=True,
                          tie_word_embeddings=False)
    if family in _MOE:
        from transformers import AutoConfig

        return AutoConfig.for_model(family, **common, **_MOE[family])
    raise ValueError(f"unknown tiny family {family!r}")


# Mixture-of-experts families: 8-16 experts of width 64 (a multiple of every int4 group size)
_MOE = {
    "qwen3_moe": dict(head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                      tie_word_embeddings=False),
    # GLM-4.5 in small: grouped top-4 of 16 experts (2 of 4 groups), a shared expert, layer 0 dense
    "glm4_moe": dict(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                     moe_intermediate_size=64, n_shared_experts=1, routed_scaling_factor=2.5,
                     norm_topk_prob=True, first_k_dense_replace=1, partial_rotary_factor=0.5,
                     use_qk_norm=True, attention_bias=True, tie_word_embeddings=False),
}
LLM_FAMILIES = ("llama", "qwen2", "qwen3", "glm4")
MOE_FAMILIES = tuple(_MOE)


def build_llm(out_dir: str | Path, family: str = "llama", seed: int = 0,
              config_overrides: dict | None = None) -> Path:
    """Save a tiny random causal LM of `family` plus the tiny tokenizer to `out_dir`;
    `config_overrides` are set on its config (e.g. a head_dim another engine supports)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out_dir)
    config = _llm_config(family, len(tok), tok.pad_token_id, tok.eos_token_id)
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    # Random init gives near-uniform logits; larger weights make greedy choices decisive
    # so parity tests are not decided by float ties.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # zeros at init: make it steer choices
                b.normal_(0.0, 0.1)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(str(out_dir))
    return out_dir
