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


def launch_train(spec_path: Path, nproc: int = 2, *args: str, launcher: str = "accelerate",
                 cpu: bool = True) -> subprocess.CompletedProcess:
    """`graft train SPEC ARGS` in `nproc` ranks (CPU ranks on gloo unless `cpu` is False: one GPU
    each, NCCL) started by `launcher`: accelerate (`accelerate launch --multi_gpu`), torchrun
    (one node), or nodes (one torchrun per rank, each its own node of a multi-node rendezvous
    over loopback). Returns rank 0's process, or the first that failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    port = str(_free_port())
    train = ["-m", "graft.cli", "train", str(spec_path), *args]
    if launcher == "accelerate":
        cmds = [["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(nproc),
                 "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                 "--main_process_port", port, *train]]
    elif launcher == "torchrun":
        cmds = [["-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                 "--master_port", port, *train]]
    else:
        cmds = [["-m", "torch.distributed.run", "--nnodes", str(nproc), "--node_rank", str(rank),
                 "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", port, *train]
                for rank in range(nproc)]
    procs = [subprocess.Popen([sys.executable, *cmd], env=env, cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for cmd in cmds]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    failed = [r for r in results if r.returncode != 0]
    return failed[0] if failed else results[0]
