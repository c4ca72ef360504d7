"""`graft train --dry-run`: everything `graft train` checks before the LLM's weights load,
printed: the resolved spec, data counts, image tokens per image and a memory estimate."""

from __future__ import annotations

from pathlib import Path

import yaml

from graft.spec import GraftSpec

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def dry_run(spec: GraftSpec) -> dict:
    """The report (also printed by the CLI); builds only the image path (encoder, projector,
    tokenizer) and reads the data, never the LLM's weights."""
    from transformers import AutoConfig, AutoTokenizer

    from graft.image_path import ImagePath, llm_dir as checked_llm_dir
    from graft.train.data import prepare_samples

    llm_dir = checked_llm_dir(spec.llm.path)
    llm_cfg = AutoConfig.from_pretrained(llm_dir)
    image_path = ImagePath.from_spec(spec, llm_cfg.hidden_size)
    tokenizer = AutoTokenizer.from_pretrained(llm_dir)
    max_len = min(spec.data.max_length, getattr(llm_cfg, "max_position_embeddings", None) or 10**9)
    data = {}
    for split in ("train", "val"):
        path = getattr(spec.data, split)
        if not path:
            continue
        samples, skipped = prepare_samples(
            GraftSpec.expand(path), GraftSpec.expand(spec.data.image_root), tokenizer,
            image_path.image_token_count, max_len, spec.data.on_bad_sample, spec.data.system_prompt)
        per_image = sorted({n for s in samples for _, n in s.chat.image_spans})
        lengths = [len(s.chat.input_ids) for s in samples]
        data[split] = {"samples": len(samples), "skipped": len(skipped),
                       "images": sum(len(s.image_paths) for s in samples),
                       "image_tokens_per_image": per_image,
                       "tokens_max": max(lengths), "tokens_mean": round(sum(lengths) / len(lengths), 1)}
    return {"spec": spec.to_dict(), "data": data,
            "memory_gib": memory_estimate(spec, image_path, llm_dir, llm_cfg, data["train"]["tokens_max"])}


def memory_estimate(spec: GraftSpec, image_path, llm_dir: str, llm_cfg, seq_len: int) -> dict:
    """A rough peak in GiB: frozen weights in their dtype, the trainable projector with its
    gradient and two AdamW moments (fp32), and the LLM's activations for one micro-batch
    (about 16 values of d_model per token per layer kept for backward; much less with
    gradient checkpointing). LoRA's few parameters are left out."""
    llm_params = _safetensors_params(Path(llm_dir))
    frozen = llm_params * _BYTES[spec.llm.dtype] + sum(p.numel() for p in image_path.encoder.parameters()) * 4
    trainable = sum(p.numel() for p in image_path.projector.parameters()) * 4 * 4
    act_bytes = 2 if spec.train.precision == "bf16" else 4
    per_layer = 2 if spec.train.gradient_checkpointing else 16
    layers = getattr(llm_cfg, "num_hidden_layers", 1)
    acts = spec.train.batch_size * seq_len * llm_cfg.hidden_size * layers * per_layer * act_bytes
    gib = 1024 ** 3
    parts = {"frozen_weights": frozen / gib, "trainable_and_optimizer": trainable / gib,
             "activations": acts / gib}
    parts["total"] = sum(parts.values())
    return {k: round(v, 3) for k, v in parts.items()}


def _safetensors_params(llm_dir: Path) -> int:
    """Parameter count from the safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    from graft.shards import safetensors_files

    total = 0
    for f in safetensors_files(llm_dir):
        with safe_open(str(f), "pt") as fh:
            for name in fh.keys():
                n = 1
                for d in fh.get_slice(name).get_shape():
                    n *= d
                total += n
    return total


def format_report(report: dict) -> str:
    lines = ["resolved spec:", yaml.safe_dump(report["spec"], sort_keys=False).rstrip(), ""]
    for split, d in report["data"].items():
        lines.append(f"data.{split}: {d['samples']} samples ({d['skipped']} skipped), "
                     f"{d['images']} images, image tokens per image {d['image_tokens_per_image']}, "
                     f"tokens per sample max {d['tokens_max']} mean {d['tokens_mean']}")
    m = report["memory_gib"]
    lines.append(f"memory estimate: {m['total']:.2f} GiB (frozen weights {m['frozen_weights']:.2f}, "
                 f"trainable + AdamW {m['trainable_and_optimizer']:.3f}, activations "
                 f"{m['activations']:.2f} for one micro-batch of the longest sample)")
    return "\n".join(lines)
