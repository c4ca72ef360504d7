"""Tiny GGUF files written from the tiny HF checkpoints (tests/tiny_llm.py) the way llama.cpp's
convert_hf_to_gguf.py writes them: its metadata keys, its tensor names, Llama's q/k rows
permuted for its RoPE layout, the tokenizer as a gpt2 BPE vocabulary, each linear in the
GGUF block type asked for (gguf-py's quantizers are llama.cpp's reference ones)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: HF's rotate-half rows -> interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(llm_dir: Path, out: Path, linear_type: dict[str, str], other: str = "F32",
               eot: int | None = None) -> Path:
    """GGUF of the HF dir `llm_dir` (llama, qwen2, qwen3 or qwen3_moe): a linear named by a key
    of `linear_type` (q_proj, ..., down_proj, lm_head) takes that block type (Q4_0, Q4_1, Q8_0,
    Q4_K, Q6_K, Q5_0, F32); the embedding table `other`; norms, biases and a MoE router F32; a MoE layer's
    experts stacked per projection (ffn_gate_exps, ...), as llama.cpp's converter does; `eot`:
    an end-of-turn token id written besides eos."""
    import gguf
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(llm_dir)
    tok = AutoTokenizer.from_pretrained(llm_dir)
    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
            "qwen3": gguf.MODEL_ARCH.QWEN3, "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE}[config.model_type]
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    if getattr(config, "head_dim", None):  # as the converter: what transformers reads for Qwen3-MoE
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
    if arch == gguf.MODEL_ARCH.QWEN3MOE:
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    # as convert_hf_to_gguf: ids the tokenizer lacks, up to the config's vocab_size, are [PADn]
    # tokens of type UNUSED (5), so the embedding table has a token per row
    vocab = {i: t for t, i in tok.get_vocab().items()}
    special = set(tok.all_special_ids)
    ids = range(max(config.vocab_size, len(vocab)))
    w.add_token_list([vocab.get(i, f"[PAD{i}]") for i in ids])
    w.add_token_types([3 if i in special else 1 if i in vocab else 5 for i in ids])
    w.add_token_merges([" ".join(m) if isinstance(m, (list, tuple)) else m
                        for m in json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]])
    w.add_eos_token_id(tok.eos_token_id)
    if eot is not None:  # an end-of-turn token besides eos (Llama-3's <|eot_id|>)
        w.add_eot_token_id(eot)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
    state = _stack_experts(load_file(str(llm_dir / "model.safetensors")))
    for name, tensor in state.items():
        data = tensor.to(torch.float32).numpy()
        module, _, kind = name.rpartition(".")
        short = module.rpartition(".")[2]
        if arch == gguf.MODEL_ARCH.LLAMA and short in ("q_proj", "k_proj"):
            heads = config.num_attention_heads if short == "q_proj" else config.num_key_value_heads
            data = _permute(data, heads)
        qtype = linear_type.get(short, other if data.ndim == 2 else "F32") if kind == "weight" else "F32"
        qtype = gguf.GGMLQuantizationType[qtype]
        target = names.get_name(module) + "." + kind if "_exps" not in module else name
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(target, data)
        else:
            writer = {"Q4_K": q4_k_blocks, "Q6_K": q6_k_blocks}.get(qtype.name)
            blocks = writer(data) if writer else gguf.quants.quantize(data, qtype)
            w.add_tensor(target, blocks, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _stack_experts(state: dict) -> dict:
    """model.layers.L.mlp.experts.E.gate_proj.weight ... -> blk.L.ffn_gate_exps.weight [E, out, in]."""
    import re

    import torch

    out, experts = {}, {}
    for name, tensor in state.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", name)
        if m:
            experts.setdefault(f"blk.{m[1]}.ffn_{m[3]}_exps.weight", {})[int(m[2])] = tensor
        else:
            out[name] = tensor
    for name, per in experts.items():
        out[name] = torch.stack([per[e] for e in sorted(per)])
    return out


def q4_k_blocks(w: np.ndarray) -> np.ndarray:
    """llama.cpp's Q4_K blocks of w [..., rows, cols] (cols a multiple of 256; gguf-py reads them
    but has no quantizer): per 32-weight sub-block w ~ d*sc * code - dmin*m, a plain min-max
    choice of the 6-bit sc and m (llama.cpp searches better ones; the layout is what matters)."""
    if w.ndim > 2:
        return q4_k_blocks(w.reshape(-1, w.shape[-1])).reshape(*w.shape[:-1], -1)
    rows, cols = w.shape
    b = w.astype(np.float32).reshape(rows, cols // 256, 8, 32)
    low = np.maximum(-b.min(-1), 0)  # dmin*m >= 0
    step = np.maximum(b.max(-1) + low, 1e-8) / 15
    d = (step.max(-1) / 63).astype(np.float16)
    dmin = (np.maximum(low.max(-1), 1e-8) / 63).astype(np.float16)
    sc = np.clip(np.round(step / d[..., None].astype(np.float32)), 1, 63).astype(np.uint8)
    m = np.clip(np.round(low / dmin[..., None].astype(np.float32)), 0, 63).astype(np.uint8)
    scale = d[..., None].astype(np.float32) * sc
    codes = np.clip(np.round((b + (dmin[..., None].astype(np.float32) * m)[..., None])
                             / scale[..., None]), 0, 15).astype(np.uint8)
    packed_scales = np.concatenate([sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
                                    m[..., :4] | ((m[..., 4:] >> 4) << 6),
                                    (sc[..., 4:] & 0xF) | ((m[..., 4:] & 0xF) << 4)], axis=-1)
    pairs = codes.reshape(rows, cols // 256, 4, 2, 32)  # sub-blocks 2i, 2i+1 share bytes
    qs = (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(rows, cols // 256, 128)
    head = np.concatenate([d[..., None].view(np.uint8), dmin[..., None].view(np.uint8)], axis=-1)
    return np.concatenate([head.reshape(rows, cols // 256, 4), packed_scales, qs],
                          axis=-1).reshape(rows, -1)


def q6_k_blocks(w: np.ndarray) -> np.ndarray:
    """llama.cpp's Q6_K blocks of w [..., rows, cols] (cols a multiple of 256; gguf-py reads them
    but has no quantizer): per 16-weight sub-block w ~ d*sc * (code - 32), sc an int8 and d one
    fp16 per 256 weights, codes 6 bits (4 in ql, 2 in qh, in gguf-py's order)."""
    if w.ndim > 2:
        return q6_k_blocks(w.reshape(-1, w.shape[-1])).reshape(*w.shape[:-1], -1)
    rows, cols = w.shape
    b = w.astype(np.float32).reshape(-1, 16, 16)  # [blocks, sub-blocks, weights]
    step = np.abs(b).max(-1) / 32
    d = np.maximum(step.max(-1) / 127, 2.0 ** -14).astype(np.float16)  # fp16 normal: no 0 to divide by
    sc = np.clip(np.round(step / d[:, None].astype(np.float32)), -127, 127).astype(np.int8)
    scale = d[:, None].astype(np.float32) * sc
    safe = np.where(scale == 0, 1, scale)
    codes = (np.clip(np.round(b / safe[..., None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)
    ql = (codes[..., :64] & 0xF) | ((codes[..., 64:] & 0xF) << 4)  # [blocks, 2, 64]
    high = (codes >> 4).reshape(-1, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    n = b.shape[0]
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8),
                           d[:, None].view(np.uint8)], axis=-1).reshape(rows, -1)
