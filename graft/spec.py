"""GraftSpec: the one config tree (YAML) that names encoder, adapter, LLM, data and training.

Every field has a default and a one-line comment. `graft train` saves the resolved spec
as graft.yaml in the run dir; everything downstream reads it back from there.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from graft.errors import GraftConfigError, check_fields
from graft.loads import yaml_loads

if TYPE_CHECKING:
    from graft.adapters.config import AdapterConfig
    from graft.encoders.config import EncoderConfig
from graft.spec_paths import INPUT_PATHS, absolutize, resolve_file_paths


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
    # checkpoint every N optimizer steps, so an interrupted run resumes (0: only at the end)
    save_every: int = 50
    keep_checkpoints: int = 2  # the newest N checkpoints stay on disk (0: keep all)
    log_every: int = 1  # a metrics.jsonl row (and tracker point) every N optimizer steps; step 1 always
    eval_every: int = 0  # validation loss on data.val every N optimizer steps (0: only at the end)
    report_to: str = "none"  # none | tensorboard | trackio | wandb | mlflow (accelerate's trackers)
    feature_cache: str | None = None  # folder for cached frozen-encoder outputs (None: off)
    num_workers: int = 0  # DataLoader workers
    # none: every rank holds the whole frozen LLM (data parallel) | fsdp: the frozen LLM sharded
    # per decoder layer across the ranks (accelerate's FSDP2); the result is the same
    sharding: str = "none"
    cpu_offload: bool = False  # fsdp on GPUs: LLM shards wait in host memory, moved in a layer at a time
    # memory one rank may use, e.g. 80GiB (None: the device's, or this host's RAM over its
    # local ranks); a run whose plan does not fit stops before loading any weights
    device_memory: str | None = None
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
        if isinstance(raw, dict):  # the file's relative input paths: against its folder
            resolve_file_paths(raw, Path(path).resolve().parent)
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
        for dotted, allowed in _CHOICES.items():
            value = self._get(dotted)
            if value not in allowed:
                raise GraftConfigError(f"{dotted}={value!r}: use one of {', '.join(allowed)}")
        for dotted, (ok, hint) in _RANGES.items():
            value = self._get(dotted)
            if value is not None and not math.isfinite(value):
                raise GraftConfigError(f"{dotted}={value!r}: must be a finite number, {hint}")
            if value is not None and not ok(value):
                raise GraftConfigError(f"{dotted}={value!r}: must be {hint}")
        if self.train.lr * self.train.weight_decay >= 1:
            raise GraftConfigError(
                f"train.weight_decay={self.train.weight_decay:g} with train.lr={self.train.lr:g}: "
                "AdamW scales every weight by 1 - lr * weight_decay a step, so their product "
                "must be < 1 (typical: weight_decay 0.0 to 0.1)")
        if self.train.cpu_offload and self.train.sharding != "fsdp":
            raise GraftConfigError("train.cpu_offload=true offloads FSDP shards; it needs "
                                   "train.sharding=fsdp (or set train.cpu_offload=false)")
        if self.train.eval_every and not self.data.val:
            raise GraftConfigError(f"train.eval_every={self.train.eval_every} needs data.val (a "
                                   "held-out JSON like data.train); set it, or train.eval_every=0")

    def _get(self, dotted: str):
        node = self
        for part in dotted.split("."):
            node = getattr(node, part)
        return node

    # Paths in the spec may use ~ and ${ENV}; resolved at use, saved as written. Relative
    # input paths were made absolute by `load` (graft.spec_paths).
    @staticmethod
    def expand(path: str | None) -> str | None:
        return None if path is None else os.path.expandvars(os.path.expanduser(path))


# Enum fields and their values; numeric fields as (test, wording for the message). Every
# numeric field is also checked finite: a NaN fails no comparison, so a test alone passes it.
_CHOICES = {
    "train.stage": ("align", "finetune"),
    "train.precision": ("fp32", "bf16"),
    "data.on_bad_sample": ("error", "skip"),
    "llm.dtype": ("float32", "bfloat16", "float16"),
    "train.report_to": ("none", "tensorboard", "trackio", "wandb", "mlflow"),
    "train.sharding": ("none", "fsdp"),
}
_RANGES = {
    # AdamW moves a weight by about lr a step: past 10 a run only diverges (past ~1e37 the
    # optimizer's own float32 arithmetic overflows)
    "train.lr": (lambda v: 0 < v <= 10, "> 0 and <= 10"),
    "train.weight_decay": (lambda v: v >= 0, ">= 0"),
    "train.batch_size": (lambda v: v >= 1, ">= 1"),
    "train.grad_accum": (lambda v: v >= 1, ">= 1"),
    "train.epochs": (lambda v: v >= 1, ">= 1"),
    "train.max_steps": (lambda v: v >= 1, ">= 1 or null"),
    "train.warmup_ratio": (lambda v: 0 <= v <= 1, "between 0 and 1"),
    "train.max_grad_norm": (lambda v: v >= 0, ">= 0 (0 disables clipping)"),
    "train.save_every": (lambda v: v >= 0, ">= 0 (0: only at the end)"),
    "train.keep_checkpoints": (lambda v: v >= 0, ">= 0 (0: keep all)"),
    "train.log_every": (lambda v: v >= 1, ">= 1"),
    "train.eval_every": (lambda v: v >= 0, ">= 0 (0: only at the end)"),
    "train.num_workers": (lambda v: v >= 0, ">= 0"),
    "train.lora.r": (lambda v: v >= 1, ">= 1"),
    "train.lora.dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "data.max_length": (lambda v: v >= 1, ">= 1"),
}


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


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _coerce(value, f: dataclasses.Field, dotted: str):
    """`value` as field `f`'s type, strictly: `ture` or `2.5` for an int is an error naming
    the key and what it accepts, never a silent default."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if value is None:
        if "None" in kind:
            return None
        raise GraftConfigError(f"{dotted}: null is not allowed; expected {kind.split(' ')[0]}")
    if kind.startswith("bool"):
        text = str(value).lower() if isinstance(value, (str, int)) else None
        if isinstance(value, bool) or text in _TRUE + _FALSE:
            return value if isinstance(value, bool) else text in _TRUE
        raise GraftConfigError(f"{dotted}={value!r}: expected a boolean (true or false)")
    if kind.startswith("int"):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value)
        raise GraftConfigError(f"{dotted}={value!r}: expected an integer")
    if kind.startswith("float"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise GraftConfigError(f"{dotted}={value!r}: expected a number (e.g. 1e-4)")
    if kind.startswith("str") and not isinstance(value, str):
        raise GraftConfigError(f"{dotted}={value!r}: expected a string")
    if kind.startswith("list") and not isinstance(value, list):
        raise GraftConfigError(f"{dotted}={value!r}: expected a list, e.g. [a, b]")
    if kind.startswith("dict") and not isinstance(value, dict):
        raise GraftConfigError(f"{dotted}={value!r}: expected a mapping, e.g. {{kind: mlp}}")
    return value


def apply_override(raw: dict, item: str) -> None:
    """Apply one `--set a.b.c=value` (value parsed as YAML) to the raw mapping."""
    if "=" not in item:
        raise GraftConfigError(f"--set {item!r}: expected key=value, e.g. train.lr=1e-4")
    key, _, text = item.partition("=")
    value = yaml_loads(text, f"--set {key.strip()}") if text else None
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise GraftConfigError(f"--set {key}: {part} is not a mapping")
    node[parts[-1]] = absolutize(value, Path.cwd()) if key.strip() in INPUT_PATHS else value
