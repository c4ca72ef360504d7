"""GraftSpec: the one config tree (YAML) that names encoder, adapter, LLM, data and training.

Every field has a default and a one-line comment. `graft train` saves the resolved spec
as graft.yaml in the run dir; everything downstream reads it back from there.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from graft.errors import GraftConfigError, check_fields

if TYPE_CHECKING:
    from graft.adapters.config import AdapterConfig
    from graft.encoders.config import EncoderConfig


@dataclass
class LLMConfig:
    path: str = ""  # local HF dir of the frozen decoder-only LLM (config.json + safetensors)
    dtype: str = "float32"  # weights dtype for training/chat: float32 | bfloat16 | float16
    sha256: str | None = None  # digest of the weight files; recorded at training, checked on load


@dataclass
class DataConfig:
    train: str = ""  # LLaVA-format JSON (list of {image|images, conversations})
    val: str | None = None  # optional held-out JSON in the same format (loss only)
    image_root: str = "."  # folder that relative image paths are resolved against
    max_length: int = 512  # samples longer than this (in tokens, images included) are bad
    on_bad_sample: str = "error"  # error: stop with the sample index | skip: count and go on
    system_prompt: str | None = None  # optional system message prepended to every sample


@dataclass
class LoraConfig:
    r: int = 8  # LoRA rank (stage finetune only)
    alpha: int = 16  # LoRA scaling numerator
    dropout: float = 0.0  # dropout on the LoRA branch
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])  # LLM module names


@dataclass
class TrainConfig:
    stage: str = "align"  # align: projector only | finetune: projector + LoRA on the LLM
    lr: float = 1.0e-3  # peak learning rate (AdamW)
    weight_decay: float = 0.0  # AdamW weight decay
    batch_size: int = 8  # samples per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    epochs: int = 1  # passes over the training data (ignored when max_steps is set)
    max_steps: int | None = None  # optimizer steps; overrides epochs
    warmup_ratio: float = 0.03  # share of steps with linear warmup, then cosine decay to 0
    max_grad_norm: float = 1.0  # gradient clipping (0 disables)
    precision: str = "fp32"  # fp32 | bf16 (autocast on the frozen parts)
    gradient_checkpointing: bool = False  # trade compute for memory in the LLM
    seed: int = 0  # seeds data order, projector init and dropout
    save_every: int = 0  # checkpoint every N optimizer steps (0: only at the end)
    log_every: int = 10  # write metrics.jsonl every N optimizer steps
    feature_cache: str | None = None  # folder for cached frozen-encoder outputs (None: off)
    num_workers: int = 0  # DataLoader workers
    lora: LoraConfig = field(default_factory=LoraConfig)  # used by stage finetune


@dataclass
class GraftSpec:
    # encoder/adapter stay the mappings as written: that is what graft.yaml saves and what the
    # encoder-cache and eval identities hash; encoder_config()/adapter_config() are their typed form.
    encoder: dict = field(default_factory=dict)  # graft.encoders.EncoderConfig fields
    adapter: dict = field(default_factory=lambda: {"kind": "mlp", "depth": 2})  # AdapterConfig fields
    adapter_init: str | None = None  # start the projector from this adapter dir (e.g. `graft extract --part projector`)
    llm: LLMConfig = field(default_factory=LLMConfig)  # the frozen LLM
    data: DataConfig = field(default_factory=DataConfig)  # training data
    train: TrainConfig = field(default_factory=TrainConfig)  # optimisation settings
    output_dir: str = "runs/graft"  # run directory written by `graft train`

    # ---- loading -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict, source: str = "spec") -> "GraftSpec":
        if not isinstance(raw, dict):
            raise GraftConfigError(f"{source}: top level must be a mapping, got {type(raw).__name__}")
        spec = _build(cls, raw, "")
        spec.validate()
        return spec

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> "GraftSpec":
        from graft.io import read_yaml

        raw = read_yaml(path) or {}
        for item in overrides or []:
            apply_override(raw, item)
        return cls.from_dict(raw, source=str(path))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # ---- typed blocks ----------------------------------------------------------------
    def encoder_config(self, expand_path: bool = True) -> "EncoderConfig":
        """The `encoder:` block as a checked EncoderConfig (defaults filled in; ~ and ${ENV}
        in its path expanded unless expand_path=False). A fresh object: editing it leaves the spec."""
        from graft.encoders.config import EncoderConfig

        cfg = EncoderConfig.from_dict(dict(self.encoder))
        if expand_path and cfg.path:
            cfg.path = self.expand(cfg.path)
        return cfg

    def adapter_config(self) -> "AdapterConfig":
        """The `adapter:` block as a checked AdapterConfig (defaults filled in); a fresh object."""
        from graft.adapters.config import AdapterConfig

        return AdapterConfig.from_dict(dict(self.adapter))

    def save(self, path: str | Path) -> None:
        from graft.io import atomic_write_text

        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))

    def validate(self) -> None:
        if not self.llm.path:
            raise GraftConfigError("llm.path is required: a local HF model directory")
        if not self.encoder.get("kind"):
            raise GraftConfigError("encoder.kind is required (timm, siglip, clip, moonvit)")
        if self.train.stage not in ("align", "finetune"):
            raise GraftConfigError(f"train.stage={self.train.stage!r}: use align or finetune")
        if self.train.precision not in ("fp32", "bf16"):
            raise GraftConfigError(f"train.precision={self.train.precision!r}: use fp32 or bf16")
        if self.data.on_bad_sample not in ("error", "skip"):
            raise GraftConfigError(
                f"data.on_bad_sample={self.data.on_bad_sample!r}: use error or skip")
        for name in ("batch_size", "grad_accum", "epochs"):
            if getattr(self.train, name) < 1:
                raise GraftConfigError(f"train.{name} must be >= 1")
        if self.train.max_steps is not None and self.train.max_steps < 1:
            raise GraftConfigError("train.max_steps must be >= 1 or null")

    # Paths in the spec may use ~ and ${ENV}; resolved at use, saved as written.
    @staticmethod
    def expand(path: str | None) -> str | None:
        return None if path is None else os.path.expandvars(os.path.expanduser(path))


def _build(cls, raw: dict, prefix: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    raw = check_fields(cls, raw, prefix.rstrip(".") or "spec")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        f = fields[name]
        sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(sub):
            kwargs[name] = _build(type(sub), value, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, f, f"{prefix}{name}")
    return cls(**kwargs)


def _coerce(value, f: dataclasses.Field, dotted: str):
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if value is None:
        return None
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        if kind == "bool":
            if isinstance(value, str):
                return value.lower() in ("1", "true", "yes", "on")
            return bool(value)
        if kind.startswith("dict") and not isinstance(value, dict):
            raise TypeError("expected a mapping")
    except (TypeError, ValueError):
        raise GraftConfigError(f"{dotted}={value!r}: expected {kind}") from None
    return value


def apply_override(raw: dict, item: str) -> None:
    """Apply one `--set a.b.c=value` (value parsed as YAML) to the raw mapping."""
    if "=" not in item:
        raise GraftConfigError(f"--set {item!r}: expected key=value, e.g. train.lr=1e-4")
    key, _, text = item.partition("=")
    value = yaml.safe_load(text) if text else None
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise GraftConfigError(f"--set {key}: {part} is not a mapping")
    node[parts[-1]] = value
