"""train.sharding=fsdp on two GPUs (NCCL), with and without the LLM's shards offloaded to host
memory: the same adapter as one GPU on the global batch. Needs 2 CUDA devices (skips with
fewer); on a GPU machine: `python -m pytest -q tests/gpu/test_sharded_train.py` (make gpu-check
runs it too)."""

import pytest
import torch

from graft.train.loop import train
from tests.graft.conftest import make_spec, tiny_dataset  # noqa: F401 (fixtures)
from tests.graft.train.launch import launch_train
from tests.graft.train.test_sharded import _assert_same_run, _summary, sharded_spec  # noqa: F401

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


@pytest.mark.parametrize("offload", [False, True])
def test_two_gpus_sharded_equal_one(offload, sharded_spec, tiny_llm_factory, tmp_path):  # noqa: F811
    llm = tiny_llm_factory("qwen3_moe")
    one = train(sharded_spec(8, "one", llm=llm))
    two = sharded_spec(4, "two", llm=llm, sharding="fsdp", cpu_offload=offload)
    two.save(tmp_path / "two.yaml")
    proc = launch_train(tmp_path / "two.yaml", 2, cpu=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same_run(one, tmp_path / "two", rel=1e-4)  # TF32-free fp32, but other reduction orders
    summary = _summary(tmp_path / "two")
    assert all(b <= 0.6 * summary["llm_param_bytes"] for b in summary["llm_param_bytes_per_rank"])
    assert all(m and m > 0 for m in summary["peak_device_memory_bytes_per_rank"])
