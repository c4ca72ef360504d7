"""train.sharding=fsdp in two real CPU ranks (gloo): the frozen LLM split between them, the
result that of one process on the global batch, and checkpoints that resume at any world size."""

import json
import shutil

import pytest
import torch

from graft.errors import GraftConfigError
from graft.train.loop import train
from tests.graft.train.launch import launch_train, metric_rows, uneven_dataset


def _adapter(run_dir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "train_summary.json").read_text())


@pytest.fixture
def sharded_spec(make_spec, tmp_path):
    """spec(batch_size, out, llm=..., **train): the uneven-answer data set, 4 steps of 8 samples."""
    data = uneven_dataset(tmp_path / "data")

    def spec(batch_size, out, llm=None, **train_fields):
        fields = dict(batch_size=batch_size, max_steps=4, lr=1e-2, max_grad_norm=1.0)
        s = make_spec(llm=llm, **{**fields, **train_fields})
        s.data.train, s.data.image_root, s.output_dir = str(data), str(data.parent), str(tmp_path / out)
        return s

    return spec


def _launch(spec, path, nproc=2, *args, launcher="accelerate"):
    spec.save(path)
    proc = launch_train(path, nproc, *args, launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _assert_same_run(a, b, rel=1e-5) -> None:
    ra, rb = metric_rows(a), metric_rows(b)
    assert [r["step"] for r in rb] == [r["step"] for r in ra]
    assert [r["loss"] for r in rb] == pytest.approx([r["loss"] for r in ra], rel=rel)
    assert [r["grad_norm"] for r in rb] == pytest.approx([r["grad_norm"] for r in ra], rel=10 * rel)
    assert _max_diff(_adapter(a), _adapter(b)) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("family,launcher", [("llama", "accelerate"), ("qwen3_moe", "torchrun"),
                                             ("glm4_moe", "nodes")])
def test_two_sharded_ranks_equal_one_process(family, launcher, sharded_spec, tiny_llm_factory, tmp_path):
    """Each family under another launcher: accelerate launch, torchrun, and two single-rank
    "nodes" meeting over loopback as a multi-node job would."""
    llm = tiny_llm_factory(family)
    one = train(sharded_spec(8, "one", llm=llm))
    proc = _launch(sharded_spec(4, "two", llm=llm, sharding="fsdp"), tmp_path / "two.yaml",
                   launcher=launcher)
    assert "world size 2 (DistributedType.FSDP), process 0" in proc.stderr
    _assert_same_run(one, tmp_path / "two")

    whole, sharded = _summary(one), _summary(tmp_path / "two")
    assert whole["llm_param_bytes_per_rank"] == [whole["llm_param_bytes"]]
    assert sharded["llm_param_bytes"] == whole["llm_param_bytes"]
    per_rank = sharded["llm_param_bytes_per_rank"]
    assert len(per_rank) == 2 and sum(per_rank) >= sharded["llm_param_bytes"]
    assert all(b <= 0.6 * sharded["llm_param_bytes"] for b in per_rank)
    assert len(sharded["peak_rss_bytes_per_rank"]) == 2 and min(sharded["peak_rss_bytes_per_rank"]) > 0
    assert sharded["peak_device_memory_bytes_per_rank"] == [None, None]  # CPU ranks
    # rank 0 alone reads the weights; rank 1 gets its shards from it
    assert sharded["llm_weights_read_per_rank"] == [True, False]


@pytest.mark.slow
def test_sharded_moe_finetune_trains_lora_like_one_process(sharded_spec, tiny_llm_factory, tmp_path):
    from safetensors.torch import load_file

    llm = tiny_llm_factory("glm4_moe")
    one = train(sharded_spec(8, "one", llm=llm, stage="finetune"))
    _launch(sharded_spec(4, "two", llm=llm, stage="finetune", sharding="fsdp"), tmp_path / "two.yaml")
    _assert_same_run(one, tmp_path / "two")
    lora_a = load_file(str(one / "lora" / "adapter_model.safetensors"))
    lora_b = load_file(str(tmp_path / "two" / "lora" / "adapter_model.safetensors"))
    assert lora_a and all("self_attn" in k for k in lora_a)  # attention only, never the experts
    # most entries agree to 1e-7; Adam divides each gradient by its own running size, so an
    # entry whose gradient is near zero in both runs moves by a share of lr (1e-2) that the
    # gradients' fp32 summation order decides (1.4e-5 seen on a Xeon's oneDNN GEMMs)
    assert _max_diff(lora_a, lora_b) <= 1e-4


@pytest.mark.slow
def test_sharded_bf16_checkpointing_and_feature_cache(sharded_spec, tiny_llm_factory, tmp_path):
    llm = tiny_llm_factory("qwen3_moe")
    cache = str(tmp_path / "features")
    kw = dict(precision="bf16", gradient_checkpointing=True, feature_cache=cache)
    one = train(sharded_spec(8, "one", llm=llm, **kw))
    _launch(sharded_spec(4, "two", llm=llm, sharding="fsdp", **kw), tmp_path / "two.yaml")
    a, b = metric_rows(one), metric_rows(tmp_path / "two")
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in b)
    # bf16 rounds differently when FSDP casts the gathered layers than under autocast alone
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=3e-2)
    assert b[-1]["feature_cache_misses"] == 0 and b[-1]["feature_cache_hits"] > 0  # filled by `one`


def _exact(rows: list[dict]) -> list[tuple]:
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in rows]  # not the timings


def _drop_last_checkpoint(run_dir) -> None:
    """As if the run had stopped after its step-2 checkpoint."""
    shutil.rmtree(run_dir / "checkpoints" / "step_00000004")


@pytest.mark.slow
def test_sharded_resume_exact_and_at_another_world_size(sharded_spec, tmp_path):
    two = sharded_spec(4, "two", sharding="fsdp", save_every=2)
    _launch(two, tmp_path / "two.yaml")
    ref_rows, ref_adapter = metric_rows(tmp_path / "two"), _adapter(tmp_path / "two")

    # 2 ranks -> 2 ranks: bit-identical
    _drop_last_checkpoint(tmp_path / "two")
    _launch(two, tmp_path / "two.yaml", 2, "--resume")
    assert _exact(metric_rows(tmp_path / "two")) == _exact(ref_rows)
    assert _max_diff(_adapter(tmp_path / "two"), ref_adapter) == 0

    # 2 ranks -> 1 process, the global batch kept: the same run up to float rounding
    _drop_last_checkpoint(tmp_path / "two")
    with pytest.raises(GraftConfigError, match=r"global batch of 8 samples.*--set train\.batch_size=8"):
        train(sharded_spec(4, "two", sharding="fsdp", save_every=2), resume=True)
    train(sharded_spec(8, "two", sharding="fsdp", save_every=2), resume=True)
    rows = metric_rows(tmp_path / "two")
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in ref_rows], rel=1e-5)
    assert _max_diff(_adapter(tmp_path / "two"), ref_adapter) <= 1e-5

    # 1 process -> 2 sharded ranks
    one = train(sharded_spec(8, "one", save_every=2))
    one_rows, one_adapter = metric_rows(one), _adapter(one)
    _drop_last_checkpoint(one)
    _launch(sharded_spec(4, "one", sharding="fsdp", save_every=2), tmp_path / "one.yaml", 2, "--resume")
    assert [r["loss"] for r in metric_rows(one)] == pytest.approx([r["loss"] for r in one_rows], rel=1e-5)
    assert _max_diff(_adapter(one), one_adapter) <= 1e-5


def test_cpu_offload_needs_fsdp_and_a_gpu(make_spec):
    with pytest.raises(GraftConfigError, match="needs train.sharding=fsdp"):
        make_spec(cpu_offload=True)
    if not torch.cuda.is_available():
        with pytest.raises(GraftConfigError, match="this machine has no GPU: set it false"):
            train(make_spec(sharding="fsdp", cpu_offload=True))


def test_launcher_fsdp_without_sharding_is_refused(make_spec, monkeypatch):
    from graft.train import sharding

    monkeypatch.setattr(sharding, "_LAUNCHED_WITH_FSDP", True)
    with pytest.raises(GraftConfigError, match="add --set train.sharding=fsdp"):
        train(make_spec())
