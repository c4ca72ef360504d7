"""`graft train --plan`: what each rank holds under data parallelism (the whole frozen LLM on
every rank) and under FSDP (the LLM sharded per decoder layer), from config.json files and
safetensors headers only: no weight is read, so a 355B-parameter LLM is planned in seconds.

Under FSDP a rank holds its shard of everything, plus the units gathered whole while they
run: the root unit (embeddings, final norm, LM head and the projector: everything outside
the decoder layers) for the whole forward and backward, two decoder layers (the one running,
the next one prefetched), and the all-gather buffer of the largest unit (a gather lands
there before it is copied into the unit's parameters). tests/graft/train/test_plan_measured.py holds the plan to
the peak memory of a real two-rank run.

The same numbers guard `graft train`: a run whose weights and optimizer state do not fit the
memory of one rank stops with the plan in one line before anything loads.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import torch

from graft.errors import GraftConfigError
from graft.spec import GraftSpec

GIB, MIB = 1024 ** 3, 1024 ** 2
MAX_WORLD_SIZE = 1 << 20  # past any cluster built; a shard of nothing would "fit" anything
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000 ** 2, "mb": 1000 ** 2,
          "mib": 1024 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": GIB, "t": 1000 ** 4,
          "tb": 1000 ** 4, "tib": 1024 ** 4}
# fp32 master value, gradient and AdamW's two moments per trainable parameter
_TRAINABLE_STATE_BYTES = 16


def parse_bytes(text: str | int, field: str = "--device-memory") -> int:
    """'80GiB', '80GB', '512MiB' or a plain byte count -> bytes; an error naming the field."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise GraftConfigError(f"{field}={text!r}: expected a size such as 80GiB, 80GB or 512MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # shared (tied) tensors count once


def _moe_summary(config, layers) -> dict | None:
    """Experts per MoE layer, how many a token uses, and the parameters a token passes through."""
    experts = getattr(config, "num_experts", None) or getattr(config, "n_routed_experts", None)
    if not experts:
        return None
    per_token = config.num_experts_per_tok
    routed = 0
    for layer in layers:
        for name, p in layer.named_parameters():
            if ".experts." in f".{name}":
                routed += p.numel()
    return {"experts": experts, "experts_per_token": per_token, "routed_params": routed,
            "inactive_params_per_token": routed - routed * per_token // experts}


def _lora_params(llm: torch.nn.Module, spec: GraftSpec) -> int:
    if spec.train.stage != "finetune":
        return 0
    r, targets = spec.train.lora.r, set(spec.train.lora.target_modules)
    return sum(r * (m.in_features + m.out_features) for name, m in llm.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets)


def _encoder_footprint(spec: GraftSpec) -> tuple[int, int]:
    """(parameters, output width) of the frozen encoder, from headers or a meta-device build."""
    cfg = spec.encoder_config()
    if cfg.kind == "timm":
        from graft.encoders.timm_encoder import TimmEncoder

        # The encoder as it runs, not timm's whole model: cnn_stage sets the width the projector
        # sees and drops later stages, feature_layer prunes a ViT's later blocks.
        with torch.device("meta"):
            encoder = TimmEncoder(dataclasses.replace(cfg, path=None))
        return _numel(encoder.model), encoder.hidden_size
    root = Path(cfg.path or "")
    if not (root / "config.json").is_file():
        raise GraftConfigError(f"encoder.path {cfg.path!r}: no config.json; the plan reads the "
                               f"encoder's size from it (kind {cfg.kind})")
    if cfg.kind == "moonvit":
        from graft.encoders.moonvit_model import MoonViT
        from graft.encoders.moonvit_weights import read_vision_config

        vision, _ = read_vision_config(root)
        with torch.device("meta"):
            return _numel(MoonViT(vision)), vision.merged_size
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(root)
    vision = getattr(config, "vision_config", config)
    with torch.device("meta"):
        model = AutoModel.from_config(vision)
    return _numel(model), vision.hidden_size


def _projector_params(spec: GraftSpec, d_vision: int, d_model: int) -> int:
    from graft.adapters.registry import build_adapter

    with torch.device("meta"):
        return _numel(build_adapter(spec.adapter_config(), d_vision, d_model))


def activation_bytes(spec: GraftSpec, hidden: int, layers: int, seq_len: int, vocab: int = 0) -> int:
    """About 16 values of d_model per token per layer kept for backward (2 with gradient
    checkpointing), plus the logits over the vocabulary in fp32 (HF upcasts them), about four
    copies (logits, log-softmax, their gradients), for one micro-batch of seq_len tokens: an
    estimate, never a guard."""
    per_layer = 2 if spec.train.gradient_checkpointing else 16
    act = 2 if spec.train.precision == "bf16" else 4
    tokens = spec.train.batch_size * seq_len
    return tokens * hidden * layers * per_layer * act + tokens * vocab * 4 * 4


def make_plan(spec: GraftSpec, world_size: int = 1, device_memory: int | None = None,
              seq_len: int | None = None) -> dict:
    """Bytes per rank for sharding none (DDP) and fsdp at `world_size` ranks, and which fit."""
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise GraftConfigError(f"--world-size={world_size}: use 1 to {MAX_WORLD_SIZE} ranks")
    from graft.model import meta_llm

    llm, config = meta_llm(spec.llm.path, spec.llm.dtype)
    decoder_layers = list(llm.get_decoder().layers)
    llm_params = _numel(llm)
    llm_bytes = llm_params * _BYTES[spec.llm.dtype]
    layer_bytes = max((_numel(x) for x in decoder_layers), default=0) * _BYTES[spec.llm.dtype]
    enc_params, d_vision = _encoder_footprint(spec)
    projector = _projector_params(spec, d_vision, config.hidden_size)
    trainable = projector + _lora_params(llm, spec)
    # the root FSDP unit: the LLM outside its decoder layers (a tied embedding counts once),
    # and the projector in fp32
    root_bytes = ((llm_params - sum(_numel(x) for x in decoder_layers)) * _BYTES[spec.llm.dtype]
                  + projector * 4)
    seq_len = seq_len or spec.data.max_length
    acts = activation_bytes(spec, config.hidden_size, len(decoder_layers), seq_len,
                            config.vocab_size)
    fixed = enc_params * 4  # the encoder is held whole (fp32) on every rank: it feeds the batches
    state = trainable * _TRAINABLE_STATE_BYTES
    # FSDP: each rank keeps 1/world of the LLM, gathers the root unit whole for the forward and
    # backward, and one decoder layer at a time with the next one prefetched (two full layers
    # in flight); a unit's all-gather lands in a buffer of its full size before it is copied
    # into its parameters, so one such buffer (the largest unit's) is counted too; trainable
    # state is sharded
    ddp = {"llm_bytes": llm_bytes, "weights_and_state_bytes": llm_bytes + fixed + state}
    shard = -(-llm_bytes // world_size)
    if spec.train.cpu_offload:  # the shards wait in host memory; the device sees what runs
        shard = 0
    buffer = max(root_bytes, layer_bytes)
    gathered = root_bytes + 2 * layer_bytes + buffer
    fsdp = {"llm_bytes": shard + gathered, "shard_bytes": shard, "gathered_bytes": gathered,
            "all_gather_buffer_bytes": buffer,
            "weights_and_state_bytes": shard + gathered + fixed + -(-state // world_size)}
    for strategy in (ddp, fsdp):
        strategy["activation_bytes"] = acts
        strategy["total_bytes"] = strategy["weights_and_state_bytes"] + acts
        strategy["fits"] = None if device_memory is None else strategy["total_bytes"] <= device_memory
    return {"llm": {"path": spec.llm.path, "model_type": config.model_type, "params": llm_params,
                    "dtype": spec.llm.dtype, "bytes": llm_bytes, "layers": len(decoder_layers),
                    "largest_layer_bytes": layer_bytes, "root_unit_bytes": root_bytes,
                    "vocab_size": config.vocab_size, "moe": _moe_summary(config, decoder_layers)},
            "encoder": {"kind": spec.encoder.get("kind"), "params": enc_params, "bytes": fixed},
            "trainable": {"params": trainable, "state_bytes": state},
            "world_size": world_size, "device_memory": device_memory, "seq_len": seq_len,
            "micro_batch": spec.train.batch_size, "cpu_offload": spec.train.cpu_offload,
            "strategies": {"none": ddp, "fsdp": fsdp}}


def default_device_memory(spec: GraftSpec) -> int | None:
    """train.device_memory, else one GPU's memory, else this host's RAM over its local ranks."""
    if spec.train.device_memory:
        return parse_bytes(spec.train.device_memory, "train.device_memory")
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    from graft.cli_types import env_int

    return ram // env_int("LOCAL_WORLD_SIZE", 1)


def check_fits(spec: GraftSpec, world_size: int) -> dict:
    """The plan for this launch; GraftConfigError in one line when the chosen strategy's weights
    and optimizer state alone exceed one rank's memory (activations are only estimated)."""
    memory = default_device_memory(spec)
    plan = make_plan(spec, world_size, memory)
    chosen = plan["strategies"][spec.train.sharding]
    if memory is not None and chosen["weights_and_state_bytes"] > memory:
        other = "fsdp" if spec.train.sharding == "none" else "none"
        alt = plan["strategies"][other]
        hint = (f"train.sharding={other} needs {_size(alt['weights_and_state_bytes'])} per rank "
                + ("and fits (--set train.sharding=" + other + ")" if alt["weights_and_state_bytes"] <= memory
                   else "and does not fit either: add ranks or use a smaller llm.dtype"))
        raise GraftConfigError(
            f"train.sharding={spec.train.sharding} on {world_size} rank(s): each rank needs "
            f"{_size(chosen['weights_and_state_bytes'])} for weights and optimizer state (LLM "
            f"{_size(chosen['llm_bytes'])}) but has {_size(memory)}; {hint}; `graft train CONFIG "
            "--plan` shows the whole plan")
    return plan


def _size(n: int) -> str:
    """MiB, to the MiB past 1000 (planning at GiB steps hid 10 MiB differences)."""
    mib = n / MIB
    return f"{mib:.2f} MiB" if mib < 10 else f"{mib:.1f} MiB" if mib < 1000 else f"{mib:,.0f} MiB"


def format_plan(plan: dict) -> str:
    llm, enc, tr = plan["llm"], plan["encoder"], plan["trainable"]
    lines = [f"LLM {llm['path']} ({llm['model_type']}): {llm['params'] / 1e9:.3f}B parameters, "
             f"{_size(llm['bytes'])} in {llm['dtype']}, {llm['layers']} decoder layers "
             f"(largest {_size(llm['largest_layer_bytes'])}; root unit: embeddings, LM head "
             f"and projector {_size(llm['root_unit_bytes'])})"]
    if llm["moe"]:
        moe = llm["moe"]
        lines.append(f"  MoE: {moe['experts']} experts, {moe['experts_per_token']} per token; "
                     f"{(llm['params'] - moe['inactive_params_per_token']) / 1e9:.3f}B parameters "
                     "active per token")
    lines.append(f"encoder ({enc['kind']}): {enc['params'] / 1e6:.1f}M parameters, "
                 f"{_size(enc['bytes'])} (fp32, whole on every rank)")
    lines.append(f"trainable: {tr['params'] / 1e6:.2f}M parameters, {_size(tr['state_bytes'])} "
                 "with gradients and AdamW state")
    memory = plan["device_memory"]
    lines.append(f"per rank at {plan['world_size']} rank(s), micro-batch {plan['micro_batch']} x "
                 f"{plan['seq_len']} tokens" + (f", {_size(memory)} each:" if memory else ":"))
    for name, s in plan["strategies"].items():
        verdict = "" if s["fits"] is None else ("  fits" if s["fits"] else "  does NOT fit")
        label = "none (DDP)" if name == "none" else "fsdp" + (" (offload)" if plan["cpu_offload"] else "")
        lines.append(f"  {label:<14} LLM {_size(s['llm_bytes']):>12}   weights + state "
                     f"{_size(s['weights_and_state_bytes']):>12}   + activations ~"
                     f"{_size(s['activation_bytes'])} = {_size(s['total_bytes'])}{verdict}")
    fitting = [n for n, s in plan["strategies"].items() if s["fits"]]
    if memory:
        lines.append("fits: " + (", ".join(f"train.sharding={n}" for n in fitting) if fitting
                                 else "neither; add ranks, lower micro-batch or max_length, or "
                                      "turn on gradient checkpointing"))
    return "\n".join(lines)
