"""Run `graft train` in real CPU ranks (gloo) through `accelerate launch`, as a user would."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.graft.conftest import make_dataset

REPO = Path(__file__).resolve().parents[3]
# answers of very different lengths, so the two halves of a batch hold different token counts;
# 9 samples: the second global batch of 8 holds one, so one rank runs a stand-in micro-batch
ANSWERS = ["red", "green", "a blue square in the center of the picture", "red red red red red",
           "blue", "the colour is green, and it fills the whole image", "yes", "two green triangles", "no"]


def uneven_dataset(root: Path) -> Path:
    path = make_dataset(root, n=len(ANSWERS))
    samples = json.loads(path.read_text())
    for sample, answer in zip(samples, ANSWERS):
        sample["conversations"][1]["value"] = answer
    path.write_text(json.dumps(samples))
    return path


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_train(spec_path: Path, nproc: int = 2, *args: str) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu --num_processes N -m graft.cli train SPEC ARGS` on CPU."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
           str(nproc), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), "-m", "graft.cli", "train", str(spec_path), *args]
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
