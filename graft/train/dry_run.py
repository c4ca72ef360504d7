"""`graft train --dry-run`: everything `graft train` checks before the LLM's weights load,
printed: the resolved spec, data counts, image tokens per image and a memory estimate."""

from __future__ import annotations

import yaml

from graft.spec import GraftSpec

SHOWN_SKIPS = 5  # skipped samples whose reason --dry-run prints (the rest are counted)


def dry_run(spec: GraftSpec) -> dict:
    """The report (also printed by the CLI); reads what `graft train` reads before the LLM's
    weights (`read_inputs`: the image path, the tokenizer, the data), never the weights."""
    from graft.train.inputs import read_inputs

    inputs = read_inputs(spec)
    data = {}
    for split, samples, skipped in (("train", inputs.samples, inputs.skipped),
                                    ("val", inputs.val_samples, inputs.val_skipped)):
        if not samples:  # no data.val
            continue
        per_image = sorted({n for s in samples for _, n in s.chat.image_spans})
        lengths = [len(s.chat.input_ids) for s in samples]
        data[split] = {"samples": len(samples), "skipped": len(skipped),
                       "skip_reasons": skipped[:SHOWN_SKIPS],
                       "images": sum(len(s.image_paths) for s in samples),
                       "image_tokens_per_image": per_image,
                       "tokens_max": max(lengths), "tokens_mean": round(sum(lengths) / len(lengths), 1)}
    return {"spec": spec.to_dict(), "data": data,
            "memory_gib": memory_estimate(spec, data["train"]["tokens_max"])}


def memory_estimate(spec: GraftSpec, seq_len: int) -> dict:
    """One process's peak in GiB, from graft.train.plan (config.json and the encoder's size):
    frozen weights in their dtype, the trainable parameters with gradients and AdamW moments,
    and an estimate of the LLM's activations for one micro-batch of the longest sample."""
    from graft.train.plan import GIB, make_plan

    plan = make_plan(spec, world_size=1, seq_len=seq_len)
    whole = plan["strategies"]["none"]
    parts = {"frozen_weights": (plan["llm"]["bytes"] + plan["encoder"]["bytes"]) / GIB,
             "trainable_and_optimizer": plan["trainable"]["state_bytes"] / GIB,
             "activations": whole["activation_bytes"] / GIB}
    parts["total"] = sum(parts.values())
    return {k: round(v, 3) for k, v in parts.items()}


def format_report(report: dict) -> str:
    lines = ["resolved spec:", yaml.safe_dump(report["spec"], sort_keys=False).rstrip(), ""]
    for split, d in report["data"].items():
        lines.append(f"data.{split}: {d['samples']} samples ({d['skipped']} skipped), "
                     f"{d['images']} images, image tokens per image {d['image_tokens_per_image']}, "
                     f"tokens per sample max {d['tokens_max']} mean {d['tokens_mean']}")
        lines += [f"  skipped: {reason}" for reason in d["skip_reasons"]]
        if d["skipped"] > len(d["skip_reasons"]):
            lines.append(f"  ... and {d['skipped'] - len(d['skip_reasons'])} more skipped")
    m = report["memory_gib"]
    lines.append(f"memory estimate: {m['total']:.2f} GiB (frozen weights {m['frozen_weights']:.2f}, "
                 f"trainable + AdamW {m['trainable_and_optimizer']:.3f}, activations "
                 f"{m['activations']:.2f} for one micro-batch of the longest sample)")
    return "\n".join(lines)
