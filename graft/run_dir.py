"""The run dir `graft train` writes and everything downstream reads: its file names, and the
"run dir or LLM dir?" question every loader asks, answered in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graft.errors import GraftConfigError

SPEC_FILE = "graft.yaml"  # the resolved GraftSpec
ADAPTER_WEIGHTS = "adapter.safetensors"  # the trained projector (graft.adapters.save_adapter)
ADAPTER_CONFIG = "adapter.json"  # its config, d_vision and d_model
LORA_DIR = "lora"  # LoRA weights of a finetune run (peft's save_pretrained)
TRAINER_STATE = "trainer_state.pt"  # optimizer, scheduler, RNG and data position, per checkpoint
CHECKPOINTS_DIR = "checkpoints"  # step_NNNNNNNN/ folders for --resume
METRICS_FILE = "metrics.jsonl"  # one row per logged optimizer step
TRAIN_SUMMARY = "train_summary.json"  # written when training ends
LOSS_CURVE = "loss_curve.png"
EVAL_DIR = "eval"  # results of `graft eval` on this run
TRACKER_DIR = "logs"  # train.report_to's local files (TensorBoard event files)
LLM_CONFIG = "config.json"  # what makes a dir an HF LLM dir


def is_run_dir(path: str | Path) -> bool:
    """Whether `path` holds a graft.yaml (a training run dir)."""
    return (Path(path) / SPEC_FILE).is_file()


def is_llm_dir(path: str | Path) -> bool:
    """Whether `path` holds an HF config.json (a bare LLM dir)."""
    return (Path(path) / LLM_CONFIG).is_file()


def model_dir_kind(path: str | Path, what: str = "model path") -> str:
    """"run" for a run dir, "llm" for an HF LLM dir; GraftConfigError naming both when neither."""
    if is_run_dir(path):
        return "run"
    if is_llm_dir(path):
        return "llm"
    raise GraftConfigError(
        f"{what} {path}: neither a run dir ({SPEC_FILE}) nor an HF LLM dir ({LLM_CONFIG})")


def _inside(name: str) -> property:
    return property(lambda self: self.path / name, doc=f"<run dir>/{name}")


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run dir; `RunDir.open` also checks that it is one."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def open(cls, path: str | Path, what: str = "") -> "RunDir":
        """The run dir at `path`, or GraftConfigError: `what` prefixes the message (e.g. a graft name)."""
        if not is_run_dir(path):
            raise GraftConfigError(f"{what}{path} is not a run dir: {SPEC_FILE} is missing; pass "
                                   "the output_dir of `graft train`")
        return cls(path)

    spec_file = _inside(SPEC_FILE)
    adapter_weights = _inside(ADAPTER_WEIGHTS)
    adapter_config = _inside(ADAPTER_CONFIG)
    lora_dir = _inside(LORA_DIR)
    checkpoints_dir = _inside(CHECKPOINTS_DIR)
    metrics_file = _inside(METRICS_FILE)
    train_summary = _inside(TRAIN_SUMMARY)
    loss_curve = _inside(LOSS_CURVE)
    eval_dir = _inside(EVAL_DIR)
    tracker_dir = _inside(TRACKER_DIR)

    @property
    def has_lora(self) -> bool:
        return self.lora_dir.is_dir()

    def load_spec(self):
        """The GraftSpec saved in graft.yaml."""
        from graft.spec import GraftSpec

        return GraftSpec.load(self.spec_file)
